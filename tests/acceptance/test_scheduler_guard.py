"""Acceptance: a beat of an app that uses the library runs ClaimingScheduler, or does
not start (issue #33).

* Embedded beat on every replica works: ``celery worker -B --scheduler elarion`` on one
  replica, ``worker -B`` with ``beat_scheduler = "elarion"`` in the configuration on
  another, and a ``celery beat`` with that configuration and no flag on a third each run
  ClaimingScheduler (each heartbeats as a node) and each 2 s slot is sent once.
* The ``-S`` trap: on ``celery worker``, ``-S`` is ``--statedb``, so ``worker -B -S
  elarion`` would run Celery's stock scheduler beside the claiming ones and send every
  occurrence again. In an app that configures ``elarion_beat_dsn`` (in ``app.conf`` or
  as ``ELARION_BEAT_DSN``) or calls ``install_worker``, such a worker, and a ``celery
  beat`` with a stock scheduler, refuse to start: one CRITICAL line naming the class and
  the fix, exit code 78, nothing sent. ``elarion_beat_allow_other_scheduler = True``
  lets one start on purpose, with a WARNING.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from celery_elarion_beat.beat.startup import EXIT_CONFIG
from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.testing._harness import ChildProcess, wait_until
from tests.acceptance import proj_guard
from tests.acceptance.cluster import parse_iso
from tests.acceptance.guard import START_TIMEOUT, GuardRun

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# three replicas (worker -B and beat) send every 2 s slot, counted exactly
pytestmark += [pytest.mark.heavy]

#: slots every replica must have shared, each sent once
SLOTS = 4
STOCK = "celery.beat.PersistentScheduler"


@pytest.fixture
def run(tmp_path: Path, pg_dsn: str, redis_url: str) -> GuardRun:
    guard = GuardRun(tmp_path / "procs", pg_dsn, redis_url)
    try:
        yield guard  # type: ignore[misc]
    finally:
        guard.close()


def embedded(run: GuardRun, name: str, *args: str, env: dict[str, str]) -> ChildProcess:
    """``celery worker -B`` (solo pool): the embedded beat runs in a child process."""
    return run.pm.worker(name, "-B", *args, env=env)


def test_embedded_beats_on_every_replica_send_each_slot_once(run: GuardRun) -> None:
    nodes = {"flag": run.node("flag"), "conf": run.node("conf"), "beat": run.node("beat")}
    conf = {"ELARION_ACC_SCHEDULER_CONF": "elarion"}
    processes = [
        embedded(run, "w-flag", "--scheduler", "elarion", env=nodes["flag"]),
        embedded(run, "w-conf", env={**nodes["conf"], **conf}),
        run.pm.celery("beat-conf", ["beat", "-l", "INFO"], env={**nodes["beat"], **conf}),
    ]
    names = {env["ELARION_ACC_NODE"] for env in nodes.values()}
    # every beat heartbeats as a node of the cluster: each runs ClaimingScheduler
    wait_until(lambda: run.live_nodes() >= names, START_TIMEOUT, interval=0.5,
               message=lambda: f"the three nodes' heartbeats\n{run.tails()}")
    for process in processes:
        assert process.records(action="started"), process.tail()
    begun = max(record_time(r) for p in processes for r in p.records(action="started"))

    def shared() -> list[str] | None:
        slots = sorted({r.occurrence for r in run.runs()
                        if r.occurrence and parse_iso(r.occurrence).timestamp() > begun})
        slots = slots[:-1]  # the newest slot may still be running on a worker
        return slots if len(slots) >= SLOTS else None

    slots = wait_until(shared, 60, interval=0.5,
                       message=lambda: f"{SLOTS} slots after every beat started\n{run.tails()}")
    runs = [r for r in run.runs() if r.occurrence in slots]
    per_slot = Counter(r.occurrence for r in runs)
    assert all(n == 1 for n in per_slot.values()), per_slot
    assert {r.job for r in runs} == {proj_guard.JOB}, runs  # all claimed: nothing stock
    assert {r.node for r in runs} <= names, runs
    assert not [r for r in run.runs() if r.job is None], "a stock beat sent something"
    for process in processes:
        assert process.alive(), process.tail()
        assert not process.records(level="CRITICAL"), process.tail()


def assert_refused(process: ChildProcess, *says: str) -> None:
    """Exit 78, one CRITICAL line (``beat: cannot start: ...``) saying *says*, nothing
    sent, and a worker never ready."""
    code = process.wait(START_TIMEOUT)
    assert code == EXIT_CONFIG, f"{process.name}: exit {code}\n{process.tail()}"
    critical = process.records(level="CRITICAL")
    assert len(critical) == 1, process.tail()
    line = critical[0]
    assert line["action"] == "refused-start" and line["exit_code"] == EXIT_CONFIG, line
    assert line["message"].startswith("beat: cannot start: "), line
    for words in says:
        assert words in line["message"], f"{process.name}: {words!r} not in {line['message']}"
    log = process.log()
    assert "Sending due task" not in log and " ready." not in log, process.tail()
    assert "Traceback" not in log, process.tail()


def test_a_stock_scheduler_in_an_app_that_uses_the_library_refuses_to_start(
        run: GuardRun) -> None:
    trap = embedded(run, "w-trap", "-S", "elarion", env=run.node("trap"))
    # the DSN from the environment, not app.conf: the library's own fallback
    stock = run.pm.celery("beat-stock", ["beat", "-l", "INFO"], env={
        "ELARION_BEAT_DSN": run.pg_dsn, "ELARION_ACC_NODE": f"stock-{run.run_id}"})
    # no claims database configured at all: install_worker(app) says enough
    installed = embedded(run, "w-installed", env={})
    allowed = run.pm.celery("beat-allowed", ["beat", "-l", "INFO"], env={
        **run.node("allowed"), "ELARION_BEAT_ALLOW_OTHER_SCHEDULER": "true"})

    assert_refused(trap, STOCK, "celery worker -B", "--scheduler elarion",
                   'beat_scheduler = "elarion"', "-S is --statedb", "elarion_beat_dsn",
                   "elarion_beat_allow_other_scheduler")
    assert_refused(stock, STOCK, "celery beat", "-S elarion", 'beat_scheduler = "elarion"',
                   "ELARION_BEAT_DSN")
    assert_refused(installed, STOCK, "--scheduler elarion", "install_worker(app)")

    warning = allowed.wait_for_record({"action": "other-scheduler"}, START_TIMEOUT)
    assert warning["level"] == "WARNING" and STOCK in warning["message"], warning
    assert "elarion_beat_allow_other_scheduler" in warning["message"], warning
    allowed.wait_ready(lambda: "Sending due task" in allowed.log(), 30,
                       "the allowed stock beat sending")
    assert not allowed.records(level="CRITICAL"), allowed.tail()
