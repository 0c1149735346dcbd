"""In-process checks of the board (states, runs, runtimes, lateness), the counters and
the Flower hook (no services)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from celery_elarion_beat.flower.board import Board
from celery_elarion_beat.flower.templates import PAGE
from celery_elarion_beat.observe.metrics import OccurrenceCounters, counters_for

OCC = "2026-11-29T03:00:00Z"


def dispatched(node: str, job: str = "report", occurrence: str | None = OCC,
               task_id: str = "t-1", ts: float = 100.0, **extra: Any) -> dict[str, Any]:
    return {"type": "elarion-dispatched", "hostname": f"beat@{node}", "job": job,
            "task_name": "proj.report", "occurrence": occurrence, "node": node,
            "placement": "cluster", "claim": "slot", "task_id": task_id,
            "local_received": ts, **extra}


def skipped(node: str, reason: str = "claimed-elsewhere", winner: str | None = "a",
            job: str = "report", occurrence: str | None = OCC,
            ts: float = 100.0) -> dict[str, Any]:
    return {"type": "elarion-skipped", "hostname": f"beat@{node}", "job": job,
            "task_name": "proj.report", "occurrence": occurrence, "node": node,
            "placement": "cluster", "claim": "slot", "reason": reason, "winner": winner,
            "local_received": ts}


def test_one_occurrence_joins_its_winner_and_its_skips() -> None:
    board = Board()
    for event in (skipped("b"), dispatched("a"), skipped("c", "claim-error", None)):
        board.observe(event)
    state = board.snapshot()
    (job,) = state["jobs"]
    assert (job["job"], job["task_name"], job["dispatched"], job["skipped"]) == \
        ("report", "proj.report", 1, 2)
    (occ,) = job["occurrences"]
    assert (occ["occurrence"], occ["winner"], occ["task_id"]) == (OCC, "a", "t-1")
    assert occ["skipped"] == [{"node": "b", "reason": "claimed-elsewhere"},
                              {"node": "c", "reason": "claim-error"}]
    nodes = {n["node"]: n for n in state["nodes"]}
    assert nodes["a"]["dispatched"] == 1 and nodes["a"]["skipped"] == 0
    assert nodes["c"]["reasons"] == {"claim-error": 1}
    assert nodes["b"]["last_seen"] == "1970-01-01T00:01:40Z"


def test_the_winner_is_known_from_a_skip_before_its_own_event_arrives() -> None:
    board = Board()
    board.observe(skipped("b", winner="a"))
    (occ,) = board.snapshot()["jobs"][0]["occurrences"]
    assert (occ["winner"], occ["task_id"]) == ("a", None)


def test_every_node_runs_and_claimless_skips_get_rows_of_their_own() -> None:
    board = Board()
    board.observe(dispatched("a", occurrence=None, task_id="x", ts=10))
    board.observe(dispatched("b", occurrence=None, task_id="y", ts=11))
    board.observe(skipped("c", "claim-error", None, occurrence=None, ts=12))
    rows = board.snapshot()["jobs"][0]["occurrences"]
    assert [(r["winner"], r["task_id"]) for r in rows] == [(None, None), ("b", "y"), ("a", "x")]
    assert rows[0]["skipped"] == [{"node": "c", "reason": "claim-error"}]


def test_memory_is_bounded_per_job_jobs_and_nodes() -> None:
    board = Board(per_job=3, max_jobs=2, max_nodes=2)
    for i in range(10):
        board.observe(dispatched("a", occurrence=f"2026-11-29T03:00:{i:02d}Z", task_id=str(i)))
    occs = board.snapshot()["jobs"][0]["occurrences"]
    assert [o["task_id"] for o in occs] == ["9", "8", "7"]
    for job in ("j1", "j2", "j3"):
        board.observe(dispatched("n-" + job, job=job))
    state = board.snapshot()
    assert [j["job"] for j in state["jobs"]] == ["j2", "j3"]
    assert [n["node"] for n in state["nodes"]] == ["n-j2", "n-j3"]


def test_other_events_and_drift() -> None:
    board = Board()
    board.observe({"type": "task-succeeded", "uuid": "u", "hostname": "celery@w"})
    board.observe({"type": "elarion-drift", "node": "a", "fingerprint": "f",
                   "differing": {"b": ["report"]}, "timestamp": 5.0})
    state = board.snapshot()
    assert state["jobs"] == [] and state["events"] == 1
    assert state["nodes"][0]["drift"] == {"b": ["report"]}


def orphaned(node: str, action: str, holder: str = "a", error: str | None = None,
             ts: float = 200.0) -> dict[str, Any]:
    return {"type": "elarion-orphaned", "hostname": f"beat@{node}", "job": "report",
            "occurrence": OCC, "node": node, "holder": holder, "task_id": "t-1",
            "claim": "slot", "state": "pending", "publish_error": error, "age": 31.0,
            "takeovers": 0, "delivery": "at_most_once", "action": action,
            "local_received": ts}


def test_an_orphan_shows_on_its_occurrence_once_whoever_reports_it() -> None:
    board = Board()
    for event in (orphaned("b", "reported"), orphaned("c", "reported"),
                  dispatched("d", occurrence="2026-11-29T03:01:00Z", task_id="t-2",
                             catch_up=True)):
        board.observe(event)
    (job,) = board.snapshot()["jobs"]
    assert (job["orphaned"], job["dispatched"], job["skipped"]) == (1, 1, 0)
    replay, orphan = job["occurrences"]
    assert orphan["occurrence"] == OCC and orphan["task_id"] == "t-1"
    assert orphan["notes"] == ["orphaned: claimed by a, never published, not sent again"]
    assert replay["notes"] == ["catch-up"]
    nodes = {n["node"]: n for n in board.snapshot()["nodes"]}
    assert nodes["b"]["skipped"] == 0 and nodes["b"]["dispatched"] == 0  # not an outcome


def test_a_taken_over_orphan_says_who_published_it() -> None:
    board = Board()
    board.observe(orphaned("b", "taken-over", error="broker down"))
    board.observe(dispatched("b", takeover=1))
    (occ,) = board.snapshot()["jobs"][0]["occurrences"]
    assert occ["winner"] == "b"
    assert occ["notes"] == ["orphaned (claimed by a, never published)",
                            "taken over by b (takeover 1)"]


def test_counters_are_labelled_by_job_or_by_node_never_both() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    assert isinstance(counters, OccurrenceCounters)
    for event in (dispatched("a"), skipped("b"), skipped("b"), skipped("c", "publish-error"),
                  {"type": "elarion-drift", "node": "a", "local_received": 100.0},
                  {"type": "worker-heartbeat"}):
        counters.observe(event)
    text = generate_latest(registry).decode()
    assert 'elarion_beat_occurrences_total{job="report",outcome="dispatched",reason=""} 1.0' \
        in text
    assert 'elarion_beat_occurrences_total{job="report",outcome="skipped",' \
           'reason="claimed-elsewhere"} 2.0' in text
    assert 'elarion_beat_occurrences_total{job="report",outcome="skipped",' \
           'reason="publish-error"} 1.0' in text
    assert 'elarion_beat_node_occurrences_total{node="a",outcome="dispatched",reason=""} 1.0' \
        in text
    assert 'elarion_beat_node_occurrences_total{node="b",outcome="skipped",' \
           'reason="claimed-elsewhere"} 2.0' in text
    assert 'elarion_beat_node_occurrences_total{node="c",outcome="skipped",' \
           'reason="publish-error"} 1.0' in text
    assert 'elarion_beat_drift_events_total{node="a"} 1.0' in text
    counters.observe(orphaned("b", "reported"))
    counters.observe(orphaned("c", "reported"))
    text = generate_latest(registry).decode()
    assert 'elarion_beat_orphan_events_total{action="reported",job="report"} 2.0' in text
    assert 'outcome="skipped",reason=""' not in text  # an orphan is not a skip
    assert counters_for(registry) is counters  # registered once per registry


def test_the_flower_hook_is_installed_once_and_passes_every_event_on() -> None:
    import flower.app
    import flower.urls
    from flower.events import Events

    from celery_elarion_beat import flower as ext

    ext.install()
    ext.install()
    names = [getattr(h, "name", None) for h in flower.urls.handlers]
    assert names.count("elarion") == 1 and names.count("elarion-state") == 1
    assert flower.app.default_handlers is flower.urls.handlers
    last = flower.urls.handlers[-1]
    assert last[0] == ".*", "Flower's catch-all 404 must stay last"
    assert Events.on_event.__wrapped__.__name__ == "on_event"
    assert not hasattr(Events.on_event.__wrapped__, "__wrapped__")

    passed: list[Any] = []

    class FakeEvents:
        class io_loop:  # noqa: N801 - Flower's attribute name
            @staticmethod
            def add_callback(callback: Any) -> None:
                passed.append(callback.args[0])

        state = type("State", (), {"event": staticmethod(lambda event: None)})()

    before = ext.BOARD.events
    beat_event = dispatched("hook-node", job="hook-job")
    task_event = {"type": "task-received", "uuid": "u", "hostname": "celery@w"}
    Events.on_event(FakeEvents(), beat_event)
    Events.on_event(FakeEvents(), task_event)
    assert passed == [beat_event, task_event]  # Flower's own processing sees both
    assert ext.BOARD.events == before + 1
    assert any(j["job"] == "hook-job" for j in ext.BOARD.snapshot()["jobs"])


# -- states, runs, runtimes and lateness ------------------------------------------------


def run(state: str, task_id: str = "t-1", ts: float = 110.0, occurrence: str | None = OCC,
        placement: str = "cluster", **extra: Any) -> dict[str, Any]:
    """A worker's elarion-run event (sent at *ts* on the worker's clock)."""
    return {"type": "elarion-run", "hostname": "worker@w1", "job": "report",
            "occurrence": occurrence, "task_id": task_id, "node": "a",
            "worker": "celery@w1", "placement": placement, "state": state,
            "timestamp": ts, "local_received": ts + 0.01, **extra}


def only(board: Board) -> dict[str, Any]:
    (job,) = board.snapshot()["jobs"]
    (occ,) = job["occurrences"]
    return dict(occ)


STATE_CASES = {
    "published": [skipped("b"), dispatched("a", lateness=0.25)],
    "running": [dispatched("a"), run("running")],
    "succeeded": [dispatched("a"), run("running"), run("succeeded", ts=111, runtime=1.5)],
    "failed": [dispatched("a"), run("running"),
               run("failed", ts=111, runtime=0.2, exception="ValueError")],
    "retried": [dispatched("a"), run("running"),
                run("retried", ts=111, runtime=0.2, exception="Retry")],
    "orphaned": [skipped("b"), orphaned("b", "reported")],
    "missed (claim errors)": [skipped("b", "claim-error", None), skipped("c", "claim-error", None)],
    "missed (publish error)": [skipped("b"), skipped("a", "publish-error", None)],
    "missed (invalid entry)": [skipped("a", "invalid-entry", None)],
    "skipped": [skipped("a", "still-running", "a"), skipped("b", "still-running", "a")],
    "skipped (a node saw the claim)": [skipped("b", "claimed-elsewhere", "a"),
                                       skipped("a", "still-running", "a")],
    "claimed": [skipped("b", "claimed-elsewhere", "a"), skipped("c", "claim-error", None)],
    "published (taken over)": [orphaned("b", "taken-over"), dispatched("b", takeover=1)],
}


@pytest.mark.parametrize("case", STATE_CASES)
def test_each_state_follows_from_the_events(case: str) -> None:
    board = Board()
    for event in STATE_CASES[case]:
        board.observe(event)
    assert only(board)["state"] == case.split(" ")[0]


def test_a_finished_run_shows_its_worker_runtime_exception_and_lateness() -> None:
    board = Board()
    for event in (dispatched("a", lateness=0.034), run("running"),
                  run("failed", ts=112, runtime=2.5, exception="KeyError")):
        board.observe(event)
    occ = only(board)
    assert {k: occ[k] for k in ("state", "runtime", "lateness", "worker", "exception")} == \
        {"state": "failed", "runtime": 2.5, "lateness": 0.034, "worker": "celery@w1",
         "exception": "KeyError"}
    assert board.snapshot()["jobs"][0]["runtimes"] == [2.5]
    assert board.snapshot()["jobs"][0]["runtime_states"] == ["failed"]


def test_the_page_gets_each_duration_written_as_the_cli_writes_it() -> None:
    """The seconds stay numbers; beside each, the text the page shows, from the
    package's one formatter (``34ms``, ``2.5s``, ``1m16s``), never a second one in
    JavaScript."""
    board = Board()
    for event in (dispatched("a", lateness=0.034), run("running"),
                  run("failed", ts=112, runtime=75.5, exception="KeyError")):
        board.observe(event)
    occ = only(board)
    assert (occ["lateness_text"], occ["runtime_text"]) == ("34ms", "76s")
    (job,) = board.snapshot()["jobs"]
    assert (job["runtimes_text"], job["max_runtime_text"]) == (["76s"], "76s")
    (node, *_) = board.snapshot()["nodes"]
    assert re.fullmatch(r"\d+(d|h|m|s)\S*", node["last_seen_ago"]), node
    assert "function duration" not in PAGE and "function ago" not in PAGE


def test_a_run_before_its_dispatched_event_lands_on_the_same_row() -> None:
    board = Board()
    board.observe(run("running", ts=99))  # the worker's event overtook the beat's
    assert only(board)["state"] == "running"
    board.observe(skipped("b"))
    board.observe(dispatched("a", lateness=0.1))
    occ = only(board)
    assert (occ["state"], occ["winner"], occ["task_id"], occ["lateness"]) == \
        ("running", "a", "t-1", 0.1)


def test_a_late_event_never_moves_a_run_back() -> None:
    board = Board()
    board.observe(dispatched("a"))
    board.observe(run("succeeded", ts=120, runtime=1.0))
    board.observe(run("running", ts=119))  # its start, arriving after its finish
    assert (only(board)["state"], only(board)["runtime"]) == ("succeeded", 1.0)
    board.observe(run("running", ts=130))  # a later start of a finished task: not a re-run
    assert only(board)["state"] == "succeeded"


def test_a_retried_run_runs_again_under_the_same_task_id() -> None:
    board = Board()
    board.observe(dispatched("a"))
    board.observe(run("running", ts=110))
    board.observe(run("retried", ts=111, runtime=0.5, exception="Retry"))
    board.observe(run("running", ts=120))
    occ = only(board)
    assert (occ["state"], occ["runtime"], occ["exception"]) == ("running", None, None)
    # the retry's own report arriving late (sent before the re-run started) changes nothing
    board.observe(run("retried", ts=111, runtime=0.5, exception="Retry"))
    assert only(board)["state"] == "running"
    board.observe(run("succeeded", ts=121, runtime=0.75))
    assert (only(board)["state"], only(board)["runtime"]) == ("succeeded", 0.75)
    job = board.snapshot()["jobs"][0]
    assert (job["runtimes"], job["runtime_states"]) == ([0.5, 0.75], ["retried", "succeeded"])


def test_out_of_order_finish_of_an_earlier_attempt_still_counts_its_runtime() -> None:
    board = Board()
    board.observe(run("running", ts=120))  # the re-run's start arrives first
    board.observe(run("retried", ts=111, runtime=0.5))
    assert only(board)["state"] == "running"
    assert board.snapshot()["jobs"][0]["runtimes"] == [0.5]


def test_every_node_runs_match_their_rows_by_task_id() -> None:
    board = Board()
    # every-node: no occurrence in the beat's events; the run's is its start on the worker
    board.observe(dispatched("a", occurrence=None, task_id="x", ts=10))
    board.observe(dispatched("b", occurrence=None, task_id="y", ts=10.5))
    board.observe(run("running", task_id="x", occurrence="2026-11-29T03:00:01Z",
                      placement="every_node", ts=11))
    board.observe(run("succeeded", task_id="x", occurrence="2026-11-29T03:00:01Z",
                      placement="every_node", ts=12, runtime=0.3))
    # y's run arrives before anything else of y's would have
    board.observe(run("failed", task_id="z", occurrence="2026-11-29T03:00:02Z",
                      placement="every_node", ts=13, runtime=0.1))
    board.observe(dispatched("c", occurrence=None, task_id="z", ts=14))
    rows = {r["task_id"]: r for r in board.snapshot()["jobs"][0]["occurrences"]}
    assert set(rows) == {"x", "y", "z"}
    assert {t: (r["state"], r["winner"], r["occurrence"]) for t, r in rows.items()} == {
        "x": ("succeeded", "a", None), "y": ("published", "b", None),
        "z": ("failed", "c", None)}


def test_a_cluster_run_is_matched_by_its_task_before_its_occurrence() -> None:
    board = Board()
    board.observe(dispatched("a", task_id="t-9"))
    # a run whose occurrence text differs (an old worker, a window) still finds its row
    board.observe(run("succeeded", task_id="t-9", occurrence="2026-11-29T03:00:00+00:00",
                      runtime=0.5))
    assert (only(board)["state"], only(board)["runtime"]) == ("succeeded", 0.5)


def test_run_events_are_not_beat_nodes_and_bad_durations_are_left_out() -> None:
    board = Board()
    board.observe(dispatched("a", lateness=float("nan")))
    for value in (-1.0, float("inf"), "1.5", True, None):
        board.observe(run("succeeded", runtime=value))
    board.observe(run("exploded", ts=150, runtime=1.0))  # not a run state: ignored
    board.observe(run("succeeded", task_id="", occurrence=None))  # names nothing
    state = board.snapshot()
    occ = state["jobs"][0]["occurrences"][0]
    assert (occ["state"], occ["runtime"], occ["lateness"]) == ("succeeded", None, None)
    assert state["jobs"][0]["runtimes"] == []
    assert [n["node"] for n in state["nodes"]] == ["a"]  # no worker@w1, no second "a" count
    assert state["nodes"][0]["dispatched"] == 1 and state["events"] == 8


def test_runtimes_and_task_ids_stay_bounded() -> None:
    board = Board(per_job=3, max_jobs=2)
    for i in range(40):
        occurrence = f"2026-11-29T03:{i // 60:02d}:{i % 60:02d}Z"
        board.observe(dispatched("a", occurrence=occurrence, task_id=f"t{i}", ts=100 + i))
        board.observe(run("succeeded", task_id=f"t{i}", occurrence=occurrence,
                          ts=100.5 + i, runtime=float(i)))
    job = board.snapshot()["jobs"][0]
    assert job["runtimes"] == [float(i) for i in range(10, 40)]
    assert [o["task_id"] for o in job["occurrences"]] == ["t39", "t38", "t37"]
    assert sum(len(space._tasks) for space in board._spaces.values()) <= 2 * 3


def test_two_clusters_on_one_broker_never_mix_their_jobs_or_nodes() -> None:
    """Two apps whose events reach one Flower (one broker): each app's page shows its
    own jobs and its own node-1, and the events of beats before clusters in both."""
    board = Board()
    board.observe({**dispatched("node-1", job="cleanup", task_id="ta", ts=100),
                   "cluster": "svc_a"})
    board.observe({**skipped("node-1", job="cleanup", ts=100), "cluster": "svc_b"})
    board.observe(dispatched("old-node", job="legacy", task_id="tl", ts=101))
    mine = board.snapshot("svc_a")
    assert [(n["node"], n["dispatched"], n["skipped"]) for n in mine["nodes"]] == [
        ("node-1", 1, 0), ("old-node", 1, 0)]
    assert [j["job"] for j in mine["jobs"]] == ["cleanup", "legacy"]
    assert mine["jobs"][0]["occurrences"][0]["task_id"] == "ta"
    theirs = board.snapshot("svc_b")
    assert [(n["node"], n["dispatched"], n["skipped"]) for n in theirs["nodes"]] == [
        ("node-1", 0, 1), ("old-node", 1, 0)]
    assert board.clusters == ["", "svc_a", "svc_b"] and mine["clusters"] == ["svc_a", "svc_b"]



def test_beats_that_claim_nothing_are_listed_apart_from_the_nodes() -> None:
    board = Board(max_nodes=2)
    event = {"type": "elarion-foreign-beat", "hostname": "worker@w1", "origin": "gen1@old",
             "host": "old", "task_name": "proj.a", "entry": "nightly", "count": 2,
             "worker": "celery@w1", "local_received": 1000.0}
    board.observe(event)
    board.observe({**event, "count": 3, "local_received": 1001.0})
    board.observe({**event, "task_name": "proj.b", "entry": None, "count": 1})
    board.observe({**event, "count": "many"})  # malformed: left out
    snap = board.snapshot()
    assert snap["nodes"] == [] and snap["jobs"] == []
    (sender,) = snap["foreign_beats"]
    assert (sender["origin"], sender["host"], sender["count"], sender["worker"]) == (
        "gen1@old", "old", 6, "celery@w1")
    assert sender["tasks"] == [{"task": "proj.a", "entry": "nightly", "count": 5},
                               {"task": "proj.b", "entry": None, "count": 1}]
    assert sender["last_seen_ts"] == 1001.0
    # written by the server, as the nodes' (the page has no duration code of its own)
    assert re.fullmatch(r"\d+(d|h|m|s)\S*", sender["last_seen_ago"]), sender
    for i in range(3):  # bounded like the nodes: the least recently seen go first
        board.observe({**event, "origin": f"gen{10 + i}@x", "local_received": 2000.0 + i})
    assert [s["origin"] for s in board.snapshot()["foreign_beats"]] == ["gen12@x", "gen11@x"]
