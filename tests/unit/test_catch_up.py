"""Catch-up policies, missed slots and interval anchors: pure functions, no I/O."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab

from celery_elarion_beat import CatchUp, CatchUpPolicy, ConfigurationError, cron
from celery_elarion_beat.beat.catch_up import CatchUpQueue, interval_anchor, missed_slots
from celery_elarion_beat.config.catch_up import entry_catch_up
from celery_elarion_beat.config.delivery import Delivery, entry_delivery
from celery_elarion_beat.config.options import publish_options

UTC = timezone.utc
T0 = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
DEFAULT = CatchUpPolicy(CatchUp.SKIP, timedelta(hours=1), 10)
MINUTE = timedelta(minutes=1)


def policy(mode: str, window: float = 3600, most: int = 10) -> CatchUpPolicy:
    return CatchUpPolicy(CatchUp(mode), timedelta(seconds=window), most)


# -- options ------------------------------------------------------------------


def test_options_override_the_defaults() -> None:
    got = entry_catch_up("report", {"catch_up": "all", "catch_up_window": timedelta(hours=6),
                                    "catch_up_max": 3}, DEFAULT)
    assert got == CatchUpPolicy(CatchUp.ALL, timedelta(hours=6), 3)
    assert entry_catch_up("report", {"catch_up_window": 90}, DEFAULT).window == \
        timedelta(seconds=90)
    assert entry_catch_up("report", None, DEFAULT) == DEFAULT
    assert entry_catch_up("report", {"catch_up": CatchUp.LATEST}, DEFAULT).mode is CatchUp.LATEST


@pytest.mark.parametrize(("options", "names"), [
    ({"catch_up": "everything"}, ["'report'", "catch_up", "'everything'", "'skip'", "'all'"]),
    ({"catch_up_window": "soon"}, ["'report'", "catch_up_window", "'soon'"]),
    ({"catch_up_window": timedelta(0)}, ["'report'", "catch_up_window", "longer than 0"]),
    ({"catch_up_max": 0}, ["'report'", "catch_up_max", "at least 1"]),
    ({"catch_up_max": 2.5}, ["'report'", "catch_up_max", "whole number"]),
    ({"catch_up_max": True}, ["'report'", "catch_up_max"]),
])
def test_a_bad_option_names_the_entry_the_key_and_what_is_allowed(
        options: dict[str, object], names: list[str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        entry_catch_up("report", options, DEFAULT)
    for name in names:
        assert name in str(info.value)


def test_delivery_option() -> None:
    assert entry_delivery("r", None, Delivery.AT_MOST_ONCE) is Delivery.AT_MOST_ONCE
    assert entry_delivery("r", {"delivery": "at_least_once"},
                          Delivery.AT_MOST_ONCE) is Delivery.AT_LEAST_ONCE
    with pytest.raises(ConfigurationError, match="'r'.*delivery.*'exactly_once'.*at_least_once"):
        entry_delivery("r", {"delivery": "exactly_once"}, Delivery.AT_MOST_ONCE)


def test_beat_options_never_reach_the_broker() -> None:
    options = {"placement": "cluster", "catch_up": "all", "catch_up_window": 60,
               "catch_up_max": 3, "delivery": "at_least_once", "queue": "reports",
               "expires": 30}
    assert publish_options(options) == {"queue": "reports", "expires": 30}


# -- missed slots -------------------------------------------------------------


def test_the_missed_slots_lie_between_the_last_claim_and_now() -> None:
    sched = crontab()  # every minute
    now = T0 + timedelta(minutes=5, seconds=20)
    missed = missed_slots("r", sched, policy("all"), T0, now)
    assert missed.slots == [T0 + MINUTE * k for k in (5, 4, 3, 2, 1)]  # newest first
    assert missed.replay == [T0 + MINUTE * k for k in (1, 2, 3, 4, 5)]  # oldest first


def test_each_policy_replays_its_share() -> None:
    sched, now = crontab(), T0 + timedelta(minutes=5, seconds=20)
    assert missed_slots("r", sched, policy("skip"), T0, now).replay == []
    assert missed_slots("r", sched, policy("latest"), T0, now).replay == [T0 + 5 * MINUTE]
    assert missed_slots("r", sched, policy("all", most=2), T0, now).replay == [
        T0 + 4 * MINUTE, T0 + 5 * MINUTE]  # the cap keeps the newest, run oldest first


def test_the_window_cuts_off_older_slots() -> None:
    now = T0 + timedelta(minutes=5, seconds=20)
    missed = missed_slots("r", crontab(), policy("all", window=150), T0, now)
    assert missed.replay == [T0 + 3 * MINUTE, T0 + 4 * MINUTE, T0 + 5 * MINUTE]


def test_no_claim_means_nothing_was_missed() -> None:
    missed = missed_slots("r", crontab(), policy("all"), None, T0 + timedelta(hours=3))
    assert missed.slots == [] and missed.replay == []


def test_seconds_and_time_zones_count_too() -> None:
    sched = cron("*/10 * * * * *", tz="Europe/Berlin")
    missed = missed_slots("r", sched, policy("all", most=100), T0, T0 + timedelta(seconds=35))
    assert missed.replay == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]


# -- intervals ------------------------------------------------------------------


def test_an_interval_counts_from_its_last_claim() -> None:
    every = timedelta(hours=6)
    # a restart 4 hours after the last run: the next run is 2 hours away, not 6
    assert interval_anchor(every, T0, T0 + timedelta(hours=4), CatchUp.SKIP) == T0


def test_the_window_in_progress_at_start_is_the_current_one_under_every_policy() -> None:
    """A quick restart (#35): the nodes come back just after the run was due. The window
    that began at T0 + 20 s has not ended: it is no missed window, and runs now."""
    every = timedelta(seconds=20)
    for mode in CatchUp:
        for late in (0.5, 2.0, 5.0, 19.9):  # in IN_FLIGHT, or well after
            now = T0 + every + timedelta(seconds=late)
            anchor = interval_anchor(every, T0, now, mode)
            assert anchor == T0 and anchor + every <= now, (mode, late)


def test_an_interval_missed_while_the_cluster_was_down() -> None:
    every = timedelta(hours=6)
    now = T0 + timedelta(hours=13)  # windows at 6 h ended unrun; the one at 12 h is current
    # latest/all: run it once now (counted from the last run)
    assert interval_anchor(every, T0, now, CatchUp.LATEST) == T0
    # skip: the ended window is dropped; the current one runs now, on the rhythm
    anchor = interval_anchor(every, T0, now, CatchUp.SKIP)
    assert anchor == T0 + every and anchor + every == T0 + timedelta(hours=12) <= now


# -- the queue -----------------------------------------------------------------


def test_the_queue_hands_out_the_oldest_slots_first_each_once() -> None:
    queue = CatchUpQueue()
    assert queue.add("b", [T0 + MINUTE, T0 + 3 * MINUTE]) == 2
    assert queue.add("a", [T0 + 2 * MINUTE, T0 + MINUTE]) == 2
    assert queue.add("a", [T0 + MINUTE]) == 0  # already queued
    assert queue.take(3, lambda job: True) == [
        ("a", T0 + MINUTE), ("b", T0 + MINUTE), ("a", T0 + 2 * MINUTE)]
    assert len(queue) == 1
    assert queue.take(5, lambda job: job != "b") == []  # "b" left the schedule
    assert not queue
