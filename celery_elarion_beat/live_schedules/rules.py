"""One name space for code and database entries: which of the two runs under a name.

The one rule, for beat, ``schedule list``, ``status``, ``preview`` and ``simulate``
alike (:func:`decide`):

* a name in code only: the code entry runs;
* a database entry whose name no code entry has: it runs (when enabled);
* a database entry with the name of a code entry that it does not override (a deploy
  added the code entry since): the **code entry** runs, and the database entry is
  reported (remove it, or make it an override);
* an override (``schedule override NAME``) runs instead of the code entry, and a
  disabled override disables the code entry; when the code entry has changed in
  code since the override was written (its digest differs), the override is
  reported and ``elarion_beat_db_override_policy`` decides: ``keep`` (the override
  runs) or ``code`` (the code entry runs);
* an override whose code entry is gone from the code: nothing runs (a code entry
  removed from code leaves nothing running), and it is reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..observe.fingerprint import entry_digests
from ..store.entry_records import StoredEntry

__all__ = ["CODE", "DATABASE", "Decision", "code_digest", "decide"]

#: What runs under a name.
CODE = "code"
DATABASE = "database"


@dataclass(frozen=True)
class Decision:
    """What runs under a name (:data:`CODE`, :data:`DATABASE`, or None: nothing), and
    what an operator must hear about it (None: nothing wrong)."""

    runs: str | None
    problem: str | None = None


def code_digest(name: str, entry: Any) -> str:
    """The digest of a code entry's definition (the drift check's), which an override
    remembers to tell when the code entry changed since."""
    return entry_digests({name: entry})[name]


def decide(name: str, code: Any | None, row: StoredEntry | None, policy: str,
           digests: Mapping[str, str] | None = None) -> Decision:
    """What runs under *name*, given its code entry *code* (a ``ScheduleEntry``, or
    None) and its database row *row* (or None), under the override *policy*
    (``keep`` or ``code``); *digests* may hold the code entries' digests already."""
    if row is None:
        return Decision(CODE if code is not None else None)
    enabled = row.definition.enabled
    if not row.overrides:
        if code is not None:
            return Decision(CODE, (
                f"database entry {name!r} has the name of a code entry, which runs instead; "
                "remove the database entry, or override the code entry with "
                f"`schedule override {name}`"))
        return Decision(DATABASE if enabled else None)
    if code is None:
        return Decision(None, (
            f"database entry {name!r} overrides a code entry that is no longer in the code: "
            f"nothing runs under that name; remove it (`schedule remove {name}`)"))
    digest = (digests or {}).get(name) or code_digest(name, code)
    if row.code_digest and row.code_digest != digest:
        if policy == "code":
            return Decision(CODE, (
                f"code entry {name!r} changed in code since database entry {name!r} "
                "overrode it: the code entry runs (elarion_beat_db_override_policy = "
                f"'code'); remove the override, or write it again with `schedule override "
                f"{name}`"))
        return Decision(DATABASE if enabled else None, (
            f"code entry {name!r} changed in code since database entry {name!r} overrode "
            "it: the override runs (elarion_beat_db_override_policy = 'keep'); check it, "
            f"then write it again with `schedule override {name}`, or remove it"))
    return Decision(DATABASE if enabled else None)
