"""Races of the one-offs against a real database, shared by the PostgreSQL and MariaDB
tests: many leasing connections at once, and a cancel racing a lease."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from celery_elarion_beat.store.one_off_records import NewOneOff, OneOffState
from celery_elarion_beat.store.sql import SqlClaimStore

LEASE = timedelta(seconds=60)


def insert_due(store: SqlClaimStore, count: int) -> list[str]:
    """*count* one-offs due a minute ago, written in one statement."""
    now = store.clock()
    ids = [str(uuid.uuid4()) for _ in range(count)]
    rows = [{"cluster": store.cluster, "id": id_, "idem_key": None,
             "task_name": "proj.tasks.remind",
             "due_utc": store._param_time(now - timedelta(seconds=60, microseconds=i)),
             "state": "scheduled", "created_at": store._param_time(now), "attempts": 0,
             "options": "{}", "content_type": "application/json",
             "content_encoding": "utf-8", "body": b"[[], {}]"} for i, id_ in enumerate(ids)]
    with store.engine.begin() as conn:
        conn.execute(store.one_offs_table.insert(), rows)
    return ids


@dataclass
class LeaseRace:
    """What each of the racing connections leased, and how long it all took."""

    leased: list[list[str]] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def split(self) -> list[int]:
        return [len(ids) for ids in self.leased]


def race_leases(stores: list[SqlClaimStore], batch: int) -> LeaseRace:
    """Every store leases batch after batch until none is left, all released together."""
    barrier = threading.Barrier(len(stores))
    race = LeaseRace([[] for _ in stores], [0 for _ in stores])

    def run(i: int) -> None:
        barrier.wait()
        while True:
            got = stores[i].lease_one_offs(f"node-{i}", limit=batch, lease=LEASE)
            race.calls[i] += 1
            race.leased[i].extend(x.id for x in got)
            if not got:
                return

    started = time.monotonic()
    with ThreadPoolExecutor(len(stores)) as pool:
        for done in [pool.submit(run, i) for i in range(len(stores))]:
            done.result()
    race.seconds = time.monotonic() - started
    return race


def race_cancel_and_lease(make: Callable[[], SqlClaimStore], trials: int) -> dict[str, int]:
    """In each trial one connection cancels a due one-off while another leases it: exactly
    one wins, and the row ends in the winner's state. Returns the count of each winner."""
    canceller, leaser = make(), make()
    wins = {"cancel": 0, "lease": 0}
    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        for _ in range(trials):
            row = canceller.add_one_off(NewOneOff(
                id=str(uuid.uuid4()), task="proj.tasks.remind",
                content_type="application/json", content_encoding="utf-8", body=b"[[], {}]",
                options={}, delay=-1.0))

            def cancel(id_: str = row.id) -> object:
                barrier.wait()
                return canceller.cancel_one_off(id_)

            def lease() -> object:
                barrier.wait()
                return leaser.lease_one_offs("node-l", limit=10, lease=LEASE)

            cancelled_f, leased_f = pool.submit(cancel), pool.submit(lease)
            cancelled, leased = cancelled_f.result(), leased_f.result()
            assert cancelled is not None
            final = canceller.one_offs(id_or_key=row.id)[0]
            state = cancelled.state  # type: ignore[attr-defined]
            if state is OneOffState.CANCELLED:
                assert leased == [], "a cancelled one-off was leased"
                assert final.state is OneOffState.CANCELLED
                wins["cancel"] += 1
            else:
                assert state is OneOffState.LEASED, state
                assert [x.id for x in leased] == [row.id]  # type: ignore[attr-defined]
                assert final.state is OneOffState.LEASED and final.node == "node-l"
                wins["lease"] += 1
            leaser.finish_one_offs("node-l", published=[x.id for x in leased], failed={})  # type: ignore[attr-defined]
    return wins
