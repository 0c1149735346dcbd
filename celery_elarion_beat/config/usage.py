"""Whether an app uses celery-elarion-beat: the question the scheduler guard asks.

An app uses the library when it names a claims database (``elarion_beat_dsn`` in
``app.conf`` or as ``ELARION_BEAT_DSN``, or a Django alias in
``elarion_beat_django_database``) or when :func:`~..worker.install_worker` ran on it
(which marks the app object with :func:`mark_installed`). A beat of such an app must
run ``ClaimingScheduler`` (:mod:`..beat.scheduler_guard`); an app that does none of
this (a replica built before the library, whose module never imports it) is left
alone, even though the ``celery`` command loads the library's entry point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .settings import claims_configured_by

__all__ = ["INSTALLED_ATTRIBUTE", "mark_installed", "uses_library"]

#: The attribute :func:`mark_installed` sets on an app object.
INSTALLED_ATTRIBUTE = "_elarion_beat_installed"


def mark_installed(app: Any) -> None:
    """Note on *app* (the app object, a proxy resolved) that ``install_worker`` ran on it."""
    app = getattr(app, "_get_current_object", lambda: app)()
    setattr(app, INSTALLED_ATTRIBUTE, True)


def uses_library(app: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Why *app* uses the library, as an operator reads it (``elarion_beat_dsn is
    set``, ``it calls install_worker(app)``), or None when it does not."""
    where = claims_configured_by(app, environ)
    if where is not None:
        return f"{where} is set"
    app = getattr(app, "_get_current_object", lambda: app)()
    if getattr(app, INSTALLED_ATTRIBUTE, False):
        return "it calls install_worker(app)"
    return None
