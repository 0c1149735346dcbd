"""The One-offs card of Flower's ``/elarion`` page, against a real PostgreSQL table.

A Flower application with the extension runs in a thread (as in
test_controls_inprocess.py); its app points at this test's claims table. One-offs
are written with ``schedule_once`` and leased, published, failed and cancelled
through the store as beat nodes and operators would; ``/elarion/api/one-offs`` must
list the pending ones soonest first and the finished ones newest first, each list
bounded, with the error of a failed one, and the page must carry the card.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_elarion_beat import OneOff, schedule_once
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.flower.one_offs import ONE_OFF_ROWS
from celery_elarion_beat.store import ClaimStore, open_store
from celery_elarion_beat.testing._harness import wait_until
from tests.flower.support import chromium
from tests.flower.test_controls_inprocess import _call, serve_flower

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=60)
ERROR = "task 'proj.gone' is not registered in app 'proj'"


@contextmanager
def flower(conf: dict[str, Any]) -> Iterator[str]:
    """A Flower application with the extension, served by a thread (as in
    test_controls_inprocess.py); the claims store its page opened is closed after."""
    app = Celery("elarion_inprocess_one_offs", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    made: list[Any] = []
    try:
        with serve_flower(app, made) as url:
            yield url
    finally:
        board = getattr(made[0], "_elarion_panel", None) if made else None
        if board is not None and board._store is not None:
            board._store.close()
        app.close()


@pytest.fixture
def conf(pg_dsn: str, table_name: str) -> dict[str, str]:
    return {"elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name}


@pytest.fixture
def app(conf: dict[str, str]) -> Iterator[Celery]:
    app = Celery("elarion_flower_one_offs", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> Iterator[ClaimStore]:
    s = open_store(Settings.from_app(app))
    s.ensure_schema()
    yield s
    s.close()


def _due_now(app: Celery, task: str, *args: object) -> OneOff:
    return schedule_once(app, task, args, countdown=0)


def test_the_card_lists_upcoming_soonest_first_and_recent_newest_first(
        app: Celery, store: ClaimStore, conf: dict[str, str]) -> None:
    # finished, oldest first: published, then failed, then cancelled
    sent = _due_now(app, "proj.report", 1)
    assert [o.id for o in store.lease_one_offs("node-a", limit=10, lease=LEASE)] == [sent.id]
    store.finish_one_offs("node-a", published=[sent.id], failed={})
    gone = _due_now(app, "proj.gone")
    assert [o.id for o in store.lease_one_offs("node-b", limit=10, lease=LEASE)] == [gone.id]
    store.finish_one_offs("node-b", published=[], failed={gone.id: ERROR})
    dropped = schedule_once(app, "proj.report", (3,), countdown=3600, key="drop-me")
    store.cancel_one_off("drop-me")
    # pending: one leased (due now), more scheduled than the card shows
    held = _due_now(app, "proj.report", 4)
    assert [o.id for o in store.lease_one_offs("node-a", limit=10, lease=LEASE)] == [held.id]
    later = [schedule_once(app, "proj.report", (i,), countdown=600 + i, key=f"later-{i}")
             for i in range(ONE_OFF_ROWS + 5)]

    with flower(conf) as base:
        status, text, headers = _call(base + "/elarion/api/one-offs")
        assert status == 200, text
        assert headers["Cache-Control"] == "no-store"
        data = json.loads(text)
        status, page, _ = _call(base + "/elarion")
    assert status == 200
    assert 'id="elarion-one-offs"' in page and "/elarion/api/one-offs" in page

    upcoming = data["upcoming"]
    assert len(upcoming) == ONE_OFF_ROWS
    assert [o["id"] for o in upcoming] == [held.id] + [o.id for o in later][:ONE_OFF_ROWS - 1]
    assert upcoming[0]["state"] == "leased" and upcoming[0]["node"] == "node-a"
    assert upcoming[1]["state"] == "scheduled" and upcoming[1]["key"] == "later-0"

    recent = data["recent"]
    assert [(o["id"], o["state"]) for o in recent] == [
        (dropped.id, "cancelled"), (gone.id, "failed"), (sent.id, "published")]
    failed = recent[1]
    assert failed["error"] == ERROR and failed["node"] == "node-b" and failed["task"] == "proj.gone"
    assert recent[2]["published"] is not None and recent[2]["attempts"] == 1
    assert all("args" not in o and "body" not in o for o in upcoming + recent)


def test_no_one_offs_and_no_database(app: Celery, store: ClaimStore,
                                     conf: dict[str, str]) -> None:
    with flower(conf) as base:
        status, text, _ = _call(base + "/elarion/api/one-offs")
    assert status == 200, text
    assert {k: v for k, v in json.loads(text).items() if k != "now"} == {
        "upcoming": [], "recent": []}
    down = {"elarion_beat_dsn": "postgresql://elarion:x@127.0.0.1:1/none",
            "elarion_beat_claim_timeout": 2}
    with flower(down) as base:
        status, text, _ = _call(base + "/elarion/api/one-offs")
        assert status == 503 and json.loads(text)["error"].startswith(
            "the claims database failed"), text
        assert _call(base + "/elarion")[0] == 200  # the page itself still renders


def test_headless_chromium_draws_the_card(app: Celery, store: ClaimStore,
                                          conf: dict[str, str], tmp_path: Path) -> None:
    gone = _due_now(app, "proj.gone")
    store.lease_one_offs("node-b", limit=10, lease=LEASE)
    store.finish_one_offs("node-b", published=[], failed={gone.id: ERROR})
    later = schedule_once(app, "proj.report", (1,), countdown=600, key="later-1")
    script = """
        var rows = function (id) {
          return Array.from(document.querySelectorAll('#' + id + ' tr.elarion-one-off'))
            .map(function (r) { return [r.dataset.id, r.dataset.state, r.innerText]; });
        };
        var up = rows('elarion-one-offs-upcoming'), done = rows('elarion-one-offs-recent');
        return (up.length && done.length) ? [up, done] : null;"""
    driver = chromium(tmp_path / "profile")
    try:
        with flower(conf) as base:
            driver.get(base + "/elarion")
            upcoming, recent = wait_until(lambda: driver.execute_script(script), 20,
                                          message="the One-offs card to be drawn")
            errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    assert [(r[0], r[1]) for r in upcoming] == [(later.id, "scheduled")]
    assert "later-1" in upcoming[0][2] and "proj.report" in upcoming[0][2]
    assert [(r[0], r[1]) for r in recent] == [(gone.id, "failed")]
    assert ERROR in recent[0][2] and "node-b" in recent[0][2]
    assert errors == [], errors
