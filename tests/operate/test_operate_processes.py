"""Operations with real `celery beat` processes: drift between two beats started with
different schedules, heartbeats in the nodes table, and `status` as a health check."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from celery_elarion_beat.testing._harness import ProcessManager, clean_env

ROOT = Path(__file__).parents[2]
APP = "tests.operate.proj_ops"


@pytest.mark.acceptance
def test_two_beats_with_different_schedules_raise_the_drift_alarm(
        tmp_path: Path, pg_dsn: str, redis_url: str, table_name: str) -> None:
    env = {"ELARION_OPS_DSN": pg_dsn, "ELARION_OPS_TABLE": table_name,
           "ELARION_OPS_BROKER": redis_url, "ELARION_OPS_HEARTBEAT": "1",
           "ELARION_OPS_QUEUE": f"ops-{uuid.uuid4().hex[:8]}"}
    with ProcessManager(tmp_path, APP, env) as pm:
        plain = pm.beat("beat-plain", env={"ELARION_BEAT_NODE": "ops-plain"})
        extra = pm.beat("beat-extra", env={"ELARION_BEAT_NODE": "ops-extra",
                                           "ELARION_OPS_EXTRA": "1"})
        plain.wait_for_log(r"schedule drift: node ops-extra .*extra-cleanup \(missing here\)",
                           120)
        extra.wait_for_log(r"schedule drift: node ops-plain .*extra-cleanup \(only here\)", 120)
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "elarion-beat", "status"],
            env=clean_env(env), cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "SCHEDULE DRIFT" in done.stdout and "extra-cleanup" in done.stdout
        assert "ops-plain" in done.stdout and "ops-extra" in done.stdout
        assert done.stdout.count("alive") == 2, done.stdout
        assert plain.alive() and extra.alive()
