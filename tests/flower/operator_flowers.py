"""Four real Flowers of the test app (tests/flower/app.py) started with
examples/flowerconfig.py, and no beat (the controls need none), on their own claims
table and queues: what the tests of who may act (test_operators.py) and of the edit
form (test_schedule_browser.py) share, built once per xdist worker (the package fixture
``flowers`` in conftest.py; both modules are in the ``flower-operators`` xdist group).

* ``closed``: no authentication, ``FLOWER_UNAUTHENTICATED_API=false`` (Flower's default);
* ``opened``: no authentication, ``FLOWER_UNAUTHENTICATED_API=true``;
* ``listed``: the same, with ``ELARION_BEAT_FLOWER_OPERATORS`` set (nobody can match it);
* ``guarded``: basic auth for an operator and a viewer, and
  ``ELARION_BEAT_FLOWER_OPERATORS="ops-*, carol"`` (the environment's comma-separated form);
  its edit form is on (``ELARION_BEAT_FLOWER_EDIT``, database entries of the tasks
  :data:`ENTRY_TASKS`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.store.registry import open_store
from celery_elarion_beat.testing._harness import claims_tables
from celery_elarion_beat.testing._harness import drop_tables as drop_claims_tables
from tests.flower.support import (
    FLOWERCONFIG,
    Db,
    basic,
    delete_broker_keys,
    free_port,
    http_get,
)
from tests.helpers.processes import ProcessManager, wait_until

APP = "tests.flower.app"
OPERATOR = ("ops-alice", "pw-alice")
VIEWER = ("bob", "pw-bob")
#: the tasks the guarded Flower's database entries may start
ENTRY_TASKS = "elarion_flower.*"
#: what turns the guarded Flower's edit form on
EDIT_ENV = {"ELARION_BEAT_FLOWER_EDIT": "true", "ELARION_BEAT_DB_ENTRIES": "true",
            "ELARION_BEAT_DB_ENTRY_TASKS": ENTRY_TASKS}


@dataclass(frozen=True)
class Flowers:
    closed: str
    opened: str
    listed: str
    guarded: str
    db: Db
    pm: ProcessManager
    #: the test app's environment (make_app(env) is the app these Flowers run)
    env: dict[str, str] = field(default_factory=dict)
    operator: str = basic(*OPERATOR)
    viewer: str = basic(*VIEWER)


@contextmanager
def running_flowers(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
                    redis_url: str) -> Iterator[Flowers]:
    run = uuid.uuid4().hex[:10]
    table = f"fo_{run}_claims"
    settings = Settings.from_mapping({"elarion_beat_dsn": pg_dsn, "elarion_beat_table": table,
                                      "elarion_beat_db_entries": True})
    store = open_store(settings)
    try:
        store.create_schema()  # as the beats (or `elarion-beat init-db`) would have
    finally:
        store.close()
    env = {"ELARION_FL_BROKER": redis_url, "ELARION_FL_RUN": run, "ELARION_FL_DSN": pg_dsn,
           "ELARION_FL_TABLE": table}
    pm = ProcessManager(tmp_path_factory.mktemp("operators"), APP, env)
    ports = [free_port() for _ in range(4)]
    closed = {"FLOWER_UNAUTHENTICATED_API": "false"}  # whatever this shell has
    opened = {"FLOWER_UNAUTHENTICATED_API": "true"}
    starts: list[tuple[str, list[str], dict[str, str]]] = [
        ("closed", [], closed),
        ("opened", [], opened),
        ("listed", [], {**opened, "ELARION_BEAT_FLOWER_OPERATORS": "ops-alice"}),
        ("guarded", ["--basic_auth=" + ",".join(f"{u}:{p}" for u, p in (OPERATOR, VIEWER))],
         {**closed, "ELARION_BEAT_FLOWER_OPERATORS": "ops-*, carol", **EDIT_ENV}),
    ]
    try:
        for (name, extra, child_env), port in zip(starts, ports):
            pm.celery(name, ["flower", f"--conf={FLOWERCONFIG}", f"--port={port}",
                             "--address=127.0.0.1", *extra], env=child_env)
        bases = [f"http://127.0.0.1:{port}" for port in ports]
        found = Flowers(*bases, db=Db(pg_dsn, table), pm=pm, env=env)

        def answering() -> bool:
            for process in pm.processes:
                if not process.alive():
                    raise AssertionError(f"{process.name} died\n{process.tail()}")
            return all(http_get(base + "/elarion/api/controls",
                                found.operator if base == found.guarded else None)[0] == 200
                       for base in bases)

        wait_until(answering, 90, interval=0.5,
                   message=lambda: "the Flowers to answer\n" + pm.tails(15))
        yield found
    finally:
        pm.stop_all()
        drop_claims_tables(pg_dsn, *claims_tables(table))
        delete_broker_keys(redis_url, run)
