"""Moved to :mod:`celery_elarion_beat.observe.logformat`; this path stays for imports
(``celery_elarion_beat.logformat.connect_json_logging(app)``)."""

from __future__ import annotations

from .observe.logformat import (
    JsonFormatter,
    connect_json_logging,
    install_json_logging,
    read_json_log,
)

__all__ = ["JsonFormatter", "connect_json_logging", "install_json_logging", "read_json_log"]
