"""One broken ``beat_schedule`` entry among good ones: beat runs the good ones, and so
must every command (issue #27: ``status``, ``pause good`` and ``trigger good`` died
with a ``ValueError`` traceback while ``preview`` coped)."""

from __future__ import annotations

import json

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.operate import proj_ops

APP = "tests.operate.proj_ops"


def run(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", APP, "elarion-beat", *args])


def named_once(result: Result) -> str:
    """The one stderr line that names the broken entry, with its reason."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.output, result.exc_info)
    lines = [line for line in result.stderr.splitlines() if "'broken'" in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def broken(ops_env: dict[str, str], store: PostgresClaimStore,
           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(proj_ops.app.conf.beat_schedule, "broken", "every day")


@pytest.mark.usefixtures("broken")
def test_every_command_works_on_the_good_entries_and_names_the_bad_one() -> None:
    status = run("status", "--json", "--fail-on", "none")
    assert status.exit_code == 0
    assert "not a mapping" in named_once(status)
    report = json.loads(status.stdout)
    assert [e["name"] for e in report["entries"]] == ["poll", "report", "tick"]
    assert [i["job"] for i in report["invalid_entries"]] == ["broken"]

    text = run("status", "--fail-on", "none")
    assert text.exit_code == 0 and "report" in text.stdout
    named_once(text)

    paused = run("pause", "report", "--reason", "broken entry test")
    assert paused.exit_code == 0 and "report of cluster default paused by" in paused.stdout
    named_once(paused)
    assert run("resume", "report").exit_code == 0

    triggered = run("trigger", "tick", "--json")
    assert triggered.exit_code == 0, triggered.output
    assert json.loads(triggered.stdout)["job"] == "tick"
    named_once(triggered)

    catch_up = run("catch-up", "--dry-run")
    assert catch_up.exit_code == 0 and "report" in catch_up.stdout
    named_once(catch_up)


@pytest.mark.usefixtures("broken")
def test_pausing_the_broken_entry_is_refused_with_its_reason() -> None:
    refused = run("pause", "broken")
    assert refused.exit_code == 2
    assert "'broken'" in refused.stderr and "not a mapping" in refused.stderr
    assert "Traceback" not in refused.output
