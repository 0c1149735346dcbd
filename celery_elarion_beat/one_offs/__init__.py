"""Durable one-offs: run a task once, later, from any process.

* :mod:`.api`: ``schedule_once``, ``apply_at``, ``cancel``, ``get_one_off``,
  ``list_one_offs`` (a row in the claims database, committed with your own writes
  when you pass ``connection=``);
* :mod:`.runner`: beat's side, which leases due rows, publishes and records them.

Their records are :mod:`celery_elarion_beat.store.one_off_records`; their table
:func:`celery_elarion_beat.store.schema.one_offs_table`.
"""

from __future__ import annotations

from .api import (
    apply_at,
    cancel,
    get_one_off,
    list_one_offs,
    schedule_once,
)

__all__ = ["apply_at", "cancel", "get_one_off", "list_one_offs", "schedule_once"]
