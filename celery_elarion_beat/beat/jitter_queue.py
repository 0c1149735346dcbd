"""The jitter queue: slots held back until their jittered time (:mod:`..config.jitter`).
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime
from typing import Any

__all__ = ["JitterQueue"]


class JitterQueue:
    """Planned slots waiting for their publish time (slot + offset), earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, Any]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, at: datetime, plan: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), plan))

    def due(self, now: datetime) -> list[Any]:
        """The plans whose publish time has come, earliest first (removed)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def wait(self, now: datetime) -> float | None:
        """Seconds until the next plan's publish time (None when none waits)."""
        if not self._heap:
            return None
        return max(0.0, (self._heap[0][0] - now).total_seconds())
