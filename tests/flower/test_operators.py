"""Who may act through the Beat page (issue #30), on real Flowers started with
examples/flowerconfig.py, with a real HTTP client and headless Chromium; after every
refused request the claims database says that nothing was written.

The four Flowers of tests/flower/operator_flowers.py (``closed``, ``opened``,
``listed``, ``guarded``), shared with test_schedule_browser.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.flower.app import CONTROL_JOB
from tests.flower.operator_flowers import Flowers
from tests.flower.support import (
    Answer,
    Session,
    basic,
    call,
    chromium,
    controls,
)
from tests.helpers.processes import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# four real Flowers (tests/flower/operator_flowers.py), built once per worker for the
# modules of this xdist group, and Chromium
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("flower-operators")]

ANONYMOUS = "anonymous@127.0.0.1 (flower)"


def writes(base: str, auth: str | None) -> list[Answer]:
    """Every write the page can send, each with the page's XSRF token (as the issue's
    plain HTTP client did): pause, resume and run one job, pause and resume all."""
    session = Session.open(base, auth)
    return [session.post("pause", job=CONTROL_JOB, reason="not mine", until="1h"),
            session.post("resume", job=CONTROL_JOB),
            session.post("trigger", job=CONTROL_JOB, reason="not mine", force="1"),
            session.post("pause", all="1"),
            session.post("resume", all="1")]


def refused(answers: list[Answer]) -> str:
    """The one reason every answer gave, after checking each is a 403 in JSON."""
    assert [a.status for a in answers] == [403] * len(answers), answers
    reasons = {a.json["error"] for a in answers}
    assert len(reasons) == 1, reasons
    return reasons.pop()


def acts(flowers: Flowers, base: str, auth: str | None, actor: str) -> None:
    """Pause, resume and run the job: 200 each, recorded as *actor*."""
    audited = len(flowers.db.audit())
    session = Session.open(base, auth)
    paused = session.post("pause", job=CONTROL_JOB, reason="allowed", until="1h")
    assert paused.status == 200 and paused.json["pause"]["paused_by"] == actor, paused
    assert flowers.db.pauses()[CONTROL_JOB]["paused_by"] == actor
    resumed = session.post("resume", job=CONTROL_JOB)
    assert resumed.status == 200 and CONTROL_JOB not in flowers.db.pauses(), resumed
    sent = session.post("trigger", job=CONTROL_JOB, reason="allowed", force="1")
    assert sent.status == 200 and sent.json["sent"], sent
    assert [(a["action"], a["actor"]) for a in flowers.db.audit()[audited:]] == [
        ("pause", actor), ("resume", actor), ("trigger", actor)]


def test_without_authentication_nobody_may_act(flowers: Flowers) -> None:
    base, db = flowers.closed, flowers.db
    before = db.state()
    reason = refused(writes(base, None))
    assert db.state() == before, "a refused request wrote to the claims database"
    assert "no authentication" in reason and "FLOWER_UNAUTHENTICATED_API=true" in reason, reason
    assert "--basic_auth" in reason and "--auth" in reason, reason
    # the page and its data stay readable, and say why there is nothing to press
    shown = controls(base, None)
    assert (shown["actions"], shown["actions_reason"]) == (False, reason), shown
    assert shown["read_only"] is False and CONTROL_JOB in {j["name"] for j in shown["jobs"]}
    for path in ("/elarion", "/elarion/api/state", "/elarion/api/one-offs"):
        assert call(base + path)[0].status == 200, path
    # the same rule as Flower's own API on that Flower
    assert call(base + "/api/workers")[0].status == 401


def test_flower_unauthenticated_api_lets_anonymous_callers_act(flowers: Flowers) -> None:
    shown = controls(flowers.opened, None)
    assert (shown["actions"], shown["actions_reason"]) == (True, None), shown
    acts(flowers, flowers.opened, None, ANONYMOUS)


def test_an_operators_list_without_authentication_refuses_everyone(flowers: Flowers) -> None:
    before = flowers.db.state()
    reason = refused(writes(flowers.listed, None))
    assert flowers.db.state() == before, "a refused request wrote to the claims database"
    assert "elarion_beat_flower_operators" in reason and "no authentication" in reason, reason
    assert "--basic_auth" in reason, reason
    assert controls(flowers.listed, None)["actions_reason"] == reason


def test_basic_auth_a_viewer_is_refused_and_an_operator_acts(flowers: Flowers) -> None:
    base, db = flowers.guarded, flowers.db
    before = db.state()
    reason = refused(writes(base, flowers.viewer))
    assert db.state() == before, "a refused request wrote to the claims database"
    assert reason.startswith("bob may watch this page but not act") and \
        "elarion_beat_flower_operators" in reason, reason
    assert "ops-*" not in reason, "the refusal shows the operators list to a viewer"
    shown = controls(base, flowers.viewer)
    assert (shown["actions"], shown["actions_reason"]) == (False, reason), shown
    assert shown["caller"] == "bob (flower)"
    for path in ("/elarion", "/elarion/api/state", "/elarion/api/one-offs"):
        assert call(base + path, auth=flowers.viewer)[0].status == 200, path

    shown = controls(base, flowers.operator)
    assert (shown["actions"], shown["actions_reason"]) == (True, None), shown
    acts(flowers, base, flowers.operator, "ops-alice (flower)")

    # a wrong password is still Flower's 401, before anything else
    session = Session.open(base, flowers.operator)
    assert session.post("pause", auth=basic("ops-alice", "wrong"), job=CONTROL_JOB).status == 401


_BUTTONS_JS = """
return Array.from(document.querySelectorAll('#elarion button.elarion-action')).map(
  function (b) {
    var row = b.closest('tr.elarion-control');
    return {job: row ? row.dataset.job : '', action: b.dataset.action, disabled: b.disabled,
            title: b.title};
  });
