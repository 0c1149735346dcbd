"""``celery -A proj elarion-beat preview``: the schedule's next occurrences
(:mod:`..operate.preview`).

The schedule part needs no database: the occurrences come from the app's
``beat_schedule`` and the slot naming. From the database, when it answers, come the
live nodes that send every-node entries, the pauses in force and the newest claims
interval entries count from; when it does not, one line says so and the exit code
stays 0. Invalid entries are listed with their reason; ``--strict`` exits 1 on them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
from celery.schedules import schedule as interval_schedule

from ..config.entries import InvalidEntry, read_schedule
from ..config.parsers import format_duration
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ElarionBeatError
from ..live_schedules.listing import read_live_schedule, upcoming_entries
from ..operate.preview import (
    LIMIT,
    PreviewRow,
    SchedulePreview,
    preview_entries,
)
from ..schedules.clock import as_utc, utcnow
from ..schedules.cron import zone_name
from ..store.control_records import Pause
from ..store.registry import open_store
from .context import app_of
from .text import utc

__all__ = ["preview_command"]


@dataclass
class _Known:
    """What the database said: live nodes, pauses, newest interval claims, or why not."""

    nodes: list[str] | None = None
    pauses: list[Pause] = field(default_factory=list)
    anchors: dict[str, datetime] | None = None
    error: str | None = None


def _read_database(settings: Settings, interval_jobs: Sequence[str]) -> _Known:
    if settings.dsn is None:
        return _Known(error="elarion_beat_dsn is not set")
    try:
        store = open_store(settings)
    except ElarionBeatError as exc:
        return _Known(error=str(exc))
    try:
        now, nodes = store.nodes()
        timeout = timedelta(seconds=settings.node_timeout)
        known = _Known(sorted(n.node for n in nodes if n.is_live(now, timeout)),
                       store.pauses()[1])
        if settings.interval_anchor == "cluster":
            latest = store.latest_claims(list(interval_jobs)) if interval_jobs else {}
            known.anchors = {job: row.occurrence for job, row in latest.items()}
    except ElarionBeatError as exc:
        return _Known(error=str(exc))
    finally:
        store.close()
    return known


def _entries(app: Any, settings: Settings) -> tuple[dict[str, Any], list[InvalidEntry],
                                                   dict[str, Any], str | None]:
    """The entries to preview (with ``elarion_beat_db_entries``, the database entries
    too), the ones left out, the database entries' revisions still to come, and why the
    database entries could not be read (None: they were, or are off)."""
    if not settings.db_entries or settings.dsn is None:
        entries, invalid = read_schedule(app, settings)
        return entries, invalid, {}, None
    try:
        store = open_store(settings)
    except ElarionBeatError as exc:
        entries, invalid = read_schedule(app, settings)
        return entries, invalid, {}, " ".join(str(exc).split())
    try:
        entries, invalid = read_live_schedule(app, settings, store)
        return entries, invalid, upcoming_entries(app, settings, store), None
    except ElarionBeatError as exc:
        entries, invalid = read_schedule(app, settings)
        return entries, invalid, {}, " ".join(str(exc).split())
    finally:
        store.close()


def _start(text: str | None) -> datetime:
    if text is None:
        return utcnow().replace(microsecond=0)
    try:
        return as_utc(datetime.fromisoformat(text.strip().replace("Z", "+00:00")))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO time; use e.g. 2026-03-28T12:00Z "
                                 "(without an offset, UTC)", param_hint="'--from'") from None


def _zone(text: str | None) -> tzinfo | None:
    if text is None:
        return None
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise click.BadParameter(f"{text!r} is not a known time zone; use an IANA name such "
                                 "as Europe/Berlin", param_hint="'--tz'") from None


@click.command("preview")
@click.option("--from", "from_text", help="Start of the window, an ISO time "
              "(2026-03-28T12:00Z; without an offset, UTC). Default: now.")
@click.option("--hours", default=48.0, show_default=True,
              type=click.FloatRange(0, 366 * 24, min_open=True), help="Length of the window.")
@click.option("--tz", "tz_text", help="Show local times in this zone (an IANA name) instead "
              "of each entry's own.")
@click.option("--job", "jobs", multiple=True, help="Only this entry (repeat for more).")
@click.option("--limit", default=LIMIT, show_default=True, type=click.IntRange(1, 100000),
              help="Occurrences listed per entry at most.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--strict", is_flag=True, help="Exit 1 when an entry is invalid.")
@click.pass_context
def preview_command(ctx: click.Context, from_text: str | None, hours: float,
                    tz_text: str | None, jobs: tuple[str, ...], limit: int, as_json: bool,
                    strict: bool) -> None:
    """The next occurrences of each beat_schedule entry, with daylight-saving changes,
    claim kinds, placements, the nodes that send every-node entries and pauses."""
    start, display = _start(from_text), _zone(tz_text)
    app = app_of(ctx)
    try:
        settings = Settings.from_app(app)
    except ElarionBeatError as exc:
        raise click.ClickException(str(exc)) from exc
    entries, invalid, upcoming, note = _entries(app, settings)
    if jobs:
        unknown = sorted(set(jobs) - set(entries) - {i.job for i in invalid})
        if unknown:
            raise click.BadParameter(
                f"no beat_schedule entry named {', '.join(map(repr, unknown))}; the entries "
                f"are {', '.join(sorted([*entries, *(i.job for i in invalid)])) or '(none)'}",
                param_hint="'--job'")
        entries = {name: entry for name, entry in entries.items() if name in jobs}
        invalid = [i for i in invalid if i.job in jobs]
        upcoming = {name: entry for name, entry in upcoming.items() if name in jobs}
    intervals = [name for name, entry in entries.items()
                 if isinstance(entry.schedule, interval_schedule)
                 and entry_placement(name, entry.options) is Placement.CLUSTER]
    known = _read_database(settings, intervals)
    result = preview_entries(
        entries, start, start + timedelta(hours=hours), app_zone=app.timezone,
        display_zone=display, limit=limit, tolerance=settings.window_tolerance,
        anchor_mode=settings.interval_anchor, anchors=known.anchors, live_nodes=known.nodes,
        pauses=known.pauses, invalid=invalid)
    if upcoming:  # database entries edited with a later effective time: from then on
        later = preview_entries(
            upcoming, start, start + timedelta(hours=hours), app_zone=app.timezone,
            display_zone=display, limit=limit, tolerance=settings.window_tolerance,
            anchor_mode=settings.interval_anchor, anchors=known.anchors,
            live_nodes=known.nodes, pauses=known.pauses)
        result.rows = sorted([*result.rows, *later.rows], key=lambda row: (row.utc, row.job))
    result.nodes_error = known.error
    if note:
        click.echo(f"elarion-beat: database entries not shown: {note}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        _print(result, entries, display)
    ctx.exit(1 if strict and result.invalid else 0)


def _print(result: SchedulePreview, entries: dict[str, Any], display: tzinfo | None) -> None:
    span = format_duration(result.end - result.start)
    zones = f"in {zone_name(display)}" if display else "in each entry's zone"
    click.echo(f"preview {utc(result.start)} to {utc(result.end)} ({span}), local times "
               f"{zones}")
    if result.nodes is not None:
        click.echo(f"live nodes: {', '.join(result.nodes) or '(none)'}")
    else:
        why = " ".join(str(result.nodes_error).split())  # one line
        click.echo(f"node list unknown ({why}); the schedule below needs no database")
    headers = ["local", "offset", "utc", "job", "kind", "placement", "sent by", "notes"]
    rows = [[f"{r.local:%H:%M:%S %Z}", r.offset, utc(r.utc), r.job, _kind(r), r.placement.value,
             _sent_by(r), _notes(r)] for r in result.rows]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    changes = result.transitions()
    day: date | None = None
    for row, cells in zip(result.rows, rows):
        if row.local.date() != day:
            day = row.local.date()
            click.echo(f"\n{day:%a %Y-%m-%d}" + "".join(
                f"  [{zone_name(t.zone)}: clocks {t.describe()} at {utc(t.at)}]"
                for t in changes if t.at.astimezone(t.zone).date() == day))
            click.echo("  " + _line(headers, widths))
        click.echo("  " + _line(cells, widths))
    if not result.rows:
        click.echo("\n(no occurrences in the window)")
    _print_footer(result, entries)


def _print_footer(result: SchedulePreview, entries: dict[str, Any]) -> None:
    anchors = {r.job: r for r in result.rows if r.anchor}
    if anchors:
        click.echo("\nintervals (no fixed instants; claimed as a window on the database clock):")
        for job, row in sorted(anchors.items()):
            every = entries[job].schedule.run_every
            window = f", window {format_duration(row.window)}" if row.window else ""
            click.echo(f"  {job}: every {format_duration(every)}{window}; {row.anchor}")
    for job in result.cut:
        click.echo(f"\n{job}: more than {result.limit} occurrences in the window; the first "
                   f"{result.limit} are shown (--limit)")
    for job in result.unknown:
        click.echo(f"\n{job}: its schedule names no instants a preview can list")
    if result.invalid:
        click.echo("\nINVALID (beat leaves these out or refuses to start):")
        for item in result.invalid:
            click.echo(f"  {item.job}: {item.reason}")


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


def _kind(row: PreviewRow) -> str:
    return f"window {format_duration(row.window)}" if row.window else row.kind


def _sent_by(row: PreviewRow) -> str:
    if row.placement is not Placement.EVERY_NODE:
        return "one node"
    if row.nodes is None:
        return "each live node (unknown)"
    return ", ".join(row.nodes) if row.nodes else "no live node"


def _notes(row: PreviewRow) -> str:
    notes = [row.dst_mark] if row.dst_mark else []
    if row.paused is not None:
        until = f" until {utc(row.paused.until)}" if row.paused.until else ""
        notes.append(f"PAUSED{until}")
    return "; ".join(notes)
