"""The Schedule card's edit form in headless Chromium, on the real Flower ``guarded`` of
tests/flower/operator_flowers.py (basic auth, its edit form on, database entries of the
tasks ``elarion_flower.*``): an operator adds an entry, edits it with an effective
time and sees the preview on both sides of it, and when the entry is edited through
the API between the form's load and its save, sees the 409 (nothing written), reloads
the entry and saves again; then disables and removes it. The claims database says
what each step wrote, and who. An entry whose name, arguments, reason and actor are
markup is shown as text (nothing from it runs).

With ``ELARION_FLOWER_SCHEDULE_SCREENSHOT=docs/img/flower-schedule.png`` the test saves
its screenshot of the form and its preview there (docs/flower.md)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.store.registry import close_app_stores
from tests.flower.app import TASK, make_app
from tests.flower.operator_flowers import ENTRY_TASKS, Flowers
from tests.flower.support import chromium
from tests.helpers.processes import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# the four real Flowers of tests/flower/operator_flowers.py (shared with test_operators.py,
# built once per worker for this xdist group), and Chromium
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("flower-operators")]

ACTOR = "ops-alice (flower)"
BERLIN = "Europe/Berlin"

_FORM_JS = """
var form = document.getElementById('elarion-schedule-form');
var conflict = document.getElementById('elarion-schedule-conflict');
var error = document.getElementById('elarion-schedule-form-error');
var message = document.getElementById('elarion-schedule-message');
return {hidden: form.hidden, action: form.dataset.action, revision: form.dataset.revision,
        title: document.getElementById('elarion-schedule-form-title').textContent,
        save: !document.getElementById('elarion-schedule-save').disabled,
        conflict: conflict.hidden ? null : conflict.textContent,
        error: error.hidden ? null : error.textContent,
        message: message.hidden ? null : [message.dataset.ok, message.textContent],
        invalid: Array.from(form.querySelectorAll('.is-invalid')).map(function (n) {
          return n.name; }),
        fields: Object.fromEntries(Array.from(form.querySelectorAll('[name]')).map(
          function (n) { return [n.name, n.type === 'checkbox' || n.type === 'radio' ?
                                 n.checked : n.value]; })),
        preview: Array.from(document.querySelectorAll(
          '#elarion-schedule-preview-rows tr.elarion-preview-row')).map(function (r) {
            return [r.dataset.side, r.dataset.governs, r.dataset.utc,
                    r.querySelector('.elarion-preview-local').textContent]; }),
        none: (document.querySelector('#elarion-schedule-preview:not([hidden]) '
                                      + 'tr.elarion-preview-none') || {}).textContent || null,
        history: Array.from(document.querySelectorAll('tr.elarion-history-row')).map(
          function (r) { return [r.dataset.revision, r.dataset.action, r.dataset.actor]; })};
"""
_ROW_JS = """
var name = arguments[0];
var row = Array.from(document.querySelectorAll('tr.elarion-schedule-entry')).filter(
  function (r) { return r.dataset.name === name; })[0];
return row ? {revision: row.dataset.revision, source: row.dataset.source,
              name: row.querySelector('strong').textContent,
              change: row.querySelector('.elarion-schedule-change').textContent,
              schedule: row.querySelector('.elarion-schedule-text').textContent} : null;
"""
_STATE_JS = """
var found = Array.from(document.querySelectorAll(arguments[0]));
var form = document.getElementById('elarion-schedule-form');
return {found: found.map(function (b) { var r = b.getBoundingClientRect();
          return [b.disabled, b.hidden, r.width, r.height, b.title]; }),
        form: form.hidden, scroll: window.scrollY, height: window.innerHeight};
"""
_EDIT_JS = """
var name = arguments[0];
Array.from(document.querySelectorAll('tr.elarion-schedule-entry')).filter(function (r) {
  return r.dataset.name === name; })[0].querySelector('button[data-action="edit"]').click();
"""
#: an entry whose name, arguments and reason are markup: shown as text, never run
HOSTILE = '<img src=x onerror="window.__pwned=1">'
HOSTILE_REASON = '</script><script>window.__pwned=2</script>'
_INJECTED_JS = """
return {images: document.querySelectorAll('#elarion-schedule img').length,
        scripts: document.querySelectorAll('#elarion-schedule script').length,
        pwned: typeof window.__pwned === 'undefined' ? null : window.__pwned};
"""


@pytest.fixture
def app(flowers: Flowers) -> Iterator[Celery]:
    """The app the Flowers run, as the test's own API client of their claims database."""
    found = make_app(flowers.env)
    found.conf.update(elarion_beat_db_entries=True, elarion_beat_db_entry_tasks=ENTRY_TASKS)
    try:
        yield found
    finally:
        close_app_stores()
        found.close()


