"""Installing the worker side: consume this node's queue, record what ran, and name
the beats that send without claiming.
"""

from __future__ import annotations

from typing import Any

from ..config.node_queue import consume_node_queue
from ..config.settings import Settings
from ..config.usage import mark_installed
from ..exceptions import ConfigurationError
from .foreign_beats import watch_foreign_beats
from .runs import TRACKER_ATTRIBUTE, RunTracker

__all__ = ["install_worker"]


def install_worker(app: Any, track_runs: bool | None = None) -> RunTracker | None:
    """Make the workers of *app* consume their node's queue and record each run of
    a beat occurrence (unless ``elarion_beat_track_runs`` is False, or *track_runs*
    says otherwise). Call it where the app is created; calling it again returns the
    app's tracker. Returns the tracker.

    It also marks the app as one that uses the library: a beat of it (``celery beat``,
    ``celery worker -B``) must then run ClaimingScheduler (see
    :mod:`~..beat.scheduler_guard`); and its workers name any beat among the replicas
    that sends without claiming (:mod:`.foreign_beats`), whatever *track_runs* says."""
    mark_installed(app)
    consume_node_queue(app)
    watch_foreign_beats(app)
    if track_runs is None:
        try:
            track_runs = Settings.from_app(app).track_runs
        except ConfigurationError:
            track_runs = True  # the settings are reported when the worker starts tracking
    if not track_runs:
        return None
    tracker = getattr(app, TRACKER_ATTRIBUTE, None)
    if not isinstance(tracker, RunTracker):
        tracker = RunTracker(app)
        tracker.connect()
    return tracker
