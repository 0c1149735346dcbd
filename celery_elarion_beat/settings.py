"""Moved to :mod:`celery_elarion_beat.config.settings`; this path stays for imports
and for ``python -m celery_elarion_beat.settings`` (the reference table)."""

from __future__ import annotations

from .config.settings import (
    DEFAULT_TABLE,
    SETTINGS,
    Setting,
    Settings,
    mask_dsn,
    normalize_dsn,
    reference_table,
)

__all__ = ["DEFAULT_TABLE", "SETTINGS", "Setting", "Settings", "mask_dsn", "normalize_dsn",
           "reference_table"]

if __name__ == "__main__":  # python -m celery_elarion_beat.settings
    print(reference_table())
