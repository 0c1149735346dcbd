"""`celery elarion-beat catch-up --dry-run` and the orphans in `status`, on the real
PostgreSQL server (click runner over the ops app)."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg

from celery_elarion_beat import ClaimRequest, slot_task_id
from celery_elarion_beat.schedules.slots import iso, name_occurrence
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.operate import proj_ops
from tests.operate.support import invoke


def claim_report_slots_ago(store: PostgresClaimStore, minutes: int) -> list[str]:
    """Claim the every-minute "report" slot *minutes* ago; return the slots since (ISO)."""
    now = store.clock()
    sched = proj_ops.app.conf.beat_schedule["report"]["schedule"]
    last = name_occurrence("report", sched, now - timedelta(minutes=minutes), tolerance=0).slot
    assert last is not None
    store.claim("node-a", [ClaimRequest.for_slot("report", last, slot_task_id("report", last))])
    return [iso(last + timedelta(minutes=k)) for k in range(1, minutes + 1)
            if last + timedelta(minutes=k) <= now]


def preview(*args: str) -> dict[str, dict]:
    code, out = invoke("catch-up", "--dry-run", "--json", *args)
    assert code == 0, out
    return {row["job"]: row for row in json.loads(out)["entries"]}


def test_catch_up_needs_dry_run(ops_env: dict) -> None:
    code, out = invoke("catch-up")
    assert code == 2 and "--dry-run" in out and "beat replays missed slots itself" in out


def test_the_preview_lists_missed_slots_and_what_each_policy_replays(
        ops_env: dict, store: PostgresClaimStore) -> None:
    missed = claim_report_slots_ago(store, 5)
    rows = preview()
    report = rows["report"]
    assert report["catch_up"] == "skip" and report["replay"] == []
    assert sorted(report["missed"]) == missed and len(missed) == 5
    assert "tick" in rows and rows["tick"]["last_claim"] is None  # never claimed: nothing
    assert preview("--policy", "latest")["report"]["replay"] == [missed[-1]]
    assert preview("--policy", "all")["report"]["replay"] == missed[-report["max"]:]
    code, out = invoke("catch-up", "--dry-run", "--policy", "all")
    assert code == 0 and "report" in out and "all (at most 10) within 1h" in out, out


def test_an_interval_preview_counts_from_its_last_claim(ops_env: dict,
                                                       store: PostgresClaimStore) -> None:
    store.claim("node-a", [ClaimRequest.for_window("poll", timedelta(seconds=1), "p-1")])
    (claim,) = store.find_claims(job="poll")
    row = preview()["poll"]
    assert row["next_run"] == iso(claim.occurrence + timedelta(seconds=2))


def test_an_orphan_makes_status_fail_and_is_listed(ops_env: dict, pg_dsn: str,
                                                  table_name: str,
                                                  store: PostgresClaimStore) -> None:
    claim_report_slots_ago(store, 0)  # claimed just now, never published: in flight
    code, out = invoke("status", "--json")
    (entry,) = [e for e in json.loads(out)["entries"] if e["name"] == "report"]
    assert len(entry["unpublished"]) == 1 and entry["orphaned"] == []
    assert entry["catch_up"] == "skip" and entry["delivery"] == "at_most_once"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # ... for longer than 30 s
        conn.execute(f'UPDATE "{table_name}" SET claimed_at = claimed_at - interval \'1 min\'')
    code, out = invoke("status")
    assert code == 1 and "ORPHANED" in out and "UNHEALTHY" in out, out
    code, out = invoke("status", "--json")
    (entry,) = [e for e in json.loads(out)["entries"] if e["name"] == "report"]
    assert len(entry["orphaned"]) == 1 and entry["unpublished"] == []
