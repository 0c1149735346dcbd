"""The CLI a person reads, driven as a person runs it: real ``celery -A app elarion-beat
...`` processes on pseudo-terminals (stdout and stderr each a terminal of its own,
Ctrl-C typed on the terminal), and through a pipe, against the real PostgreSQL.

* ``purge`` on a terminal shows, on stderr and redrawn in place, the rows deleted of
  about how many, the rate and the time left; through a pipe or with ``--json`` it
  prints only its summary; Ctrl-C stops it between two batches, saying what it
  deleted (exit 130).
* ``init-db`` on a big table of an older version shows each upgrade (and PostgreSQL's
  count of the index build), and finishes however long an index takes.
* Every command writes durations as people write them (``7d``, ``1h30m``), never
  ``7 days, 0:00:00`` or ``0:01:00``.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState
from celery_elarion_beat.testing._harness import (
    ProcessManager,
    TerminalProcess,
    frames,
    plain,
)
from tests.operate.support import invoke, settings_for

APP = "tests.operate.proj_ops"
#: What Python prints for a timedelta, which a person never reads from us.
TIMEDELTA_TEXT = re.compile(r"\d+ days?, \d+:\d\d|(?:than|within|interval|every|for|after|;) "
                            r"\d+:\d\d:\d\d")
#: Small batches (elarion_beat_purge_batch), so a purge of 200,000 rows takes a while.
BATCH_OF_1000 = {"ELARION_BEAT_PURGE_BATCH": "1000"}
BATCH_OF_2000 = {"ELARION_BEAT_PURGE_BATCH": "2000"}
PROGRESS = re.compile(r"^purging claims: [\d,]+ of ~[\d,]+ rows \(\d+%\), [\d,]+ rows/s, "
                      r"[\dhms]+ left$")


@pytest.fixture
def pm(tmp_path: Path, pg_dsn: str, table_name: str) -> Iterator[ProcessManager]:
    env = {"ELARION_OPS_DSN": pg_dsn, "ELARION_OPS_TABLE": table_name,
           "TERM": "xterm-256color", "COLUMNS": "200"}
    with ProcessManager(tmp_path / "procs", APP, env) as manager:
        yield manager


@pytest.fixture
def store(pg_dsn: str, table_name: str) -> Iterator[PostgresClaimStore]:
    s = PostgresClaimStore(settings_for(pg_dsn, table_name))
    s.create_schema()
    yield s
    s.close()


def fill(pg_dsn: str, table: str, rows: int, days_old: int = 30, jobs: int = 20) -> None:
    """*rows* claims of *jobs* jobs, all claimed *days_old* days ago, in the run's cluster
    (tests/conftest.py pins it for the CLI processes too)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{table}" (cluster, job_name, occurrence_utc, node, task_id, kind, '
            "claimed_at, state) SELECT %s, 'job-' || (g %% %s), now() - make_interval(days => "
            "%s) - g * interval '1 second', 'node-a', 'task-' || g, 'slot', "
            "now() - make_interval(days => %s), 'published' FROM generate_series(1, %s) g",
            (DEFAULT_CLUSTER, jobs, days_old, days_old, rows))
        conn.execute(f'ANALYZE "{table}"')


