"""Moved to :mod:`celery_elarion_beat.schedules.cron`; this path stays for imports and
for pickled ``cron`` objects (the class keeps ``celery_elarion_beat.cron`` as its
module, so pickles and schedule fingerprints match those of earlier releases)."""

from __future__ import annotations

from .schedules.cron import cron, zone_name

__all__ = ["cron", "zone_name"]
