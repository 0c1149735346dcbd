"""``python -m celery_elarion_beat.demo``."""

from __future__ import annotations

from .runner import main

raise SystemExit(main())
