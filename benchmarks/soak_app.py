"""The Celery app of the soak (:mod:`benchmarks.soak`): real beats and workers.

Configured from the environment the soak sets, so that every run has its own
queue, node queues, claims table and runs table:

``ELARION_SOAK_BROKER``      broker URL (Redis by default)
``ELARION_SOAK_QUEUE``       the task queue (and exchange) of this run
``ELARION_SOAK_DSN``         -> ``elarion_beat_dsn`` (PostgreSQL)
``ELARION_SOAK_TABLE``       -> ``elarion_beat_table``
``ELARION_SOAK_NODE``        -> ``elarion_beat_node``
``ELARION_SOAK_RUNS_TABLE``  the runs table the task writes into (created by the soak)
``ELARION_SOAK_ENTRIES``     how many entries (default 300)
``ELARION_SOAK_SEED``        the seed of the mix (every node builds the same schedule)
``ELARION_SOAK_BEAT_NODES``  (workers) the beat nodes whose node queues this worker also
                             consumes, comma-separated

The schedule is :func:`build_specs`: a seeded, deterministic mix of Celery
``crontab()`` (every minute), our ``cron`` with seconds (every 5, 10 or 15 s),
intervals (5 to 30 s) and ~10 % ``every_node`` entries, with ``catch_up``,
``delivery`` and ``overlap`` options spread over the cluster entries (see
:data:`MIX`). The one task records each execution, with the elarion headers
it came with, into the runs table over one connection per worker process.

Orphans and node liveness are made quicker than the defaults (publish timeout
15 s, heartbeats every 5 s) so that ``at_least_once`` takeovers happen, and can be
checked, inside a short run.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.beat import BeatLazyFunc
from celery.schedules import crontab

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

TASK = "elbench_soak.record"
PUBLISH_TIMEOUT = 15.0
HEARTBEAT = 5.0
NODE_TIMEOUT = 15.0
#: elarion_beat_window_tolerance (the library default)
WINDOW_TOLERANCE = 1.0

#: (weight, kind, choices of the period in seconds): 2/9 of the entries ``crontab``
#: (Celery, every minute), 3/9 ``cron`` (ours, ``*/N`` seconds), 4/9 ``interval``
#: (timedelta)
MIX: tuple[tuple[float, str, tuple[int, ...]], ...] = (
    (0.20, "crontab", (60,)),
    (0.30, "cron", (5, 10, 10, 15, 15)),
    (0.40, "interval", (5, 7, 10, 12, 15, 20, 25, 30)),
)
#: share of every_node entries (their kinds drawn like the others')
EVERY_NODE_SHARE = 0.10
#: options of the cluster entries: (share, value); the rest keep the defaults
CATCH_UP = ((0.25, "latest"), (0.15, "all"))          # else skip (the default)
DELIVERY = ((0.25, "at_least_once"),)                 # else at_most_once (the default)
OVERLAP_SKIP = 0.10                                   # overlap: skip


@dataclass(frozen=True)
class Spec:
    """One entry of the soak: its schedule and options, as the analysis reads them."""

    name: str
    kind: str           # crontab | cron | interval
    period: int         # seconds between two occurrences
    placement: str      # cluster | every_node
    catch_up: str       # skip | latest | all
    delivery: str       # at_most_once | at_least_once
    overlap: str        # allow | skip

    @property
    def exact(self) -> bool:
        """Whether the entry has exact slots (crontab, cron) rather than windows."""
        return self.kind != "interval"

    def schedule(self) -> Any:
        if self.kind == "crontab":
            return crontab()
        if self.kind == "cron":
            return cron(f"*/{self.period} * * * * *")
        return timedelta(seconds=self.period)

    def options(self) -> dict[str, Any]:
        if self.placement == "every_node":
            return {"placement": "every_node"}
        opts: dict[str, Any] = {}
        if self.catch_up != "skip":
            opts["catch_up"] = self.catch_up
        if self.delivery != "at_most_once":
            opts["delivery"] = self.delivery
        if self.overlap != "allow":
            opts["overlap"] = self.overlap
        return opts


def _pick(rng: random.Random, shares: tuple[tuple[float, str], ...], default: str) -> str:
    x = rng.random()
    for share, value in shares:
        if x < share:
            return value
        x -= share
    return default


def _kind(x: float) -> tuple[str, tuple[int, ...]]:
    """The kind of :data:`MIX` that *x* (uniform in [0, total share)) falls on."""
    for share, kind, periods in MIX:
        if x < share:
            return kind, periods
        x -= share
    return MIX[-1][1], MIX[-1][2]


def build_specs(n: int, seed: int) -> list[Spec]:
    """The *n* entries of a soak, the same for every process given the same *seed*."""
    rng = random.Random(seed)
    total = sum(share for share, _, _ in MIX)
    specs = []
    n_every = round(n * EVERY_NODE_SHARE)
    every = set(rng.sample(range(n), n_every))
    for i in range(n):
        kind, periods = _kind(rng.random() * total)
        period = rng.choice(periods)
        if i in every:
            specs.append(Spec(f"soak-{i:04}-{kind}{period}-en", kind, period, "every_node",
                              "skip", "at_most_once", "allow"))
            continue
        catch_up = _pick(rng, CATCH_UP, "skip")
        delivery = _pick(rng, DELIVERY, "at_most_once")
        overlap = "skip" if rng.random() < OVERLAP_SKIP else "allow"
        specs.append(Spec(f"soak-{i:04}-{kind}{period}", kind, period, "cluster", catch_up,
                          delivery, overlap))
    return specs


def beat_schedule(specs: list[Spec]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in specs:
        # sent_at: beat calls it when it publishes, so the run knows when it was sent
        entry: dict[str, Any] = {"task": TASK, "schedule": spec.schedule(),
                                 "kwargs": {"entry": spec.name,
                                            "sent_at": BeatLazyFunc(time.time)}}
        options = spec.options()
        if options:
            entry["options"] = options
        out[spec.name] = entry
    return out


RUNS_TABLE_DDL = """
CREATE TABLE {table} (
    id bigserial PRIMARY KEY,
    entry text, job text, occurrence text, node text, placement text, claim text,
    catch_up text, takeover text, task_id text, worker text, sent_at double precision,
    executed_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def node_queue_format(queue: str) -> str:
    """This run's node queues: ``<queue>.node.{node}``."""
    return f"{queue}.node.{{node}}"


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    queue = env.get("ELARION_SOAK_QUEUE", "elbench.soak")
    specs = build_specs(int(env.get("ELARION_SOAK_ENTRIES", "300")),
                        int(env.get("ELARION_SOAK_SEED", "16")))
    app.conf.update(isolated_conf(
        env.get("ELARION_SOAK_BROKER", "redis://127.0.0.1:6379/0"), queue,
        beat_schedule=beat_schedule(specs),
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        elarion_beat_node_queue=node_queue_format(queue),
        elarion_beat_publish_timeout=PUBLISH_TIMEOUT,
        elarion_beat_heartbeat_interval=HEARTBEAT,
        elarion_beat_node_timeout=NODE_TIMEOUT,
    ))
    conf_from_env(app, env, {"ELARION_SOAK_DSN": "elarion_beat_dsn",
                             "ELARION_SOAK_TABLE": "elarion_beat_table",
                             "ELARION_SOAK_NODE": "elarion_beat_node"})
    return app


def consume_beat_node_queues(app: Celery, nodes: list[str]) -> None:
    """Make this app's workers consume the node queue of each of *nodes* too, declared
    exactly as those beats declare them (RabbitMQ refuses a queue redeclared with other
    arguments, e.g. without ``x-expires``), so one worker runs every beat's every-node
    entries."""
    import dataclasses

    from celery.signals import celeryd_after_setup

    from celery_elarion_beat.config.node_queue import node_queue
    from celery_elarion_beat.config.settings import Settings

    def add(sender: Any = None, instance: Any = None, **_: Any) -> None:
        worker_app = getattr(instance, "app", None)
        if worker_app is None or worker_app.main != app.main:
            return
        settings = Settings.from_app(worker_app)
        for node in nodes:
            fmt = worker_app.conf.elarion_beat_node_queue
            worker_app.amqp.queues.select_add(node_queue(
                dataclasses.replace(settings, node=node, node_queue=fmt.format(node=node))))

    celeryd_after_setup.connect(add, weak=False, dispatch_uid=f"elbench_soak.{app.main}")


app = configure(Celery("elbench_soak"), os.environ)
celery_elarion_beat.install_worker(app)  # run tracking: overlap: skip needs it
connect_json_logging(app)
if os.environ.get("ELARION_SOAK_BEAT_NODES"):
    consume_beat_node_queues(app, os.environ["ELARION_SOAK_BEAT_NODES"].split(","))

_conn: Any = None


def _connection() -> Any:
    """One connection per worker process, opened again after an error."""
    global _conn
    import psycopg

    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["ELARION_SOAK_DSN"], autocommit=True,
                                connect_timeout=10,
                                application_name=f"elbench-soak-worker {os.getpid()}")
    return _conn


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None, sent_at: float | None = None) -> None:
    """Record this execution and the elarion headers it came with."""
    global _conn
    from psycopg import sql

    request = self.request
    values = [entry] + [getattr(request, h, None) for h in (
        "elarion_job", "elarion_occurrence", "elarion_node", "elarion_placement",
        "elarion_claim", "elarion_catch_up", "elarion_takeover")] + [request.id,
                                                                      request.hostname, sent_at]
    query = sql.SQL("INSERT INTO {} (entry, job, occurrence, node, placement, claim, catch_up, "
                    "takeover, task_id, worker, sent_at) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)").format(
        sql.Identifier(os.environ["ELARION_SOAK_RUNS_TABLE"]))
    for attempt in range(3):
        try:
            _connection().execute(query, [v if v is None or isinstance(v, float) else str(v)
                                          for v in values])
            return
        except Exception:  # noqa: BLE001 - reconnect and try again; the third error raises
            try:
                if _conn is not None:
                    _conn.close()
            finally:
                _conn = None
            if attempt == 2:
                raise
