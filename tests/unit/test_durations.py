"""Durations as people write them: the one formatter, beside the one parser.

``format_duration`` writes ``7d``, ``1h``, ``90s``, ``1h30m``, ``2h5m30s``, ``250ms``,
never ``7 days, 0:00:00`` or ``0:01:00``; ``duration`` (the parser of ``--older-than``,
``--since``, ``--for``, ``--max-age``) reads back every text it writes, exactly.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_elarion_beat.config.catch_up import CatchUp, CatchUpPolicy
from celery_elarion_beat.config.parsers import duration, format_duration
from celery_elarion_beat.exceptions import ConfigurationError

#: Texts the formatter writes: each reads back to a duration it writes the same way.
CANONICAL = ["0s", "1ms", "250ms", "0.5ms", "0.001ms", "1s", "1.5s", "45s", "59.999s", "90s",
             "119.5s", "1m", "2m", "2m30s", "1h", "1h30m", "2h5m30s", "1h0.5s", "23h59m59s",
             "1d", "7d", "14d", "1d12h", "3d4h5m6.000007s", "400d", "999999999d"]


@pytest.mark.parametrize("text", CANONICAL)
def test_what_it_writes_reads_back_and_is_written_the_same(text: str) -> None:
    assert format_duration(duration("x", text)) == text


@pytest.mark.parametrize(("written", "shown"), [
    ("90", "90s"), ("60", "1m"), ("60s", "1m"), ("1m30s", "90s"), ("120s", "2m"),
    ("30m", "30m"), ("90m", "1h30m"), ("12h", "12h"), ("36h", "1d12h"), ("7d", "7d"),
    ("2w", "14d"), ("1w1d", "8d"), ("1.5h", "1h30m"), ("0.5s", "500ms"), ("1500ms", "1.5s"),
    ("1h 30m", "1h30m"), (" 3 h ", "3h"), ("0", "0s")])
def test_what_people_write_is_shown_in_the_one_way(written: str, shown: str) -> None:
    assert format_duration(duration("x", written)) == shown


@pytest.mark.parametrize(("value", "shown"), [
    (timedelta(days=7), "7d"), (timedelta(hours=1), "1h"), (timedelta(seconds=90), "90s"),
    (timedelta(minutes=90), "1h30m"), (timedelta(hours=2, minutes=5, seconds=30), "2h5m30s"),
    (timedelta(minutes=1), "1m"), (0.25, "250ms"), (0.5, "500ms"), (1.25, "1.25s"),
    (3725, "1h2m5s"), (-2.5, "-2.5s"), (timedelta(seconds=-60), "-1m"), (0, "0s"),
    (timedelta(days=7, hours=1), "7d1h")])
def test_never_the_timedelta_text(value: timedelta | float, shown: str) -> None:
    assert format_duration(value) == shown
    assert "day" not in shown and ":" not in shown


@pytest.mark.parametrize(("seconds", "precision", "shown"), [
    (3725.4, 1, "1h2m5s"), (0.0004, 0.001, "0s"), (59.96, 0.1, "1m"), (29.9996, 0.001, "30s"),
    (-1.26, 0.1, "-1.3s")])
def test_a_precision_rounds_first(seconds: float, precision: float, shown: str) -> None:
    assert format_duration(seconds, precision) == shown


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.000049, "0.049ms"), (0.0042, "4.2ms"), (0.34, "340ms"), (1.25, "1.3s"), (9.96, "10s"),
    (75.5, "76s"), (602.4, "10m2s"), (7530, "2h6m"), (3 * 86400 + 4 * 3600 + 100, "3d4h")])
def test_approximate_keeps_about_two_digits(seconds: float, shown: str) -> None:
    assert format_duration(seconds, approximate=True) == shown


@pytest.mark.parametrize("text", ["", "h", "1x", "-5s", "30m1h", "1h1h", "1h30", "5s3", "1.s",
                                  "1e3s", "1,5s", "9999999999d"])
def test_a_bad_duration_names_the_option_and_shows_how_to_write_one(text: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        duration("--older-than", text)
    message = str(caught.value)
    assert message.startswith(f"--older-than {text!r} is ")
    assert "1h30m" in message or "999999999d" in message


def test_describe_writes_the_catch_up_window_as_people_do() -> None:
    policy = CatchUpPolicy(CatchUp.ALL, timedelta(hours=1), 10)
    assert policy.describe() == "all (at most 10) within 1h"
    assert CatchUpPolicy(CatchUp.LATEST, timedelta(minutes=90), 1).describe() == \
        "latest within 1h30m"


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=999_999_999)))
def test_every_duration_reads_back_exactly(value: timedelta) -> None:
    text = format_duration(value)
    assert duration("x", text) == value
    assert format_duration(duration("x", text)) == text


@given(st.floats(min_value=0, max_value=10**9, allow_nan=False),
       st.sampled_from([None, 0.001, 0.1, 1.0, 60.0]))
def test_a_rounded_duration_reads_back_within_its_precision(seconds: float,
                                                              precision: float | None) -> None:
    back = duration("x", format_duration(seconds, precision)).total_seconds()
    assert abs(back - seconds) <= (precision or 0.000001) / 2 + 0.000001  # + float error


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=23),
       st.integers(min_value=0, max_value=59), st.integers(min_value=0, max_value=59))
def test_compound_texts_read_as_the_sum_of_their_parts(d: int, h: int, m: int, s: int) -> None:
    parts = [f"{n}{u}" for n, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if n] or ["0s"]
    assert duration("x", "".join(parts)) == timedelta(days=d, hours=h, minutes=m, seconds=s)
