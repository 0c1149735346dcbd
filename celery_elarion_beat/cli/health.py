"""``celery -A proj elarion-beat health``: a probe of one node's beat.

Exits 0 when the node's last heartbeat (its row in the nodes table, written every
``elarion_beat_heartbeat_interval`` by its beat) is at most ``--max-age`` seconds old
(default ``elarion_beat_node_timeout``: the age at which ``status`` calls a node dead,
:meth:`~..store.interface.NodeState.is_live`), else 1, printing one line either way.

The age is measured on the database clock, as ``status`` measures it: the heartbeat's
``last_seen`` is written by the database, and the probe reads the database's ``now()``
in the same query, so a probe on a host whose clock is off judges the same as any
other. A database that cannot be reached exits 1 too, within
``elarion_beat_claim_timeout`` (the connect timeout of the claims connection): a probe
never hangs.

``--unreachable-ok`` makes an unreachable claims database exit 0: a liveness probe
should not restart a beat that fails closed through a database outage (a restart
does not bring the database back); see examples/kubernetes/deployment.yaml.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, NoReturn

import click

from ..beat.startup import one_line
from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import ElarionBeatError, StoreRefused, StoreUnavailable
from ..schedules.slots import iso
from ..store.registry import open_store
from .context import app_of, parse_duration, refusing

__all__ = ["health_command"]


@click.command("health")
@click.option("--node", default=None,
              help="The node to probe. Default: this node (elarion_beat_node, the "
                   "ELARION_BEAT_NODE variable, else the host name).")
@click.option("--max-age", "max_age_text", default=None,
              help="How old the last heartbeat may be: 90s, 2m (a bare number counts "
                   "seconds). Default: elarion_beat_node_timeout.")
@click.option("--unreachable-ok", is_flag=True,
              help="Exit 0 when the claims database cannot be reached (beat fails closed "
                   "meanwhile): for a liveness probe.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def health_command(ctx: click.Context, node: str | None, max_age_text: str | None,
                   unreachable_ok: bool, as_json: bool) -> None:
    """Exit 0 when NODE's beat sent a heartbeat within --max-age, else 1."""
    max_age = _max_age(max_age_text)
    with refusing():
        settings = Settings.from_app(app_of(ctx))
        store = open_store(settings)
    name = node or settings.node
    limit = max_age if max_age is not None else settings.node_timeout
    report: dict[str, Any] = {"node": name, "max_age": limit, "age": None,
                              "last_seen": None, "db_now": None, "error": None}
    try:
        now, nodes = store.nodes()
    except ElarionBeatError as exc:
        outage = isinstance(exc, StoreUnavailable) and not isinstance(exc, StoreRefused)
        report.update(error=one_line(exc), healthy=unreachable_ok and outage)
        _finish(report, as_json, f"{'ok' if report['healthy'] else 'unhealthy'}: cannot read "
                                 f"the heartbeat of node {name}: {report['error']}")
    finally:
        store.close()
    seen = next((n for n in nodes if n.node == name), None)
    report["db_now"] = iso(now)
    if seen is None or seen.last_seen is None:
        report["healthy"] = False
        _finish(report, as_json, f"unhealthy: node {name} has sent no heartbeat (nodes table "
                                 f"{settings.qualified_nodes_table})")
    age = (now - seen.last_seen).total_seconds()
    healthy = seen.is_live(now, timedelta(seconds=limit))
    report.update(age=round(age, 3), last_seen=iso(seen.last_seen), healthy=healthy)
    verdict = "within" if healthy else "older than"
    _finish(report, as_json, f"{'healthy' if healthy else 'unhealthy'}: node {name}'s last "
                             f"heartbeat is {format_duration(age, approximate=True)} old, "
                             f"{verdict} {format_duration(limit)} (on the database clock)")


def _max_age(text: str | None) -> float | None:
    if text is None:
        return None
    seconds = parse_duration(text, "--max-age").total_seconds()
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} must be longer than 0 seconds",
                                 param_hint="'--max-age'")
    return seconds


def _finish(report: dict[str, Any], as_json: bool, line: str) -> NoReturn:
    click.echo(json.dumps(report) if as_json else line)
    click.get_current_context().exit(0 if report["healthy"] else 1)
