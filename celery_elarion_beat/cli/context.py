"""What every ``elarion-beat`` sub-command shares: the app and an open store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

import click
from celery.beat import ScheduleEntry

from ..beat.startup import one_line
from ..config.entries import InvalidEntry, Schedule
from ..config.parsers import duration
from ..config.settings import Settings
from ..exceptions import ConfigurationError, ElarionBeatError
from ..live_schedules.listing import read_live_schedule
from ..schedules.clock import as_utc
from ..store.interface import ClaimStore
from ..store.registry import open_store

__all__ = ["StoreContext", "app_of", "parse_duration", "period", "refusing", "warn_invalid"]


class StoreContext:
    """The app's settings and its claim store, closed on exit; a bad setting or DSN
    becomes a usage error that names it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._schedule: Schedule | None = None
        try:
            self.settings = Settings.from_app(app)
            self.store: ClaimStore = open_store(self.settings)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc

    def schedule(self) -> dict[str, ScheduleEntry]:
        """The good entries of the app's ``beat_schedule`` (and its database entries,
        with ``elarion_beat_db_entries``); each entry beat leaves out is named on stderr,
        in one line with why (once per command)."""
        if self._schedule is None:
            self._schedule = read_live_schedule(self.app, self.settings, self.store,
                                                checked=False)
            warn_invalid(self._schedule.invalid)
        return self._schedule.entries

    def __enter__(self) -> StoreContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()


def warn_invalid(invalid: Iterable[InvalidEntry]) -> None:
    """Name each ``beat_schedule`` entry beat leaves out, one line each on stderr."""
    for entry in invalid:
        click.echo(f"elarion-beat: {entry.line()}", err=True)


def app_of(ctx: click.Context) -> Any:
    """The Celery app of ``celery -A proj elarion-beat ...``."""
    obj = ctx.find_object(object) if ctx.obj is None else ctx.obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.ClickException("no Celery app: run it as `celery -A proj elarion-beat ...`")
    return app


@contextlib.contextmanager
def refusing() -> Iterator[None]:
    """Bad input (:class:`ConfigurationError`) becomes a usage error, exit 2, its text
    naming what is wrong; any other library error (the database) exits 1. Either way
    the message is printed on one line."""
    try:
        yield
    except ConfigurationError as exc:
        raise click.UsageError(one_line(exc)) from exc
    except ElarionBeatError as exc:
        raise click.ClickException(one_line(exc)) from exc  # libpq's errors span lines


def parse_duration(text: str, option: str | None = None) -> timedelta:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``1h30m`` -> timedelta
    (:func:`~..config.parsers.duration`); a usage error naming *option* and saying
    what is wrong."""
    try:
        return duration("", text)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'" if option else None) \
            from None


def period(text: str | None) -> datetime | timedelta | None:
    """``--since``: an ISO time, or a duration back from the database clock."""
    if text is None:
        return None
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        try:
            return parse_duration(text)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{text!r} is neither a duration (24h, 7d) nor an ISO "
                                     "time (2026-11-29T03:00:00Z)",
                                     param_hint="'--since'") from exc
