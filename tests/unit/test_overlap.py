"""The overlap option: parsed and refused at start, naming the entry; the rule's
idea of an unfinished run (the stores apply the same rule inside the claim)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab

from celery_elarion_beat import ClaimingScheduler, ConfigurationError, MemoryClaimStore
from celery_elarion_beat.config.overlap import OverlapRule, entry_overlap
from celery_elarion_beat.store.records import ClaimRow, overlap_blocks
from tests.helpers.fakes import FakeClock, make_app

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
RULE = OverlapRule(timedelta(minutes=10), timedelta(seconds=30))


def _row(age: float, state: str | None = "published", run_state: str | None = None,
         kind: str = "slot") -> ClaimRow:
    claimed = NOW - timedelta(seconds=age)
    return ClaimRow("report", claimed, "a", "t", kind, claimed, state=state, run_state=run_state)


@pytest.mark.parametrize(("row", "blocks"), [
    (_row(5), True),                                   # published, not started yet
    (_row(5, run_state="running"), True),
    (_row(5, run_state="retried"), True),              # runs again under the same id
    (_row(5, run_state="succeeded"), False),
    (_row(5, run_state="failed"), False),
    (_row(5, state="pending"), True),                  # being published
    (_row(45, state="pending"), False),                # an orphan: runs only if taken over
    (_row(5, state="failed"), False),                  # the publish failed: nothing runs
    (_row(5, state="skipped"), False),
    (_row(5, state=None), False),                      # the purge election publishes nothing
    (_row(601, run_state="running"), False),           # older than the timeout: dead
    (_row(5, run_state="running", kind="node"), False),  # every-node runs are never claims
])
def test_what_counts_as_an_unfinished_run(row: ClaimRow, blocks: bool) -> None:
    assert overlap_blocks(RULE, row, NOW) is blocks


def test_allow_is_the_default_and_has_no_rule() -> None:
    assert entry_overlap("x", {}, 3600, 30) is None
    assert entry_overlap("x", {"overlap": "allow"}, 3600, 30) is None


def test_the_timeout_comes_from_the_option_then_the_time_limit_then_the_setting() -> None:
    skip = {"overlap": "skip"}
    assert entry_overlap("x", skip, 3600, 30) == OverlapRule(timedelta(hours=1),
                                                             timedelta(seconds=30))
    assert entry_overlap("x", skip, 3600, 30, time_limit=300).timeout == timedelta(seconds=330)
    both = {**skip, "overlap_timeout": timedelta(minutes=5)}
    assert entry_overlap("x", both, 3600, 30, time_limit=900).timeout == timedelta(minutes=5)
    # a pending claim never counts for longer than the run itself may
    assert entry_overlap("x", {**skip, "overlap_timeout": 10}, 3600, 30).pending == \
        timedelta(seconds=10)


@pytest.mark.parametrize(("options", "words"), [
    ({"overlap": "forbid"}, ["'report'", "options['overlap'] = 'forbid'", "'allow', 'skip'"]),
    ({"overlap": "skip", "overlap_timeout": 0}, ["options['overlap_timeout']", "more than 0"]),
    ({"overlap": "skip", "overlap_timeout": "soon"}, ["options['overlap_timeout']",
                                                      "a timedelta or a number of seconds"]),
])
def test_bad_options_name_the_entry_and_the_fix(options: dict, words: list[str]) -> None:
    with pytest.raises(ConfigurationError) as info:
        entry_overlap("report", options, 3600, 30)
    for word in words:
        assert word in str(info.value)


def test_skip_on_an_every_node_entry_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="every_node"):
        entry_overlap("cache", {"overlap": "skip"}, 3600, 30, every_node=True)


def test_beat_refuses_a_bad_overlap_option_at_start() -> None:
    clock = FakeClock(NOW)
    app = make_app({"report": {"task": "t", "schedule": crontab(nowfun=clock),
                               "options": {"overlap": "never"}}})
    with pytest.raises(ConfigurationError, match="'report'.*'overlap'"):
        ClaimingScheduler(app, clock=clock, store=MemoryClaimStore("overlap-start",
                                                                   clock=clock))


def test_the_overlap_options_never_reach_the_broker() -> None:
    from celery_elarion_beat.config.options import publish_options

    assert publish_options({"overlap": "skip", "overlap_timeout": 5, "queue": "q"}) == \
        {"queue": "q"}


def test_a_task_time_limit_sets_the_timeout() -> None:
    clock = FakeClock(NOW)
    app = make_app({"report": {"task": "t.limited", "schedule": crontab(nowfun=clock),
                               "options": {"overlap": "skip"}}}, task_time_limit=120)
    beat = ClaimingScheduler(app, clock=clock, store=MemoryClaimStore("overlap-limit",
                                                                      clock=clock))
    try:
        rule = beat.pipeline.rules.overlap(beat.schedule["report"])
        assert rule is not None and rule.timeout == timedelta(seconds=150)
    finally:
        beat.close()
