"""Names that become database keys: job names, node names, table names.

Pure checks, no I/O. Each limit is the one the schema enforces, so a name that
passes here is stored byte for byte on every backend; a name that does not is
refused when the schedule or the settings are read, with the entry or the
setting named, never at run time in the middle of a claim batch.
"""

from __future__ import annotations

import re

from .exceptions import ConfigurationError

__all__ = [
    "KEY_LENGTH",
    "NODES_TABLE_MAX",
    "TABLE_MAX",
    "check_job_name",
    "job_name_problem",
]

#: Characters in a job or node name: the key column is VARCHAR(191) (PostgreSQL,
#: SQLite) and VARBINARY(764) on MariaDB/MySQL (191 characters of up to 4 bytes).
KEY_LENGTH = 191
#: PostgreSQL and MySQL identifiers have 63 (64) characters; the claims table's
#: index is ``ix_<table>_claimed_at``, so the table name may have 49.
TABLE_MAX = 63 - len("ix_") - len("_claimed_at")
#: The nodes table's primary key is ``<table>_pkey``.
NODES_TABLE_MAX = 63 - len("_pkey")

_NODE = re.compile(r"^[A-Za-z0-9_.@:-]+$")


def job_name_problem(name: object) -> str | None:
    """Why *name* cannot be a claim key, or None when it can."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a string"
    if not name:
        return "it is empty"
    if len(name) > KEY_LENGTH:
        return f"it has {len(name)} characters, more than the limit of {KEY_LENGTH}"
    if "\x00" in name:
        return "it contains a NUL character, which the claims database cannot store"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode text (it contains a lone surrogate)"
    return None


def check_job_name(name: object) -> None:
    """Raise :class:`ConfigurationError` naming the entry if *name* cannot be a claim key."""
    problem = job_name_problem(name)
    if problem is not None:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise ConfigurationError(
            f"beat_schedule entry {shown} cannot be claimed: {problem}; rename the entry "
            f"(at most {KEY_LENGTH} characters, no NUL)")


def check_node_name(name: str) -> str:
    """Return *name* if it is a usable node name, else raise naming the setting."""
    if not _NODE.match(name) or len(name) > KEY_LENGTH:
        raise ConfigurationError(
            f"elarion_beat_node = {name!r} is not a usable node name; use 1-{KEY_LENGTH} "
            "letters, digits or the characters _ . @ : -")
    return name
