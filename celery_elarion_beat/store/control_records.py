"""Live control's records: a job paused cluster-wide, and the audit of operator actions.

Plain value types (no SQLAlchemy); times are on the database clock.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..exceptions import ConfigurationError
from ..schedules.clock import iso_utc

__all__ = ["ALL_JOBS", "REASON_MAX", "AuditEntry", "Pause", "os_actor", "pauses_in_force",
           "reason_text", "storable"]

#: The longest reason kept (a note for the next operator, not a log).
REASON_MAX = 500


def os_actor(source: str = "cli") -> str:
    """Who acts from this machine: ``alice@host1 (cli)``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container's numeric uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()} ({source})"


def storable(text: str, most: int = 2000) -> str:
    """*text* as any database stores it: no NUL, valid UTF-8, at most *most* characters
    (a publish error rides along with every claim until written: it must never be the
    reason a claim is refused)."""
    clean = text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    return clean[:most]


def reason_text(reason: str, option: str = "--reason") -> str:
    """*reason* as it is stored: stripped, at most :data:`REASON_MAX` characters (a
    longer one is refused, naming *option*)."""
    text = (reason or "").strip()
    if len(text) > REASON_MAX:
        raise ConfigurationError(f"{option} has {len(text)} characters; keep it under "
                                 f"{REASON_MAX}")
    return storable(text, REASON_MAX)

#: The job name of a pause of every job (``elarion-beat pause --all``): no job has it.
ALL_JOBS = ""


@dataclass(frozen=True)
class Pause:
    """A job paused cluster-wide (:data:`ALL_JOBS`: every job), by whom, why, until when
    (None: until resumed). Times are on the database clock."""

    job: str
    paused_at: datetime
    paused_by: str
    reason: str = ""
    until: datetime | None = None

    @property
    def all_jobs(self) -> bool:
        return self.job == ALL_JOBS

    def active(self, now: datetime) -> bool:
        """Not expired at *now* (database clock)."""
        return self.until is None or self.until > now

    def covers(self, job: str) -> bool:
        return self.all_jobs or self.job == job

    def describe(self) -> str:
        """``paused by alice@host (cli) until 2026-12-01T06:00:00Z: db migration``."""
        text = f"paused by {self.paused_by}"
        if self.until is not None:
            text += f" until {self.until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return text + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "all_jobs": self.all_jobs,
                "paused_at": iso_utc(self.paused_at), "paused_by": self.paused_by,
                "reason": self.reason, "until": iso_utc(self.until)}


def pauses_in_force(pauses: Iterable[Pause], jobs: Iterable[str]) -> dict[str, Pause]:
    """Each of *jobs* that *pauses* hold, with the pause that holds it: its own pause,
    else the pause of every job."""
    found = list(pauses)
    every = next((p for p in found if p.all_jobs), None)
    own = {p.job: p for p in found if not p.all_jobs}
    held = {job: own.get(job) or every for job in jobs}
    return {job: pause for job, pause in held.items() if pause is not None}


@dataclass(frozen=True)
class AuditEntry:
    """One operator action: ``pause``, ``resume`` or ``trigger`` of *job* (:data:`ALL_JOBS`:
    every job), by *actor*, at *at* (database clock)."""

    at: datetime
    actor: str
    action: str
    job: str
    reason: str = ""
    until: datetime | None = None
    task_id: str | None = None
    detail: str = ""

    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"

    def as_dict(self) -> dict[str, Any]:
        return {"at": iso_utc(self.at), "actor": self.actor, "action": self.action,
                "job": self.job, "all_jobs": self.job == ALL_JOBS, "reason": self.reason,
                "until": iso_utc(self.until), "task_id": self.task_id, "detail": self.detail}
