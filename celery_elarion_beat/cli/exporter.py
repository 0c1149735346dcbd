"""``celery -A proj elarion-beat exporter``: Prometheus counters of beat's events
(:mod:`celery_elarion_beat.observe.exporter`), for clusters without Flower, and the
gauge ``elarion_beat_every_node_missing`` read from the claims database
(:mod:`celery_elarion_beat.operate.coverage_metrics`).
"""

from __future__ import annotations

import click

from .context import app_of as _app

__all__ = ["exporter_command"]


@click.command("exporter")
@click.option("--port", default=9808, show_default=True, type=int, help="HTTP port.")
@click.option("--address", default="0.0.0.0", show_default=True, help="Bind address.")
@click.pass_context
def exporter_command(ctx: click.Context, port: int, address: str) -> None:
    """Serve Prometheus counters of beat's elarion-* events, and which live nodes did
    not run an every-node entry, on /metrics."""
    import logging

    from ..observe.exporter import serve
    from ..operate.coverage_metrics import collectors

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    serve(_app(ctx), port=port, address=address, collectors=collectors)
