"""The PostgreSQL claim statement: its SQL, its parameters, and how each row it
returns answers a request (:class:`~.postgres.PostgresClaimStore` sends it).

The statements are templates: ``{table}`` (and ``{pauses}``) are filled with the
quoted table names once per store; the values travel as arrays (``unnest``), one
element per request, and the store's cluster as ``%(cluster)s``: every row read or
written is one of its cluster (the first column of every key).

The claim's ``ON CONFLICT DO NOTHING`` names no conflict target: it holds on the key
``(cluster, job_name, occurrence_utc)``, and on the key of a table of 0.2
(``(job_name, occurrence_utc)``) until ``init-db`` swaps it, while nodes of 0.2 still
claim in it (they name that key as their target, so it must stay until then).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..schedules.clock import as_utc
from .control_records import Pause
from .records import ClaimRequest, ClaimResult, PublishReport
from .states import PENDING, SKIPPED

__all__ = ["CLAIM_SQL", "GUARDED_CLAIM_SQL", "LOCK_SQL", "LOOKUP_SQL", "REPORT_SQL",
           "VERSIONS_LOCK_SQL", "claim_params", "claim_result", "guarded", "lock_namespace",
           "pause_of", "report_params"]


#: The window locks: each namespace of ``%(ns)s`` in turn (the cluster's; first the
#: table's, as 0.2 takes it, while the table may have nodes of 0.2), each job's key in
#: key order, so two nodes never deadlock.
LOCK_SQL = """
SELECT count(pg_advisory_xact_lock(ns, k)) FROM (
    SELECT n.ns, k.k FROM unnest(%(ns)s::int[]) WITH ORDINALITY AS n(ns, o)
    CROSS JOIN (SELECT DISTINCT hashtext(j) AS k FROM unnest(%(jobs)s::text[]) AS j) AS k
    ORDER BY n.o, k.k OFFSET 0
) AS keys
"""

_INPUT = """
input AS (
    SELECT t.ord, t.job_name, t.kind, t.slot, t.window_s, t.task_id, t.state, t.overlap_s,
           t.pending_s, t.lead_s
    FROM unnest(%(jobs)s::text[], %(kinds)s::text[], %(slots)s::timestamptz[],
                %(windows)s::float8[], %(task_ids)s::text[], %(states)s::text[],
                %(overlaps)s::float8[], %(pendings)s::float8[], %(leads)s::float8[])
         WITH ORDINALITY AS t(job_name, kind, slot, window_s, task_id, state, overlap_s,
                              pending_s, lead_s, ord)
)"""

_INPUT_GUARDED = """
input AS (
    SELECT t.ord, t.job_name, t.kind, t.slot, t.window_s, t.task_id, t.state, t.overlap_s,
           t.pending_s, t.lead_s, t.revision
    FROM unnest(%(jobs)s::text[], %(kinds)s::text[], %(slots)s::timestamptz[],
                %(windows)s::float8[], %(task_ids)s::text[], %(states)s::text[],
                %(overlaps)s::float8[], %(pendings)s::float8[], %(leads)s::float8[],
                %(revisions)s::bigint[])
         WITH ORDINALITY AS t(job_name, kind, slot, window_s, task_id, state, overlap_s,
                              pending_s, lead_s, revision, ord)
)"""

#: Where a window ends: its length back from the clock. The clock is read in a
#: sub-select, one value for the whole statement (read after the advisory lock):
#: clock_timestamp() itself is volatile, so it could not bound an index scan, and
#: each window check would read every claim the job ever made (at 10 million rows,
#: 1,000 per job, a chunk took seconds instead of milliseconds).
_WINDOW_START = "((SELECT clock_timestamp()) - make_interval(secs => i.window_s))"

#: An exact slot whose claim comes too early: more than its lead ahead of the database
#: clock (the claiming node's clock runs ahead; see ClaimRequest.lead).
_EARLY = ("(i.kind = 'slot' AND i.lead_s IS NOT NULL"
          " AND i.slot > (SELECT clock_timestamp()) + make_interval(secs => i.lead_s))")

#: The claim that holds a request's occurrence: the slot's row (a primary-key look-up)
#: or the newest claim inside the window (a backward scan of the key, bounded by the
#: window's start).
_HELD = """
LEFT JOIN LATERAL (
    SELECT p.node, p.task_id, p.occurrence_utc, p.claim_token, p.state, p.publish_error
    FROM {table} AS p
    WHERE {condition} AND p.cluster = %(cluster)s AND p.job_name = i.job_name
      AND p.occurrence_utc BETWEEN
          CASE WHEN i.kind = 'slot' THEN i.slot ELSE """ + _WINDOW_START + """ END
          AND CASE WHEN i.kind = 'slot' THEN i.slot ELSE 'infinity'::timestamptz END
      AND (i.kind = 'slot'
        OR (p.kind <> 'manual' AND p.occurrence_utc > """ + _WINDOW_START + """))
    ORDER BY p.occurrence_utc DESC LIMIT 1
) AS held ON true"""

#: ``overlap: skip``: the newest unfinished run of the job (see OverlapRule.blocks),
#: found through ix_<table>_job_claimed; only for requests with an overlap rule. The
#: bound reads the clock in a sub-select, a value for the whole statement: with
#: clock_timestamp() itself (volatile) it could not be an index condition, and the
#: scan would read every claim of the job.
_RUNNING = """
LEFT JOIN LATERAL (
    SELECT r.occurrence_utc FROM {table} AS r
    WHERE i.overlap_s IS NOT NULL AND r.cluster = %(cluster)s AND r.job_name = i.job_name
      AND r.claimed_at > (SELECT clock_timestamp()) - make_interval(secs => i.overlap_s)
      AND r.kind <> 'node'
      AND ((r.state = 'pending'
            AND r.claimed_at > clock_timestamp() - make_interval(secs => i.pending_s))
        OR (r.state = 'published' AND (r.run_state IS NULL
                                       OR r.run_state IN ('running', 'retried'))))
    ORDER BY r.claimed_at DESC LIMIT 1
) AS run ON true"""

#: ``elarion-beat pause``: the pause in force of the job (its own before the pause of
#: every job, whose name '' sorts first); never of an untracked claim (the purge election).
_PAUSED = """
LEFT JOIN LATERAL (
    SELECT z.job_name, z.paused_at, z.paused_by, z.reason, z.until_utc FROM {pauses} AS z
    WHERE i.state IS NOT NULL AND z.cluster = %(cluster)s AND z.job_name IN (i.job_name, '')
      AND (z.until_utc IS NULL OR z.until_utc > clock_timestamp())
    ORDER BY z.job_name DESC LIMIT 1
) AS pz ON true"""

#: A database entry's claim (a revision given): stale unless its revision governs the
#: occurrence, the latest written of the entry's revisions effective at or before it
#: (a window's: the clock). Read after VERSIONS_LOCK_SQL: an edit in flight commits
#: first (and is seen, a statement of its own), one that comes later is effective later.
_STALE = """
    CASE WHEN i.revision IS NULL THEN false
         ELSE i.revision IS DISTINCT FROM (
             SELECT g.revision FROM {revisions} AS g
             WHERE g.cluster = %(cluster)s AND g.name = i.job_name
               AND g.effective_at <= CASE WHEN i.kind = 'slot' THEN i.slot
                                          ELSE clock_timestamp() END
             ORDER BY g.revision DESC LIMIT 1)
    END"""

#: Locks the version row of the cluster whose entries a claim checks (FOR SHARE: the
#: claims of every node share it; a write of the entries waits for them, and they for it).
VERSIONS_LOCK_SQL = """
SELECT count(*) FROM (SELECT 1 FROM {versions} WHERE cluster = %(cluster)s FOR SHARE) AS locked
"""


def _claim_sql(guarded: bool) -> str:
    """The claim statement; *guarded*: with the revision check of database entries (only
    then does it read the revisions table and write the claims' ``revision``)."""
    source = "input" if not guarded else "checked"
    checked = "" if not guarded else (
        ",\nchecked AS (\n    SELECT i.*, " + _STALE + " AS stale\n    FROM input AS i\n)")
    column = ", revision" if guarded else ""
    value = ", i.revision" if guarded else ""
    fresh = "NOT i.stale AND " if guarded else ""
    stale = "i.stale" if guarded else "false"
    return ("WITH " + (_INPUT_GUARDED if guarded else _INPUT) + checked + """,
decided AS (
    SELECT i.*, run.occurrence_utc AS blocker, pz.job_name AS p_job, pz.paused_at AS p_at,
           pz.paused_by AS p_by, pz.reason AS p_reason, pz.until_utc AS p_until
    FROM """ + source + """ AS i""" + _RUNNING + _PAUSED + """
),
inserted AS (
    INSERT INTO {table} AS c (cluster, job_name, occurrence_utc, node, task_id, kind,
                              claimed_at, claim_token, state, publish_error""" + column + """)
    SELECT %(cluster)s, i.job_name,
           CASE WHEN i.kind = 'window' THEN clock_timestamp() ELSE i.slot END,
           %(node)s, i.task_id, i.kind, clock_timestamp(), %(token)s,
           CASE WHEN i.p_at IS NOT NULL OR i.blocker IS NOT NULL THEN 'skipped'
                ELSE i.state END,
           CASE WHEN i.p_at IS NOT NULL THEN 'paused'
                WHEN i.blocker IS NOT NULL THEN 'still-running' END""" + value + """
    FROM decided AS i
    WHERE """ + fresh + """NOT """ + _EARLY + """ AND (i.kind = 'slot'
       OR NOT EXISTS (
            SELECT 1 FROM {table} AS p
            WHERE p.cluster = %(cluster)s AND p.job_name = i.job_name AND p.kind <> 'manual'
              AND p.occurrence_utc > """ + _WINDOW_START + """))
    ORDER BY i.job_name, i.slot
    ON CONFLICT DO NOTHING
    RETURNING c.job_name, c.occurrence_utc, c.task_id, c.state, c.publish_error
)
SELECT i.ord, ins.occurrence_utc IS NOT NULL,
       COALESCE(ins.occurrence_utc, held.occurrence_utc, i.slot), held.node, held.task_id,
       held.claim_token, COALESCE(ins.state, held.state), i.blocker,
       COALESCE(ins.publish_error, held.publish_error), i.p_job, i.p_at, i.p_by, i.p_reason,
       i.p_until, """ + stale + """, """ + _EARLY + """
FROM decided AS i
LEFT JOIN inserted AS ins ON ins.job_name = i.job_name AND ins.task_id = i.task_id
""" + _HELD.replace("{condition}", "ins.occurrence_utc IS NULL") + """
ORDER BY i.ord
""")


CLAIM_SQL = _claim_sql(guarded=False)
GUARDED_CLAIM_SQL = _claim_sql(guarded=True)

LOOKUP_SQL = "WITH " + _INPUT + """
SELECT i.ord, false, COALESCE(held.occurrence_utc, i.slot), held.node, held.task_id,
       held.claim_token, held.state, NULL::timestamptz, held.publish_error, pz.job_name,
       pz.paused_at, pz.paused_by, pz.reason, pz.until_utc, false, false
FROM input AS i
""" + _HELD.replace("{condition}", "true") + _PAUSED + """
ORDER BY i.ord
"""


def guarded(requests: Sequence[ClaimRequest]) -> bool:
    """Whether a claim of *requests* checks revisions (one of them is a database entry's)."""
    return any(r.revision is not None for r in requests)


#: Publish reports, one statement for a whole chunk: by primary key, and only
#: rows still pending under the reporting call's token.
REPORT_SQL = """
UPDATE {table} AS c
SET state = CASE WHEN u.error IS NULL THEN 'published' ELSE 'failed' END,
    published_at = CASE WHEN u.error IS NULL THEN clock_timestamp() END,
    publish_error = u.error
FROM unnest(%(r_jobs)s::text[], %(r_occurrences)s::timestamptz[], %(r_tokens)s::text[],
            %(r_errors)s::text[]) AS u(job_name, occurrence_utc, token, error)
WHERE c.cluster = %(r_cluster)s AND c.job_name = u.job_name
  AND c.occurrence_utc = u.occurrence_utc AND c.claim_token = u.token AND c.state = 'pending'
"""


def lock_namespace(qualified_table: str, cluster: str | None = None) -> int:
    """The first key of the advisory locks: a signed int32 from the table name (the
    DDL lock, and the locks of 0.2), or from the table and *cluster* (the window and
    control locks of one cluster)."""
    name = f"celery_elarion_beat:{qualified_table}"
    if cluster is not None:
        name += f"\x00{cluster}"
    crc = zlib.crc32(name.encode())
    return (crc ^ 0x80000000) - 0x80000000


def claim_params(node: str, requests: Sequence[ClaimRequest], token: str,
                 cluster: str) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": node,
        "token": token,
        "jobs": [r.job for r in requests],
        "kinds": [r.kind.value for r in requests],
        "slots": [r.slot for r in requests],
        "windows": [r.window.total_seconds() if r.window is not None else None for r in requests],
        "task_ids": [r.task_id for r in requests],
        "states": [PENDING if r.tracked else None for r in requests],
        "overlaps": [r.overlap.timeout.total_seconds() if r.overlap else None for r in requests],
        "pendings": [r.overlap.pending.total_seconds() if r.overlap else None for r in requests],
        "revisions": [r.revision for r in requests],
        "leads": [r.lead.total_seconds() if r.lead is not None else None for r in requests],
    }


