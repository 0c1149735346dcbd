"""Names that become database keys: job names, node names, cluster names, table names.

Pure checks, no I/O. Each limit is the one the schema enforces, so a name that
passes here is stored byte for byte on every backend; a name that does not is
refused when the schedule or the settings are read, with the entry or the
setting named, never at run time in the middle of a claim batch.
"""

from __future__ import annotations

import re

from ..exceptions import ConfigurationError

__all__ = [
    "CLUSTER_MAX",
    "KEY_LENGTH",
    "NODES_TABLE_MAX",
    "TABLE_MAX",
    "check_cluster",
    "check_job_name",
    "cluster_problem",
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

#: Characters in a cluster name (``elarion_beat_cluster``): part of every key, and of
#: the NOTIFY channel and the lock names, so kept short.
CLUSTER_MAX = 64

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


def cluster_problem(name: object) -> str | None:
    """Why *name* cannot be a cluster name, or None when it can: 1 to
    :data:`CLUSTER_MAX` printable characters (no NUL, no control character), without
    spaces around them."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a string"
    if not name:
        return "it is empty"
    if len(name) > CLUSTER_MAX:
        return f"it has {len(name)} characters, more than the limit of {CLUSTER_MAX}"
    if not name.isprintable():
        return "it contains a NUL or control character"
    if name != name.strip():
        return "it starts or ends with a space"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode text (it contains a lone surrogate)"
    return None


def check_cluster(name: object, source: str = "elarion_beat_cluster =") -> str:
    """Return *name* if it is a usable cluster name, else raise naming *source* (the
    setting, or where the name was derived from) and the fix."""
    problem = cluster_problem(name)
    if problem is not None:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise ConfigurationError(
            f"{source} {shown} is not a usable cluster name: {problem}; set "
            f"elarion_beat_cluster (or ELARION_BEAT_CLUSTER) to 1-{CLUSTER_MAX} printable "
            "characters, e.g. the app's name")
    assert isinstance(name, str)
    return name
