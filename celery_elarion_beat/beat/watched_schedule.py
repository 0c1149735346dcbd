"""Beat's schedule, which knows when it was edited.

Stock beat compares the whole schedule with a copy of itself on every tick to
notice an edit (``Scheduler.schedules_equal``): O(entries) for a tick that sends
nothing, a third of a core at 100,000 entries with one seconds entry. The
scheduler keeps its entries in a :class:`WatchedSchedule` instead, a ``dict``
whose :attr:`~WatchedSchedule.version` moves on with every edit: adding,
replacing or removing an entry through the mapping, or merging a new schedule
(the scheduler's ``merge_inplace`` and ``update_from_dict``). What depends on the
whole schedule (the heap of next runs, the fingerprint the heartbeat sends, the
orphan watch's horizon) is worked out again only when the version changed, so a
tick that finds nothing due is O(1), and one that sends is O(due x log entries).

Beat's own step to an entry's next run (``reserve``) replaces the entry with
:meth:`WatchedSchedule.advance`, which is no edit: the entry's task, schedule,
arguments and options are the same. An edit made inside an entry object
(``entry.update(...)`` on an entry taken out of the mapping) is not seen; assign
the entry again, or call :meth:`WatchedSchedule.touch`.

A database entry that changes (live schedules) is put in place with
:meth:`WatchedSchedule.swap`: an edit (the version moves on) that the heap follows by
itself, without a rebuild (:attr:`WatchedSchedule.layout` stays): the scheduler pushes
the new entry (:attr:`WatchedSchedule.fresh`) and drops the old one's event when it
comes up. An edit applied at 10,000 entries costs O(log entries), not a rebuild.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ScheduleMemo", "WatchedSchedule"]

T = TypeVar("T")


class WatchedSchedule(dict):  # type: ignore[type-arg]
    """A ``dict`` of schedule entries with a version that every edit moves on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: moves on with every edit (what is worked out from the whole schedule)
        self.version = 0
        #: moves on with every edit the heap cannot follow by itself (a rebuild)
        self.layout = 0
        #: entries put in place by :meth:`swap`, for the scheduler to push on its heap
        self.fresh: list[Any] = []

    def _edited(self) -> None:
        self.version += 1
        self.layout += 1

    def touch(self) -> None:
        """Count an edit the mapping could not see."""
        self._edited()

    def advance(self, name: str, entry: Any) -> None:
        """Put *entry*, the next run of the entry *name*: no edit."""
        dict.__setitem__(self, name, entry)

    def swap(self, name: str, entry: Any | None) -> None:
        """Put *entry* in place of the entry *name* (None: take it out): an edit the heap
        follows without a rebuild (*entry* waits in :attr:`fresh` to be pushed)."""
        if entry is None:
            if dict.pop(self, name, None) is None:
                return
        else:
            dict.__setitem__(self, name, entry)
            self.fresh.append(entry)
        self.version += 1

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._edited()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._edited()

    def pop(self, *args: Any) -> Any:
        self._edited()
        return super().pop(*args)

    def popitem(self) -> Any:
        self._edited()
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self._edited()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._edited()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self._edited()
        return super().setdefault(key, default)

    def __ior__(self, other: Any) -> WatchedSchedule:  # type: ignore[misc]
        self.update(other)
        return self


class ScheduleMemo(Generic[T]):
    """A value worked out from the whole schedule, kept until the schedule is edited."""

    def __init__(self, work: Callable[[Any], T]) -> None:
        self._work = work
        self._of: Any = None
        self._version = -1
        self._value: T | None = None

    def get(self, schedule: Any) -> T:
        """The value for *schedule*: the one kept, unless *schedule* was replaced or
        edited since (a plain mapping is worked out every time)."""
        version = getattr(schedule, "version", None)
        if version is None:
            return self._work(schedule)
        if schedule is not self._of or version != self._version:
            self._value = self._work(schedule)
            self._of, self._version = schedule, version
        return self._value  # type: ignore[return-value]
