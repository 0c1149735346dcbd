"""The settings of an app that runs beat in a test, the demo or a benchmark.

:func:`isolated_conf` gives an app one queue (and exchange) of its own, so runs
that share a broker never consume each other's messages, and makes beat react
within a second. :func:`conf_from_env` copies the set environment variables of a
mapping into the app's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["conf_from_env", "isolated_conf"]


def isolated_conf(broker: str, queue: str, **overrides: Any) -> dict[str, Any]:
    """Celery settings for an app that owns *queue* on *broker* and ticks every second."""
    return {
        "broker_url": broker,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_default_queue": queue,
        "task_default_exchange": queue,
        "task_default_routing_key": queue,
        "timezone": "UTC",
        "enable_utc": True,
        "beat_max_loop_interval": 1,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": True,
        **overrides,
    }


def conf_from_env(app: Any, env: Mapping[str, str], keys: Mapping[str, str]) -> None:
    """For each ``variable -> setting`` of *keys*, set the setting when *env* has it."""
    for variable, key in keys.items():
        if env.get(variable):
            app.conf[key] = env[variable]
