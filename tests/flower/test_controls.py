"""The pause, resume and run-now buttons of the /elarion page, on the real Flowers of
tests/flower/cluster.py (their beats have stopped; the job is :data:`CONTROL_JOB`, due
once a year): headless Chromium presses them, the claims database says what they did,
and raw HTTP requests try what the page never sends (no XSRF token, GET, no
credentials, a read-only Flower).

With ``ELARION_FLOWER_CONTROLS_SCREENSHOT=docs/img/flower-controls.png`` the browser
test saves its screenshot of the page (a paused job, the audit) there (docs/flower.md)."""

from __future__ import annotations

import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat.flower.controls import READ_ONLY
from tests.flower.app import CONTROL_JOB, CRON_JOB
from tests.flower.cluster import PASSWORD, USER, Cluster
from tests.flower.support import (
    PROBE_NODE,
    Db,
    Session,
    basic,
    call,
    chromium,
    controls,
    send_events,
)
from tests.helpers.processes import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# the package's Flower cluster (three Flowers, two exporters, three beats, a worker) is built
# once, on one worker
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("flower-cluster")]

ACTOR = f"{USER} (flower)"


# -- the claims database and HTTP (tests/flower/support.py) --------------------------


@pytest.fixture(scope="module")
def db(cluster: Cluster) -> Db:
    return Db(cluster.env["ELARION_FL_DSN"], cluster.env["ELARION_FL_TABLE"])


# -- the browser ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium that sends the basic-auth credentials with every request."""
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                               {"headers": {"Authorization": cluster.auth}})
        yield driver
    finally:
        driver.quit()


def press(driver: Any, action: str, job: str) -> None:
    """Click the *action* button of *job* ('' : the Pause all / Resume all pair)."""
    from selenium.common.exceptions import StaleElementReferenceException

    where = "#elarion-all-actions" if job == "" else \
        f'tr.elarion-control[data-job="{job}"]'
    selector = f'{where} button.elarion-action[data-action="{action}"]'

    def click() -> bool:
        try:
            for button in driver.find_elements("css selector", selector):
                if button.is_enabled():
                    button.click()
                    return True
        except StaleElementReferenceException:
            pass  # the controls were drawn again meanwhile
        return False

    wait_until(click, 20, message=f"an enabled {action} button of {job or 'every job'}")


