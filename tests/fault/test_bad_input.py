"""Fault proofs: bad input, given to real ``celery beat`` processes.

Three scenarios, each a group of real processes started together (the machine is
slow: one start can take a minute, so the processes of a scenario share it):

1. **Refused at start.** Eleven beats, each with one bad setting or one bad entry
   (an unparsable DSN, an unknown scheme, SQL in the table and schema names, an
   unknown setting value, an unknown option value, job names of 500 characters and
   with a NUL, a missing table with creation off). Each exits non-zero, its output
   names the setting or entry, the value and the fix, and no database object was
   touched: a sentinel table the injections name survives, and no table was made.
2. **A database that refuses at start.** A beat whose database does not exist yet,
   and one whose role may not log in yet, with ``elarion_beat_startup_errors =
   "fail_closed"`` (the default refuses to start). Both stay up and fail closed (one ERROR
   with the masked DSN, ``claim-error`` skips, never the password), then recover by
   themselves once the database is created / the role gets LOGIN, and claim.
3. **Broken entries among good ones.** One beat and one worker on a schedule with a
   good unicode-named entry beside five entries that can never run, a cron that
   never fires (30 February) and a task no process registered. Beat leaves out the
   five with one ERROR each naming it, keeps the cron (Celery's ERROR at each
   wake-up), sends the unregistered task by name (the worker logs Celery's
   "unregistered task" error and drops it), runs the good entry, and never spins.

docs/bad-input.md lists every input with what happens and the test that proves it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.beat.startup import EXIT_CONFIG
from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
)
from tests.fault.proj_bad_input import (
    GOOD,
    LEFT_OUT,
    LONG_NAME,
    NEVER,
    STRANGER,
    TASK,
    UNREGISTERED,
)

pytestmark = [pytest.mark.postgres]
# real beats started with bad input; its GRANT on the test database must not race the other grant
# tests
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("pg-grants")]

APP = "tests.fault.proj_bad_input"
#: generous: eleven celery processes importing at once on a loaded 2-core machine
START_TIMEOUT = 240.0
#: a password in every DSN: trust authentication accepts it, and it must never be printed
SECRET = "PWSECRET4bad"
#: claims of the good entry to see before a scenario counts as running
CLAIMS_SEEN = 3
#: a beat ticking once a second uses a few % of a core; a busy loop takes a core
#: (or, on this shared machine, at least its share of one: well above this bound)
MAX_CPU_SHARE = 0.15


@dataclass(frozen=True)
class Refusal:
    """A beat given one bad input, and what its output must say."""

    name: str
    env: dict[str, str]
    says: tuple[str, ...]
    #: True: a setting, refused as beat reads its settings; False: refused as the
    #: scheduler sets up. Either way one CRITICAL line, exit 78 (celery_elarion_beat.beat.startup)
    setting: bool = True


def admin(pg_dsn: str, sql: str, dbname: str | None = None) -> None:
    """Run *sql* (autocommit) as the test's superuser."""
    dsn = make_url(pg_dsn).set(database=dbname) if dbname else make_url(pg_dsn)
    with psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True,
                         connect_timeout=10) as conn:
        conn.execute(sql)


def tables_like(pg_dsn: str, prefix: str) -> set[str]:
    with psycopg.connect(pg_dsn, connect_timeout=10) as conn:
        rows = conn.execute("SELECT schemaname || '.' || tablename FROM pg_tables "
                            "WHERE tablename LIKE %s", (prefix + "%",)).fetchall()
    return {r[0] for r in rows}


def with_password(pg_dsn: str, user: str | None = None, database: str | None = None) -> str:
    url = make_url(pg_dsn).set(password=SECRET)
    if user:
        url = url.set(username=user)
    if database:
        url = url.set(database=database)
    return url.render_as_string(hide_password=False)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of *pid* so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks


