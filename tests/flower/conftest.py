"""One cluster run for the whole tests/flower package (see tests/flower/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.flower.cluster import Cluster, running_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
            redis_url: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory, pg_dsn, redis_url) as c:
        yield c
