"""Moved to :mod:`celery_elarion_beat.beat.scheduler`; this path stays for
``celery beat -S celery_elarion_beat.scheduler.ClaimingScheduler``."""

from __future__ import annotations

from .beat.scheduler import ClaimingScheduler

__all__ = ["ClaimingScheduler"]