@pytest.fixture
def run() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def pm(tmp_path: Path, redis_url: str, run: str) -> Iterator[ProcessManager]:
    manager = ProcessManager(tmp_path / "procs", APP,
                             {"ELARION_BAD_BROKER": redis_url, "ELARION_BAD_RUN": run,
                              "ELARION_BEAT_LOG_FORMAT": "json"})
    try:
        yield manager
    finally:
        manager.stop_all()


# -- 1. refused at start --------------------------------------------------------------


def refusals(pg_dsn: str, run: str, sentinel: str) -> list[Refusal]:
    dsn = with_password(pg_dsn)
    table = f"elarion_bad_{run}"
    return [
        Refusal("dsn-not-a-url", {"ELARION_BEAT_DSN": "not a url"},
                ("elarion_beat_dsn is not a URL", "postgresql://user:password@host")),
        Refusal("dsn-unknown-scheme",
                {"ELARION_BEAT_DSN": f"oracle://scott:{SECRET}@db.example/x"},
                ("elarion_beat_dsn has the unsupported scheme 'oracle'", "postgresql://")),
        Refusal("table-injection",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": f"x; DROP TABLE {sentinel}--"},
                (f"elarion_beat_table = 'x; DROP TABLE {sentinel}--' is not a usable SQL "
                 "identifier", "letters, digits and underscores")),
        Refusal("schema-injection",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table,
                 "ELARION_BEAT_SCHEMA": f'public"; DROP TABLE public.{sentinel}; --'},
                ("elarion_beat_schema = 'public\"; DROP TABLE", "not a usable SQL identifier")),
        Refusal("table-quoted-with-space",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": '"my claims"'},
                ("elarion_beat_table = '\"my claims\"' is not a usable SQL identifier",)),
        Refusal("unknown-setting-value",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table,
                 "ELARION_BEAT_CATCH_UP": "sometimes"},
                ("elarion_beat_catch_up must be one of 'skip', 'latest', 'all', "
                 "not 'sometimes'",)),
        Refusal("unknown-option-value",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table,
                 "ELARION_BAD_SCHEDULE": "placement"},
                ("beat_schedule entry 'everywhere' has options['placement'] = 'everywhere'; "
                 "use one of 'cluster', 'every_node'",), setting=False),
        Refusal("name-of-500-characters",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table,
                 "ELARION_BAD_SCHEDULE": "long-name"},
                (f"beat_schedule entry '{LONG_NAME[:60]}", "it has 500 characters, more than "
                 "the limit of 191; rename the entry"), setting=False),
        Refusal("name-with-nul",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": table,
                 "ELARION_BAD_SCHEDULE": "nul-name"},
                ("beat_schedule entry 'nul\\x00name' cannot be claimed: it contains a NUL "
                 "character",), setting=False),
        Refusal("missing-table-creation-off",
                {"ELARION_BEAT_DSN": dsn, "ELARION_BEAT_TABLE": f"{table}_missing",
                 "ELARION_BEAT_CREATE_TABLE": "false"},
                (f"the table {table}_missing does not exist and elarion_beat_create_table is "
                 "False", "elarion-beat init-db"), setting=False),
    ]


def test_bad_settings_and_entries_refuse_to_start_naming_them(
        pm: ProcessManager, pg_dsn: str, run: str) -> None:
    """Each beat exits non-zero with its one bad input named; nothing was created or
    dropped in the database (the injections name a sentinel table that survives)."""
    sentinel = f"elarion_bad_{run}_sentinel"
    admin(pg_dsn, f"CREATE TABLE public.{sentinel} (id int)")
    try:
        cases = refusals(pg_dsn, run, sentinel)
        # text logs: an entry's repr (the NUL) reads as written, not escaped again by JSON
        beats = {c.name: pm.beat(c.name, env={"ELARION_BAD_SCHEDULE": "good",
                                              "ELARION_BEAT_LOG_FORMAT": "text", **c.env})
                 for c in cases}
        for case in cases:
            beat = beats[case.name]
            code = beat.wait(START_TIMEOUT)
            assert code == EXIT_CONFIG, f"{case.name} did not refuse\n{beat.tail()}"
            out = beat.log()
            for words in case.says:
                assert words in out, f"{case.name}: {words!r} not said\n{beat.tail()}"
            critical = [line for line in out.splitlines() if "CRITICAL" in line]
            assert len(critical) == 1 and "beat: cannot start: " in critical[0], beat.tail()
            assert "Traceback" not in out, f"{case.name}\n{beat.tail()}"
            assert SECRET not in out, f"{case.name} printed the password\n{beat.tail()}"
            # the scenario really was a refusal at start: nothing was ever claimed or sent
            assert "Sending due task" not in out
        assert tables_like(pg_dsn, f"elarion_bad_{run}") == {f"public.{sentinel}"}
    finally:
        admin(pg_dsn, f"DROP TABLE IF EXISTS public.{sentinel}")


