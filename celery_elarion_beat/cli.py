"""``celery -A proj elarion-beat ...``: operate the claims tables.

Commands: ``status`` (a health check: exits 1 on schedule drift between live
nodes, a missed slot or an orphan; with ``--since 24h`` also a reconciliation of
each entry's occurrences over the period, see :mod:`.reconcile`, exiting 1 on
failed runs and duplicates too; ``--fail-on`` chooses which findings fail),
``claims`` (query the ledger: each occurrence's state, start, runtime, lateness,
worker and error), ``pause``, ``resume``, ``trigger`` and ``audit`` (live control,
see :mod:`.cli_control`), ``catch-up --dry-run``, ``init-db``, ``purge`` and ``exporter``
(Prometheus counters of beat's events, see :mod:`.exporter`), ``health`` (a
probe of one node's heartbeat, see :mod:`.cli_health`), ``preview`` (the
schedule's next occurrences, DST changes marked, see :mod:`.cli_preview`),
``one-offs list|show|cancel`` (durable one-offs, see :mod:`.cli_one_offs`).
Installed as a Celery sub-command through the ``celery.commands`` entry point.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from datetime import datetime, timedelta

import click

from .catch_up import MAX_MISSED, CatchUp
from .cli_context import StoreContext as _Ctx
from .cli_context import app_of as _app
from .cli_context import parse_duration
from .cli_context import period as _period
from .cli_control import audit_command, pause_command, resume_command, trigger_command
from .cli_health import health_command
from .cli_one_offs import one_offs_group
from .cli_preview import preview_command
from .clock import as_utc, utcnow
from .control import job_label
from .exceptions import ElarionBeatError
from .purge import purge_one_offs
from .resume import Preview, preview
from .slots import iso
from .startup import one_line
from .status import FINDINGS, EntryStatus, Status, build_status, schedule_entries
from .tables import claim_json, claims_table, print_reconciliation
from .tables import table as _table
from .tables import utc as _t

__all__ = ["elarion_beat", "parse_duration", "parse_fail_on"]

def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return utcnow() - parse_duration(text)


@click.group("elarion-beat")
@click.pass_context
def elarion_beat(ctx: click.Context) -> None:
    """celery-elarion-beat: claims, nodes and health of the beat cluster."""


def parse_fail_on(text: str) -> frozenset[str]:
    """``--fail-on``: a comma-separated list of :data:`~.status.FINDINGS`, ``all`` or
    ``none``."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return frozenset(FINDINGS)
    if names == ["none"]:
        return frozenset()
    wrong = [name for name in names if name not in FINDINGS]
    if wrong or not names:
        what = (f"{', '.join(repr(w) for w in wrong)} cannot be combined with other findings"
                if set(wrong) & {"all", "none"} else
                f"{', '.join(repr(w) for w in wrong) or repr(text)} is not a finding")
        raise click.BadParameter(
            f"{what}; use a comma-separated list of {', '.join(FINDINGS)}, or all (the "
            "default), or none (always exit 0)", param_hint="'--fail-on'")
    return frozenset(names)


@elarion_beat.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--grace", default="60s", show_default=True,
              help="How long a slot may stay unclaimed before it counts as missed.")
@click.option("--lookback", default=None,
              help="How far back missed slots count (e.g. 24h). Default: the --since period, "
                   "else the claim retention.")
@click.option("--since", default=None,
              help="Reconcile each entry over this period: a duration back from now (24h, 7d) "
                   "or an ISO time. Counts expected, claimed, published, succeeded, failed, "
                   "running, missed, orphaned, skipped and duplicate occurrences.")
@click.option("--fail-on", "fail_on", default="all", show_default=True,
              help=f"Findings that make the exit code 1: a comma-separated list of "
                   f"{', '.join(FINDINGS)}; or all; or none (always exit 0).")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool, grace: str, lookback: str | None,
                   since: str | None, fail_on: str) -> None:
    """Entries, nodes, drift, missed slots and (--since) a reconciliation of each entry's
    occurrences; exits 1 on the findings --fail-on names."""
    failing = parse_fail_on(fail_on)
    period = _period(since)
    with _Ctx(_app(ctx)) as c:
        try:
            report = build_status(c.app, c.settings, c.store, grace=parse_duration(grace),
                                  lookback=parse_duration(lookback) if lookback else None,
                                  since=period)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
    code = report.exit_code(failing)
    if as_json:
        click.echo(json.dumps({**report.as_dict(), "fail_on": sorted(failing),
                               "exit_code": code}, indent=2, sort_keys=True))
    else:
        _print_status(report, failing)
    ctx.exit(code)


def _state(entry: EntryStatus) -> str:
    parts = []
    if entry.paused is not None:
        until = f" until {_t(entry.paused.until)}" if entry.paused.until else ""
        parts.append(f"PAUSED{until}")
    if entry.missed is not None:
        count = entry.missed_count
        parts.append(f"MISSED {_t(entry.missed)}" + (f" (+{count - 1} earlier)"
                                                     if count > 1 else ""))
    if entry.orphaned:
        parts.append(f"ORPHANED {_t(entry.orphaned[-1])}" + (
            f" (+{len(entry.orphaned) - 1})" if len(entry.orphaned) > 1 else ""))
    if entry.unpublished:
        parts.append(f"unpublished {len(entry.unpublished)}")
    return "; ".join(parts) or "ok"


