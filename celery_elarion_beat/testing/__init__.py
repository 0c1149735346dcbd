"""What the tests, the demo and the benchmarks share to run beat for real.

* :mod:`.conf`: the settings of an app that owns its queue (:func:`isolated_conf`,
  :func:`conf_from_env`);
* :mod:`.processes`: child ``celery`` processes, started with a scrubbed
  environment, waited for, stopped and reaped (:class:`ProcessManager`,
  :class:`ChildProcess`, :func:`wait_until`);
* :mod:`.tables`: a run's claims table, read (:func:`read_claims`) and dropped
  (:func:`drop_tables`);
* in process, for users' own schedules (the pytest plugin :mod:`celery_elarion_beat.pytest`
  is built on them): :class:`BeatClock`, a beat :class:`Cluster` over the memory
  store, and :func:`simulate`.
"""

from __future__ import annotations

from .beat_clock import BeatClock
from .cluster import Cluster, SimulatedOccurrence, SimulationError
from .conf import conf_from_env, isolated_conf
from .processes import (
    ChildProcess,
    ProcessError,
    ProcessManager,
    clean_env,
    sleep_until,
    stop_all,
    wait_until,
)
from .simulation import simulate
from .tables import claims_tables, drop_tables, read_claims

__all__ = [
    "BeatClock",
    "ChildProcess",
    "Cluster",
    "ProcessError",
    "ProcessManager",
    "SimulatedOccurrence",
    "SimulationError",
    "claims_tables",
    "clean_env",
    "conf_from_env",
    "drop_tables",
    "isolated_conf",
    "read_claims",
    "simulate",
    "sleep_until",
    "stop_all",
    "wait_until",
]
