"""Moved to :mod:`celery_elarion_beat.operate.control`; this path stays for imports
(``pause_job``, ``resume_job``, ``trigger_job``, ``active_pauses``, ``audit_log``)."""

from __future__ import annotations

from .operate.control import (
    Triggered,
    active_pauses,
    audit_log,
    pause_job,
    resume_job,
    trigger_job,
)

__all__ = ["Triggered", "active_pauses", "audit_log", "pause_job", "resume_job", "trigger_job"]
