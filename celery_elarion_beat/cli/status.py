"""``celery -A proj elarion-beat status``: the cluster's health (:mod:`..operate.status`).

Exits 1 on schedule drift between live nodes, a missed slot, an orphan, a beat that
sends without claiming (``foreign-beat``), an every-node entry a live node's workers
did not run (``node-missing``), or tables shared with another app that still have the
keys of 0.2 (``shared``); with ``--since 24h`` also a reconciliation of each
entry's occurrences over the period, exiting 1 on failed runs and duplicates too;
``--fail-on`` chooses which findings fail. Only the app's cluster
(``elarion_beat_cluster``) is reported.
"""

from __future__ import annotations

import json
from collections.abc import Collection

import click

from ..beat.startup import one_line
from ..exceptions import ElarionBeatError
from ..operate.control import job_label
from ..operate.status import (
    FINDINGS,
    EntryStatus,
    Status,
    build_status,
)
from ..store.clusters import legacy_message, shared_message
from .context import StoreContext as _Ctx
from .context import app_of as _app
from .context import parse_duration, warn_invalid
from .context import period as _period
from .text import print_reconciliation
from .text import table as _table
from .text import utc as _t

__all__ = ["parse_fail_on", "status_command"]


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


@click.command("status")
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
                   f"{', '.join(FINDINGS)}; or all; or none (always exit 0). foreign-beat: "
                   "a worker saw messages of a beat that claims nothing within --since "
                   "(else --lookback, else a day). node-missing: a live beat node whose "
                   "workers record runs (install_worker) recorded no run of an every-node "
                   "entry within --since (else --lookback, else the entry's last two "
                   "periods), though live for two periods of it.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool, grace: str, lookback: str | None,
                   since: str | None, fail_on: str) -> None:
    """Entries, nodes, drift, missed slots, beats that claim nothing, every-node entries a
    live node did not run, and (--since) a reconciliation of each entry's occurrences;
    exits 1 on the findings --fail-on names."""
    failing = parse_fail_on(fail_on)
    period = _period(since)
    grace_span = parse_duration(grace, "--grace")
    back = parse_duration(lookback, "--lookback") if lookback else None
    with _Ctx(_app(ctx)) as c:
        try:
            report = build_status(c.app, c.settings, c.store, grace=grace_span, lookback=back,
                                  since=period)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
    warn_invalid(report.invalid)
    if report.foreign_error is not None:
        click.echo(f"warning: beats that claim nothing are not known: {report.foreign_error}",
                   err=True)
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
    if entry.nodes_missing:
        parts.append(f"NODE MISSING {', '.join(entry.nodes_missing)}")
    return "; ".join(parts) or "ok"


def _print_coverage(report: Status) -> None:
    """The every-node entries a live node did not run, and the nodes nobody tracks."""
    if report.node_missing:
        click.echo("\nNODE MISSING: live beat nodes whose workers recorded no run of an "
                   "every-node entry (is the node's worker down? its beat sends on and the "
                   "messages expire unexecuted):")
        for entry in report.node_missing:
            ran = ", ".join(f"{node} {count}" for node, count in (entry.nodes_ran or {}).items())
            click.echo(f"  {entry.name}: {', '.join(entry.nodes_missing or ())} (no run since "
                       f"{_t(entry.nodes_since)}; ran: {ran or 'none'})")
    untracked = sorted({node for e in report.entries for node in e.nodes_not_tracked or ()})
    if untracked:
        click.echo(f"\nNOT TRACKED: every-node runs are not recorded on {', '.join(untracked)} "
                   "(no worker there calls install_worker, or none ran yet): a missing run "
                   "there cannot be told")


def _print_status(report: Status, failing: Collection[str]) -> None:
    rows = [[e.name, e.schedule, e.placement, _t(e.last_occurrence), e.winner or "-",
             e.task_id or "-", _t(e.next_due),
             ", ".join(f"{k}={v}" for k, v in sorted(e.skips.items())) or "-",
             e.catch_up, e.delivery, _state(e)] for e in report.entries]
    click.echo(f"now (database clock): {_t(report.now)}")
    census = report.census
    others = f" (its tables hold other apps too: {', '.join(census.others)})" \
        if census is not None and census.others else ""
    click.echo(f"cluster: {report.cluster}{others}\n")
    _table(["entry", "schedule", "placement", "last occurrence", "winner", "task id",
            "next due", "skips", "catch-up", "delivery", "state"], rows)
    click.echo("")
    _table(["node", "state", "last heartbeat", "started", "version", "fingerprint", "host/pid"],
           [[n.node, "alive" if n.alive else "dead", _t(n.last_seen), _t(n.started_at),
             n.version if n.cluster else f"{n.version} (before clusters)", n.fingerprint,
             f"{n.host}/{n.pid}"] for n in report.nodes])
    if census is not None and census.colliding:
        click.echo(f"\nSHARED: {shared_message(census, report.table)}")
    elif census is not None and census.legacy:
        click.echo(f"\nUPGRADE: {legacy_message(census, report.table)}")
    if report.pauses:
        click.echo("\nPAUSED (lift with `elarion-beat resume JOB`, or `resume --all` for "
                   "all jobs):")
        for pause in report.pauses:
            click.echo(f"  {job_label(pause.job)}: since {_t(pause.paused_at)}, "
                       f"{pause.describe()}")
    if report.drift:
        click.echo("\nSCHEDULE DRIFT between live nodes (their code entries differ: a deploy "
                   "in progress?):")
        for node, entries in sorted(report.drift.items()):
            click.echo(f"  {node}: {', '.join(entries) or '(options only)'}")
    if report.behind:
        click.echo(f"\nBEHIND the database entries (version {report.entries_version}): "
                   + ", ".join(f"{node} (holds {held if held is not None else 'none'})"
                               for node, held in sorted(report.behind.items())))
    if report.missed:
        click.echo("\nMISSED: no node claimed a slot of: "
                   + ", ".join(f"{e.name} ({e.missed_count}, latest {_t(e.missed)})"
                               for e in report.missed))
    if report.orphaned:
        click.echo("\nORPHANED: claimed and never published (see docs/missed.md): "
                   + ", ".join(f"{e.name} ({len(e.orphaned)}, latest {_t(e.orphaned[-1])})"
                               for e in report.orphaned))
    if report.foreign_beats:
        click.echo(f"\nFOREIGN BEATS since {_t(report.foreign_since)}: beats that claim "
                   "nothing (every occurrence they send goes out twice); stop them, or run "
                   "them with beat_scheduler = \"elarion\" (see docs/howto/embedded-beat.md)")
        for sender in report.foreign_beats:
            tasks = ", ".join(f"{t.task}" + (f" ({t.entry})" if t.entry else "") + f" x{t.count}"
                              for t in sender.tasks)
            click.echo(f"  {sender.origin} on {sender.host}: {sender.count} messages, last "
                       f"{_t(sender.last_seen)}: {tasks}")
    _print_coverage(report)
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
