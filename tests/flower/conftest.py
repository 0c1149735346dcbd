"""What the tests/flower modules share: one cluster run (tests/flower/cluster.py) and the
four Flowers of who may act (tests/flower/operator_flowers.py), each built on first use
and kept for the package (the modules that use one are in one xdist group)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.flower.cluster import Cluster, running_cluster
from tests.flower.operator_flowers import Flowers, running_flowers


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
            redis_url: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory, pg_dsn, redis_url) as c:
        yield c


@pytest.fixture(scope="package")
def flowers(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
            redis_url: str) -> Iterator[Flowers]:
    with running_flowers(tmp_path_factory, pg_dsn, redis_url) as found:
        yield found