def _print_status(report: Status, failing: Collection[str]) -> None:
    rows = [[e.name, e.schedule, e.placement, _t(e.last_occurrence), e.winner or "-",
             e.task_id or "-", _t(e.next_due),
             ", ".join(f"{k}={v}" for k, v in sorted(e.skips.items())) or "-",
             e.catch_up, e.delivery, _state(e)] for e in report.entries]
    click.echo(f"now (database clock): {_t(report.now)}\n")
    _table(["entry", "schedule", "placement", "last occurrence", "winner", "task id",
            "next due", "skips", "catch-up", "delivery", "state"], rows)
    click.echo("")
    _table(["node", "state", "last heartbeat", "started", "version", "fingerprint", "host/pid"],
           [[n.node, "alive" if n.alive else "dead", _t(n.last_seen), _t(n.started_at),
             n.version, n.fingerprint, f"{n.host}/{n.pid}"] for n in report.nodes])
    if report.pauses:
        click.echo("\nPAUSED (lift with `elarion-beat resume JOB`, or `resume --all` for "
                   "all jobs):")
        for pause in report.pauses:
            click.echo(f"  {job_label(pause.job)}: since {_t(pause.paused_at)}, "
                       f"{pause.describe()}")
    if report.drift:
        click.echo("\nSCHEDULE DRIFT between live nodes:")
        for node, entries in sorted(report.drift.items()):
            click.echo(f"  {node}: {', '.join(entries) or '(options only)'}")
    if report.missed:
        click.echo("\nMISSED: no node claimed a slot of: "
                   + ", ".join(f"{e.name} ({e.missed_count}, latest {_t(e.missed)})"
                               for e in report.missed))
    if report.orphaned:
        click.echo("\nORPHANED: claimed and never published (see docs/missed.md): "
                   + ", ".join(f"{e.name} ({len(e.orphaned)}, latest {_t(e.orphaned[-1])})"
                               for e in report.orphaned))
    if report.reconciliation is not None:
        click.echo("")
        print_reconciliation(report.reconciliation)
    findings = report.findings
    if not findings:
        click.echo("\nhealthy")
        return
    line = f"\nUNHEALTHY: {', '.join(findings)}"
    if not set(findings) & set(failing):
        line += f" (exit 0: --fail-on {','.join(sorted(failing)) or 'none'})"
    click.echo(line)


@elarion_beat.command("catch-up")
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
            rows = preview(c.store, c.settings, schedule_entries(c.app), now,
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
        return f"interval {row.interval}"
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


@elarion_beat.command("claims")
@click.option("--job", help="Only this entry.")
@click.option("--node", help="Only claims won by this node.")
@click.option("--since", help="ISO time (2026-11-29T03:00:00Z) or a duration back (2h, 7d).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_context
def claims_command(ctx: click.Context, job: str | None, node: str | None, since: str | None,
                   limit: int, as_json: bool) -> None:
    """Query the claims ledger, newest first: who claimed each occurrence, where it
    stands (pending, published, running, succeeded, failed, orphaned, skipped), when
    its run started, its runtime, its lateness (slot to publish) and any error."""
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
    claims_table(rows, now, timeout)


@elarion_beat.command("init-db")
@click.pass_context
def init_db_command(ctx: click.Context) -> None:
    """Create the claims, nodes, pauses and audit tables (and schema) if missing, and
    bring tables of an older version up to date."""
    with _Ctx(_app(ctx)) as c:
        create = getattr(c.store, "create_schema", c.store.ensure_schema)
        try:
            create()
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
        click.echo(f"ready: {c.store.describe()}")


@elarion_beat.command("purge")
@click.option("--older-than", help="Retention, e.g. 7d (default: elarion_beat_claim_retention).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.pass_context
def purge_command(ctx: click.Context, older_than: str | None, dry_run: bool) -> None:
    """Delete claims older than the retention, in batches, and the one-offs finished
    (published, failed, cancelled) longer ago than that (not with --dry-run)."""
    with _Ctx(_app(ctx)) as c:
        age = parse_duration(older_than) if older_than else timedelta(
            seconds=c.settings.claim_retention)
        try:
            count = c.store.purge(age, batch_size=c.settings.purge_batch, dry_run=dry_run)
            gone = None if dry_run else purge_one_offs(c.store, age, c.settings.purge_batch)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {count} claims older than {age}")
    if gone is not None:
        click.echo(f"deleted {gone} one-offs finished more than {age} ago")


@elarion_beat.command("exporter")
@click.option("--port", default=9808, show_default=True, type=int, help="HTTP port.")
@click.option("--address", default="0.0.0.0", show_default=True, help="Bind address.")
@click.pass_context
def exporter_command(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus counters of beat's elarion-* events on /metrics."""
    import logging

    from .exporter import serve

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    serve(_app(ctx), port=port, address=address)


for _command in (pause_command, resume_command, trigger_command, audit_command):
    elarion_beat.add_command(_command)
elarion_beat.add_command(health_command)
elarion_beat.add_command(preview_command)
elarion_beat.add_command(one_offs_group)


def main() -> None:  # pragma: no cover - convenience for `python -m celery_elarion_beat.cli`
    sys.exit("run it as: celery -A proj elarion-beat --help")
