"""The zone transitions cron reads (schedules/cron_dst.py): found once per zone and
year, then a binary search. Sampled on every call, a yearly entry's next instant in a
zone with daylight saving cost half a year of hourly conversions: 10,000 such entries
kept a beat busy for minutes at start and at every rebuild of its heap."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import pytest
from dateutil import tz as dateutil_tz

from celery_elarion_beat.schedules import cron_dst
from celery_elarion_beat.schedules.cron import cron

UTC = timezone.utc
ZONES: list[tzinfo] = [
    ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York"), ZoneInfo("Australia/Sydney"),
    ZoneInfo("Australia/Lord_Howe"),  # a half-hour shift
    ZoneInfo("Europe/Moscow"),  # 2011: summer time for good; 2014: back, no DST
    ZoneInfo("Asia/Tokyo"), timezone(timedelta(hours=5, minutes=30)), UTC,
    dateutil_tz.gettz("Europe/Paris"),  # not a zoneinfo: any tzinfo will do
]


def _changes_by_sampling(zone: tzinfo, start: datetime, end: datetime) -> list[datetime]:
    """Every whole second in (start, end] where the offset changes, the slow way: each
    hour, then to the second."""
    out, low = [], start
    offset = low.astimezone(zone).utcoffset()
    while low < end:
        high = min(low + timedelta(hours=1), end)
        if high.astimezone(zone).utcoffset() != offset:
            while high - low > timedelta(seconds=1):
                mid = low + (high - low) // 2
                mid = mid.replace(microsecond=0)
                if mid.astimezone(zone).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            out.append(high)
            offset = high.astimezone(zone).utcoffset()
        low = high
    return out


@pytest.mark.parametrize("zone", ZONES, ids=lambda z: str(z))
def test_the_changes_are_the_ones_sampling_finds(zone: tzinfo) -> None:
    start, end = datetime(2010, 6, 1, tzinfo=UTC), datetime(2016, 6, 1, tzinfo=UTC)
    expected = _changes_by_sampling(zone, start, end)
    found, cursor = [], start
    while (change := cron_dst.first_change(zone, cursor, end)) is not None:
        found.append(change)
        cursor = change
    assert found == expected
    # and backwards: where each stretch of constant offset begins
    for before, change in zip([start, *expected], expected):
        assert cron_dst._last_change(zone, before, change + timedelta(days=1)) == change
    assert cron_dst._last_change(zone, end - timedelta(hours=1), end) is None


def test_a_yearly_entry_is_a_binary_search_after_the_first(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    yearly = cron("0 30 4 1 7 *", tz=berlin)  # 04:30:00 on July 1st, Berlin time
    now = datetime(2026, 12, 2, 7, tzinfo=UTC)
    assert yearly.next_after(now) == datetime(2027, 7, 1, 2, 30, tzinfo=UTC)
    conversions = 0
    offset = cron_dst._offset

    def counted(zone: tzinfo, instant: datetime) -> timedelta:
        nonlocal conversions
        conversions += 1
        return offset(zone, instant)

    monkeypatch.setattr(cron_dst, "_offset", counted)
    for minute in range(100):  # 100 more entries of the zone, each half a year ahead
        entry = cron(f"0 {minute % 60} 4 1 7 *", tz=berlin)
        assert entry.next_after(now + timedelta(minutes=minute)).month == 7
    # sampled per call: 8,575 conversions an entry (hourly, to July); now about 50
    assert conversions < 100 * 100, conversions
