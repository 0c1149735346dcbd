"""Moved to :mod:`celery_elarion_beat.observe.events`; this path stays for imports
(``celery_elarion_beat.events.expand(event)``)."""

from __future__ import annotations

from .observe.events import EVENT_TYPES, event_text, expand, is_elarion

__all__ = ["EVENT_TYPES", "event_text", "expand", "is_elarion"]
