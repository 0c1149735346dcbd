"""The CLI's text: tables of claims and of a reconciliation, times in UTC.

What ``celery elarion-beat claims`` and ``status --since`` print for a human (the
``--json`` forms carry the same fields); nothing here reads the store.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import click

from ..config.parsers import format_duration
from ..operate.reconcile import (
    COUNTERS,
    EVERY_NODE,
    INTERVAL,
    OTHER,
    EntryCount,
    Reconciliation,
)
from ..schedules.slots import iso
from ..store.records import ClaimRow

__all__ = ["claim_json", "claims_table", "print_reconciliation", "short", "table", "utc"]

#: Characters of a publish or run error a table shows (``--json`` has all of it).
ERROR_WIDTH = 40
#: Occurrences named per entry and finding under the reconciliation table.
SHOWN = 3


def utc(value: datetime | None) -> str:
    """``2026-11-29 03:00:00Z``, or ``-``."""
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def seconds(value: float | None, sign: bool = False) -> str:
    """A runtime or lateness to about two digits: ``250ms``, ``12s``, ``1h2m``
    (``+`` in front with *sign*), or ``-``."""
    if value is None:
        return "-"
    text = format_duration(value, approximate=True)
    return f"+{text}" if sign and value >= 0 else text


def short(text: str | None, most: int = ERROR_WIDTH) -> str:
    """The first line of *text*, at most *most* characters (``...`` when cut), or ``-``."""
    stripped = (text or "").strip()
    if not stripped:
        return "-"
    line = stripped.splitlines()[0]
    if len(line) > most:
        return line[:most - 3] + "..."
    return line + "..." if line != stripped else line


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
          right: Collection[int] = ()) -> None:
    """Columns padded to their widest cell; the columns in *right* right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    click.echo(line(headers))
    click.echo("  ".join("-" * w for w in widths))
    for row in cells:
        click.echo(line(row))
    if not rows:
        click.echo("(none)")


# -- claims -------------------------------------------------------------------


def claim_json(row: ClaimRow, now: datetime, timeout: timedelta) -> dict[str, Any]:
    """One line of ``claims --json``: the row, its state and measures, full errors."""
    def when(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {"cluster": row.cluster, "job": row.job, "occurrence": iso(row.occurrence),
            "node": row.node,
            "task_id": row.task_id, "kind": row.kind, "claimed_at": row.claimed_at.isoformat(),
            "state": row.status(now, timeout), "published_at": when(row.published_at),
            "started_at": when(row.started_at), "finished_at": when(row.finished_at),
            "runtime": row.runtime, "lateness": row.lateness, "worker": row.worker,
            "takeovers": row.takeovers, "publish_error": row.publish_error,
            "run_error": row.run_error}


def claims_table(rows: Sequence[ClaimRow], now: datetime, timeout: timedelta) -> None:
    """``claims``: one line per row, newest first; the error is the run's, else the
    publish's (or the skip reason), shortened."""
    table(["job", "occurrence", "state", "winner", "task id", "kind", "claimed at",
           "started", "runtime", "lateness", "worker", "error"],
          [[r.job, iso(r.occurrence), r.status(now, timeout), r.node, r.task_id, r.kind,
            utc(r.claimed_at), utc(r.started_at), seconds(r.runtime),
            seconds(r.lateness, sign=True), r.worker or "-",
            short(r.run_error or r.publish_error)] for r in rows],
          right={8, 9})


# -- reconciliation ------------------------------------------------------------


def print_reconciliation(rec: Reconciliation) -> None:
    """One line per entry and the totals, then each finding with its occurrences."""
    clipped = "; clipped to elarion_beat_claim_retention" if rec.clipped else ""
    click.echo(f"reconciliation {utc(rec.start)} .. {utc(rec.end)} (UTC, database clock; "
               f"{format_duration(rec.end - rec.start, 1)}, grace "
               f"{format_duration(rec.grace)}{clipped})")
    rows: list[list[Any]] = [[e.job, *(_n(getattr(e, name)) for name in COUNTERS),
                              _notes(e, rec.start, rec.end)] for e in rec.entries]
    rows.append(["total", *(rec.total(name) for name in COUNTERS), ""])
    table(["entry", *COUNTERS, "notes"], rows, right=range(1, len(COUNTERS) + 1))
    lines = []
    for name, found in (("MISSED", lambda e: e.missed_at), ("FAILED", _failures),
                        ("DUPLICATES", lambda e: e.duplicate_at),
                        ("ORPHANED", lambda e: e.orphaned_at)):
        for e in rec.entries:
            count = getattr(e, name.lower())
            if count:
                listed = [x if isinstance(x, str) else utc(x) for x in found(e)]
                more = f" and {count - SHOWN} more" if count > SHOWN else ""
                lines.append(f"{name} {e.job}: {count} ({'; '.join(listed[:SHOWN])}{more})")
    if lines:
        click.echo("\n" + "\n".join(lines))


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _failures(entry: EntryCount) -> list[str]:
    return [f"{utc(r.occurrence)} on {r.worker or r.node}: {short(r.run_error)}"
            for r in entry.failures]


def _notes(entry: EntryCount, start: datetime, end: datetime) -> str:
    notes = []
    if entry.kind == EVERY_NODE:
        notes.append("every node: " + (", ".join(
            f"{node} {per['runs']} run{'s' if per['runs'] != 1 else ''}"
            + (f" ({per['failed']} failed)" if per["failed"] else "")
            for node, per in sorted(entry.nodes.items())) or "no runs"))
    elif entry.kind == INTERVAL:
        notes.append("interval: expected is nominal")
    elif entry.kind == OTHER:
        notes.append("no slots or interval: rows only")
    if entry.start >= end:
        notes.append("new: never claimed, and no node ran it")
    elif entry.capped:
        notes.append(f"counted from {utc(entry.start)} (too many to count)")
    elif entry.start > start:
        notes.append(f"counted from {utc(entry.start)} (first known)")
    return "; ".join(notes)
