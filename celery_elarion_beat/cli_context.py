"""What every ``elarion-beat`` sub-command shares: the app and an open store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import click

from .clock import as_utc
from .exceptions import ConfigurationError, ElarionBeatError
from .parsers import duration
from .settings import Settings
from .startup import one_line
from .store import ClaimStore, open_store

__all__ = ["StoreContext", "app_of", "parse_duration", "period", "refusing"]


class StoreContext:
    """The app's settings and its claim store, closed on exit; a bad setting or DSN
    becomes a usage error that names it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        try:
            self.settings = Settings.from_app(app)
            self.store: ClaimStore = open_store(self.settings)
        except ElarionBeatError as exc:
            raise click.ClickException(one_line(exc)) from exc

    def __enter__(self) -> StoreContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()


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


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> timedelta."""
    try:
        return duration("", text)
    except ConfigurationError:
        raise click.BadParameter(f"{text!r} is not a duration; use e.g. 90s, 30m, 12h, "
                                 "7d") from None


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
