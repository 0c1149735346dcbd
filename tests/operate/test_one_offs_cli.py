"""``celery -A proj elarion-beat one-offs list|show|cancel`` on the real PostgreSQL server.

The one-offs are written with ``schedule_once`` on the ops app (pointed at this test's
own table by ``ops_env``) and leased/finished through the store as a beat node would;
the CLI runs through celery's own click entry point, and once as a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from celery_elarion_beat import OneOff, OneOffState, schedule_once
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.testing._harness import clean_env
from tests.operate import proj_ops
from tests.operate.support import invoke

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).parents[2]
LEASE = timedelta(seconds=60)


def _schedule(*args: object, **kw: object) -> OneOff:
    return schedule_once(proj_ops.app, "ops.report", args, **kw)  # type: ignore[arg-type]


def _lease_due(store: PostgresClaimStore, node: str = "node-x") -> list[str]:
    return [leased.id for leased in store.lease_one_offs(node, limit=100, lease=LEASE)]


def test_list_shows_each_one_off_filters_by_state_and_limits(
        ops_env: dict[str, str], store: PostgresClaimStore) -> None:
    soon = _schedule(1, countdown=600, key="order-1")
    later = _schedule(2, countdown=1200)
    gone = _schedule(3, countdown=900)
    store.cancel_one_off(gone.id)

    code, out = invoke("one-offs", "list")
    assert code == 0, out
    cluster, *lines = out.splitlines()
    assert cluster == "cluster: default"
    assert lines[0].split()[:5] == ["id", "key", "task", "due", "state"]
    body = {line.split()[0]: line for line in lines[2:]}
    assert set(body) == {soon.id, later.id, gone.id}
    assert "order-1" in body[soon.id] and "scheduled" in body[soon.id]
    assert "cancelled" in body[gone.id]
    # latest due first
    assert [line.split()[0] for line in lines[2:]] == [later.id, gone.id, soon.id]

    code, out = invoke("one-offs", "list", "--state", "scheduled", "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["state"], r["key"]) for r in rows] == [
        (later.id, "scheduled", None), (soon.id, "scheduled", "order-1")]
    assert rows[1]["task"] == "ops.report" and rows[1]["due"].startswith(
        soon.due.strftime("%Y-%m-%dT%H:%M:%S"))

    code, out = invoke("one-offs", "list", "--state", "cancelled", "--state", "scheduled",
                       "--limit", "2", "--json")
    assert code == 0, out
    assert [json.loads(line)["id"] for line in out.splitlines()] == [later.id, gone.id]

    code, out = invoke("one-offs", "list", "--state", "nonsense")
    assert code == 2 and "nonsense" in out


def test_show_finds_a_one_off_by_id_or_key(ops_env: dict[str, str],
                                           store: PostgresClaimStore) -> None:
    one = _schedule("a", countdown=600, key="welcome-42", options={"priority": 3})
    code, out = invoke("one-offs", "show", "welcome-42", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert (shown["id"], shown["key"], shown["state"], shown["attempts"]) == (
        one.id, "welcome-42", "scheduled", 0)
    assert shown["options"] == {"priority": 3}
    assert "args" not in shown and "payload" not in shown

    code, out = invoke("one-offs", "show", one.id)
    assert code == 0, out
    fields = dict(line.split(None, 1) for line in out.splitlines() if " " in line.strip())
    assert fields["id"] == one.id and fields["state"] == "scheduled"
    assert fields["task"] == "ops.report"

    code, out = invoke("one-offs", "show", "no-such-key")
    assert code == 1 and "no one-off with id or key 'no-such-key'" in out


def test_cancel_wins_before_the_lease_and_is_refused_after(
        ops_env: dict[str, str], store: PostgresClaimStore) -> None:
    waiting = _schedule(countdown=600)
    code, out = invoke("one-offs", "cancel", waiting.id)
    assert code == 0, out
    assert f"cancelled one-off {waiting.id}" in out
    assert store.one_offs(id_or_key=waiting.id)[0].state is OneOffState.CANCELLED

    due = _schedule(countdown=0, key="due-now")
    assert due.id in _lease_due(store, "node-x")
    code, out = invoke("one-offs", "cancel", "due-now")
    assert code == 1, out
    assert f"too late: one-off {due.id} (ops.report) is leased by node-x" in out
    assert store.one_offs(id_or_key=due.id)[0].state is OneOffState.LEASED

    store.finish_one_offs("node-x", published=[due.id], failed={})
    code, out = invoke("one-offs", "cancel", due.id)
    assert code == 1 and "is published by node-x" in out

    code, out = invoke("one-offs", "cancel", "no-such-one-off")
    assert code == 1 and "no one-off with id or key 'no-such-one-off'" in out


def test_cancel_as_a_real_subprocess_exit_codes(ops_env: dict[str, str],
                                                store: PostgresClaimStore) -> None:
    one = _schedule(countdown=600)

    def cancel(what: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.operate.proj_ops", "elarion-beat",
             "one-offs", "cancel", what], cwd=ROOT, env=clean_env(ops_env),
            capture_output=True, text=True, timeout=120)

    done = cancel(one.id)
    assert done.returncode == 0, done.stderr
    assert store.one_offs(id_or_key=one.id)[0].state is OneOffState.CANCELLED
    missing = cancel("nothing-here")
    assert missing.returncode == 1
    assert "no one-off with id or key 'nothing-here'" in missing.stderr


def test_purge_deletes_finished_one_offs_older_than_the_retention(
        ops_env: dict[str, str], store: PostgresClaimStore, pg_dsn: str) -> None:
    old_sent, old_gone, fresh = (_schedule(i, countdown=0) for i in range(3))
    assert set(_lease_due(store)) == {old_sent.id, old_gone.id, fresh.id}
    store.finish_one_offs("node-x", published=[old_sent.id, fresh.id], failed={
        old_gone.id: "task 'x' is not registered in app 'y'"})
    waiting = _schedule(countdown=600)
    old_waiting = _schedule(countdown=0)
    table = store.settings.one_offs_table
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # age the rows by 8 days
        conn.execute(f'UPDATE "{table}" SET finished_at = finished_at - interval \'8 days\', '
                     f'created_at = created_at - interval \'8 days\', '
                     f'due_utc = due_utc - interval \'8 days\' WHERE id <> %s',
                     (fresh.id,))

    code, out = invoke("purge", "--older-than", "7d", "--dry-run")
    assert code == 0 and "would delete 2 one-offs finished more than 7d ago" in out, out
    assert len(store.one_offs(limit=10)) == 5

    code, out = invoke("purge", "--older-than", "7d")
    assert code == 0, out
    assert "deleted 2 one-offs finished more than 7d ago" in out
    left = {o.id for o in store.one_offs(limit=10)}
    # the fresh one, and the unfinished ones however old
    assert left == {fresh.id, waiting.id, old_waiting.id}
