"""Start-up errors a person can act on, proven on the real ``celery beat`` CLI.

A beat that cannot start logs ONE CRITICAL line, ``beat: cannot start: <what and the
fix>``, and exits with a documented code (:mod:`celery_elarion_beat.beat.startup`): 78 for a
wrong setting or entry, 77 when the claims database refuses the node (no such database
or role, a wrong password, no right on the schema). No traceback, unless
``--loglevel DEBUG``. An outage (connection refused) starts fail-closed instead, and so
does a refusal with ``elarion_beat_startup_errors = "fail_closed"``.

Each group's beats start together (a start takes seconds on a loaded machine).
Entries that are structurally broken (no task, a schedule that is text) are left out
with an ERROR while beat runs on: tests/fault/test_bad_input.py proves that.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.beat.startup import EXIT_CONFIG, EXIT_REFUSED
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager
from tests.helpers.ports import free_port
from tests.operate.proj_startup import BAD_OPTION

pytestmark = [pytest.mark.acceptance]

APP = "tests.operate.proj_startup"
#: generous: several celery processes importing at once on a loaded 2-core machine
START_TIMEOUT = 120.0
#: a password in the DSNs: it must never be printed
SECRET = "PWSECRETstartup"


@dataclass(frozen=True)
class Refusal:
    """A beat that must refuse to start, and what its CRITICAL line must say."""

    name: str
    env: dict[str, str]
    code: int
    says: tuple[str, ...]
    loglevel: str = "INFO"
    extra: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def run() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def pm(tmp_path: Path, redis_url: str, run: str) -> Iterator[ProcessManager]:
    manager = ProcessManager(tmp_path / "procs", APP,
                             {"ELARION_STARTUP_BROKER": redis_url, "ELARION_STARTUP_RUN": run})
    try:
        yield manager
    finally:
        manager.stop_all()


def with_password(dsn: str, password: str = SECRET, **parts: Any) -> str:
    return make_url(dsn).set(password=password, **parts).render_as_string(hide_password=False)


def pg_admin(pg_dsn: str, sql: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)



def start(pm: ProcessManager, case: Refusal) -> ChildProcess:
    return pm.beat(case.name, env={"ELARION_BEAT_LOG_FORMAT": "text", **case.env},
                   scheduler="elarion", loglevel=case.loglevel)


def assert_refused(beat: ChildProcess, case: Refusal) -> None:
    """Exit code, exactly one CRITICAL line saying what and how to fix it, no traceback
    (but at DEBUG), never the password."""
    code = beat.wait(START_TIMEOUT)
    assert code == case.code, f"{case.name}: exit {code}, not {case.code}\n{beat.tail()}"
    out = beat.log()
    critical = [line for line in out.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1, f"{case.name}: {len(critical)} CRITICAL lines\n{beat.tail()}"
    assert "beat: cannot start: " in critical[0], critical[0]
    for words in case.says:
        assert words in critical[0], f"{case.name}: {words!r} not said in {critical[0]}"
    assert ("Traceback" in out) is (case.loglevel == "DEBUG"), f"{case.name}\n{beat.tail()}"
    assert "WARNING/MainProcess" not in out, f"{case.name}: a redirected traceback\n{out}"
    assert "beat raised exception" not in out and "Sending due task" not in out
    assert SECRET not in out, f"{case.name} printed the password"


@pytest.mark.postgres
def test_a_wrong_setting_or_entry_exits_78_with_one_critical_line(
        pm: ProcessManager, pg_dsn: str, table_name: str) -> None:
    """No DSN, a bad value, a malformed DSN, an unknown choice, an unknown option value
    of an entry; the DEBUG run also prints the traceback."""
    dsn = {"ELARION_BEAT_DSN": with_password(pg_dsn), "ELARION_BEAT_TABLE": table_name}
    timeout = "elarion_beat_claim_timeout must be a number of seconds, not 'abc'"
    cases = [
        Refusal("no-dsn", {}, EXIT_CONFIG,
                ("elarion_beat_dsn is not set", "ELARION_BEAT_DSN",
                 "postgresql://user:password@host:5432/dbname")),
        Refusal("bad-value", {**dsn, "ELARION_BEAT_CLAIM_TIMEOUT": "abc"}, EXIT_CONFIG,
                (timeout,)),
        Refusal("bad-value-debug", {**dsn, "ELARION_BEAT_CLAIM_TIMEOUT": "abc"}, EXIT_CONFIG,
                (timeout,), loglevel="DEBUG"),
        Refusal("malformed-dsn", {"ELARION_BEAT_DSN": f"postgresql://u:{SECRET}@host:port/x"},
                EXIT_CONFIG, ("elarion_beat_dsn has a port that is not a number",)),
        Refusal("unknown-choice", {**dsn, "ELARION_BEAT_STARTUP_ERRORS": "sometimes"},
                EXIT_CONFIG, ("elarion_beat_startup_errors must be one of 'refuse', "
                              "'fail_closed', not 'sometimes'",)),
        Refusal("unknown-option", {**dsn, "ELARION_STARTUP_SCHEDULE": "bad-option"},
                EXIT_CONFIG, (f"beat_schedule entry '{BAD_OPTION}' has options['placement'] "
                              "= 'everywhere'; use one of 'cluster', 'every_node'",)),
    ]
    beats = {case.name: start(pm, case) for case in cases}
    for case in cases:
        assert_refused(beats[case.name], case)


@pytest.mark.postgres
def test_a_database_that_refuses_the_node_exits_77_naming_the_fix(
        pm: ProcessManager, pg_dsn: str, table_name: str, run: str) -> None:
    """No such database, no such role, no right to create the table in the schema
    (PostgreSQL here trusts every password from 127.0.0.1: a wrong password is proven
    on MariaDB below)."""
    role = f"elarion_noperm_{run}"
    pg_admin(pg_dsn, f"CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'")  # no CREATE on public
    try:
        table = {"ELARION_BEAT_TABLE": table_name}
        cases = [
            Refusal("no-database", {"ELARION_BEAT_DSN": with_password(
                pg_dsn, database=f"elarion_nodb_{run}"), **table}, EXIT_REFUSED,
                ("postgresql+psycopg://postgres:***@", f'database "elarion_nodb_{run}" does not '
                 "exist", "create the database, or fix its name in elarion_beat_dsn")),
            Refusal("no-role", {"ELARION_BEAT_DSN": with_password(
                pg_dsn, username=f"elarion_norole_{run}"), **table}, EXIT_REFUSED,
                (f'role "elarion_norole_{run}" does not exist', "create the role")),
            Refusal("no-permission", {"ELARION_BEAT_DSN": with_password(
                pg_dsn, username=role), **table}, EXIT_REFUSED,
                ("permission denied for schema public", "grant the role the rights beat needs")),
        ]
        beats = {case.name: start(pm, case) for case in cases}
        for case in cases:
            assert_refused(beats[case.name], case)
    finally:
        pg_admin(pg_dsn, f"DROP ROLE IF EXISTS {role}")


@pytest.mark.postgres
def test_an_outage_and_fail_closed_start_and_keep_running(
        pm: ProcessManager, pg_dsn: str, table_name: str, run: str) -> None:
    """Connection refused (an outage) starts fail-closed; so does a missing database with
    elarion_beat_startup_errors = fail_closed. Each logs the outage once, skips the
    entry's occurrences (claim-error) and stays up. ``elarion-beat status`` against the
    closed port prints one line and exits 1."""
    env = {"ELARION_BEAT_LOG_FORMAT": "json", "ELARION_BEAT_TABLE": table_name}
    closed = with_password(pg_dsn, port=free_port())
    status = pm.celery("status", ["elarion-beat", "status"], env={"ELARION_BEAT_DSN": closed})
    beats = {
        "refused-port": pm.beat("refused-port", env={**env, "ELARION_BEAT_DSN": closed}),
        "fail-closed": pm.beat("fail-closed", env={
            **env, "ELARION_BEAT_STARTUP_ERRORS": "fail_closed",
            "ELARION_BEAT_DSN": with_password(pg_dsn, database=f"elarion_nodb_{run}")}),
    }
    for name, beat in beats.items():
        error = beat.wait_for_record({"action": "claims-unavailable"}, START_TIMEOUT)
        assert error["level"] == "ERROR" and "***@" in error["message"], error
        beat.wait_ready(lambda b=beat: len(b.records(action="skipped", reason="claim-error"))
                        >= 3, START_TIMEOUT, "three claim-error skips")
        assert beat.alive(), beat.tail()
        assert len(beat.records(action="claims-unavailable")) == 1, beat.tail()
        assert not beat.records(level="CRITICAL"), beat.tail()
        assert SECRET not in beat.log(), f"{name} printed the password"
    refused = beats["fail-closed"].records(action="claims-unavailable")[0]
    assert f'database "elarion_nodb_{run}" does not exist' in refused["message"]
    # the CLI says it on one line (libpq's message spans two), exit 1
    assert status.wait(START_TIMEOUT) == 1, status.tail()
    lines = [line for line in status.log().splitlines() if line.strip()]
    assert len(lines) == 1 and "Connection refused" in lines[0], status.log()


@pytest.mark.mysql
def test_a_wrong_password_exits_77_and_the_cli_says_it_in_one_line(
        pm: ProcessManager, mysql_dsn: str, run: str) -> None:
    """MariaDB checks passwords: beat exits 77 naming the DSN to fix; ``elarion-beat
    status`` with the same DSN prints one line and exits 1."""
    user = f"elarion_pw_{run}"
    url = make_url(mysql_dsn)
    admin = pymysql.connect(host=url.host, port=url.port or 3306, user=url.username,
                            password=url.password or "", database=url.database, autocommit=True)
    try:
        admin.cursor().execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'right-{SECRET}'")
        wrong = with_password(mysql_dsn, username=user)
        case = Refusal("wrong-password", {"ELARION_BEAT_DSN": wrong}, EXIT_REFUSED,
                       ("mysql+pymysql://" + user + ":***@", "check the user and password in "
                        "elarion_beat_dsn", f"Access denied for user '{user}'"))
        beat = start(pm, case)
        status = pm.celery("status", ["elarion-beat", "status"],
                           env={"ELARION_BEAT_DSN": wrong})
        assert_refused(beat, case)
        assert status.wait(START_TIMEOUT) == 1, status.tail()
        lines = [line for line in status.log().splitlines() if line.strip()]
        assert len(lines) == 1 and "Access denied" in lines[0], status.log()
        assert SECRET not in status.log()
    finally:
        admin.cursor().execute(f"DROP USER IF EXISTS '{user}'@'%'")
        admin.close()
