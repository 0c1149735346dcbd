"""``celery -A proj elarion-beat init-db|purge``: the tables themselves.

Both may run long on a big table. On a terminal they show how far they got on
stderr (:mod:`.progress`): ``purge`` the rows deleted of about how many, the rate
and the time left; ``init-db`` each upgrade of a table of an older version (on
PostgreSQL an index build's blocks and tuples, as the server counts them). Ctrl-C
stops ``purge`` after the batch in hand (a second one at once) and ``init-db`` at
once (its upgrades run in one transaction on PostgreSQL and SQLite); either says
what was done and exits 130.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import click

from ..beat.startup import one_line
from ..config.parsers import format_duration
from ..exceptions import ElarionBeatError, SchemaMissing, StoreError
from ..store.interface import ClaimStore
from ..store.records import PurgeProgress, SchemaStep
from .context import StoreContext as _Ctx
from .context import app_of as _app
from .context import parse_duration
from .progress import INTERRUPTED, Interrupts, Progress, watching

__all__ = ["init_db_command", "purge_command"]

#: The quotes around an identifier in DDL (PostgreSQL and SQLite, MySQL).
_QUOTES = '"`'
#: Seconds a command must take before its summary says how long it took.
SHOW_TIME = 1.0


@click.command("init-db")
@click.option("--force", is_flag=True,
              help="Finish the upgrade of tables of 0.2 even while nodes of 0.2 heartbeat "
                   "(their claims fail until they are upgraded).")
@click.pass_context
def init_db_command(ctx: click.Context, force: bool) -> None:
    """Create the claims, nodes, pauses, audit and one-offs tables (and schema) if
    missing, bring tables of an older version up to date, and finish the upgrade of
    tables of 0.2: their keys start with the cluster, so apps that share them are kept
    apart (refused while a node of 0.2 still heartbeats, unless --force)."""
    steps: list[SchemaStep] = []
    stopped = False
    upgraded: tuple[str, ...] = ()
    with _Ctx(_app(ctx)) as c, Progress(show=watching()) as progress:

        def on_step(step: SchemaStep) -> None:
            steps.append(step)
            progress.stage(f"upgrading the tables ({step.number} of {step.total})",
                           counted=False, detail=_change(step.statement))

        def probe() -> None:
            found = c.store.schema_progress()
            if found is None or not steps:
                return
            phase = found.phase.removeprefix("building index: ")
            progress.detail(f"{_change(steps[-1].statement)} ({phase})")
            if found.total:
                progress.measure(found.done, found.total, found.unit)

        progress.watch(probe)
        started = time.monotonic()
        try:
            upgraded = c.store.create_schema(on_step, force=force)
        except KeyboardInterrupt:
            stopped = True
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc
    if stopped:
        during = f" during change {steps[-1].number} of {steps[-1].total}" if steps else ""
        click.echo(f"init-db stopped by Ctrl-C{during}; what it had not committed was rolled "
                   "back: run it again to finish", err=True)
        ctx.exit(INTERRUPTED)
    if steps:
        click.echo(f"upgraded the tables of an older version: {len(steps)} "
                   f"change{'s' if len(steps) != 1 else ''} in "
                   f"{format_duration(time.monotonic() - started, approximate=True)}")
    if upgraded:
        click.echo(f"upgraded the keys of {', '.join(upgraded)}: each starts with the "
                   "cluster; the apps that share these tables are kept apart from now")
    click.echo(f"ready: {c.store.describe()} (cluster {c.store.cluster})")


def _change(statement: str) -> str:
    """What an upgrade statement does, in a few words: ``creating index ix_x_pending``."""
    for pattern, what in ((r"CREATE (?:UNIQUE )?INDEX (\S+)", "creating index"),
                          (r"ADD COLUMN (\S+)", "adding column"),
                          (r"MODIFY (\S+)", "changing column")):
        found = re.search(pattern, statement, re.IGNORECASE)
        if found:
            return what + " " + found.group(1).strip(_QUOTES)
    return statement if len(statement) <= 60 else statement[:57] + "..."


@dataclass
class _Purged:
    """What a purge did (or, with --dry-run, would do)."""

    older_than: timedelta
    dry_run: bool = False
    claims: int = 0
    estimate: int | None = None
    #: None: the one-offs table does not exist
    one_offs: int | None = 0
    dropped: list[str] = field(default_factory=list)
    claims_done: bool = False
    one_offs_done: bool = False
    interrupted: bool = False
    seconds: float = 0.0
    #: what stopped an unfinished purge, for the summary
    stopped_by: str = "Ctrl-C"

    def as_dict(self) -> dict[str, Any]:
        return {"older_than": self.older_than.total_seconds(), "dry_run": self.dry_run,
                "claims": self.claims, "one_offs": self.one_offs,
                "dropped_partitions": self.dropped, "interrupted": self.interrupted,
                "complete": self.claims_done and self.one_offs_done,
                "seconds": round(self.seconds, 3)}

    def lines(self) -> list[str]:
        """The summary, for a person."""
        age = format_duration(self.older_than)
        if self.dry_run:
            out = [f"would delete {self.claims} claims older than {age}"]
            if self.one_offs is not None:
                out.append(f"would delete {self.one_offs} one-offs finished more than {age} "
                           "ago")
            return out
        line = f"deleted {self.claims} claims older than {age}"
        if self.dropped:
            line += (f" ({len(self.dropped)} day partition"
                     f"{'s' if len(self.dropped) != 1 else ''} dropped whole)")
        if self.seconds >= SHOW_TIME:
            line += f" in {format_duration(self.seconds, approximate=True)}"
        if not self.claims_done:
            left = (f"; about {max(0, self.estimate - self.claims)} left"
                    if self.estimate is not None else "")
            return [line + f" (stopped by {self.stopped_by}{left}: run purge again to go on)"]
        out = [line]
        if self.one_offs is not None:
            stopped = ("" if self.one_offs_done
                       else f" (stopped by {self.stopped_by}: run purge again)")
            out.append(f"deleted {self.one_offs} one-offs finished more than {age} ago"
                       + stopped)
        return out


@click.command("purge")
@click.option("--older-than", help="Retention, e.g. 7d or 36h (default: "
              "elarion_beat_claim_retention).")
@click.option("--batch-size", type=click.IntRange(1, 1_000_000), default=None,
              help="Rows deleted per transaction (default: elarion_beat_purge_batch).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object at the end (and no progress line).")
@click.pass_context
def purge_command(ctx: click.Context, older_than: str | None, batch_size: int | None,
                  dry_run: bool, as_json: bool) -> None:
    """Delete claims older than the retention, in batches, and the one-offs finished
    (published, failed, cancelled) longer ago than that (not with --dry-run). On a
    terminal it shows its progress on stderr; Ctrl-C stops it after the batch in hand
    (exit 130)."""
    with _Ctx(_app(ctx)) as c:
        age = parse_duration(older_than, "--older-than") if older_than else timedelta(
            seconds=c.settings.claim_retention)
        batch = batch_size or c.settings.purge_batch
        result = _Purged(age, dry_run=dry_run)
        started = time.monotonic()
        try:
            if dry_run:
                _count(c.store, result)
            else:
                try:
                    with Progress(show=watching(as_json)) as progress, \
                            Interrupts(progress) as stop:
                        _purge(c.store, result, batch, progress, stop)
                except KeyboardInterrupt:  # a second Ctrl-C just after the last batch
                    result.interrupted = True
        except ElarionBeatError as exc:
            if result.claims or result.one_offs:  # say what it did before the error
                result.stopped_by, result.seconds = "the error below", time.monotonic() - started
                _report(result, as_json)
            raise click.ClickException(one_line(exc)) from exc
        result.seconds = time.monotonic() - started
    _report(result, as_json)
    if result.interrupted:
        ctx.exit(INTERRUPTED)


def _report(result: _Purged, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.as_dict(), sort_keys=True))
    else:
        for line in result.lines():
            click.echo(line)


def _count(store: ClaimStore, result: _Purged) -> None:
    result.claims = store.purge(result.older_than, dry_run=True)
    try:
        result.one_offs = store.purge_one_offs(result.older_than, dry_run=True)
    except SchemaMissing:
        result.one_offs = None


def _purge(store: ClaimStore, result: _Purged, batch: int, progress: Progress,
           stop: Interrupts) -> None:
    """The claims, then the one-offs, one batch per stretch (``budget=0``), each
    counted on *progress*; stop after the batch in hand once Ctrl-C asks. A second
    Ctrl-C (``KeyboardInterrupt``) stops at once: the batch in hand rolls back."""
    try:
        try:
            result.estimate = store.estimate_purge(result.older_than)
        except StoreError:
            result.estimate = None  # a progress line without its total
        progress.stage("purging claims", total=result.estimate, about=True)
        step: PurgeProgress | None = None
        while not stop.requested:
            step = store.purge_pass(result.older_than, batch_size=batch, budget=0,
                                    resume=step)
            result.claims, result.claims_done = step.total, step.done
            result.dropped.extend(step.dropped)
            progress.advance(step.deleted)
            if step.done:
                break
        if not result.claims_done:
            result.interrupted = True
            return
        try:
            total = store.purge_one_offs(result.older_than, dry_run=True)
        except SchemaMissing:
            result.one_offs, result.one_offs_done = None, True
            return
        progress.stage("purging one-offs", total=total, unit="one-offs")
        step = None
        while not stop.requested:
            step = store.purge_one_offs_pass(result.older_than, batch_size=batch, budget=0,
                                             resume=step)
            result.one_offs, result.one_offs_done = step.total, step.done
            progress.advance(step.deleted)
            if step.done:
                break
        result.interrupted = not result.one_offs_done
    except KeyboardInterrupt:
        result.interrupted = True
