"""The pytest plugin as a user runs it: a test file of theirs, in a pytest process of
its own, with ``-p celery_elarion_beat.pytest``; and its entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = '''
from datetime import datetime, timezone

from celery import Celery
from celery.schedules import crontab

app = Celery("shop", broker="redis://redis.invalid:6379/0", set_as_current=False)
app.conf.timezone = "Europe/Berlin"
app.conf.elarion_beat_dsn = "postgresql://beat:secret@db.invalid/shop"
app.conf.beat_schedule = {
    "nightly": {"task": "shop.nightly", "schedule": crontab(minute=30, hour=2)},
}
UTC = timezone.utc


def test_spring_forward(simulate):
    sent = simulate(app, "2026-03-28", "2026-03-30")
    assert [o.slot for o in sent] == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
                                      datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]


def test_one_node_sends(beat_clock, beat_cluster, claims_store):
    beat_clock.set("2026-03-28T01:29:59Z")
    cluster = beat_cluster(3, app=app)
    cluster.advance(2)
    (message,) = cluster.sent()
    assert message.headers["elarion_occurrence"] == "2026-03-28T01:30:00Z"
    (row,) = [row for row in claims_store.find_claims() if row.job == "nightly"]
    assert (row.job, row.node) == ("nightly", message.node)


def test_default_app_is_celery_app(beat_cluster, celery_app):
    assert beat_cluster(1).app.main == celery_app.main


def test_wrong_expectation(simulate):
    sent = simulate(app, "2026-03-28", "2026-03-30")
    # 02:30 local on the 29th does not exist: this user expected 00:30 UTC
    assert [o.slot for o in sent][1] == datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
'''


def test_a_users_tests_pass_and_fail_through_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_shop=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "celery_elarion_beat.pytest", "-q",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "FAILED test_shop.py::test_wrong_expectation - *",
    ])
    result.stdout.fnmatch_lines(["*datetime.datetime(2026, 3, 29, 1, 0, tzinfo=*"])


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    (point,) = [ep for ep in entry_points(group="pytest11")
                if ep.value == "celery_elarion_beat.pytest"]
    # named as the module, so ``-p celery_elarion_beat.pytest`` and the autoload agree
    assert point.name == "celery_elarion_beat.pytest"
    plugin = point.load()
    fixtures = {"beat_clock", "claims_store", "beat_cluster", "simulate"}
    assert fixtures <= set(vars(plugin))
    assert not [name for name in fixtures if "autouse=True" in repr(vars(plugin)[name])]
