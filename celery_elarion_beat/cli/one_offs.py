"""``celery -A proj elarion-beat one-offs list|show|cancel``: durable one-offs
(:mod:`..one_offs.api`).

Each command reads or changes the one-offs table through the app's claim store;
beat need not be running.

* ``list [--state STATE ...] [--limit N] [--json]``: the one-offs, latest due first,
  optionally only those in the given states;
* ``show ID_OR_KEY [--json]``: one one-off, found by its id or its idempotency key;
  exit 1 when there is none;
* ``cancel ID_OR_KEY``: exit 0 when it is cancelled (now, or already); exit 1 with
  its state when it is too late (a node leased it, or it was published or failed),
  and exit 1 when there is no such one-off. A cancel and a node's lease race on the
  row: whichever commits first wins, and the loser sees the winner's state.

A database error exits 1 with its text; bad input exits 2. ``elarion-beat purge``
also deletes the finished one-offs (:func:`~celery_elarion_beat.beat.purge.purge_one_offs`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from ..store.one_off_records import OneOff, OneOffState
from .context import StoreContext, app_of, refusing
from .text import short, table, utc

__all__ = ["one_offs_group"]

_STATES = [state.value for state in OneOffState]


def _row(one: OneOff) -> list[str]:
    outcome = (utc(one.published) if one.published is not None
               else short(one.error) if one.error else "-")
    return [one.id, one.key or "-", one.task, utc(one.due), one.state.value, one.node or "-",
            str(one.attempts), outcome]


def _print_table(rows: Sequence[OneOff]) -> None:
    table(["id", "key", "task", "due", "state", "node", "attempts", "published / error"],
          [_row(one) for one in rows], right=(6,))


def _json(one: OneOff, cluster: str) -> str:
    return json.dumps({**one.as_dict(), "cluster": cluster}, sort_keys=True)


@click.group("one-offs")
def one_offs_group() -> None:
    """Durable one-offs (`schedule_once`) of the app's cluster: list, show and cancel
    them."""


@one_offs_group.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(_STATES),
              help="Only one-offs in this state (repeat the option for several).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_context
def list_command(ctx: click.Context, states: tuple[str, ...], limit: int,
                 as_json: bool) -> None:
    """The one-offs, latest due first: id, key, task, due time (UTC), state, the node
    that leased or published it, its leases taken, and when it was published or why it
    failed."""
    wanted = [OneOffState(s) for s in states] or None
    with StoreContext(app_of(ctx)) as c, refusing():
        rows = c.store.one_offs(states=wanted, limit=limit)
    if as_json:
        for one in rows:
            click.echo(_json(one, c.store.cluster))
        return
    click.echo(f"cluster: {c.store.cluster}")
    _print_table(rows)


def _find(store: Any, id_or_key: str) -> OneOff | None:
    rows: list[OneOff] = store.one_offs(id_or_key=id_or_key, limit=1)
    return rows[0] if rows else None


def _missing(id_or_key: str) -> str:
    return f"no one-off with id or key {id_or_key!r}"


@one_offs_group.command("show")
@click.argument("id_or_key")
@click.option("--json", "as_json", is_flag=True, help="Print the one-off as JSON.")
@click.pass_context
def show_command(ctx: click.Context, id_or_key: str, as_json: bool) -> None:
    """One one-off, by its id or its key (exit 1 when there is none)."""
    with StoreContext(app_of(ctx)) as c, refusing():
        one = _find(c.store, id_or_key)
    if one is None:
        click.echo(_missing(id_or_key), err=True)
        ctx.exit(1)
        return
    if as_json:
        click.echo(_json(one, c.store.cluster))
        return
    fields = {**one.as_dict(), "cluster": c.store.cluster}
    width = max(len(name) for name in fields)
    for name in sorted(fields):
        value = fields[name]
        text = json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
        click.echo(f"{name.ljust(width)}  {'-' if text is None else text}")


@one_offs_group.command("cancel")
@click.argument("id_or_key")
@click.pass_context
def cancel_command(ctx: click.Context, id_or_key: str) -> None:
    """Cancel a one-off that no node has leased yet: exit 0 when it is cancelled, 1 when
    it is too late (its state is printed) or there is no such one-off."""
    with StoreContext(app_of(ctx)) as c, refusing():
        one: OneOff | None = c.store.cancel_one_off(id_or_key)
    if one is None:
        click.echo(_missing(id_or_key), err=True)
        ctx.exit(1)
        return
    if one.state is OneOffState.CANCELLED:
        click.echo(f"cancelled one-off {one.id} ({one.task}, due {utc(one.due)})")
        return
    holder = f" by {one.node}" if one.node else ""
    click.echo(f"too late: one-off {one.id} ({one.task}) is {one.state.value}{holder}; "
               "only a scheduled one-off can be cancelled", err=True)
    ctx.exit(1)