def count(pg_dsn: str, table: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    assert row is not None
    return int(row[0])


def run(pm: ProcessManager, name: str, *args: str, stdout_tty: bool = True,
        env: dict[str, str] | None = None) -> TerminalProcess:
    return pm.celery(name, ["elarion-beat", *args], env=env, kind=TerminalProcess,
                     stdout_tty=stdout_tty)


def finished(process: TerminalProcess, timeout: float = 120) -> int:
    code = process.finish(timeout)
    assert code is not None, process.tail()
    return code


def lines(text: str) -> list[str]:
    return [line for line in plain(text).splitlines() if line.strip()]


# -- purge ---------------------------------------------------------------------------


def test_purge_on_a_terminal_shows_rows_rate_and_time_left_then_its_summary(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    fill(pg_dsn, table_name, 200_000)
    purge = run(pm, "purge", "purge", env=BATCH_OF_2000)
    assert finished(purge) == 0, purge.tail()
    drawn = frames(purge.stderr())
    assert any(PROGRESS.match(line) for line in drawn), drawn[:5]
    assert all(line.startswith(("purging claims: ", "purging one-offs: ")) for line in drawn)
    assert lines(purge.stderr()) == []  # redrawn in place, erased at the end
    summary = lines(purge.stdout())
    assert re.fullmatch(r"deleted 199980 claims older than 7d( in [\d.ms]+)?", summary[0]), summary
    assert summary[1:] == ["deleted 0 one-offs finished more than 7d ago"]
    assert count(pg_dsn, table_name) == 20  # each job's newest claim is kept


def test_purge_through_a_pipe_or_with_json_prints_only_its_summary(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    fill(pg_dsn, table_name, 5000, days_old=2)
    dry = run(pm, "dry", "purge", "--dry-run", "--older-than", "36h", stdout_tty=False)
    assert finished(dry) == 0, dry.tail()
    assert dry.stderr() == "" and lines(dry.stdout()) == [
        "would delete 4980 claims older than 1d12h",
        "would delete 0 one-offs finished more than 1d12h ago"]
    piped = run(pm, "piped", "purge", "--older-than", "36h", "--batch-size", "100",
                stdout_tty=False)
    assert finished(piped) == 0, piped.tail()
    assert piped.stderr() == "", "no progress when stdout is not a terminal"
    assert lines(piped.stdout())[0].startswith("deleted 4980 claims older than 1d12h")
    fill(pg_dsn, table_name, 3000, days_old=9)
    as_json = run(pm, "json", "purge", "--json", "--batch-size", "100")  # on terminals
    assert finished(as_json) == 0, as_json.tail()
    assert as_json.stderr() == "", "no progress with --json"
    report = json.loads(plain(as_json.stdout()))
    assert report == {**report, "claims": 3000, "one_offs": 0, "older_than": 604800.0,
                      "dry_run": False, "interrupted": False, "complete": True}
    assert isinstance(report["seconds"], float)


def test_ctrl_c_stops_the_purge_between_two_batches_and_says_what_it_deleted(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    fill(pg_dsn, table_name, 200_000)
    purge = run(pm, "purge", "purge", env=BATCH_OF_1000)
    purge.wait_ready(lambda: any(PROGRESS.match(line) for line in frames(purge.stderr())), 60,
                     "drawing its progress")
    purge.ctrl_c()
    assert finished(purge) == 130, purge.tail()
    left = count(pg_dsn, table_name)
    deleted = 200_000 - left
    assert 0 < deleted < 199_980 and deleted % 1000 == 0, deleted  # whole batches only
    (summary,) = lines(purge.stdout().replace("^C", ""))
    assert re.fullmatch(rf"deleted {deleted} claims older than 7d( in [\d.ms]+)? \(stopped by "
                        rf"Ctrl-C; about {200_000 - deleted} left: run purge again to go on\)",
                        summary), summary


def test_sigint_stops_a_purge_in_a_pipe_and_its_summary_or_json_says_so(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    fill(pg_dsn, table_name, 200_000)
    purge = run(pm, "purge", "purge", stdout_tty=False, env=BATCH_OF_1000)
    purge.wait_ready(lambda: count(pg_dsn, table_name) < 195_000, 60, "deleting")
    purge.signal(signal.SIGINT)  # what a shell sends the pipeline's processes
    assert finished(purge) == 130, purge.tail()
    left = count(pg_dsn, table_name)
    deleted = 200_000 - left
    assert 0 < deleted < 199_980 and deleted % 1000 == 0, deleted
    assert re.fullmatch(rf"deleted {deleted} claims older than 7d( in [\d.ms]+)? \(stopped by "
                        r"Ctrl-C; .*\)\n", purge.stdout()), purge.stdout()
    assert purge.stderr() == ""

    as_json = run(pm, "json", "purge", "--json", "--batch-size", "1000", stdout_tty=False)
    as_json.wait_ready(lambda: count(pg_dsn, table_name) < left - 5000, 60, "deleting")
    as_json.signal(signal.SIGINT)
    assert finished(as_json) == 130, as_json.tail()
    report = json.loads(as_json.stdout())
    deleted = left - count(pg_dsn, table_name)
    assert report["interrupted"] is True and report["complete"] is False
    assert report["claims"] == deleted and deleted % 1000 == 0, (report, deleted)
    assert as_json.stderr() == ""


def test_a_purge_the_database_stops_says_what_it_deleted_before_the_error(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    fill(pg_dsn, table_name, 200_000)
    purge = run(pm, "purge", "purge", stdout_tty=False, env=BATCH_OF_1000)
    purge.wait_ready(lambda: count(pg_dsn, table_name) < 195_000, 60, "deleting")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the table goes away
        conn.execute(f'ALTER TABLE "{table_name}" RENAME TO "{table_name}_gone"')
    try:
        assert finished(purge) == 1, purge.tail()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{table_name}_gone" RENAME TO "{table_name}"')
    deleted = 200_000 - count(pg_dsn, table_name)
    assert re.fullmatch(rf"deleted {deleted} claims older than 7d( in [\d.ms]+)? \(stopped by "
                        r"the error below; about \d+ left: run purge again to go on\)\n",
                        purge.stdout()), purge.stdout()
    assert f"the claims table {table_name} is missing" in plain(purge.stderr()), purge.stderr()


# -- init-db -------------------------------------------------------------------------


def make_old(pg_dsn: str, table: str) -> None:
    """Make *table* look as an older version left it: no ``worker``/``run_error``
    columns, no index of unpublished claims, none of a job's recent claims."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP INDEX "ix_{table}_pending"')
        conn.execute(f'DROP INDEX "ix_{table}_job_claimed"')
        conn.execute(f'ALTER TABLE "{table}" DROP COLUMN worker, DROP COLUMN run_error')


def indexes(pg_dsn: str, table: str) -> set[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename "
                                           "= %s", (table,))}


def test_init_db_shows_each_upgrade_of_a_big_table_and_outlasts_the_claim_timeout(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    """1,000,000 rows: each index takes about a second to build, longer than the half
    second the claims connection gives a statement here. init-db shows which upgrade
    it is at and how far PostgreSQL got, and finishes."""
    make_old(pg_dsn, table_name)
    fill(pg_dsn, table_name, 1_000_000)
    init = run(pm, "init", "init-db", env={"ELARION_BEAT_CLAIM_TIMEOUT": "0.5"})
    assert finished(init, 300) == 0, init.tail()
    drawn = frames(init.stderr())
    assert all(line.startswith("upgrading the tables (") for line in drawn), drawn
    # the two index builds are steps 3 and 4; a stage shorter than a redraw (a tenth
    # of a second) may go undrawn, but not both builds of a million rows
    assert any(re.match(rf"upgrading the tables \([34] of 4\): creating index ix_{table_name}"
                        "_(pending|job_claimed)", line) for line in drawn), drawn
    assert any(re.search(r"[\d,]+ of [\d,]+ (blocks|tuples) \(\d+%\)", line)
               for line in drawn), drawn  # the server's count of the index build
    assert lines(init.stderr()) == []
    summary = lines(init.stdout())
    assert re.fullmatch(r"upgraded the tables of an older version: 4 changes in [\d.ms]+",
                        summary[0]), summary
    assert summary[1].startswith("ready: ")
    assert {f"ix_{table_name}_pending", f"ix_{table_name}_job_claimed"} <= indexes(
        pg_dsn, table_name)


def test_init_db_through_a_pipe_prints_only_its_summary(
        pm: ProcessManager, store: PostgresClaimStore, pg_dsn: str, table_name: str) -> None:
    make_old(pg_dsn, table_name)
    fill(pg_dsn, table_name, 1000)
    init = run(pm, "init", "init-db", stdout_tty=False)
    assert finished(init) == 0, init.tail()
    assert init.stderr() == ""
    summary = lines(init.stdout())
    assert summary[0].startswith("upgraded the tables of an older version: 4 changes in ")
    again = run(pm, "again", "init-db")  # up to date: nothing to show, nothing upgraded
    assert finished(again) == 0, again.tail()
    assert frames(again.stderr()) == [] and [line.split(":")[0] for line in lines(
        again.stdout())] == ["ready"]


# -- durations in every command -------------------------------------------------------

#: (command, what it must print: the durations as people write them)
COMMANDS = [
    (["catch-up", "--dry-run", "--policy", "all"], "all (at most 10) within 1h"),
    (["status", "--since", "3h", "--grace", "90"], "(UTC, database clock; 3h, grace 90s)"),
    (["status", "--since", "90m"], "(UTC, database clock; 1h30m, grace 1m)"),
    (["purge", "--dry-run", "--older-than", "2w"], "would delete 0 claims older than 14d"),
    (["preview", "--hours", "36"], "(1d12h), local times"),
    (["preview", "--hours", "1"], "poll: every 2s, window "),
    (["health", "--node", "node-t", "--max-age", "2m"], "old, within 2m (on the database "
                                                         "clock)"),
]


@pytest.mark.parametrize("on_terminal", [True, False], ids=["terminal", "pipe"])
@pytest.mark.parametrize(("args", "expected"), COMMANDS,
                         ids=[" ".join(args) for args, _ in COMMANDS])
def test_every_command_writes_durations_as_people_do(
        pm: ProcessManager, store: PostgresClaimStore, args: list[str], expected: str,
        on_terminal: bool) -> None:
    store.heartbeat(NodeState(node="node-t", boot_id="b", version="1", fingerprint="f"))
    process = run(pm, "cmd", *args, stdout_tty=on_terminal)
    assert finished(process) in (0, 1), process.tail()
    out = plain(process.stdout())
    assert expected in out, out
    assert not TIMEDELTA_TEXT.search(out), out
    assert frames(process.stderr()) == []  # quick: no progress line


@pytest.mark.parametrize("args", [["purge", "--older-than", "30m1h"], ["status", "--grace", "1q"],
                                  ["claims", "--since", "1q"], ["health", "--max-age", "2x"],
                                  ["pause", "report", "--for", "1h30"]])
def test_a_duration_it_cannot_read_names_the_option_and_how_to_write_one(
        ops_env: dict[str, str], args: list[str]) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert f"Invalid value for '{args[-2]}'" in out or f"{args[-2]} " in out, out
    assert "is not a duration; use e.g. 90s, 30m, 12h, 7d or 1h30m" in out, out
