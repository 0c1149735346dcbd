"""The store registry: which store class opens a DSN, imported only when used.

Each backend of :data:`celery_elarion_beat.config.dsn.BACKENDS` has a factory here,
checked code rather than a ``"module:Class"`` string: a store class that moves or is
renamed fails in mypy and at import of this module, not at the first start. The
factories import their backend lazily, so a deployment never loads a driver it does
not use (PyMySQL for PostgreSQL, say).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from ..config.dsn import backend_for
from ..config.settings import Settings
from ..schedules.clock import Clock, utcnow
from .interface import ClaimStore

__all__ = ["FACTORIES", "app_store", "close_app_stores", "open_store"]

Factory = Callable[[Settings, Clock], ClaimStore]


def _postgres(settings: Settings, clock: Clock) -> ClaimStore:
    from .postgres import PostgresClaimStore

    return PostgresClaimStore(settings)


def _mysql(settings: Settings, clock: Clock) -> ClaimStore:
    from .mysql import MysqlClaimStore

    return MysqlClaimStore(settings)


def _sqlite(settings: Settings, clock: Clock) -> ClaimStore:
    # no server clock to read: the store reads the scheduler's
    from .sqlite import SqliteClaimStore

    return SqliteClaimStore(settings, clock=clock)


def _memory(settings: Settings, clock: Clock) -> ClaimStore:
    from .memory import MemoryClaimStore

    return MemoryClaimStore.from_dsn(settings.require_dsn(), clock=clock,
                                     cluster=settings.require_cluster())


#: Backend name (:class:`~celery_elarion_beat.config.dsn.Backend`) -> its store's factory.
FACTORIES: dict[str, Factory] = {
    "postgresql": _postgres,
    "mysql": _mysql,
    "sqlite": _sqlite,
    "memory": _memory,
}


def open_store(settings: Settings, clock: Clock = utcnow) -> ClaimStore:
    """Return the store the settings' DSN names, bound to their cluster
    (``elarion_beat_cluster``); opens no connection yet."""
    settings.require_cluster()
    return FACTORIES[backend_for(settings.require_dsn()).name](settings, clock)


_stores: dict[tuple[int, Settings], tuple[Any, ClaimStore]] = {}
_stores_lock = threading.Lock()


def app_store(app: Any) -> ClaimStore:
    """The store of *app*'s settings, opened once per app and settings and closed at
    exit: what the APIs that take an app use (``schedule_once``, the live schedules)."""
    settings = Settings.from_app(app)
    with _stores_lock:
        held = _stores.get((id(app), settings))
        if held is not None and held[0] is app:
            return held[1]
        store = open_store(settings)
        _stores[(id(app), settings)] = (app, store)
        return store


@atexit.register
def close_app_stores() -> None:
    """Close the stores :func:`app_store` opened (at exit; tests may call it)."""
    with _stores_lock:
        held = list(_stores.values())
        _stores.clear()
    for _, store in held:
        try:
            store.close()
        except Exception:  # exiting: a broken pool must not hide the real exit status
            pass
