"""Moved to :mod:`celery_elarion_beat.observe.exporter`; this path stays for
``python -m celery_elarion_beat.exporter -A proj``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .observe.exporter import main as _main
from .observe.exporter import serve
from .operate.coverage_metrics import collectors

__all__ = ["main", "serve"]


def main(argv: Sequence[str] | None = None) -> int:
    """The exporter, with the gauge read from the claims database."""
    return _main(argv, collectors=collectors)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
