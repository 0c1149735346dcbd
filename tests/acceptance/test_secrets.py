"""Acceptance: the claims database password never leaves beat in clear.

A DSN may carry its password in two places at once: the URL
(``postgresql://u:URLSECRET@h/db``) and a query parameter (``?password=QUERYSECRET``,
which libpq, psycopg and PyMySQL accept). A real ``celery beat -l debug`` runs with
both against PostgreSQL (trust authentication accepts any password), then a second
one against a closed port, so that beat logs the ERROR of an unreachable store; the
test collects everything an operator or a monitor sees (beat's banner and every log
line, every Celery event it sent, the output of ``elarion-beat status`` and
``elarion-beat claims``) and looks for either secret in it. It also checks that
the run really did something (a dispatched event, the job in the CLI output, the
masked DSN in the banner and in the ERROR line), so it cannot pass on silence.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager, wait_until
from tests.acceptance import proj_secrets
from tests.acceptance.proj_secrets import JOB
from tests.flower.support import EventCapture, delete_broker_keys

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# real beats, a worker and a Flower
pytestmark += [pytest.mark.heavy]

APP = "tests.acceptance.proj_secrets"
URL_SECRET = "URLSECRET"
QUERY_SECRET = "QUERYSECRET"
SECRETS = (URL_SECRET, QUERY_SECRET)
#: generous: a loaded 2-core machine may take long to import celery
START_TIMEOUT = 90.0
#: dispatched events to see before the CLI runs (one per second)
DISPATCHES = 3


def with_secrets(dsn: str, host: str | None = None, port: int | None = None) -> str:
    """*dsn* with a password in the URL and another one as ``?password=``."""
    url = make_url(dsn).set(password=URL_SECRET)
    if host is not None:
        url = url.set(host=host, port=port)
    url = url.update_query_dict({"password": QUERY_SECRET})
    text = url.render_as_string(hide_password=False)
    assert URL_SECRET in text and QUERY_SECRET in text, text
    return text


def run_cli(pm: ProcessManager, name: str, *args: str, env: dict[str, str] | None = None,
            ) -> ChildProcess:
    """``celery -A <app> elarion-beat <args>``, run to its end."""
    process = pm.celery(name, ["elarion-beat", *args], env=env)
    assert process.wait(START_TIMEOUT) is not None, f"{name} did not finish\n{process.tail()}"
    return process


def test_no_password_in_beat_output_events_or_cli(tmp_path: Path, pg_dsn: str,
                                                  redis_url: str, table_name: str) -> None:
    run = uuid.uuid4().hex[:10]
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_RUN": run,
           "ELARION_ACC_CLAIMS_DSN": with_secrets(pg_dsn),
           "ELARION_ACC_CLAIMS_TABLE": table_name, "ELARION_ACC_NODE": f"sec-{run}"}
    down = {"ELARION_ACC_CLAIMS_DSN": with_secrets(pg_dsn, host="127.0.0.1", port=1),
            "ELARION_ACC_NODE": f"sec-down-{run}"}
    pm = ProcessManager(tmp_path / "procs", APP, env)
    capture = EventCapture(env, app=proj_secrets.make_app(env)).start()
    try:
        # 1. a healthy run: banner, debug log, dispatched events, then the CLI
        beat = pm.beat("beat", loglevel="DEBUG")
        beat.wait_for_log(r"beat: claiming occurrences in .* as node ", START_TIMEOUT)

        def dispatched() -> list[dict[str, object]]:
            found = [e for e in capture.snapshot()
                     if e.get("type") == "elarion-dispatched" and e.get("job") == JOB]
            return found if len(found) >= DISPATCHES else []

        wait_until(dispatched, 60, interval=0.5, message=lambda: f"{DISPATCHES} "
                   f"elarion-dispatched events of {JOB}\n{beat.tail()}")
        status = run_cli(pm, "status", "status")
        claims = run_cli(pm, "claims", "claims", "--job", JOB)
        assert beat.alive(), beat.tail()
        beat.terminate()

        # 2. the store is unreachable: beat logs an ERROR naming the DSN, so does the CLI
        broken = pm.beat("beat-down", loglevel="DEBUG", env=down)
        broken.wait_for_log(r"ERROR/MainProcess\] beat: claims database unavailable",
                            START_TIMEOUT)
        broken_cli = run_cli(pm, "claims-down", "claims", env=down)
        broken.terminate()
    finally:
        pm.stop_all()
        capture.stop()
        delete_broker_keys(redis_url, run)

    events = capture.snapshot()
    outputs = {"beat": beat.log(), "beat (store down)": broken.log(),
               "elarion-beat status": status.log(), "elarion-beat claims": claims.log(),
               "elarion-beat claims (store down)": broken_cli.log(),
               "events": "\n".join(json.dumps(e, default=str) for e in events)}

    leaks = [f"{where}: {line.strip()}" for where, text in outputs.items()
             for line in text.splitlines() if any(secret in line for secret in SECRETS)]
    assert not leaks, f"a password was shown in clear on {len(leaks)} lines:\n" + \
        "\n".join(leaks[:20])

    # it ran: the banner names the masked DSN, events went out, the CLI names the job
    masked = "postgresql+psycopg://postgres:***@127.0.0.1:5432/test?password=***"
    assert f"claims -> {masked} (table {table_name})" in outputs["beat"], beat.tail()
    assert beat.lines("DEBUG/MainProcess]"), "beat did not log at debug level"
    assert sum(e.get("type") == "elarion-dispatched" for e in events) >= DISPATCHES
    assert status.returncode in (0, 1) and JOB in outputs["elarion-beat status"], status.tail()
    assert claims.returncode == 0, claims.tail()
    assert JOB in outputs["elarion-beat claims"] and f"sec-{run}" in outputs[
        "elarion-beat claims"], claims.tail()

    # the failures name the (masked) database
    down_masked = "postgresql+psycopg://postgres:***@127.0.0.1:1/test?password=***"
    (error,) = broken.lines("ERROR/MainProcess] beat: claims database unavailable")[:1]
    assert down_masked in error, error
    assert broken_cli.returncode != 0 and down_masked in outputs[
        "elarion-beat claims (store down)"], broken_cli.tail()
