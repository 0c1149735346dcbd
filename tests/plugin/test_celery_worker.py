"""pytest-celery's in-process fixtures with a beat cluster: a real Celery worker
(thread) consumes the message a ClaimingScheduler node published, the task sees
beat's ``elarion_*`` headers, and the RunTracker records the run on the claim.

pytest-celery 1.x exposes ``celery_app``, ``celery_config`` and the other fixtures
of ``celery.contrib.pytest``, but its own ``celery_worker`` is a Docker container;
importing ``celery_worker`` from ``celery.contrib.pytest`` into the module brings
back Celery's in-process worker for the module's tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery.contrib.pytest import celery_worker  # noqa: F401 - the in-process worker
from celery.schedules import crontab

from celery_elarion_beat import MemoryClaimStore, install_worker
from celery_elarion_beat.config.headers import HEADERS
from celery_elarion_beat.testing import BeatClock, Cluster
from celery_elarion_beat.testing._harness import wait_until


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return {"broker_transport_options": {"polling_interval": 0.1}}


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"perform_ping_check": False, "shutdown_timeout": 10}


@pytest.fixture
def ran(celery_app: Any, claims_store: MemoryClaimStore) -> list[dict[str, Any]]:
    """The task of the schedule (registered before the worker starts), what it saw,
    and the worker side of the library installed on the app."""
    celery_app.conf.update(
        elarion_beat_dsn=f"memory://{claims_store.name}", elarion_beat_events=False,
        beat_schedule={"report": {"task": "proj.report", "schedule": crontab(minute=0, hour=3)}})
    seen: list[dict[str, Any]] = []

    @celery_app.task(name="proj.report", bind=True)
    def report(self: Any) -> None:
        seen.append({name: getattr(self.request, name, None) for name in HEADERS})
        seen.append({"hostname": self.request.hostname})

    install_worker(celery_app)
    return seen


# Twice: the celery_app fixture names every app ``celery.tests``, and the second app's
# run must land in its own store (install_worker() keys its tracker by the app object).
@pytest.mark.parametrize("round_", [1, 2])
def test_the_worker_runs_what_beat_sent(round_: int, beat_clock: BeatClock,
                                        ran: list[dict[str, Any]],
                                        celery_worker: Any,  # noqa: F811
                                        beat_cluster: Callable[..., Cluster],
                                        claims_store: MemoryClaimStore) -> None:
    beat_clock.set("2026-11-29T02:59:59Z")
    cluster = beat_cluster(2, deliver=True)  # two nodes of the celery_app fixture's app
    cluster.advance(2)
    (sent,) = cluster.sent()
    wait_until(lambda: len(ran) == 2, timeout=10, message="the task to run")
    headers, host = ran
    assert headers == {
        "elarion_job": "report", "elarion_occurrence": "2026-11-29T03:00:00Z",
        "elarion_node": sent.node, "elarion_placement": "cluster", "elarion_claim": "slot",
        "elarion_catch_up": 0, "elarion_takeover": 0, "elarion_manual": 0}

    def finished() -> Any:
        rows = [r for r in claims_store.find_claims() if r.job == "report"]
        return rows if rows and rows[0].run_state == "succeeded" else None

    (row,) = wait_until(finished, timeout=10, message="the run on the claim row")
    assert (row.node, row.task_id) == (sent.node, sent.task_id)
    assert row.worker == host["hostname"]  # the worker's host name, as the task saw it
    assert celery_worker.hostname.endswith(row.worker)
