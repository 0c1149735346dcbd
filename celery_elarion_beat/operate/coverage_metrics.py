"""``elarion_beat_every_node_missing{job,node}``: every-node accountability
(:mod:`.coverage`) as a Prometheus gauge, for Flower's ``/metrics`` and the exporter.

The other ``elarion_beat_*`` metrics count events (:mod:`..observe.metrics`); this one
cannot: an event says what happened, and a node whose worker is down sends none. So it
is read from the claims database, as ``status`` reads it: per every-node entry and live
beat node that is judged (its workers record runs, and it has been live for two periods
of the entry), ``1`` when its workers recorded no run of the entry in the entry's last
two periods, ``0`` when they did. Nodes not tracked (no ``install_worker``) and nodes
too new have no series; a node that stops heartbeating loses its series.

A scrape never waits for the database: it serves the last reading and, when that is
older than *refresh* seconds, starts a new one in a thread of its own (one at a time).
Until the first reading, and after a reading failed (logged once, until one succeeds
again), the gauge has no series: an unknown state is never shown as 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..config.settings import Settings
from ..store.interface import ClaimStore
from ..store.registry import open_store
from .coverage import read_coverage

__all__ = ["METRIC", "REFRESH_SECONDS", "EveryNodeGauge", "collectors"]

logger = logging.getLogger(__name__)

#: The gauge's name.
METRIC = "elarion_beat_every_node_missing"
#: How old a reading may be before a scrape asks for a new one.
REFRESH_SECONDS = 15.0
_HELP = ("1: a live beat node whose workers record runs (install_worker) recorded no run "
         "of this every-node entry in its last two periods, though live for them (is the "
         "node's worker down?); 0: it ran. From the claims database")


class EveryNodeGauge:
    """The collector of ``elarion_beat_every_node_missing{job,node}`` for the app
    *app* (or :meth:`bind` it later: Flower knows its app once events arrive). *store*
    opens the claims store (default: from the app's settings), once."""

    def __init__(self, app: Any = None, refresh: float = REFRESH_SECONDS,
                 store: Callable[[], ClaimStore] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.refresh_every = refresh
        self._open = store
        self._clock = clock
        self._store: ClaimStore | None = None
        self._settings: Settings | None = None
        self._values: dict[tuple[str, str], float] | None = None
        self._read_at = float("-inf")
        self._reading = False
        self._failing = False
        self._closed = False
        self._lock = threading.Lock()
        #: held while the store is opened or closed: a refresh in the background never
        #: opens one after close(), nor two refreshes one each
        self._store_lock = threading.Lock()

    def bind(self, app: Any) -> None:
        """Read the claims database of *app* from now on (the first app bound stays)."""
        with self._lock:
            if self.app is None:
                self.app = app

    def refresh(self) -> bool:
        """Read the coverage now (blocking); False when it could not be read."""
        app = self.app
        if app is None:
            return False
        try:
            with self._store_lock:
                if self._closed:
                    return False
                if self._store is None:
                    self._settings = Settings.from_app(app)
                    self._store = self._open() if self._open else open_store(self._settings)
                settings, store = self._settings, self._store
            assert settings is not None
            _, covered = read_coverage(app, settings, store)
        except Exception as exc:  # a scrape must never fail on the database
            if self._closed:
                return False  # closed under a read in progress: nothing to report
            with self._lock:
                self._values, self._read_at = None, self._clock()
                failing, self._failing = self._failing, True
            if not failing:
                logger.warning("elarion: %s is unknown: the claims database could not be "
                               "read (%s)", METRIC, exc, extra={"action": "coverage-unread"})
            return False
        values = {(job, node): 1.0 for job, c in covered.items() for node in c.missing}
        values.update({(job, node): 0.0 for job, c in covered.items() for node in c.covered})
        with self._lock:
            self._values, self._read_at = values, self._clock()
            failing, self._failing = self._failing, False
        if failing:
            logger.info("elarion: %s is read from the claims database again", METRIC,
                        extra={"action": "coverage-read"})
        return True

    def _refresh_in_background(self) -> None:
        try:
            self.refresh()
        finally:
            with self._lock:
                self._reading = False

    def describe(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(METRIC, _HELP, labels=["job", "node"])

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            stale = self._clock() - self._read_at >= self.refresh_every
            if stale and not self._reading and self.app is not None:
                self._reading = True
                threading.Thread(target=self._refresh_in_background, daemon=True,
                                 name="elarion-coverage").start()
            values = dict(self._values or {})
        family = GaugeMetricFamily(METRIC, _HELP, labels=["job", "node"])
        for (job, node), value in sorted(values.items()):
            family.add_metric([job, node], value)
        yield family

    def close(self) -> None:
        """Close the store it opened; it reads nothing more."""
        with self._store_lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            store.close()


def collectors(app: Any) -> list[Any]:
    """The exporter's collectors of the database for *app*: the gauge."""
    return [EveryNodeGauge(app)]
