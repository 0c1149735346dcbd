"""Lanes: which tests may share the machine when pytest-xdist runs them side by side.

The suite runs on several xdist workers (``-n 4`` in the project's pytest options):
most tests wait on real processes, so 4 of them share 2 cores well. Two marks keep
the ones that must not overlap apart, across every worker of the run:

* ``@pytest.mark.heavy``: a real-process test whose timing or load must not stack on
  another heavy one (several beats and workers, bounds of a few seconds); at most
  :data:`HEAVY_SLOTS` heavy tests run at once, beside any number of light ones;
* ``@pytest.mark.alone``: a test that must have the machine to itself (it loads both
  cores, or its bounds were measured on a quiet machine): it waits until every other
  test of the run has finished, and nothing else starts until it has.

Each mark says why where it is used. A module-scoped cluster is held for as long as
the module's tests run on the worker (the lane is kept from one test to the next of
the same module or ``xdist_group``), so the cluster never runs outside its lane.

The lanes are ``flock`` locks on files in a directory of the run that the controller
hands every worker: ``alone`` takes the run lock exclusively, every other test shares
it; a gate in front gives a waiting ``alone`` test precedence over newly starting
tests (else a steady stream of short tests could starve it). Without xdist (``-n 0``)
the tests run one at a time and the lanes do nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest

#: Heavy tests that may run at once (on 2 cores, two waiting clusters fit).
HEAVY_SLOTS = 2
_KEY = "elarion_lanes"


def _open(directory: Path, name: str) -> IO[bytes]:
    return (directory / name).open("a+b")


class Lanes:
    """This worker's hold on the run's lanes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key: tuple[str, str] | None = None  # (scope, kind) held now
        self._files: list[IO[bytes]] = []

    def hold(self, scope: str, kind: str) -> None:
        """Hold the lane of *kind* (``light``, ``heavy``, ``alone``) for *scope*."""
        if self.key == (scope, kind):
            return
        self.release()
        if kind == "heavy":
            self._files.append(self._heavy_slot())
        gate = _open(self.directory, "gate.lock")
        run = _open(self.directory, "run.lock")
        if kind == "alone":
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(run, fcntl.LOCK_EX)
            self._files += [gate, run]
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # waits while an alone test waits or runs
            fcntl.flock(run, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            gate.close()
            self._files.append(run)
        self.key = (scope, kind)

    def _heavy_slot(self) -> IO[bytes]:
        while True:
            for slot in range(HEAVY_SLOTS):
                handle = _open(self.directory, f"heavy-{slot}.lock")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                return handle
            time.sleep(0.2)

    def release(self) -> None:
        for handle in reversed(self._files):
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        self._files = []
        self.key = None


def kind_of(item: pytest.Item) -> str:
    if item.get_closest_marker("alone") is not None:
        return "alone"
    if item.get_closest_marker("heavy") is not None:
        return "heavy"
    return "light"


def scope_of(item: pytest.Item) -> str:
    """What a lane is kept for: the item's xdist group, else its module."""
    group = item.get_closest_marker("xdist_group")
    if group is not None and group.args:
        return f"group:{group.args[0]}"
    return item.nodeid.split("::")[0]


# -- hooks (tests/conftest.py imports them) ------------------------------------------


def pytest_configure_node(node: Any) -> None:
    """On the controller: hand every worker the run's lane directory."""
    config = node.config
    directory = getattr(config, _KEY, None)
    if directory is None:
        directory = tempfile.mkdtemp(prefix="elarion-lanes-")
        setattr(config, _KEY, directory)
    node.workerinput[_KEY] = directory


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, None, None]:
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or _KEY not in workerinput:  # not under xdist: one at a time
        yield
        return
    lanes: Lanes | None = getattr(item.config, "_elarion_lane", None)
    if lanes is None:
        lanes = Lanes(Path(workerinput[_KEY]))
        item.config._elarion_lane = lanes  # type: ignore[attr-defined]
    scope, kind = scope_of(item), kind_of(item)
    lanes.hold(scope, kind)
    yield
    # keep the lane while the next test is of the same scope (its module's fixtures
    # live on); else let go, once this test's teardown (and its module's) is done
    if nextitem is None or scope_of(nextitem) != scope or kind_of(nextitem) != kind:
        lanes.release()


def worker_index() -> int:
    """0 for the first xdist worker (gw0) or without xdist, 1 for gw1, ..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    try:
        return int(name.removeprefix("gw"))
    except ValueError:
        return 0