def reply(driver: Any, text: str | None = None) -> str:
    """Accept the page's next prompt (typing *text*) or confirmation; its question."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    alert = WebDriverWait(driver, 10).until(expected_conditions.alert_is_present())
    question = str(alert.text)
    if text is not None:
        alert.send_keys(text)
    alert.accept()
    return question


def message(driver: Any) -> tuple[bool, str]:
    """The answer the page shows once its last action came back."""
    def shown() -> tuple[bool, str] | None:
        box = driver.find_element("id", "elarion-control-message")
        if box.get_attribute("hidden") is not None or not box.text:
            return None
        return box.get_attribute("data-ok") == "1", str(box.text)

    found: tuple[bool, str] = wait_until(shown, 20, message="the action's answer")
    driver.execute_script("document.getElementById('elarion-control-message').hidden = true;")
    return found


_CONTROLS_JS = """
return Array.from(document.querySelectorAll('tr.elarion-control')).map(function (r) {
  var badge = r.querySelector('.elarion-pause-cell .badge');
  return {job: r.dataset.job, paused: r.dataset.paused, badge: badge.textContent,
          badgeClass: badge.className,
          who: (r.querySelector('.elarion-pause-who') || {}).textContent || '',
          buttons: Array.from(r.querySelectorAll('button.elarion-action')).map(function (b) {
            return b.dataset.action + (b.disabled ? ':off' : ''); })};
});
"""
_AUDIT_JS = """
return Array.from(document.querySelectorAll('tr.elarion-audit-row')).map(function (r) {
  return {action: r.dataset.action, job: r.dataset.job, actor: r.dataset.actor,
          task: r.dataset.taskId,
          details: r.querySelector('.elarion-audit-details').textContent};
});
"""


def shown_job(driver: Any, job: str) -> dict[str, Any]:
    (row,) = [r for r in driver.execute_script(_CONTROLS_JS) if r["job"] == job]
    return dict(row)


# -- the tests -------------------------------------------------------------------------


def test_pause_run_now_and_resume_from_the_page(cluster: Cluster, db: Db, browser: Any,
                                                tmp_path: Path) -> None:
    driver, base = browser, cluster.guarded
    driver.get(base + "/elarion")
    wait_until(lambda: driver.execute_script(_CONTROLS_JS), 30, message="the controls")
    row = shown_job(driver, CONTROL_JOB)
    assert (row["paused"], row["badge"]) == ("", "active"), row
    assert row["buttons"] == ["pause", "resume:off", "trigger"], row
    assert driver.find_element("id", "elarion-all-paused").get_attribute("hidden") is not None
    audited = len(db.audit())

    # Pause: two prompts (why, until when), then the POST
    press(driver, "pause", CONTROL_JOB)
    assert reply(driver, "db migration").startswith(f"Pause {CONTROL_JOB} on every beat node?")
    assert "until when" in reply(driver, "2h")
    ok, text = message(driver)
    assert ok and text.startswith(f"{CONTROL_JOB}: paused by {ACTOR} until "), text
    pause = db.pauses()[CONTROL_JOB]
    assert (pause["paused_by"], pause["reason"]) == (ACTOR, "db migration")
    assert pause["until_utc"] - pause["paused_at"] == pytest.approx(timedelta(hours=2),
                                                                    abs=timedelta(seconds=5))
    wait_until(lambda: shown_job(driver, CONTROL_JOB)["paused"] == "own", 20,
               message="the paused badge")
    row = shown_job(driver, CONTROL_JOB)
    assert row["badge"] == "paused" and "elarion-state-paused" in row["badgeClass"], row
    until = pause["until_utc"].strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"by {ACTOR}" in row["who"] and f"until {until}" in row["who"] and \
        "db migration" in row["who"], row
    assert row["buttons"] == ["pause", "resume", "trigger"], row
    assert all(r["paused"] == "" for r in driver.execute_script(_CONTROLS_JS)
               if r["job"] != CONTROL_JOB), "another job shown paused"

    # a beat's skip of the paused job: the occurrence shows as paused
    occurrence = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    send_events(cluster.env, f"beat@{PROBE_NODE}", [("elarion-skipped", {
        "job": CONTROL_JOB, "task_name": "elarion_flower.work", "occurrence": occurrence,
        "node": PROBE_NODE, "placement": "cluster", "claim": "slot", "reason": "paused",
        "winner": PROBE_NODE})])
    wait_until(lambda: driver.execute_script(
        "var r = document.querySelector('.elarion-job[data-job=\"' + arguments[0] + '\"] "
        "tr.elarion-occurrence'); return r && r.dataset.state;", CONTROL_JOB) == "paused",
        20, message="the paused occurrence")

    # Run now: allowed on a paused job; one prompt (why), then the POST
    press(driver, "trigger", CONTROL_JOB)
    assert reply(driver, "smoke test").startswith(f"Run {CONTROL_JOB} now, once")
    ok, text = message(driver)
    (run,) = db.manual()
    assert ok and text == f"{CONTROL_JOB}: sent, task {run.task_id}", text
    assert (run.job, run.state) == (CONTROL_JOB, "published"), run

    new = db.audit()[audited:]
    assert [(a["action"], a["job_name"], a["actor"], a["reason"]) for a in new] == [
        ("pause", CONTROL_JOB, ACTOR, "db migration"), ("trigger", CONTROL_JOB, ACTOR,
                                                         "smoke test")], new
    assert new[1]["task_id"] == run.task_id and new[0]["until_utc"] == pause["until_utc"]

    def audit_rows() -> list[dict[str, Any]] | None:
        rows = driver.execute_script(_AUDIT_JS)
        return rows if rows and rows[0]["action"] == "trigger" else None

    rows = wait_until(audit_rows, 20, message="the trigger in the audit")
    assert [(r["action"], r["job"], r["actor"]) for r in rows[:2]] == [
        ("trigger", CONTROL_JOB, ACTOR), ("pause", CONTROL_JOB, ACTOR)], rows
    assert rows[0]["task"] == run.task_id and run.task_id[:8] in rows[0]["details"]
    assert "smoke test" in rows[0]["details"], rows[0]
    assert "db migration" in rows[1]["details"] and until in rows[1]["details"], rows[1]

    from selenium.webdriver.common.action_chains import ActionChains

    driver.set_window_size(1400, 1250)
    driver.execute_script("document.activeElement.blur(); window.scrollTo(0, 0);")
    ActionChains(driver).move_to_element(  # no button hovered in the picture
        driver.find_element("css selector", ".page-header")).perform()
    shot = tmp_path / "flower-controls.png"
    driver.save_screenshot(str(shot))
    if os.environ.get("ELARION_FLOWER_CONTROLS_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ELARION_FLOWER_CONTROLS_SCREENSHOT"])

    # Resume: a confirmation, then the POST
    press(driver, "resume", CONTROL_JOB)
    assert reply(driver) == f"Resume {CONTROL_JOB} on every beat node?"
    ok, text = message(driver)
    assert ok and text == f"{CONTROL_JOB}: resumed", text
    assert CONTROL_JOB not in db.pauses()
    wait_until(lambda: shown_job(driver, CONTROL_JOB)["paused"] == "", 20,
               message="the paused badge to go")
    assert [a["action"] for a in db.audit()[audited:]] == ["pause", "trigger", "resume"]
    wait_until(lambda: driver.execute_script(_AUDIT_JS)[0]["action"] == "resume", 20,
               message="the resume in the audit")


def test_every_post_needs_the_page_token_and_get_changes_nothing(cluster: Cluster,
                                                                   db: Db) -> None:
    session = Session.open(cluster.guarded, cluster.auth)
    before = db.state()
    refused = [
        session.post("pause", token=None, cookie=False, job=CONTROL_JOB),  # no token at all
        session.post("pause", token=None, job=CONTROL_JOB),                # cookie, no token
        session.post("pause", token="2|00|00|0", job=CONTROL_JOB),         # a wrong token
        session.post("trigger", token=None, job=CONTROL_JOB, force="1"),
        session.post("pause", job=CONTROL_JOB,                             # a cross-site form
                     headers={"Sec-Fetch-Site": "cross-site"}),
    ]
    assert [a.status for a in refused] == [403] * 5, refused
    assert all("xsrf" in a.body.lower() or "cross-site" in a.body.lower()
               for a in refused), refused
    for action in ("pause", "resume", "trigger"):
        query = urllib.parse.urlencode({"job": CONTROL_JOB, "_xsrf": session.token})
        got = call(f"{cluster.guarded}/elarion/api/{action}?{query}", auth=cluster.auth,
                   headers={"Cookie": f"_xsrf={session.cookie}"})[0]
        assert got.status == 405, (action, got)
    assert db.state() == before, "a refused request changed something"

    # the same requests with the page's token go through (so the refusals were the token's)
    bad = [session.post("pause", job="no-such-job"),
           session.post("pause", job=CONTROL_JOB, until="yesterday-ish"),
           session.post("pause"), session.post("trigger", all="1")]
    assert [a.status for a in bad] == [400] * 4, bad
    assert "no-such-job" in bad[0].json["error"] and CONTROL_JOB in bad[0].json["error"]
    assert "yesterday-ish" in bad[1].json["error"], bad[1]
    assert db.state() == before, "a bad request changed something"
    paused = session.post("pause", job=CONTROL_JOB, reason="token ok", until="30m")
    assert paused.status == 200 and paused.json["pause"]["paused_by"] == ACTOR, paused
    assert db.pauses()[CONTROL_JOB]["reason"] == "token ok"
    assert session.post("resume", job=CONTROL_JOB).json["message"] == f"{CONTROL_JOB}: resumed"
    forced = session.post("trigger", job=CONTROL_JOB, force="1", reason="forced")
    assert forced.status == 200 and forced.json["sent"], forced
    again = session.post("trigger", job=CONTROL_JOB)
    assert again.status == 409 and again.json["duplicate"]["task_id"] == forced.json["task_id"]
    assert "elarion_beat_trigger_window" in again.json["error"], again

    # Flower without authentication, opened by FLOWER_UNAUTHENTICATED_API (cluster.py):
    # the actor is the caller's address
    plain = Session.open(cluster.plain, None)
    everything = plain.post("pause", all="1", reason="maintenance")
    assert everything.status == 200, everything
    anonymous = "anonymous@127.0.0.1 (flower)"
    shown = controls(cluster.plain, None)
    assert shown["all_paused"]["paused_by"] == anonymous and shown["actions"] is True
    assert shown["all_paused"]["reason"] == "maintenance"
    assert {j["name"] for j in shown["jobs"]} >= {CONTROL_JOB, CRON_JOB}
    assert plain.post("resume", all="1").status == 200
    assert controls(cluster.plain, None)["all_paused"] is None and "" not in db.pauses()
    # the refused duplicate trigger wrote nothing
    assert [(a["action"], a["job_name"], a["actor"]) for a in db.audit()[len(before[1]):]] == [
        ("pause", CONTROL_JOB, ACTOR), ("resume", CONTROL_JOB, ACTOR),
        ("trigger", CONTROL_JOB, ACTOR), ("pause", "", anonymous), ("resume", "", anonymous)]


def test_a_read_only_flower_shows_no_buttons_and_refuses_every_action(
        cluster: Cluster, db: Db, browser: Any) -> None:
    base = cluster.readonly
    shown = controls(base, cluster.auth)
    assert shown["actions"] is False and CONTROL_JOB in {j["name"] for j in shown["jobs"]}
    browser.get(base + "/elarion")
    wait_until(lambda: browser.execute_script("return document.getElementById('elarion')"
                                              ".dataset.controlsLoaded"), 30,
               message="the controls")
    rows = browser.execute_script(_CONTROLS_JS)
    assert CONTROL_JOB in {r["job"] for r in rows} and all(not r["buttons"] for r in rows)
    assert browser.find_elements("css selector", "button.elarion-action") == []
    assert browser.find_element("id", "elarion-all-actions").text == "read-only"

    session = Session.open(base, cluster.auth)
    before = db.state()
    for action, fields in (("pause", {"job": CONTROL_JOB}), ("resume", {"job": CONTROL_JOB}),
                           ("trigger", {"job": CONTROL_JOB, "force": "1"}),
                           ("pause", {"all": "1"})):
        answer = session.post(action, **fields)
        assert (answer.status, answer.json) == (403, {"error": READ_ONLY}), (action, answer)
    assert db.state() == before


def test_an_unauthenticated_post_gets_401_and_changes_nothing(cluster: Cluster, db: Db) -> None:
    session = Session.open(cluster.guarded, cluster.auth)
    before = db.state()
    for auth in (None, basic(USER, "wrong"), basic("someone", PASSWORD)):
        for action in ("pause", "resume", "trigger"):
            answer = session.post(action, auth=auth, job=CONTROL_JOB, force="1")
            assert answer.status == 401, (auth, action, answer)
        assert call(cluster.guarded + "/elarion/api/controls", auth=auth)[0].status == 401
    assert db.state() == before
