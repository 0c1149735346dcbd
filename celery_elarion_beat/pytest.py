"""A pytest plugin to test your own beat schedule: fixtures only.

Installed with the library, pytest loads it by itself (entry point ``pytest11``
``celery_elarion_beat.pytest``, named after the module so that ``-p`` finds the same
plugin); ``pytest -p celery_elarion_beat.pytest`` loads it where plugin autoloading
is off. Loading it imports no Celery app, touches no broker or
database, and changes nothing: every fixture is opt-in (none is autouse).

* ``beat_clock``: a :class:`~celery_elarion_beat.testing.BeatClock` (aware UTC);
* ``claims_store``: a :class:`~celery_elarion_beat.MemoryClaimStore` of its own
  namespace on that clock, emptied after the test;
* ``beat_cluster``: ``beat_cluster(n=3, app=None) -> Cluster``, N beat nodes of
  *app* (default: Celery's ``celery_app`` fixture, from pytest-celery) over that
  store and clock; every cluster is closed after the test;
* ``simulate``: :func:`celery_elarion_beat.testing.simulate`, every occurrence a
  cluster would send from an app's schedule between two instants.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .store.memory import MemoryClaimStore
    from .testing.beat_clock import BeatClock
    from .testing.cluster import Cluster, SimulatedOccurrence

__all__ = ["beat_clock", "beat_cluster", "claims_store", "simulate"]


@pytest.fixture
def beat_clock() -> BeatClock:
    """A fake clock for beat and its schedules; ``.set(...)``, ``.advance(...)``."""
    from .testing.beat_clock import BeatClock

    return BeatClock()


@pytest.fixture
def claims_store(beat_clock: BeatClock) -> Iterator[MemoryClaimStore]:
    """An in-memory claims store with a namespace of its own, emptied after the test."""
    from .store.memory import MemoryClaimStore

    name = f"pytest-{uuid.uuid4().hex}"
    yield MemoryClaimStore(name, clock=beat_clock)
    MemoryClaimStore.reset(name)


@pytest.fixture
def beat_cluster(request: pytest.FixtureRequest, beat_clock: BeatClock,
                 claims_store: MemoryClaimStore) -> Iterator[Callable[..., Cluster]]:
    """``beat_cluster(n=3, app=None, deliver=False, names=None)``: a cluster of *n*
    beat nodes of *app* (default the ``celery_app`` fixture) over ``claims_store``
    and ``beat_clock``, created at the clock's time and closed after the test."""
    from .testing.cluster import Cluster

    clusters: list[Cluster] = []

    def make(n: int = 3, app: Any = None, *, deliver: bool = False,
             names: list[str] | None = None) -> Cluster:
        if app is None:
            try:
                app = request.getfixturevalue("celery_app")
            except pytest.FixtureLookupError:
                raise pytest.UsageError(
                    "beat_cluster() without an app uses the celery_app fixture, which "
                    "pytest-celery provides: pip install pytest-celery, or pass your app: "
                    "beat_cluster(3, app=my_app)") from None
        cluster = Cluster(app, n, beat_clock, namespace=claims_store.name, deliver=deliver,
                          names=names)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def simulate() -> Callable[..., list[SimulatedOccurrence]]:
    """:func:`celery_elarion_beat.testing.simulate`, as a fixture."""
    from .testing.simulation import simulate as run

    return run
