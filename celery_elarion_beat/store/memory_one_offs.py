"""The one-offs of the in-memory store (the reference the contract suite checks the
SQL stores against): one dict per namespace, under the namespace's lock."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .one_off_records import (
    FINISHED_STATES,
    LeasedOneOff,
    NewOneOff,
    OneOff,
    OneOffState,
)

__all__ = ["MemoryOneOffs", "OneOffRecord"]


@dataclasses.dataclass(frozen=True)
class OneOffRecord:
    """A one-off as the memory store keeps it: the row, its payload, when it finished."""

    row: OneOff
    content_type: str
    content_encoding: str
    body: bytes
    finished: datetime | None = None


class MemoryOneOffs:
    """The one-off methods of :class:`~.memory.MemoryClaimStore`."""

    _clock: Callable[[], datetime]

    def _one_off_space(self) -> tuple[threading.Lock, dict[str, OneOffRecord]]:
        raise NotImplementedError  # the store provides its namespace's lock and dict

    def add_one_off(self, new: NewOneOff, connection: Any = None) -> OneOff:
        lock, rows = self._one_off_space()
        with lock:
            if new.key is not None:
                held = _find(rows, new.key)
                if held is not None:
                    return held.row
            now = self._clock()
            due = new.due if new.due is not None else now + timedelta(seconds=new.delay or 0.0)
            row = OneOff(new.id, new.key, new.task, due, OneOffState.SCHEDULED, now, None, None,
                         0, None, None, dict(new.options))
            rows[new.id] = OneOffRecord(row, new.content_type, new.content_encoding, new.body)
            return row

    def lease_one_offs(self, node: str, *, limit: int, lease: timedelta) -> list[LeasedOneOff]:
        lock, rows = self._one_off_space()
        with lock:
            now = self._clock()
            ready = sorted((r for r in rows.values() if _leasable(r.row, now)),
                           key=lambda r: (r.row.due, r.row.id))[:limit]
            out = []
            for record in ready:
                row = dataclasses.replace(record.row, state=OneOffState.LEASED, node=node,
                                          lease_until=now + lease,
                                          attempts=record.row.attempts + 1)
                rows[row.id] = dataclasses.replace(record, row=row)
                out.append(LeasedOneOff(row, record.content_type, record.content_encoding,
                                        record.body))
            return out

    def finish_one_offs(self, node: str, published: Sequence[str], failed: Mapping[str, str],
                        released: Sequence[str] = ()) -> None:
        lock, rows = self._one_off_space()
        with lock:
            now = self._clock()
            for id_, change in [*[(i, dict(state=OneOffState.PUBLISHED, published=now))
                                  for i in published],
                                *[(i, dict(state=OneOffState.FAILED, error=error))
                                  for i, error in failed.items()],
                                *[(i, dict(state=OneOffState.SCHEDULED, node=None,
                                           lease_until=None)) for i in released]]:
                record = rows.get(id_)
                if record is None or record.row.state is not OneOffState.LEASED \
                        or record.row.node != node:
                    continue
                row = dataclasses.replace(record.row, **change)  # type: ignore[arg-type]
                done = now if row.state in FINISHED_STATES else None
                rows[id_] = dataclasses.replace(record, row=row, finished=done)

    def cancel_one_off(self, id_or_key: str) -> OneOff | None:
        lock, rows = self._one_off_space()
        with lock:
            record = _find(rows, id_or_key)
            if record is None:
                return None
            if record.row.state is OneOffState.SCHEDULED:
                row = dataclasses.replace(record.row, state=OneOffState.CANCELLED)
                record = dataclasses.replace(record, row=row, finished=self._clock())
                rows[row.id] = record
            return record.row

    def one_offs(self, *, id_or_key: str | None = None,
                 states: Collection[OneOffState] | None = None,
                 limit: int = 100, order: str = "-due") -> list[OneOff]:
        lock, rows = self._one_off_space()
        with lock:
            if id_or_key is not None:
                found = _find(rows, id_or_key)
                return [found.row] if found is not None else []
            wanted = set(states) if states is not None else None
            records = [r for r in rows.values() if wanted is None or r.row.state in wanted]
        if order.endswith("finished"):  # unfinished rows sort first, as NULLs do in SQL
            records.sort(key=lambda r: (r.finished is not None, r.finished or r.row.due, r.row.id))
        else:
            records.sort(key=lambda r: (r.row.due, r.row.id))
        if order.startswith("-"):
            records.reverse()
        return [r.row for r in records[:limit]]

    def next_one_off_due(self) -> datetime | None:
        lock, rows = self._one_off_space()
        with lock:
            times = [r.row.due for r in rows.values() if r.row.state is OneOffState.SCHEDULED]
            times += [r.row.lease_until for r in rows.values()
                      if r.row.state is OneOffState.LEASED and r.row.lease_until is not None]
        return min(times, default=None)

    def purge_one_offs(self, older_than: timedelta, batch_size: int = 5000,
                       dry_run: bool = False) -> int:
        lock, rows = self._one_off_space()
        with lock:
            cutoff = self._clock() - older_than
            old = [i for i, r in rows.items() if r.finished is not None and r.finished < cutoff]
            if not dry_run:
                for id_ in old:
                    del rows[id_]
            return len(old)


def _find(rows: Mapping[str, OneOffRecord], id_or_key: str) -> OneOffRecord | None:
    found = rows.get(id_or_key)
    if found is not None:
        return found
    return next((r for r in rows.values() if r.row.key == id_or_key), None)


def _leasable(row: OneOff, now: datetime) -> bool:
    if row.state is OneOffState.SCHEDULED:
        return row.due <= now
    return row.state is OneOffState.LEASED and row.lease_until is not None \
        and row.lease_until < now
