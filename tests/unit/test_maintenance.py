"""Heartbeats, skew and drift on the memory store, with injected clocks."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from celery_elarion_beat import MemoryClaimStore, NodeState, Settings
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.observe.fingerprint import drift_from
from celery_elarion_beat.observe.outcome import Recorder
from tests.helpers.fakes import FakeClock

T0 = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


def node(name: str, fingerprint: str, entries: dict[str, str] | None = None) -> NodeState:
    return NodeState(name, "boot", "0", fingerprint, entries or {})


def maintenance(store: MemoryClaimStore, clock: FakeClock, name: str = "node-a",
                **conf: object) -> Maintenance:
    settings = Settings.from_mapping({"elarion_beat_node": name, **conf})
    return Maintenance(settings, store, Recorder(), clock, lambda: {})


def test_skew_is_the_node_clock_against_the_store_clock(caplog: pytest.LogCaptureFixture) -> None:
    store_clock, node_clock = FakeClock(T0), FakeClock(T0 + timedelta(seconds=5))
    store = MemoryClaimStore(uuid.uuid4().hex, clock=store_clock)
    m = maintenance(store, node_clock)
    caplog.set_level(logging.WARNING, logger="celery_elarion_beat")
    m.heartbeat()
    assert m.skew == pytest.approx(5.0, abs=0.1)
    assert [r.skew for r in caplog.records if getattr(r, "action", "") == "clock-skew"]
    node_clock.now = T0  # back in sync: no warning, and the skew reads 0
    caplog.clear()
    m.heartbeat()
    assert m.skew == pytest.approx(0.0, abs=0.1)
    assert not [r for r in caplog.records if getattr(r, "action", "") == "clock-skew"]


def test_dead_and_expired_nodes_leave_the_live_list() -> None:
    clock = FakeClock(T0)
    store = MemoryClaimStore(uuid.uuid4().hex, clock=clock)
    store.heartbeat(node("old-pod", "fp"))
    clock.advance(3600)
    store.heartbeat(node("quiet-pod", "fp"))
    clock.advance(600)  # quiet-pod is dead (10 min > 120 s), old-pod expired too
    m = maintenance(store, clock, elarion_beat_node_retention=3000)
    m.heartbeat()
    assert m.live_nodes == ["node-a"]
    assert [n.node for n in store.nodes()[1]] == ["node-a", "quiet-pod"]  # old-pod deleted


def test_drift_is_one_rule_against_a_reference() -> None:
    mine = node("a", "f1", {"report": "1", "cleanup": "1"})
    others = [mine, node("b", "f1", {"report": "1", "cleanup": "1"}),
              node("c", "f2", {"report": "2"})]
    # named from the reference's side: cleanup is only on the reference ("only here")
    assert drift_from(mine, others) == {"c": ["cleanup (only here)", "report (changed)"]}
