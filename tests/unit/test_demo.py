"""The README's first command: the demo runs with no services and finds no duplicates."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_runs_without_services_and_reports_no_duplicates() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-m", "celery_elarion_beat.demo", "--seconds", "7"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"occurrences: (\d+), duplicates: (\d+)", done.stdout)
    assert summary, done.stdout
    assert int(summary.group(1)) >= 3 and summary.group(2) == "0"
    every = re.search(r"every-node runs per node: \{(.*)\}", done.stdout)
    assert every and all(f"'node-{n}'" in every.group(1) for n in "abc"), done.stdout
    winners = re.findall(r"^every-2s-cron\s+\S+\s+(node-\w)\s", done.stdout, re.M)
    assert winners, done.stdout
