"""The benchmark suite still runs: ``python -m benchmarks --smoke`` exits 0 and prints its tables.

Only that the scripts work is checked here; the numbers they print are
measurements (docs/benchmarks.md), never assertions. Needs PostgreSQL and Redis
(like the rest of the suite) and the benchmark packages (matplotlib,
celery-redbeat). The smoke run writes into a temporary directory, never into
docs/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TABLES = (
    "== Overhead:",
    "== Floor: Celery's own publish",
    "== Throughput:",
    "== Throughput, per node",
    "== Scale-out:",
    "== Latency, due -> published:",
    "== Failover:",
    "== Scheduler CPU per due entry",
)


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_the_benchmarks_run_in_smoke_mode(pg_dsn: str, redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**_env(), "ELARION_BENCH_PG_DSN": pg_dsn, "ELARION_BENCH_REDIS_URL": redis_url})
    report = f"rc {done.returncode}\n--- stdout ---\n{done.stdout[-6000:]}\n" \
             f"--- stderr ---\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    missing = [title for title in TABLES if title not in done.stdout]
    assert not missing, f"tables not printed: {missing}\n{report}"
    assert (out / "benchmarks.md").read_text().startswith("# Benchmarks")
    plots = sorted(p.name for p in (out / "img").glob("*.png"))
    assert plots == ["failover.png", "latency.png", "overhead.png", "scaleout_shares.png",
                     "scaleout_time.png", "throughput.png"], plots


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELARION_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    return env
