"""What runs on the workers: consume this node's queue, and record each run.

``install_worker(app)`` in the module that creates the app does both
(:mod:`.install`); :class:`RunTracker` (:mod:`.runs`) writes the runs.
"""

from __future__ import annotations

from .install import install_worker
from .runs import RunTracker

__all__ = ["RunTracker", "install_worker"]
