"""A Prometheus exporter for beat's events, for clusters without Flower.

::

    python -m celery_elarion_beat.exporter -A proj --port 9808
    celery -A proj elarion-beat exporter --port 9808        # the same

It listens to the ``elarion-*`` Celery events (a ``celery.events`` receiver on
the app's broker, like ``celery events`` and Flower) and serves
``elarion_beat_occurrences_total{job,outcome,reason}``,
``elarion_beat_node_occurrences_total{node,outcome,reason}``,
``elarion_beat_drift_events_total{node}``, ``elarion_beat_orphan_events_total{job,action}``
and the histograms ``elarion_beat_lateness_seconds{job,outcome}`` and
``elarion_beat_runtime_seconds{job,outcome}`` (from the workers' ``elarion-run``
events), and the gauges ``elarion_beat_node_last_seen_timestamp_seconds{node}`` and
``elarion_beat_clock_skew_seconds{node}`` (from beat's ``elarion-heartbeat`` events)
on ``http://<address>:<port>/metrics`` (with prometheus_client's process metrics;
see :class:`.metrics.OccurrenceCounters`: a node's series go once it sent no event for
a day). Counts start when the exporter starts; while the broker is away it reconnects
with a backoff (at most 30 s). The CLI's exporter (and ``python -m
celery_elarion_beat.exporter``) also serves ``elarion_beat_every_node_missing{job,node}``,
read from the claims database (:mod:`..operate.coverage_metrics`), through *collectors*.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config.parsers import format_duration
from .events import EVENT_TYPES
from .metrics import counters_for

__all__ = ["DEFAULT_PORT", "EventListener", "main", "serve"]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9808
MAX_BACKOFF = 30.0

Handler = Callable[[Mapping[str, Any]], None]
#: Builds more collectors for the app served (a higher floor's metrics: the database's).
Collectors = Callable[[Any], Sequence[Any]]


class EventListener:
    """Calls *handler* with every ``elarion-*`` event until :meth:`stop`; reconnects."""

    def __init__(self, app: Any, handler: Handler) -> None:
        self.app = app
        self.handler = handler
        self.ready = threading.Event()  # set once the receiver is consuming
        self._stopping = threading.Event()
        self._receiver: Any = None

    def _on_event(self, event: Mapping[str, Any]) -> None:
        try:
            self.handler(event)
        except Exception:  # one bad event never stops the exporter
            logger.exception("elarion exporter: could not count event %r", event.get("type"))

    def run(self) -> None:
        delay = 1.0
        while not self._stopping.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    receiver = self.app.events.Receiver(
                        conn, handlers={kind: self._on_event for kind in EVENT_TYPES})
                    receiver.on_iteration = lambda: self._on_ready(conn)  # each drain loop
                    self._receiver = receiver
                    if self._stopping.is_set():
                        return
                    for _ in receiver.consume(limit=None, timeout=None, wakeup=False):
                        delay = 1.0
            except Exception as exc:
                if self._stopping.is_set():
                    return
                logger.warning("elarion exporter: event receiver failed (%s); "
                               "reconnecting in %s", exc, format_duration(delay))
                self.ready.clear()
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF)

    def _on_ready(self, conn: Any) -> None:
        if not self.ready.is_set():
            logger.info("elarion exporter: receiving events from %s", conn.as_uri())
            self.ready.set()

    def stop(self) -> None:
        self._stopping.set()
        if self._receiver is not None:
            self._receiver.should_stop = True


def serve(app: Any, port: int = DEFAULT_PORT, address: str = "0.0.0.0",
          registry: Any = None, collectors: Collectors | None = None) -> None:
    """Serve ``/metrics`` on *address*:*port* and count events until interrupted; with
    the *collectors* made for *app* registered too."""
    from prometheus_client import REGISTRY, start_http_server

    registry = REGISTRY if registry is None else registry
    counters = counters_for(registry)
    for collector in collectors(app) if collectors is not None else ():
        registry.register(collector)
    start_http_server(port, addr=address, registry=registry)
    logger.info("elarion exporter: metrics on http://%s:%d/metrics", address, port)
    listener = EventListener(app, counters.observe)
    try:
        listener.run()
    except KeyboardInterrupt:
        pass
    finally:
        listener.stop()


def _load_app(name: str) -> Any:
    from celery.app.utils import find_app

    return find_app(name)


def main(argv: Sequence[str] | None = None, collectors: Collectors | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m celery_elarion_beat.exporter",
        description="Serve Prometheus counters of beat's elarion-* events.")
    parser.add_argument("-A", "--app", required=True, help="the Celery app, e.g. proj")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument("--address", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    parser.add_argument("-l", "--loglevel", default="INFO", help="log level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel.upper(),
                        format="[%(asctime)s: %(levelname)s] %(message)s")
    try:
        app = _load_app(args.app)
    except Exception as exc:
        parser.error(f"cannot load the Celery app {args.app!r}: {exc}")
    serve(app, port=args.port, address=args.address, collectors=collectors)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
