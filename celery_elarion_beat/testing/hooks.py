"""A scheduler with a test hook between claim and publish (never for production).

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
(:mod:`celery_elarion_beat.oneoffs`): the node whose leased batch creates the marker
first (JSON: ``one_offs``, the leased ids, and ``pid``) sleeps
``ELARION_TEST_PAUSE_SECONDS`` before publishing that batch; its lease expires after
``elarion_beat_one_off_lease`` and another node sends the batch, same task ids.

The rest of the paused chunk (other jobs claimed in the same statement) is
unpublished too. Only normal runs pause: a takeover or a caught-up run publishes
as usual. SIGTERM is held back while a chunk is claimed and published, so a
paused beat dies only by SIGKILL; that is the point.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..dispatch import Due
from ..scheduler import ClaimingScheduler
from ..slots import iso
from ..store.oneoff_rows import LeasedOneOff

__all__ = ["PausingScheduler"]


class PausingScheduler(ClaimingScheduler):
    """ClaimingScheduler that pauses once between the claim and the publish of a job."""

    _chunk: frozenset[str] = frozenset()

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

    def _claim_and_send(self, plans: Sequence[Due], now: datetime,
                        producer: Any) -> BaseException | None:
        self._chunk = frozenset(plan.entry.name for plan in plans)
        try:
            return super()._claim_and_send(plans, now, producer)
        finally:
            self._chunk = frozenset()

    def _publish(self, plan: Due, occurrence: datetime | None, producer: Any) -> Any:
        jobs = [job for job in os.environ.get("ELARION_TEST_PAUSE_JOB", "").split(",") if job]
        if (plan.entry.name in jobs and set(jobs) <= self._chunk and not plan.catch_up
                and not plan.takeover and plan.request is not None
                and self._first(plan, occurrence)):
            time.sleep(float(os.environ.get("ELARION_TEST_PAUSE_SECONDS", "3600")))
        return super()._publish(plan, occurrence, producer)

    @staticmethod
    def _first(plan: Due, occurrence: datetime | None) -> bool:
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
