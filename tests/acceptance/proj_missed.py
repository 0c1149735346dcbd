"""The Celery app of the "never lose a slot" acceptance tests (real beat and worker processes).

Like :mod:`tests.acceptance.proj` (same environment variables: broker, queue, claims
and runs tables, node), plus:

``ELARION_ACC_SCHEDULE``  which entries the beat_schedule holds, comma-separated groups:

* ``catch-up``: five ``cron("*/2 * * * * *")`` entries, one per catch-up policy
  (:data:`CU_SKIP`, :data:`CU_LATEST`, :data:`CU_ALL` uncapped, :data:`CU_CAPPED`
  with ``catch_up_max=2``, :data:`CU_WINDOW` with a 5 s ``catch_up_window``), and the
  interval entry :data:`INTERVAL_JOB` (every :data:`INTERVAL`, ``catch_up='latest'``);
* ``delivery``: two ``cron("*/2 * * * * *")`` entries, :data:`AT_MOST_ONCE` and
  :data:`AT_LEAST_ONCE`, and two fillers on the same slots (see :data:`FILLERS`), one
  ``at_least_once``, one with the default delivery (``at_most_once``);
* ``broker``: one ``at_least_once`` entry, :data:`BROKER_JOB`;
* ``restart``: per catch-up policy (skip, latest, all), an interval entry of
  :data:`RESTART_INTERVAL` (:data:`RS_INTERVALS`) and a ``cron("*/10 * * * * *")``
  entry (:data:`RS_CRONS`): the quick restart of every node.

Beat reacts within a second: heartbeats every second, a node is dead after 3 s, a
claim is orphaned 3 s after it was claimed. ``elarion_beat_interval_anchor`` is left
to the environment (``ELARION_BEAT_INTERVAL_ANCHOR``), so a run can try the 0.1
behaviour.

The task records each run like proj's, with two more headers: ``elarion_catch_up``
and ``elarion_takeover``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_elarion_beat import cron
from celery_elarion_beat.config.headers import HEADER_CATCH_UP, HEADER_TAKEOVER
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import HEARTBEAT as HEARTBEAT  # the tests read them here
from tests.acceptance.proj import PUBLISH_TIMEOUT as PUBLISH_TIMEOUT
from tests.acceptance.proj import (
    QUICK_LIVENESS,
    _header,
    configure_from_env,
    insert_run,
    runs_table_ddl,
)

TASK = "elarion_missed.record"

# -- group "catch-up" -----------------------------------------------------------
CU_SKIP = "cu-skip"
CU_LATEST = "cu-latest"
CU_ALL = "cu-all"
CU_CAPPED = "cu-all-capped"
CU_WINDOW = "cu-window"
CAPPED_MAX = 2
WINDOW = timedelta(seconds=5)
INTERVAL_JOB = "interval-16s"
INTERVAL = timedelta(seconds=16)
CATCH_UP_JOBS = (CU_SKIP, CU_LATEST, CU_ALL, CU_CAPPED, CU_WINDOW)

# -- group "delivery" -------------------------------------------------------------
AT_MOST_ONCE = "dl-at-most-once"
AT_LEAST_ONCE = "dl-at-least-once"
#: A tick claims its due entries in chunks of ceil(due / live nodes), sorted by name:
#: with four entries on one slot, the two above (first by name) share a chunk whether
#: 1, 2 or 3 nodes are live, so the node that pauses in that chunk holds both claims
#: (and the fillers too when it claims alone).
FILLERS = ("dl-filler-a", "dl-filler-b")
#: the delivery of each entry of the group
DELIVERY = {AT_LEAST_ONCE: "at_least_once", AT_MOST_ONCE: "at_most_once",
            FILLERS[0]: "at_least_once", FILLERS[1]: "at_most_once"}
DELIVERY_JOBS = tuple(DELIVERY)

# -- group "broker" ----------------------------------------------------------------
BROKER_JOB = "br-at-least-once"

# -- group "restart" ---------------------------------------------------------------
RESTART_INTERVAL = timedelta(seconds=20)
POLICIES = ("skip", "latest", "all")
#: policy -> its entry's name
RS_INTERVALS = {policy: f"rs-interval-{policy}" for policy in POLICIES}
RS_CRONS = {policy: f"rs-cron-{policy}" for policy in POLICIES}
EVERY_10S = "*/10 * * * * *"


RUNS_TABLE_DDL = runs_table_ddl("catch_up integer", "takeover integer")

EVERY_2S = "*/2 * * * * *"


def _entry(name: str, schedule: Any, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": TASK, "schedule": schedule, "kwargs": {"entry": name}}
    if options:
        entry["options"] = options
    return entry


def beat_schedule(groups: str) -> dict[str, Any]:
    schedule: dict[str, Any] = {}
    for group in filter(None, (g.strip() for g in groups.split(","))):
        if group == "catch-up":
            schedule.update({
                CU_SKIP: _entry(CU_SKIP, cron(EVERY_2S), catch_up="skip"),
                CU_LATEST: _entry(CU_LATEST, cron(EVERY_2S), catch_up="latest"),
                CU_ALL: _entry(CU_ALL, cron(EVERY_2S), catch_up="all", catch_up_max=1000),
                CU_CAPPED: _entry(CU_CAPPED, cron(EVERY_2S), catch_up="all",
                                  catch_up_max=CAPPED_MAX),
                CU_WINDOW: _entry(CU_WINDOW, cron(EVERY_2S), catch_up="all", catch_up_max=1000,
                                  catch_up_window=WINDOW),
                INTERVAL_JOB: _entry(INTERVAL_JOB, INTERVAL, catch_up="latest"),
            })
        elif group == "delivery":
            schedule.update({
                AT_MOST_ONCE: _entry(AT_MOST_ONCE, cron(EVERY_2S), delivery="at_most_once"),
                AT_LEAST_ONCE: _entry(AT_LEAST_ONCE, cron(EVERY_2S), delivery="at_least_once"),
                FILLERS[0]: _entry(FILLERS[0], cron(EVERY_2S), delivery="at_least_once"),
                FILLERS[1]: _entry(FILLERS[1], cron(EVERY_2S)),  # the default: at_most_once
            })
        elif group == "broker":
            schedule[BROKER_JOB] = _entry(BROKER_JOB, cron(EVERY_2S), delivery="at_least_once")
        elif group == "restart":
            for policy in POLICIES:
                schedule[RS_INTERVALS[policy]] = _entry(RS_INTERVALS[policy], RESTART_INTERVAL,
                                                        catch_up=policy)
                schedule[RS_CRONS[policy]] = _entry(RS_CRONS[policy], cron(EVERY_10S),
                                                    catch_up=policy)
        else:
            raise ValueError(f"unknown ELARION_ACC_SCHEDULE group {group!r}")
    return schedule


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return configure_from_env(app, env, beat_schedule(env.get("ELARION_ACC_SCHEDULE", "")),
                              "elarion-missed-acceptance", **QUICK_LIVENESS)


def make_app(env: Mapping[str, str], main: str = "elarion_missed") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_missed"), os.environ)
connect_json_logging(app)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    request = self.request
    insert_run(request, entry, {"catch_up": _int(_header(request, HEADER_CATCH_UP)),
                                "takeover": _int(_header(request, HEADER_TAKEOVER))})
