"""The scheduler guard (:mod:`celery_elarion_beat.beat.scheduler_guard`), in process: which
apps use the library, which schedulers claim, the line a refusal says, the setting that
allows another scheduler. The real ``celery beat`` and ``celery worker -B`` are
tests/acceptance/test_scheduler_guard.py.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals
from celery.beat import PersistentScheduler, Service

from celery_elarion_beat import ClaimingScheduler, ConfigurationError, install_worker
from celery_elarion_beat.beat.scheduler_guard import (
    STANDALONE,
    WORKER,
    check_scheduler,
    scheduler_class,
    scheduler_problem,
)
from celery_elarion_beat.beat.startup import EXIT_CONFIG
from celery_elarion_beat.config.usage import uses_library
from tests.helpers.fakes import make_app

STOCK = "celery.beat:PersistentScheduler"


class MyClaimingScheduler(ClaimingScheduler):
    """A subclass of ours (a project's own tweaks): it claims."""


def plain_app(**conf: Any) -> Celery:
    app = Celery("guard-unit", set_as_current=False)
    app.conf.update(**conf)
    return app


@pytest.fixture(autouse=True)
def _no_dsn_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ELARION_BEAT_DSN", "ELARION_BEAT_DJANGO_DATABASE",
                 "ELARION_BEAT_ALLOW_OTHER_SCHEDULER"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("name", "found"), [
    ("elarion", ClaimingScheduler),  # the alias of our celery.beat_schedulers entry point
    ("celery_elarion_beat.ClaimingScheduler", ClaimingScheduler),
    ("celery_elarion_beat.beat.scheduler:ClaimingScheduler", ClaimingScheduler),
    (STOCK, PersistentScheduler),
    ("celery.beat.PersistentScheduler", PersistentScheduler),
    (MyClaimingScheduler, MyClaimingScheduler),
    ("no_such_module.Scheduler", None),  # Celery says what is wrong with it itself
])
def test_the_scheduler_a_name_selects(name: Any, found: type | None) -> None:
    assert scheduler_class(name) is found


def test_an_app_uses_the_library_when_it_names_a_claims_database_or_installs_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert uses_library(plain_app()) is None
    assert uses_library(plain_app(elarion_beat_dsn="postgresql://db/app")) == (
        "elarion_beat_dsn is set")
    assert uses_library(plain_app(elarion_beat_django_database="default")) == (
        "elarion_beat_django_database is set")
    assert uses_library(plain_app(elarion_beat_dsn="")) is None  # empty: unset
    # a wrong value still says the app means to use the library
    assert uses_library(plain_app(elarion_beat_dsn="nonsense")) == "elarion_beat_dsn is set"
    installed = plain_app()
    install_worker(installed, track_runs=False)
    assert uses_library(installed) == "it calls install_worker(app)"
    monkeypatch.setenv("ELARION_BEAT_DSN", "postgresql://db/app")
    assert uses_library(plain_app()) == "ELARION_BEAT_DSN is set"


@pytest.mark.parametrize("scheduler", ["elarion", ClaimingScheduler, MyClaimingScheduler])
def test_a_claiming_scheduler_passes(scheduler: Any) -> None:
    assert scheduler_problem(make_app({}), scheduler, WORKER) is None


def test_an_app_that_does_not_use_the_library_runs_any_scheduler() -> None:
    """An old image: its stock beat is left alone (the workers name it instead)."""
    assert scheduler_problem(plain_app(), STOCK, STANDALONE) is None


def test_the_refusal_names_the_class_the_reason_and_the_fix() -> None:
    message, allowed = scheduler_problem(make_app({}), STOCK, STANDALONE) or ("", True)
    assert not allowed
    for words in ("elarion_beat_dsn is set", "this `celery beat` runs "
                  "celery.beat.PersistentScheduler", "every occurrence again",
                  "start it with `-S elarion`", 'beat_scheduler = "elarion"',
                  "elarion_beat_allow_other_scheduler = True"):
        assert words in message, (words, message)
    message, _ = scheduler_problem(make_app({}), STOCK, WORKER, statedb="elarion") or ("", 1)
    for words in ("celery worker -B", "--scheduler elarion",
                  "-S is --statedb: -S 'elarion' named a state file, not the scheduler"):
        assert words in message, (words, message)


def test_the_setting_allows_another_scheduler_and_a_wrong_value_is_named() -> None:
    problem = scheduler_problem(make_app({}, elarion_beat_allow_other_scheduler=True), STOCK,
                                STANDALONE)
    assert problem is not None and problem[1]
    with pytest.raises(ConfigurationError, match="elarion_beat_allow_other_scheduler"):
        scheduler_problem(make_app({}, elarion_beat_allow_other_scheduler="perhaps"), STOCK,
                          STANDALONE)


def test_another_bad_setting_does_not_hide_the_refusal() -> None:
    """The guard reads its one setting alone: a wrong claim timeout is beat's to report."""
    app = make_app({}, elarion_beat_claim_timeout="abc")
    assert scheduler_problem(app, STOCK, STANDALONE) is not None


def critical(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.CRITICAL]


def test_beat_init_refuses_a_stock_beat_with_one_critical_line_and_78(
        caplog: pytest.LogCaptureFixture) -> None:
    """Celery's own signal, sent as ``Service.start`` sends it (before the first tick)."""
    service = Service(make_app({}), scheduler_cls=STOCK)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        signals.beat_init.send(sender=service)
    assert caught.value.code == EXIT_CONFIG
    (line,) = critical(caplog)
    assert line.getMessage().startswith("beat: cannot start: this app uses celery-elarion-beat")
    assert line.__dict__["action"] == "refused-start" and line.exc_info is None
    # a claiming one, and a stock beat of an app that does not use the library, start
    signals.beat_init.send(sender=Service(make_app({}), scheduler_cls="elarion"))
    signals.beat_init.send(sender=Service(plain_app(), scheduler_cls=STOCK))
    assert len(critical(caplog)) == 1


def test_a_worker_with_b_is_checked_and_one_without_is_left_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    app = make_app({})

    def worker(beat: bool, scheduler: str) -> SimpleNamespace:
        """What Celery's worker has when it sends celeryd_after_setup (its -B step built)."""
        return SimpleNamespace(app=app, beat=object() if beat else None, scheduler=scheduler,
                               statedb="elarion")

    signals.celeryd_after_setup.send(sender="w@h", instance=worker(False, STOCK), conf=app.conf)
    signals.celeryd_after_setup.send(sender="w@h", instance=worker(True, "elarion"),
                                     conf=app.conf)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        signals.celeryd_after_setup.send(sender="w@h", instance=worker(True, STOCK),
                                         conf=app.conf)
    assert caught.value.code == EXIT_CONFIG
    (line,) = critical(caplog)
    assert "-S 'elarion' named a state file" in line.getMessage()


def test_an_allowed_scheduler_starts_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    app = make_app({}, elarion_beat_allow_other_scheduler="true")
    with caplog.at_level(logging.INFO):
        check_scheduler(app, STOCK, STANDALONE)
    (warning,) = [r for r in caplog.records if r.__dict__.get("action") == "other-scheduler"]
    assert warning.levelno == logging.WARNING
    assert "celery.beat.PersistentScheduler" in warning.getMessage()
