"""The database entries of the in-memory store: what the SQL stores' triggers do,
in code (the reference the contract suite checks them against): one version
counter, the entries and their revisions per cluster, under the namespace's lock."""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ..config.live_entries import EntryDefinition
from ..schedules.slots import ClaimKind
from .entry_records import (
    EntryChange,
    EntryChanges,
    EntryRevision,
    EntrySnapshot,
    EntryWrite,
    StoredEntry,
    check_unique_names,
    governing,
    plan_writes,
)
from .interface import Wakeups
from .records import ClaimRequest

__all__ = ["EntrySpace", "MemoryEntryWakeups", "MemoryLiveEntries"]


class MemoryEntryWakeups(Wakeups):
    """Told by every write of its cluster's entries in this process: a sure listener
    (the follower reads the version only when told)."""

    reliable = True

    def __init__(self) -> None:
        self._told = True  # a new listener may have missed anything

    def tell(self) -> None:
        self._told = True

    def poll(self) -> bool | None:
        told, self._told = self._told, False
        return told

    def close(self) -> None:
        return None


@dataclasses.dataclass
class EntrySpace:
    """One namespace's database entries: per cluster, the version, the entries, the
    revisions (in order), and each entry's revisions (for the claims' check)."""

    versions: dict[str, int] = dataclasses.field(default_factory=dict)
    entries: dict[str, dict[str, StoredEntry]] = dataclasses.field(default_factory=dict)
    revisions: dict[str, list[EntryRevision]] = dataclasses.field(default_factory=dict)
    by_name: dict[tuple[str, str], list[EntryRevision]] = dataclasses.field(
        default_factory=dict)
    listeners: dict[str, weakref.WeakSet[MemoryEntryWakeups]] = dataclasses.field(
        default_factory=dict)

    def tell(self, cluster: str) -> None:
        for listener in list(self.listeners.get(cluster, ())):
            listener.tell()

    def clear(self) -> None:
        self.versions.clear()
        self.entries.clear()
        self.revisions.clear()
        self.by_name.clear()


def action_of(before: StoredEntry | None, after: EntryDefinition, overrides: bool) -> str:
    """The action a write of *after* over *before* is (as the SQL triggers name it)."""
    if before is None:
        return "override" if overrides else "add"
    if overrides and not before.overrides:
        return "override"
    if after.enabled != before.definition.enabled and dataclasses.replace(
            after, enabled=before.definition.enabled).same(before.definition):
        return "enable" if after.enabled else "disable"
    return "edit"


class MemoryLiveEntries:
    """The database-entry methods of :class:`~.memory.MemoryClaimStore`."""

    _clock: Callable[[], datetime]
    cluster: str

    def _entry_space(self) -> tuple[threading.Lock, EntrySpace]:
        raise NotImplementedError  # the store provides its namespace's lock and space

    def write_entries(self, cluster: str, changes: Sequence[EntryChange], actor: str,
                      reason: str = "", connection: Any = None) -> EntryWrite:
        check_unique_names(changes)
        lock, space = self._entry_space()
        with lock:
            now = self._clock()
            held = space.entries.setdefault(cluster, {})
            writes = plan_writes(changes, held, now)
            if not writes:
                return EntryWrite(None, [held.get(c.name) for c in changes])
            version = space.versions.get(cluster, 0) + 1
            space.versions[cluster] = version
            log = space.revisions.setdefault(cluster, [])
            for change, effective in writes:
                before = held.get(change.name)
                if change.action == "remove":
                    assert before is not None
                    rev = EntryRevision(cluster, change.name, version, "remove",
                                        before.definition, now, now, actor, reason,
                                        before.overrides, before.code_digest, False)
                    del held[change.name]
                else:
                    assert change.definition is not None
                    overrides = before.overrides if before is not None \
                        else change.action == "override"
                    digest = before.code_digest if before is not None else change.code_digest
                    rev = EntryRevision(cluster, change.name, version,
                                        action_of(before, change.definition, overrides),
                                        change.definition, effective, now, actor, reason,
                                        overrides, digest, change.restart)
                    entry = rev.entry()
                    assert entry is not None
                    held[change.name] = entry
                log.append(rev)
                space.by_name.setdefault((cluster, change.name), []).append(rev)
            space.tell(cluster)
            return EntryWrite(version, [held.get(c.name) for c in changes], now)

    def entry_wakeups(self, cluster: str) -> Wakeups | None:
        lock, space = self._entry_space()
        listener = MemoryEntryWakeups()
        with lock:
            space.listeners.setdefault(cluster, weakref.WeakSet()).add(listener)
        return listener

    def entries_version(self, cluster: str) -> int:
        lock, space = self._entry_space()
        with lock:
            return space.versions.get(cluster, 0)

    def live_entries(self, cluster: str) -> EntrySnapshot:
        lock, space = self._entry_space()
        with lock:
            rows = sorted(space.entries.get(cluster, {}).values(), key=lambda e: e.name)
            return EntrySnapshot(space.versions.get(cluster, 0), rows, self._clock())

    def entry_changes(self, cluster: str, since: int, limit: int = 5000) -> EntryChanges:
        lock, space = self._entry_space()
        with lock:
            log = space.revisions.get(cluster, [])
            found = [r for r in log if r.revision > since]
        found.sort(key=lambda r: (r.revision, r.name))
        more = len(found) > limit
        found = found[:limit]
        return EntryChanges(max((r.revision for r in found), default=since), found, more)

    def entry_history(self, cluster: str, name: str | None = None,
                      limit: int = 100) -> list[EntryRevision]:
        lock, space = self._entry_space()
        with lock:
            log = list(space.by_name.get((cluster, name), ()) if name is not None
                       else space.revisions.get(cluster, ()))
        log.sort(key=lambda r: (-r.revision, r.name))
        return log[:limit]

    def _stale_request(self, request: ClaimRequest, now: datetime) -> bool:
        """Whether *request*'s revision does not govern its occurrence (call under the
        namespace's lock)."""
        if request.revision is None:
            return False
        _, space = self._entry_space()
        at = request.slot if request.kind is ClaimKind.SLOT and request.slot else now
        found = governing(space.by_name.get((self.cluster, request.job), ()), at)
        return found is None or found.revision != request.revision or found.removed
