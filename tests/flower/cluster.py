"""The Flower tests' cluster: 3 beats (Redis + PostgreSQL), a worker that records its
runs, three real Flowers started with examples/flowerconfig.py (one plain, one with
url_prefix and basic_auth, and a read-only one like it: ``elarion_beat_flower_actions``
False), and the exporter both as ``python -m`` and as a ``celery`` sub-command.

One run (about 15 s of beats) feeds every test of the package: the beats are stopped
before the tests look, the worker finishes what it was sent, and the monitors are
given time to settle, so the counts are exact. Each run has its own event and control
exchanges (see tests/flower/app.py), so no other test's events reach these monitors.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.observe.metrics import RUNTIME_BUCKETS
from tests.flower.app import JOBS
from tests.flower.support import (
    FLOWERCONFIG,
    Claim,
    EventCapture,
    Key,
    basic,
    delete_broker_keys,
    drop_tables,
    elarion_lines,
    expected_counts,
    expected_histogram,
    free_port,
    histograms,
    http_get,
    log_counts,
    occurrence_counts,
    read_claims,
)
from tests.helpers.processes import CeleryProcess, ProcessManager, clean_env, wait_until

APP = "tests.flower.app"
NODES = ("n1", "n2", "n3")
USER, PASSWORD = "elarion", "flower-pw"
RUN_SECONDS = 14.0


@dataclass
class Cluster:
    env: dict[str, str]
    pm: ProcessManager
    workdir: Path
    plain: str            # Flower, no prefix, no auth
    guarded: str          # Flower with --url_prefix=flower --basic_auth
    readonly: str         # the same, with elarion_beat_flower_actions = False
    exporters: list[str]  # /metrics URLs of the two exporters
    capture: EventCapture
    all_started: float = 0.0
    stopped: float = 0.0
    claims: list[Claim] = field(default_factory=list)
    expected: Counter[Key] = field(default_factory=Counter)
    auth: str = basic(USER, PASSWORD)

    @property
    def sent(self) -> list[Claim]:
        """The claims a node dispatched (not the occurrences decided ``skipped``)."""
        return [cl for cl in self.claims if cl.sent]

    def runtimes(self) -> dict[tuple[str, str], dict[str, float]]:
        """``elarion_beat_runtime_seconds`` as the claims table says it should be."""
        runs: dict[tuple[str, str], list[float]] = {}
        for cl in self.sent:
            if cl.run_state is not None and cl.runtime is not None:
                runs.setdefault((cl.job, cl.run_state), []).append(cl.runtime)
        return {key: expected_histogram(values, RUNTIME_BUCKETS) for key, values in runs.items()}

    def monitors(self) -> dict[str, str]:
        """name -> current /metrics text of every monitor ("" while it does not answer)."""
        urls = {"flower": self.plain + "/metrics",
                "flower (prefix, auth)": self.guarded + "/metrics",
                "exporter (python -m)": self.exporters[0],
                "exporter (celery elarion-beat exporter)": self.exporters[1]}
        found = {}
        for name, url in urls.items():
            status, body = http_get(url, self.auth if "auth" in name else None)
            found[name] = body if status == 200 else ""
        return found

    def steady(self, occurrence: str) -> bool:
        """Was every beat up (and none stopping) around this occurrence?"""
        at = datetime.strptime(occurrence, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
        return self.all_started + 4 <= at <= self.stopped - 3


def _start_exporter_module(pm: ProcessManager, port: int) -> CeleryProcess:
    argv = [sys.executable, "-m", "celery_elarion_beat.exporter", "-A", APP,
            "--port", str(port), "--address", "127.0.0.1"]
    process = CeleryProcess("exporter-module", argv, clean_env(pm.base_env),
                            pm.workdir / "exporter-module.log", pm.workdir / "exporter-module")
    pm.processes.append(process)
    return process.start()


@contextmanager
def running_cluster(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
                    redis_url: str) -> Iterator[Cluster]:
    run = uuid.uuid4().hex[:10]
    table = f"fl_{run}_claims"
    env = {"ELARION_FL_BROKER": redis_url, "ELARION_FL_RUN": run,
           "ELARION_FL_DSN": pg_dsn, "ELARION_FL_TABLE": table,
           "ELARION_BEAT_LOG_FORMAT": "json"}  # the beats' outcomes are read as JSON records
    workdir = tmp_path_factory.mktemp("flower")
    ports = [free_port() for _ in range(5)]
    pm = ProcessManager(workdir, APP, env)
    capture = EventCapture(env)
    try:
        # the worker's heartbeats (every 2 s) tell when each Flower listens
        pm.celery("worker", ["worker", "-l", "INFO", "--pool", "threads", "--concurrency", "4",
                             "-n", "worker@%h", "-E", "--without-gossip", "--without-mingle"])
        pm.celery("flower", ["flower", f"--conf={FLOWERCONFIG}", f"--port={ports[0]}",
                             "--address=127.0.0.1"], env={"FLOWER_UNAUTHENTICATED_API": "1"})
        pm.celery("flower-guarded", [
            "flower", f"--conf={FLOWERCONFIG}", f"--port={ports[1]}", "--address=127.0.0.1",
            "--url_prefix=flower", f"--basic_auth={USER}:{PASSWORD}"])
        pm.celery("flower-readonly", [
            "flower", f"--conf={FLOWERCONFIG}", f"--port={ports[4]}", "--address=127.0.0.1",
            "--url_prefix=flower", f"--basic_auth={USER}:{PASSWORD}"],
            env={"ELARION_FL_FLOWER_ACTIONS": "0"})
        _start_exporter_module(pm, ports[2])
        pm.celery("exporter-cli", ["elarion-beat", "exporter", "--port", str(ports[3]),
                                   "--address", "127.0.0.1"])
        c = Cluster(env, pm, workdir, f"http://127.0.0.1:{ports[0]}",
                    f"http://127.0.0.1:{ports[1]}/flower", f"http://127.0.0.1:{ports[4]}/flower",
                    [f"http://127.0.0.1:{p}/metrics" for p in ports[2:4]], capture.start())
        _wait_for_monitors(c)
        beats = [pm.beat(f"beat-{n}", env={"ELARION_FL_NODE": n}) for n in NODES]
        for beat in beats:
            beat.wait_for_record({"action": "started"}, 90)
        c.all_started = time.time()
        time.sleep(RUN_SECONDS)
        for beat in beats:
            beat.sigterm()
        for beat in beats:
            assert beat.terminate(30) is not None
        c.stopped = time.time()
        for node, beat in zip(NODES, beats):
            c.expected.update(log_counts(node, beat.log()))
        c.claims = _finished_claims(pg_dsn, table, c)
        _wait_until_settled(c)
        summary = "\n".join(elarion_lines(c.monitors()["flower"]))
        print(f"\n===== Flower /metrics after the run =====\n{summary}", flush=True)
        (workdir / "summary.txt").write_text(summary + "\n")
        yield c
    finally:
        capture.stop()
        pm.stop_all()
        names = Settings.from_mapping({"elarion_beat_table": table})
        drop_tables(pg_dsn, table, names.nodes_table, names.pauses_table, names.audit_table)
        delete_broker_keys(redis_url, run)


def _wait_for_monitors(c: Cluster) -> None:
    """Until the Flowers, both exporters and the capture receive events.

    A Flower lists the worker once it received one of its heartbeats; an exporter
    logs when its receiver consumes; the capture sees a heartbeat.
    """
    def listening() -> bool:
        for process in c.pm.processes:
            if not process.alive():
                raise AssertionError(f"{process.name} died\n{process.tail()}")
        for base, auth in ((c.plain, None), (c.guarded, c.auth), (c.readonly, c.auth)):
            status, body = http_get(base + "/workers?json=1", auth)
            if status != 200 or not json.loads(body)["data"]:
                return False
        exporters = [p for p in c.pm.processes if p.name.startswith("exporter")]
        return all(p.lines("receiving events from") for p in exporters) and any(
            e.get("type") == "worker-heartbeat" for e in c.capture.snapshot())

    wait_until(listening, 90, interval=0.5, message=lambda: "Flower and the exporters to "
               "receive events\n" + c.pm.tails(15))


def _finished_claims(dsn: str, table: str, c: Cluster) -> list[Claim]:
    """The claims, once the worker recorded the finish of every run it was sent."""
    def finished() -> list[Claim] | None:
        claims = read_claims(dsn, table, JOBS)
        done = all(cl.run_state in ("succeeded", "failed") for cl in claims if cl.sent)
        return claims if done else None

    return wait_until(finished, 30, interval=0.5, message=lambda: "the worker to record "
                      f"the finish of every run\n{read_claims(dsn, table, JOBS)}\n"
                      + c.pm.tails(15))


def _wait_until_settled(c: Cluster) -> None:
    def settled() -> bool:
        want = expected_counts(c.expected), c.runtimes()
        return all((occurrence_counts(t), _rounded(histograms(
            t, "elarion_beat_runtime_seconds"))) == (want[0], _rounded(want[1]))
            for t in c.monitors().values())

    try:
        wait_until(settled, 30, interval=0.5)
    except AssertionError:
        pass  # the tests show what differs


def _rounded(found: dict[tuple[str, str], dict[str, float]]) -> dict[tuple[str, str],
                                                                   dict[str, float]]:
    """Histogram samples with sums to 4 decimals (events carry runtimes to 6)."""
    return {key: {k: round(v, 4) for k, v in samples.items()} for key, samples in found.items()}


def by_job_node(counts: Counter[Key], outcome: str) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for (job, node, kind, _), n in counts.items():
        if kind == outcome:
            out[(job, node)] += n
    return out
