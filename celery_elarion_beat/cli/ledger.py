"""``celery -A proj elarion-beat claims|catch-up``: read the claims ledger.

``claims`` queries it (each occurrence's state, start, runtime, lateness, worker and
error); ``catch-up --dry-run`` previews what each entry's catch-up policy would
replay now (:mod:`celery_elarion_beat.operate.catch_up`).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import click

from ..beat.startup import one_line
from ..config.catch_up import MAX_MISSED, CatchUp
from ..config.parsers import format_duration
from ..exceptions import ElarionBeatError
from ..operate.catch_up import Preview, preview
from ..schedules.clock import as_utc, utcnow
from ..schedules.slots import iso
from .context import StoreContext as _Ctx
from .context import app_of as _app
from .context import parse_duration
from .text import claim_json, claims_table
from .text import table as _table
from .text import utc as _t

__all__ = ["catch_up_command", "claims_command"]


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return utcnow() - parse_duration(text, "--since")


@click.command("claims")
@click.option("--job", help="Only this entry.")
@click.option("--node", help="Only claims won by this node.")
@click.option("--since", help="ISO time (2026-11-29T03:00:00Z) or a duration back (2h, 7d).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_context
def claims_command(ctx: click.Context, job: str | None, node: str | None, since: str | None,
                   limit: int, as_json: bool) -> None:
    """Query the claims ledger of the app's cluster, newest first: who claimed each
    occurrence, where it stands (pending, published, running, succeeded, failed,
    orphaned, skipped), when its run started, its runtime, its lateness (slot to
    publish) and any error."""
    with _Ctx(_app(ctx)) as c:
        try:
            rows = c.store.find_claims(job=job, node=node, since=_since(since), limit=limit)
            now = c.store.clock()
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
        timeout = timedelta(seconds=c.settings.publish_timeout)
    if as_json:
        for r in rows:
            click.echo(json.dumps(claim_json(r, now, timeout)))
        return
    click.echo(f"cluster: {c.store.cluster}")
    claims_table(rows, now, timeout)


@click.command("catch-up")
@click.option("--dry-run", is_flag=True,
              help="Required: list what would be replayed now, and change nothing.")
@click.option("--policy", type=click.Choice([c.value for c in CatchUp]), default=None,
              help="Preview this policy for every entry instead of each entry's own.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def catch_up_command(ctx: click.Context, dry_run: bool, policy: str | None,
                     as_json: bool) -> None:
    """Preview what each entry's catch-up policy would replay now (see docs/missed.md)."""
    if not dry_run:
        raise click.UsageError(
            "catch-up only previews: beat replays missed slots itself when it starts and "
            "when the claims database comes back; add --dry-run to see what it would replay")
    with _Ctx(_app(ctx)) as c:
        try:
            now = c.store.clock()
            rows = preview(c.store, c.settings, c.schedule(), now,
                           CatchUp(policy) if policy else None)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
    if as_json:
        click.echo(json.dumps({"now": iso(now), "entries": [{
            "job": r.job, "catch_up": r.policy.mode.value,
            "window": r.policy.window.total_seconds(), "max": r.policy.most,
            "last_claim": iso(r.last) if r.last else None,
            "missed": [iso(s) for s in r.missed], "replay": [iso(s) for s in r.replay],
            "next_run": iso(r.next_run) if r.next_run else None} for r in rows]},
            indent=2, sort_keys=True))
        return
    click.echo(f"now (database clock): {_t(now)}\n")
    _table(["entry", "policy", "last claim", "missed", "would replay"],
           [[r.job, r.policy.describe(), _t(r.last), _missed_text(r),
             _replay_text(r, now)] for r in rows])


def _missed_text(row: Preview) -> str:
    if row.interval is not None:
        return f"interval {format_duration(row.interval)}"
    if not row.missed:
        return "none" if row.last else "none (no claim yet)"
    more = "+" if len(row.missed) >= MAX_MISSED else ""
    return f"{len(row.missed)}{more}, oldest {_t(row.missed[-1])}"


def _replay_text(row: Preview, now: datetime) -> str:
    if row.interval is not None:
        if row.next_run is None:
            return "next run one interval after start"
        return "runs now (due)" if row.next_run <= now else f"next run {_t(row.next_run)}"
    if not row.replay:
        return "nothing"
    shown = ", ".join(_t(s) for s in row.replay[:3])
    return shown + (f" and {len(row.replay) - 3} more" if len(row.replay) > 3 else "")