@pytest.fixture
def driver(flowers: Flowers, tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium logged in as the operator (basic auth on every request)."""
    browser = chromium(tmp_path / "profile")
    try:
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                                {"headers": {"Authorization": flowers.operator}})
        yield browser
    finally:
        browser.quit()


def form(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(_FORM_JS))


def fill(driver: Any, **fields: str) -> None:
    """Type into the form's fields (a select: choose the value)."""
    from selenium.webdriver.support.ui import Select

    for name, value in fields.items():
        element = driver.find_element("id", f"elarion-f-{name}")
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)


def click(driver: Any, selector: str) -> None:
    """Click what *selector* finds once it is there and enabled (the card re-renders
    its table every poll: find it again until the click lands)."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        StaleElementReferenceException,
    )

    def clicked() -> bool:
        try:
            for button in driver.find_elements("css selector", selector):
                if button.is_enabled() and button.is_displayed():
                    # in the middle of the window, never under Flower's sticky navigation bar
                    driver.execute_script("arguments[0].scrollIntoView({block: 'center', "
                                          "behavior: 'instant'});", button)
                    button.click()
                    return True
        except (StaleElementReferenceException, ElementClickInterceptedException):
            return False
        return False

    wait_until(clicked, 20, interval=0.2, message=lambda: f"{selector} to be clickable: "
               f"{driver.execute_script(_STATE_JS, selector)}")


def previewed(driver: Any, check: Any) -> dict[str, Any]:
    """The form once its preview is shown, Save enabled and *check* holds."""
    return wait_until(lambda: (lambda f: f if f["save"] and (f["preview"] or f["none"])
                               and check(f)
                               else None)(form(driver)), 20, interval=0.2,
                      message=lambda: f"the preview: {form(driver)}")


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_an_operator_adds_and_edits_an_entry_and_sees_a_conflict(
        flowers: Flowers, app: Celery, driver: Any, tmp_path: Path) -> None:
    name = f"browser-{uuid.uuid4().hex[:8]}"
    hostile = f"{HOSTILE} {uuid.uuid4().hex[:6]}"
    live.add_entry(app, hostile, TASK, {"every": 3600}, args=[HOSTILE], reason=HOSTILE_REASON,
                   actor=HOSTILE)
    driver.get(flowers.guarded + "/elarion")
    wait_until(lambda: driver.execute_script(
        "return document.getElementById('elarion').dataset.scheduleLoaded"), 30,
        message="the Schedule card to load")
    # markup in a name, an argument, a reason and an actor is shown as text
    row = driver.execute_script(_ROW_JS, hostile)
    assert row is not None and row["name"] == hostile, row
    assert HOSTILE_REASON in row["change"] and HOSTILE in row["change"], row
    driver.execute_script(_EDIT_JS, hostile)
    shown = wait_until(lambda: (lambda f: f if f["history"] else None)(form(driver)), 10,
                       message="the form and history of the entry")
    assert shown["title"] == f"Edit {hostile} (revision {row['revision']})", shown
    assert json.loads(shown["fields"]["args"]) == [HOSTILE], shown["fields"]
    assert driver.execute_script(_INJECTED_JS) == {"images": 0, "scripts": 0, "pwned": None}
    click(driver, "#elarion-schedule-cancel")
    live.remove_entry(app, hostile, reason="test", actor="test")

    # add: the preview comes first, then Save
    click(driver, "#elarion-schedule-add")
    fill(driver, name=name, task=TASK, kind="cron", expr="0 0 6 * * *", tz=BERLIN,
         args='["from the browser"]')
    shown = previewed(driver, lambda f: f["fields"]["expr"] == "0 0 6 * * *")
    assert shown["action"] == "add" and {side for side, *_ in shown["preview"]} == {"after"}
    assert all("06:00:00" in local and governs == "the new entry"
               for _, governs, _, local in shown["preview"]), shown["preview"]
    fill(driver, reason="morning numbers")
    click(driver, "#elarion-schedule-save:not([disabled])")
    wait_until(lambda: driver.execute_script(_ROW_JS, name), 20, message="the new row")
    added = live.get_entry(app, name)
    assert (added.task, added.schedule, added.actor, added.reason) == (
        TASK, f"cron 0 0 6 * * * {BERLIN}", ACTOR, "morning numbers")
    assert added.definition is not None and added.definition.args == ("from the browser",)
    assert form(driver)["message"][0] == "1"

    # edit from a later effective time: the preview shows both sides of it
    wait_until(lambda: (driver.execute_script(_ROW_JS, name) or {}).get("revision") ==
               str(added.revision), 20, message="the row at the added revision")
    click(driver, f'button.elarion-schedule-action[data-action="edit"][data-name="{name}"]')
    wait_until(lambda: form(driver)["revision"] == str(added.revision), 10,
               message=lambda: f"the edit form: {form(driver)}")
    effective = (datetime.now(timezone.utc) + timedelta(days=2)).replace(
        hour=12, minute=0, second=0, microsecond=0)
    fill(driver, expr="0 30 7 * * *", effective=effective.strftime("%Y-%m-%dT%H:%M:%SZ"))
    shown = previewed(driver, lambda f: {"before", "after"} <= {p[0] for p in f["preview"]})
    assert shown["fields"]["reason"] == "" and shown["history"][0] == [
        str(added.revision), "add", ACTOR], shown
    for side, governs, utc, local in shown["preview"]:
        at = _utc(utc)
        if side == "before":
            assert (governs, at < effective, "06:00:00" in local) == (
                f"revision {added.revision}", True, True), (side, governs, utc, local)
        else:
            assert (governs, at >= effective, "07:30:00" in local) == (
                "the edit", True, True), (side, governs, utc, local)
    fill(driver, reason="half past seven from Friday")
    previewed(driver, lambda f: f["fields"]["reason"] == "half past seven from Friday")
    if os.environ.get("ELARION_FLOWER_SCHEDULE_SCREENSHOT"):
        driver.set_window_size(1400, 1700)
        driver.execute_script("window.scrollTo({behavior: 'instant', left: 0, top: "
                              "document.getElementById('elarion-schedule')"
                              ".getBoundingClientRect().top + window.scrollY - 80});")
        shot = tmp_path / "flower-schedule.png"
        driver.save_screenshot(str(shot))
        shutil.copyfile(shot, os.environ["ELARION_FLOWER_SCHEDULE_SCREENSHOT"])

    # someone edits it through the API between the form's load and its save
    meanwhile = live.edit_entry(app, name, kwargs={"by": "api"}, reason="meanwhile",
                                actor="alice@ops (cli)")
    click(driver, "#elarion-schedule-save:not([disabled])")
    shown = wait_until(lambda: (lambda f: f if f["conflict"] else None)(form(driver)), 20,
                       message=lambda: f"the conflict: {form(driver)}")
    assert f"revision {meanwhile.revision}" in shown["conflict"], shown["conflict"]
    assert "changed since it was read" in shown["conflict"] and not shown["save"]
    now = live.get_entry(app, name)
    assert (now.revision, now.schedule, now.actor) == (
        meanwhile.revision, f"cron 0 0 6 * * * {BERLIN}", "alice@ops (cli)"), \
        "the stale form wrote"

    # reload the entry: the form holds it as it is now (the reason typed stays); save again
    click(driver, "#elarion-schedule-reload")
    shown = wait_until(lambda: (lambda f: f if f["revision"] == str(meanwhile.revision)
                                and f["conflict"] is None else None)(form(driver)), 20,
                       message=lambda: f"the reloaded form: {form(driver)}")
    assert shown["fields"]["kwargs"] == '{"by":"api"}' and \
        shown["fields"]["expr"] == "0 0 6 * * *", shown["fields"]
    assert shown["fields"]["reason"] == "half past seven from Friday"
    fill(driver, expr="0 30 7 * * *")
    previewed(driver, lambda f: f["fields"]["expr"] == "0 30 7 * * *" and
              any(p[1] == "the edit" for p in f["preview"]))
    click(driver, "#elarion-schedule-save:not([disabled])")
    wait_until(lambda: form(driver)["hidden"], 20, message=lambda: f"the save: {form(driver)}")
    saved = live.get_entry(app, name)
    assert saved.revision == meanwhile.revision + 1
    assert (saved.schedule, saved.actor, saved.reason) == (
        f"cron 0 30 7 * * * {BERLIN}", ACTOR, "half past seven from Friday")
    assert saved.definition is not None and dict(saved.definition.kwargs) == {"by": "api"}
    assert saved.effective_at == effective
    assert [(r.action, r.actor) for r in live.entry_history(app, name)] == [
        ("edit", ACTOR), ("edit", "alice@ops (cli)"), ("add", ACTOR)]

    # disable, then remove: each previewed (nothing after), each with a reason
    for action, reason in (("disable", "on hold"), ("remove", "not needed")):
        wait_until(lambda: (driver.execute_script(_ROW_JS, name) or {}).get("revision") ==
                   str(live.get_entry(app, name).revision), 20, message="the row, current")
        click(driver, f'button.elarion-schedule-action[data-action="{action}"]'
                      f'[data-name="{name}"]')
        shown = previewed(driver, lambda f, a=action: f["action"] == a)
        assert not [p for p in shown["preview"] if p[0] == "after"], shown["preview"]
        assert f"nothing runs ({action}d)" in shown["none"], shown["none"]
        fill(driver, reason=reason)
        click(driver, "#elarion-schedule-save:not([disabled])")
        wait_until(lambda: form(driver)["hidden"], 20,
                   message=lambda a=action: f"the {a}: {form(driver)}")
    assert [(r.action, r.actor, r.reason) for r in live.entry_history(app, name)][:2] == [
        ("remove", ACTOR, "not needed"), ("disable", ACTOR, "on hold")]
    wait_until(lambda: driver.execute_script(_ROW_JS, name) is None, 20,
               message="the removed entry's row to go")