"""


def _page(driver: Any, base: str, auth: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """Load the page with *auth*: its buttons, and the note above the controls."""
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                           {"headers": {"Authorization": auth} if auth else {}})
    driver.get(base + "/elarion")
    wait_until(lambda: driver.execute_script(
        "return document.getElementById('elarion').dataset.controlsLoaded"), 30,
        message=f"the controls of {base}")
    buttons = driver.execute_script(_BUTTONS_JS)
    notes = driver.find_elements("id", "elarion-actions-note")
    note = notes[0].text if notes and notes[0].get_attribute("hidden") is None else None
    return buttons, note


def test_the_page_shows_the_buttons_disabled_with_the_reason(flowers: Flowers,
                                                             tmp_path: Path) -> None:
    driver = chromium(tmp_path / "profile")
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        for base, auth in ((flowers.guarded, flowers.viewer), (flowers.closed, None)):
            buttons, note = _page(driver, base, auth)
            assert {(b["job"], b["action"]) for b in buttons} >= {
                (CONTROL_JOB, "pause"), (CONTROL_JOB, "resume"), (CONTROL_JOB, "trigger"),
                ("", "pause"), ("", "resume")}, buttons
            assert [b for b in buttons if not b["disabled"]] == [], \
                f"{base}: a button this caller may not use is enabled"
            reason = controls(base, auth)["actions_reason"]
            assert {b["title"] for b in buttons} == {reason}, buttons
            assert note == reason, (note, reason)

        buttons, note = _page(driver, flowers.guarded, flowers.operator)
        enabled = {(b["job"], b["action"]) for b in buttons if not b["disabled"]}
        assert {(CONTROL_JOB, "pause"), (CONTROL_JOB, "trigger"), ("", "pause")} <= enabled
        assert note is None and {b["title"] for b in buttons} == {""}, (note, buttons)
    finally:
        driver.quit()
