"""Two nodes whose claims cross: each won a slot and defers its publish mark, then
each claims the other's slot at once (the nodes of a cluster walk a tick's chunks
from their own ranks), the marks riding along with the claims."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from celery_elarion_beat import ClaimRequest, ClaimStore
from celery_elarion_beat.store.records import PublishReport

__all__ = ["cross_claims"]


def _claim_other(store: ClaimStore, node: str, job: str, slot: datetime,
                 gate: threading.Barrier, errors: list[BaseException]) -> None:
    gate.wait()
    try:
        (lost,) = store.claim(node, [ClaimRequest.for_slot(job, slot, f"{job}-t")])
        assert not lost.won, f"{node} won {job}, which the other node holds"
    except BaseException as exc:  # noqa: BLE001 - the caller reports them
        errors.append(exc)


def cross_claims(a: ClaimStore, c: ClaimStore, trials: int = 12) -> list[BaseException]:
    """Run *trials* crossings of the nodes of *a* and *c*; what their claims raised."""
    errors: list[BaseException] = []
    for trial in range(trials):
        slot = datetime(2026, 11, 30, 12, tzinfo=timezone.utc) + timedelta(hours=trial)
        mine = {}
        for node, store, job in (("node-a", a, f"a{trial}"), ("node-c", c, f"c{trial}")):
            (won,) = store.claim(node, [ClaimRequest.for_slot(job, slot, f"{job}-t")])
            assert won.won and won.token
            store.defer_report([PublishReport(job, slot, won.token)])
            mine[node] = job
        gate = threading.Barrier(2)
        threads = [threading.Thread(target=_claim_other,
                                    args=(a, "node-a", mine["node-c"], slot, gate, errors)),
                   threading.Thread(target=_claim_other,
                                    args=(c, "node-c", mine["node-a"], slot, gate, errors))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    return errors
