"""The Django app of celery-elarion-beat (``celery_elarion_beat.contrib.django``)."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["ElarionBeatConfig"]


class ElarionBeatConfig(AppConfig):
    """The admin of the live schedules' database entries."""

    name = "celery_elarion_beat.contrib.django"
    label = "elarion_beat"
    verbose_name = "Beat schedule"
    default_auto_field = "django.db.models.BigAutoField"
