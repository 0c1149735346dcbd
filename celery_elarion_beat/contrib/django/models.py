"""The database entries table, as the admin reads it: an unmanaged model.

``managed = False``: Django never creates, alters or writes this table; beat's schema
(``celery -A proj elarion-beat init-db``, or the Alembic migration) makes it, and every
change goes through :mod:`celery_elarion_beat.live_schedules` (the revision, the
audit, the NOTIFY). The table's name comes from the Celery settings
(``elarion_beat_table``, ``elarion_beat_schema``): :func:`.binding.bind_table` sets it
when the admin first reads. Rows are the entries of every cluster; the admin shows
its own cluster's (``cluster`` and ``name`` are the table's key: ``name`` stands as
the primary key of a cluster's rows).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models

from ...config.live_entries import ScheduleSpec
from ...exceptions import ConfigurationError

__all__ = ["DatabaseEntry", "READ_ONLY"]

#: What the ORM must never do to these rows (every write goes through the API).
READ_ONLY = ("the database entries are written through celery_elarion_beat.live_schedules "
             "(the revision, the audit, the NOTIFY), never through the ORM")


class DatabaseEntry(models.Model):
    """One row of the entries table (read only)."""

    cluster = models.CharField(max_length=191)
    name = models.CharField(max_length=191, primary_key=True)
    task = models.TextField()
    schedule = models.TextField()
    args = models.TextField()
    kwargs = models.TextField()
    options = models.TextField()
    enabled = models.BooleanField()
    revision = models.BigIntegerField()
    effective_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField(null=True)
    actor = models.TextField(null=True)
    reason = models.TextField(null=True)
    overrides = models.BooleanField()
    code_digest = models.CharField(max_length=64, null=True)
    restart = models.BooleanField()

    class Meta:
        managed = False
        db_table = "elarion_scheduler_entries"  # set from the settings at first use
        ordering = ("name",)
        verbose_name = "database entry"
        verbose_name_plural = "database entries"
        default_permissions = ("add", "change", "delete", "view")

    def __str__(self) -> str:
        return str(self.name)

    @property
    def schedule_text(self) -> str:
        """The schedule in one line (``crontab 0 6 * * * Europe/Berlin``)."""
        try:
            return ScheduleSpec.parse(json.loads(self.schedule)).text()
        except (ValueError, ConfigurationError):
            return f"(invalid) {self.schedule}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(READ_ONLY)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(READ_ONLY)
