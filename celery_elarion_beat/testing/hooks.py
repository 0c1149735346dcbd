"""Schedulers with test hooks: a pause between claim and publish, a failing tick
(never for production).

``celery -A proj beat -S celery_elarion_beat.testing.hooks.PausingScheduler`` runs
the :class:`~celery_elarion_beat.ClaimingScheduler` unchanged, except that the
first won occurrence of a job named in ``ELARION_TEST_PAUSE_JOB`` (comma-separated
names) stops right after its claim, before its publish, on the one node of the
cluster that creates the marker file first, in the first chunk that claimed every
named job (a slot whose entries a loaded machine splits over two ticks or chunks
does not pause: the next one will):

* it creates ``ELARION_TEST_PAUSE_MARKER`` exclusively (a JSON object: job,
  occurrence, task_id, pid), so the test knows the claim is made and nothing is
  sent, and no other node pauses;
* it then sleeps ``ELARION_TEST_PAUSE_SECONDS`` (default: an hour, i.e. until the
  test kills it with ``kill -9``) and carries on publishing.

With ``ELARION_TEST_PAUSE_ONE_OFF=1`` it pauses a durable one-off instead
(:mod:`celery_elarion_beat.one_offs.api`): the node whose leased batch creates the marker
first (JSON: ``one_offs``, the leased ids, and ``pid``) sleeps
``ELARION_TEST_PAUSE_SECONDS`` before publishing that batch; its lease expires after
``elarion_beat_one_offs_lease`` and another node sends the batch, same task ids.

The rest of the paused chunk (other jobs claimed in the same statement) is
unpublished too. Only normal runs pause: a takeover or a caught-up run publishes
as usual. SIGTERM is held back while a chunk is claimed and published, so a
paused beat dies only by SIGKILL; that is the point.

``celery -A proj beat -S celery_elarion_beat.testing.hooks.FailingTickScheduler``
raises ``RuntimeError`` inside every tick whose due entries include a job named
in ``ELARION_TEST_FAIL_JOB`` (comma-separated names), before anything is claimed: the
whole tick fails, as a bug in the tick would.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..beat.pipeline import ClaimPipeline
from ..beat.plan import Plan
from ..beat.scheduler import ClaimingScheduler
from ..beat.sender import Sender
from ..schedules.slots import iso
from ..store.one_off_records import LeasedOneOff

__all__ = ["FailingTickScheduler", "PausingPipeline", "PausingScheduler", "PausingSender"]


class PausingSender(Sender):
    """Pauses once before publishing a won claim of the jobs ``ELARION_TEST_PAUSE_JOB``
    names, when its chunk claimed every one of them."""

    #: the jobs of the chunk being claimed and sent (:class:`PausingPipeline`)
    chunk: frozenset[str] = frozenset()

    def publish(self, plan: Plan, occurrence: datetime | None, producer: Any) -> Any:
        jobs = [job for job in os.environ.get("ELARION_TEST_PAUSE_JOB", "").split(",") if job]
        if (plan.entry.name in jobs and set(jobs) <= self.chunk and not plan.catch_up
                and not plan.takeover and plan.request is not None
                and _first(plan, occurrence)):
            time.sleep(float(os.environ.get("ELARION_TEST_PAUSE_SECONDS", "3600")))
        return super().publish(plan, occurrence, producer)


class PausingPipeline(ClaimPipeline):
    """The claim pipeline of :class:`PausingScheduler`: tells its sender which jobs
    each chunk claims."""

    Sender = PausingSender
    sender: PausingSender

    def claim_and_send(self, plans: Sequence[Plan], now: datetime,
                       producer: Any) -> BaseException | None:
        self.sender.chunk = frozenset(plan.entry.name for plan in plans)
        try:
            return super().claim_and_send(plans, now, producer)
        finally:
            self.sender.chunk = frozenset()


def _first(plan: Plan, occurrence: datetime | None) -> bool:
    """Create the marker; False when a node (this one or another) did already."""
    marker = Path(os.environ.get("ELARION_TEST_PAUSE_MARKER", "paused.json"))
    try:
        with marker.open("x") as out:
            json.dump({"job": plan.entry.name,
                       "occurrence": iso(occurrence) if occurrence else None,
                       "task_id": plan.task_id, "pid": os.getpid()}, out)
    except FileExistsError:
        return False
    return True


class PausingScheduler(ClaimingScheduler):
    """ClaimingScheduler that pauses once between the claim and the publish of a job
    (:class:`PausingPipeline`), or before publishing a leased one-off batch."""

    Pipeline = PausingPipeline

    def setup_schedule(self) -> None:
        super().setup_schedule()
        if os.environ.get("ELARION_TEST_PAUSE_ONE_OFF") == "1" and self.one_offs is not None:
            self.one_offs.before_publish = self._pause_one_offs

    @staticmethod
    def _pause_one_offs(batch: Sequence[LeasedOneOff]) -> None:
        marker = Path(os.environ.get("ELARION_TEST_PAUSE_MARKER", "paused.json"))
        try:
            with marker.open("x") as out:
                json.dump({"one_offs": [item.id for item in batch], "pid": os.getpid()}, out)
        except FileExistsError:
            return
        time.sleep(float(os.environ.get("ELARION_TEST_PAUSE_SECONDS", "3600")))


class FailingTickScheduler(ClaimingScheduler):
    """ClaimingScheduler whose ticks fail while a job of ``ELARION_TEST_FAIL_JOB`` is due."""

    def apply_entries(self, batch: Sequence[tuple[Any, float | None]], producer: Any = None,
                      replays: Sequence[Plan] = ()) -> dict[str, float]:
        jobs = {job for job in os.environ.get("ELARION_TEST_FAIL_JOB", "").split(",") if job}
        failing = sorted(jobs.intersection(entry.name for entry, _ in batch))
        if failing:
            raise RuntimeError(f"a tick with {', '.join(failing)} due fails "
                                "(ELARION_TEST_FAIL_JOB)")
        return super().apply_entries(batch, producer=producer, replays=replays)
