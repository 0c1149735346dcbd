"""The database entries' records: what a store takes and returns (no SQLAlchemy).

Every write of the entries table gets the cluster's next **version** (a counter, one
row per cluster, bumped once per transaction of the API, once per row of a raw SQL
statement); an entry's **revision** is the version of its last change, so a
revision is never reused, not even by an entry deleted and created again. Each
change is also a row of the revisions table (:class:`EntryRevision`): the audit,
and the change feed the nodes load (everything after the version they hold).

A revision governs the occurrences from its *effective_at* on, until a later
revision takes effect: of the revisions of an entry whose effective time is at or
before an instant, the latest one governs it (:func:`governing`). A claim of a
database entry carries its revision, and the store refuses it unless that revision
governs the occurrence (``ClaimResult.stale``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..config.live_entries import EntryDefinition
from ..exceptions import ConfigurationError, EntryConflict, EntryNotFound
from ..schedules.clock import as_utc

__all__ = ["ACTIONS", "EFFECTIVE_GRACE", "EntryChange", "EntryChanges", "EntryRevision",
           "EntrySnapshot", "EntryWrite", "StoredEntry", "check_unique_names", "governing",
           "plan_writes"]

#: An effective time at most this far before the store clock counts as "now" (a
#: client's clock a little behind the database's); further back is refused.
EFFECTIVE_GRACE = timedelta(seconds=5)

#: What a revision did (the revisions table's ``action``).
ACTIONS = ("add", "edit", "remove", "enable", "disable", "override")


@dataclass(frozen=True)
class StoredEntry:
    """One row of the entries table. *overrides*: it replaces the code entry of its name
    (``schedule override``), which had the digest *code_digest* when it was written;
    *restart*: an interval entry whose phase restarts at *effective_at*."""

    cluster: str
    name: str
    definition: EntryDefinition
    revision: int
    effective_at: datetime
    updated_at: datetime
    actor: str
    reason: str
    overrides: bool = False
    code_digest: str | None = None
    restart: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.definition.as_json(), "revision": self.revision,
                "effective_at": self.effective_at.isoformat(),
                "updated_at": self.updated_at.isoformat(), "actor": self.actor,
                "reason": self.reason, "overrides": self.overrides}


@dataclass(frozen=True)
class EntryRevision:
    """One row of the revisions table: a change of entry *name*, written at *at* by
    *actor* (``sql:<role>`` for a raw SQL statement), effective from *effective_at*.
    *definition* is the entry after the change (for ``remove``: before it)."""

    cluster: str
    name: str
    revision: int
    action: str
    definition: EntryDefinition
    effective_at: datetime
    at: datetime
    actor: str
    reason: str
    overrides: bool = False
    code_digest: str | None = None
    restart: bool = False

    @property
    def removed(self) -> bool:
        return self.action == "remove"

    def entry(self) -> StoredEntry | None:
        """The entry as this revision leaves it (None: removed)."""
        if self.removed:
            return None
        return StoredEntry(self.cluster, self.name, self.definition, self.revision,
                           self.effective_at, self.at, self.actor, self.reason,
                           self.overrides, self.code_digest, self.restart)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "revision": self.revision, "action": self.action,
                **self.definition.as_json(), "effective_at": self.effective_at.isoformat(),
                "at": self.at.isoformat(), "actor": self.actor, "reason": self.reason,
                "overrides": self.overrides, "restart": self.restart}


def governing(revisions: Iterable[EntryRevision], at: datetime) -> EntryRevision | None:
    """Of *revisions* (of one entry), the one that governs the instant *at*: the latest
    written among those effective at or before it; None when none is."""
    found = None
    for rev in revisions:
        if rev.effective_at <= at and (found is None or rev.revision > found.revision):
            found = rev
    return found


@dataclass(frozen=True)
class EntryChange:
    """One change to write (:meth:`LiveEntries.write_entries`).

    *action*: ``add`` (refused if the name exists), ``override`` (an add that replaces
    the code entry of the name, whose digest is *code_digest*), ``edit``, ``enable``,
    ``disable``, ``remove``. *expected*: the revision the caller read (a stale one is
    refused: :class:`~celery_elarion_beat.exceptions.EntryConflict`); None: whatever it
    is now. *effective_at*: from when the change governs the occurrences (None: the
    store clock's now; never earlier). *restart*: an interval's phase restarts then.
    """

    action: str
    name: str
    definition: EntryDefinition | None = None
    expected: int | None = None
    effective_at: datetime | None = None
    restart: bool = False
    code_digest: str | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"a change is one of {', '.join(ACTIONS)}, not {self.action!r}")
        if self.action != "remove" and self.definition is None:
            raise ValueError(f"a change {self.action!r} needs the definition it writes")


@dataclass(frozen=True)
class EntryWrite:
    """What a write did: the cluster's *version* after it (None: nothing was written,
    every change was a no-op), and the entries as they are now, in the order of the
    changes (None for a removed one)."""

    version: int | None
    entries: list[StoredEntry | None]
    at: datetime | None = None


@dataclass(frozen=True)
class EntrySnapshot:
    """Every entry of a cluster, at *version* (read in one transaction), and *now*,
    the store clock then."""

    version: int
    entries: list[StoredEntry]
    now: datetime


@dataclass(frozen=True)
class EntryChanges:
    """The revisions after a version, oldest first, up to *version* (the cluster's
    version when they were read); *more*: the read stopped at its limit, ask again
    from the last revision's version."""

    version: int
    revisions: list[EntryRevision]
    more: bool = False


def plan_writes(changes: Sequence[EntryChange], held: Mapping[str, StoredEntry],
                now: datetime) -> list[tuple[EntryChange, datetime]]:
    """The changes to write, each with its effective time, checked against the entries
    as they are (*held*) on the store clock *now*; a change that would leave an entry
    as it is (the same definition, enabled as it was) is left out. Raises the write's
    refusals (see :meth:`~.interface.LiveEntries.write_entries`)."""
    out = []
    for change in changes:
        current = held.get(change.name)
        effective = now
        if change.effective_at is not None:
            wanted = as_utc(change.effective_at)
            if wanted < now - EFFECTIVE_GRACE:
                raise ConfigurationError(
                    f"effective: {wanted.isoformat()} is before the database clock's now "
                    f"({now.isoformat()}); an edit governs from now on or from a later "
                    "time: give a later time, or none for now")
            effective = max(wanted, now)
        if change.action in ("add", "override"):
            if current is not None:
                raise EntryConflict(
                    f"name: a database entry named {change.name!r} exists (revision "
                    f"{current.revision}); edit it, or remove it first", current.revision)
            out.append((change, effective))
            continue
        if current is None:
            raise EntryNotFound(f"name: no database entry is named {change.name!r} in this "
                                "cluster; add it first (schedule list shows the entries)")
        if change.expected is not None and change.expected != current.revision:
            raise EntryConflict(
                f"revision: entry {change.name!r} is at revision {current.revision}, not "
                f"{change.expected}: it changed since it was read; read it again and repeat "
                "the change", current.revision)
        if change.action != "remove" and change.definition is not None \
                and change.definition.same(current.definition) and not change.restart \
                and change.effective_at is None:
            continue  # nothing would change
        out.append((change, effective))
    return out


def check_unique_names(changes: Sequence[EntryChange]) -> None:
    """Refuse a write that changes one entry twice."""
    names = [change.name for change in changes]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigurationError(f"name: {', '.join(map(repr, twice))} changed twice in one "
                                 "write; give each entry one change")
