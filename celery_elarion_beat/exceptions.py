"""The exceptions raised by celery-elarion-beat.

Every exception the library raises on purpose derives from one root::

    ElarionBeatError
     ├── ConfigurationError (also ValueError)  a setting or an entry is wrong
     ├── OneOffNotFound (also LookupError)     no one-off has this id or key
     ├── EntryNotFound (also LookupError)      no database entry has this name
     ├── EntryConflict                         a database entry changed since it was read
     │                                         (a stale revision), or its name is taken
     └── StoreError                            the claims store failed
          ├── StoreUnavailable                 it could not be reached or timed out
          │    └── StoreRefused                it refused this node: credentials, database,
          │                                    role or permission (waiting does not help)
          ├── SchemaMissing                    its table does not exist and may not be created
          ├── UpgradeRefused                   init-db would break nodes of an older version
          └── ClaimRefused                     it refused a claim's data (a bad job name)

``celery_elarion_beat.testing.ProcessError`` (a beat or worker child process of a
test, the demo or a benchmark failed to start or to do what was awaited) derives
from ``ElarionBeatError`` and ``AssertionError``, so a failed wait fails a test.

Driver errors (psycopg, SQLAlchemy) are translated into ``StoreError`` subclasses
at the store boundary; the scheduler never sees a driver exception.
"""

from __future__ import annotations

__all__ = [
    "ClaimRefused",
    "ConfigurationError",
    "ElarionBeatError",
    "EntryConflict",
    "EntryNotFound",
    "OneOffNotFound",
    "SchemaMissing",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "UpgradeRefused",
]


class ElarionBeatError(Exception):
    """celery-elarion-beat failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(ElarionBeatError, ValueError):
    """celery-elarion-beat is misconfigured."""


class OneOffNotFound(ElarionBeatError, LookupError):
    """No one-off has this id or key."""


class EntryNotFound(ElarionBeatError, LookupError):
    """No database entry has this name."""


class EntryConflict(ElarionBeatError):
    """The database entry changed since it was read (its revision is not the one
    given), or an entry of this name exists already.

    *current* is the entry's revision now (None: it does not exist). Read the entry
    again, and repeat the change on what it is now.
    """

    def __init__(self, message: str | None = None, current: int | None = None) -> None:
        super().__init__(message)
        self.current = current


class StoreError(ElarionBeatError):
    """The claims store failed."""


class StoreUnavailable(StoreError):
    """The claims store could not be reached or did not answer in time."""


class StoreRefused(StoreUnavailable):
    """The claims database refused this node; waiting does not fix it.

    A wrong password, a database or role that does not exist, a role that may not log
    in or has no right on the schema or table. Beat refuses to start on it (unless
    ``elarion_beat_startup_errors = "fail_closed"``); once running, it is an outage
    like any other (fail closed, recovers when the database lets the node in again).
    The classification of driver errors is :mod:`celery_elarion_beat.store.refusal`.
    """


class SchemaMissing(StoreError):
    """The claims table does not exist and creating it is disabled."""


class UpgradeRefused(StoreError):
    """``init-db`` did not finish the upgrade of the tables: a node of an older version
    still heartbeats, and the new keys would break its claims (``--force`` finishes it
    anyway)."""


class ClaimRefused(StoreError):
    """The claims store refused the data of a claim (not an outage).

    Raised for a whole batch; the caller isolates the request at fault by
    claiming smaller batches, so one bad request never takes its neighbours down.
    """
