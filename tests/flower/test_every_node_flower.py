"""The Every-node card of Flower's ``/elarion`` page (#35), against a real PostgreSQL
table: ``/elarion/api/every-node`` names, per every-node entry, the live beat node whose
workers recorded no run of it in its last two periods, the nodes that ran it and the
node whose workers record nothing; the page carries the card. (The computation is
tests/operate/test_node_coverage.py's; the gauge's, tests/unit/test_coverage_metrics.py's.)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.store import ClaimStore, open_store
from celery_elarion_beat.store.records import NodeState, RunReport
from celery_elarion_beat.testing._harness import wait_until
from tests.flower.support import chromium
from tests.flower.test_controls_inprocess import _call
from tests.flower.test_one_offs_flower import flower

pytestmark = pytest.mark.postgres

PERIOD = timedelta(seconds=2)


@pytest.fixture
def conf(pg_dsn: str, table_name: str) -> dict[str, object]:
    return {"elarion_beat_dsn": pg_dsn, "elarion_beat_table": table_name,
            "beat_schedule": {
                "cache": {"task": "proj.cache", "schedule": PERIOD,
                          "options": {"placement": "every_node"}},
                "report": {"task": "proj.report", "schedule": timedelta(hours=1)}}}


@pytest.fixture
def store(conf: dict[str, object]) -> Iterator[ClaimStore]:
    app = Celery("elarion_flower_every_node", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    s = open_store(Settings.from_app(app))
    s.ensure_schema()
    yield s
    s.close()
    app.close()


def three_beats(store: ClaimStore) -> None:
    """Beats a, b and c, live for two periods; a's worker ran the entry twice in them,
    b's only before; c's never recorded a run."""
    states = [NodeState(node, f"boot-{node}", "0", "fp") for node in ("a", "b", "c")]
    for state in states:
        store.heartbeat(state)
    time.sleep(2 * PERIOD.total_seconds() + 0.2)  # every beat live for two periods
    for state in states:
        store.heartbeat(state)
    now = store.clock()
    store.record_runs([
        RunReport("cache", now - timedelta(seconds=s), uuid.uuid4().hex, "started",
                  f"celery@{node}", node=node, every_node=True)
        for node, s in (("a", 0.1), ("a", 0.3), ("b", 5.0))])  # in the window for 3.7 s more


def test_the_card_names_the_node_that_did_not_run_the_entry(
        store: ClaimStore, conf: dict[str, object]) -> None:
    three_beats(store)
    with flower(conf) as base:
        status, text, headers = _call(base + "/elarion/api/every-node")
        assert status == 200, text
        assert headers["Cache-Control"] == "no-store"
        data = json.loads(text)
        status, page, _ = _call(base + "/elarion")
    assert status == 200
    assert 'id="elarion-every-node"' in page and "/elarion/api/every-node" in page
    (cache,) = data["entries"]  # the cluster entry is never judged per node
    assert cache["job"] == "cache", data
    assert cache["nodes_missing"] == ["b"], cache
    assert cache["nodes_ran"] == {"a": 2}, cache
    assert cache["nodes_not_tracked"] == ["c"], cache


def test_the_card_answers_503_without_a_database() -> None:
    down = {"elarion_beat_dsn": "postgresql://elarion:x@127.0.0.1:1/none",
            "elarion_beat_claim_timeout": 2}
    with flower(down) as base:
        status, text, _ = _call(base + "/elarion/api/every-node")
        assert status == 503 and json.loads(text)["error"].startswith(
            "the claims database failed"), text


def test_headless_chromium_draws_the_card(store: ClaimStore, conf: dict[str, object],
                                          tmp_path: Path) -> None:
    script = """
        var row = document.querySelector('#elarion-every-node-table tr.elarion-every-node-entry');
        if (!row) { return null; }
        var text = function (cls) {
          return Array.from(row.querySelectorAll('.' + cls + ' .badge'))
            .map(function (b) { return b.innerText; });
        };
        return [row.dataset.job, row.className, text('elarion-every-node-missing'),
                text('elarion-every-node-ran'), text('elarion-every-node-untracked')];"""
    driver = chromium(tmp_path / "profile")  # started first: the window is 4 s long
    try:
        with flower(conf) as base:
            three_beats(store)
            driver.get(base + "/elarion")
            drawn = wait_until(lambda: driver.execute_script(script), 20,
                               message="the Every-node card to be drawn")
            errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    job, classes, missing, ran, untracked = drawn
    assert job == "cache" and "table-danger" in classes, drawn
    assert missing == ["b"] and ran == ["a 2"] and untracked == ["c"], drawn
    assert errors == [], errors
