"""The project's own harness: what its tests, demo and benchmarks share to run beat
for real (private: not part of the public API, and it may change in any release).

* :mod:`.conf`: the settings of an app that owns its queue (:func:`isolated_conf`,
  :func:`conf_from_env`);
* :mod:`.processes`: child ``celery`` processes, started with a scrubbed
  environment, waited for, stopped and reaped (:class:`ProcessManager`,
  :class:`ChildProcess`, :func:`wait_until`);
* :mod:`.terminal`: a child on pseudo-terminals, as a person runs it (its progress
  lines, Ctrl-C typed on its terminal: :class:`TerminalProcess`, :func:`frames`);
* :mod:`.tables`: a run's claims table, read (:func:`read_claims`) and dropped
  (:func:`drop_tables`).
"""

from __future__ import annotations

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
from .tables import claims_tables, drop_tables, read_claims
from .terminal import TerminalProcess, frames, plain

__all__ = [
    "ChildProcess",
    "ProcessError",
    "ProcessManager",
    "TerminalProcess",
    "claims_tables",
    "clean_env",
    "conf_from_env",
    "drop_tables",
    "frames",
    "isolated_conf",
    "plain",
    "read_claims",
    "sleep_until",
    "stop_all",
    "wait_until",
]
