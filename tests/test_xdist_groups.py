"""The suite's ``xdist_group`` marks group: the tests of one group run on one worker
(tests/helpers/groups.py), so a module's shared cluster starts once per run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = "from tests.helpers.groups import pytest_collection_modifyitems  # noqa: F401\n"
MODULE = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("{group}")


@pytest.mark.parametrize("n", range(8))
def test_records_its_worker(n):
    with open(os.path.join(os.environ["WORKERS_OUT"], "{group}"), "a") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    project = tmp_path / "project"
    out = tmp_path / "out"
    project.mkdir()
    out.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "conftest.py").write_text(CONFTEST)
    for group in ("alpha", "beta"):
        (project / f"test_{group}.py").write_text(MODULE.format(group=group))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKERS_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-p",
         "no:cacheprovider", "-q", str(project)],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for group in ("alpha", "beta"):
        workers = (out / group).read_text().split()
        assert len(workers) == 8 and len(set(workers)) == 1, (group, workers)