# -- 2. a database that refuses at start -------------------------------------------------


def wait_claims(dsn: str, table: str, beat: ChildProcess, at_least: int) -> int:
    """Wait for *at_least* claims of the good entry in *table*; their number."""
    def enough() -> int:
        found = good_claims(dsn, table)
        return found if found >= at_least else 0

    return beat.wait_ready(enough, START_TIMEOUT, f"{at_least} claims of {GOOD!r} in {table}")


def good_claims(dsn: str, table: str) -> int:
    """Claims of the good entry in *table* (none while its database is unreachable)."""
    try:
        return len([c for c in read_claims(dsn, table) if c.job == GOOD])
    except Exception:  # the table is made by the beat, a moment after it recovers
        return 0


def test_a_database_that_refuses_at_start_fails_closed_then_recovers(
        pm: ProcessManager, pg_dsn: str, run: str) -> None:
    """A database that does not exist yet, and a role that may not log in yet: with
    elarion_beat_startup_errors = fail_closed (the default refuses to start, see
    tests/operate/test_startup_errors.py) beat stays up, skips as claim-error naming the
    masked DSN, and claims once let in."""
    database, role = f"elarion_bad_{run}_db", f"elarion_bad_{run}_role"
    table = f"elarion_bad_{run}"
    admin(pg_dsn, f"CREATE ROLE {role} NOLOGIN")
    admin(pg_dsn, f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    dbname = make_url(pg_dsn).database
    # beat runs CREATE SCHEMA IF NOT EXISTS, which asks for CREATE on the database
    admin(pg_dsn, f"GRANT CREATE ON DATABASE {dbname} TO {role}")
    missing_db = with_password(pg_dsn, database=database)
    no_login = with_password(pg_dsn, user=role)
    try:
        beats = {
            "no-database": pm.beat("no-database", env={
                "ELARION_BEAT_DSN": missing_db, "ELARION_BEAT_TABLE": table,
                "ELARION_BEAT_NODE": f"nodb-{run}", "ELARION_BEAT_STARTUP_ERRORS": "fail_closed"}),
            "no-login": pm.beat("no-login", env={
                "ELARION_BEAT_DSN": no_login, "ELARION_BEAT_TABLE": table,
                "ELARION_BEAT_SCHEMA": role, "ELARION_BEAT_NODE": f"nologin-{run}",
                "ELARION_BEAT_STARTUP_ERRORS": "fail_closed"}),
        }
        refused = {"no-database": f'database "{database}" does not exist',
                   "no-login": f'role "{role}" is not permitted to log in'}
        for name, beat in beats.items():
            error = beat.wait_for_record({"action": "claims-unavailable"}, START_TIMEOUT)
            assert error["level"] == "ERROR" and "***@" in error["message"], error
            assert refused[name] in error["message"], error
            # failing closed, not stuck: the good entry's occurrences are skipped
            beat.wait_ready(lambda b=beat: len(b.records(action="skipped",
                                                         reason="claim-error")) >= 3,
                            START_TIMEOUT, "three claim-error skips")
        assert all(b.alive() for b in beats.values())
        unavailable = {n: len(b.records(action="claims-unavailable")) for n, b in beats.items()}
        assert unavailable == {"no-database": 1, "no-login": 1}  # once, not once a tick

        admin(pg_dsn, f"CREATE DATABASE {database}")
        admin(pg_dsn, f"ALTER ROLE {role} LOGIN")
        let_in = time.time()
        for name, beat in beats.items():
            back = beat.wait_for_record({"action": "claims-recovered"}, START_TIMEOUT)
            print(f"{name}: recovered {record_time(back) - let_in:.1f}s after being let in; "
                  f"{len(beat.records(action='skipped', reason='claim-error'))} claim-error "
                  "skips before")
        wait_claims(missing_db, table, beats["no-database"], CLAIMS_SEEN)
        # the role's search path starts with its own schema, where beat made the table
        wait_claims(no_login, table, beats["no-login"], CLAIMS_SEEN)
        for name, beat in beats.items():
            assert beat.alive(), beat.tail()
            assert SECRET not in beat.log(), f"{name} printed the password"
    finally:
        pm.stop_all()
        admin(pg_dsn, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin(pg_dsn, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      f"WHERE usename = '{role}'")
        admin(pg_dsn, f"DROP OWNED BY {role} CASCADE")  # its schema, tables and grant
        admin(pg_dsn, f"DROP ROLE IF EXISTS {role}")


# -- 3. broken entries among good ones ----------------------------------------------------


def test_broken_entries_among_good_ones_are_left_out_and_the_good_ones_run(
        pm: ProcessManager, pg_dsn: str, run: str) -> None:
    """The five entries that can never run are left out, one ERROR each naming it;
    the never-firing cron and the unregistered task stay; the good entry runs on the
    worker; beat stays up without spinning."""
    table = f"elarion_bad_{run}"
    dsn = with_password(pg_dsn)
    env = {"ELARION_BAD_SCHEDULE": "mixed", "ELARION_BEAT_DSN": dsn,
           "ELARION_BEAT_TABLE": table}
    try:
        worker = pm.worker("worker", env=env)
        beat = pm.beat("beat", env={**env, "ELARION_BEAT_NODE": f"mixed-{run}"})
        wait_claims(pg_dsn, table, beat, CLAIMS_SEEN)

        invalid = beat.records(action="invalid-entry")
        assert sorted(r["job"] for r in invalid) == sorted(LEFT_OUT), invalid
        assert all(r["level"] == "ERROR" and "is left out" in r["message"] for r in invalid)
        jobs = {c.job for c in read_claims(pg_dsn, table)}
        assert not jobs & {*LEFT_OUT, NEVER}, jobs  # never claimed, never sent
        assert STRANGER in jobs  # sent by name: beat cannot know the worker's tasks

        never = [r for r in beat.records(level="ERROR")
                 if f"Cannot calculate the next run of '{NEVER}'" in r["message"]]
        assert never, beat.tail()

        worker.wait_ready(lambda: f"Received unregistered task of type '{UNREGISTERED}'"
                          in worker.log(), START_TIMEOUT, "the unregistered task's error")
        worker.wait_ready(lambda: len(worker.lines(f"Task {TASK}[", "succeeded")) >= 2,
                          START_TIMEOUT, "two runs of the good task")

        # no busy loop: the CPU beat used over ten more claims of the good entry
        started, cpu = time.monotonic(), cpu_seconds(beat.pid)
        wait_claims(pg_dsn, table, beat, good_claims(pg_dsn, table) + 10)
        share = (cpu_seconds(beat.pid) - cpu) / (time.monotonic() - started)
        print(f"beat CPU share while ticking: {share:.1%}")
        assert share < MAX_CPU_SHARE, f"beat used {share:.0%} of a core"
        assert beat.alive() and worker.alive()
        assert SECRET not in beat.log() + worker.log()
    finally:
        pm.stop_all()
        drop_tables(pg_dsn, *claims_tables(table))
