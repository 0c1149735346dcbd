"""Test your own beat schedule in process: a fake clock, a simulated cluster, ``simulate``.

The pytest plugin :mod:`celery_elarion_beat.pytest` is built on these:

* :class:`BeatClock`: the one clock a simulated cluster and its schedules read;
* :class:`Cluster`: N real ``ClaimingScheduler`` nodes over one memory store;
* :func:`simulate`: every message a cluster would send from your schedule, in a span;
* :mod:`.hooks`: a scheduler that pauses between a claim and its publish, for
  ``kill -9`` tests of your own (never for production).

(The project's own process harness, which its tests, demo and benchmarks share, is
the private :mod:`._harness`.)
"""

from __future__ import annotations

from .beat_clock import BeatClock
from .cluster import Cluster, SimulatedOccurrence, SimulationError
from .simulation import simulate

__all__ = [
    "BeatClock",
    "Cluster",
    "SimulatedOccurrence",
    "SimulationError",
    "simulate",
]