def report_params(reports: Sequence[PublishReport], cluster: str) -> dict[str, Any]:
    return {
        "r_cluster": cluster,
        "r_jobs": [r.job for r in reports],
        "r_occurrences": [r.occurrence for r in reports],
        "r_tokens": [r.token for r in reports],
        "r_errors": [r.error for r in reports],
    }


def claim_result(request: ClaimRequest, node: str, row: tuple[Any, ...], token: str) -> ClaimResult:
    """Won if this statement inserted the row, or (on the retry after a lost reply)
    if the row carries this call's token: the first attempt inserted it. A row of
    another process under the same node name, with the same slot task id, carries
    another token and is a loss. A row stored ``skipped`` (by this call or another)
    is the cluster's decision that the job's previous run is still running."""
    (_, inserted, occurrence, holder, holder_task, holder_token, state, blocker, why,
     *paused, stale, early) = row
    if early:
        return ClaimResult.refused_early(request)
    if stale:
        return ClaimResult.refused_stale(request)
    occurrence = as_utc(occurrence) if occurrence is not None else None
    skipped = state == SKIPPED
    blocker = as_utc(blocker) if blocker is not None else None
    pause = pause_of(*paused)
    if skipped:
        if inserted:
            return ClaimResult.skipped(request, occurrence, node, request.task_id, why,
                                       blocker, pause)
        return ClaimResult.skipped(request, occurrence, holder, holder_task, why, pause=pause)
    if inserted:
        return ClaimResult(request, True, occurrence, node, request.task_id, token=token)
    mine = holder_token == token
    return ClaimResult(request, mine, occurrence, holder, holder_task,
                       token=token if mine else None)


def pause_of(job: str | None, at: datetime | None, by: str | None, reason: str | None,
           until: datetime | None) -> Pause | None:
    if at is None or job is None:
        return None
    return Pause(job, as_utc(at), by or "", reason or "", as_utc(until) if until else None)
