"""Fault proof: the database down during an edit of a database entry (live schedules).

Two real beats of :mod:`tests.acceptance.proj_live` reach PostgreSQL through a TCP proxy
the test cuts; the worker, the test and the CLI of the first attempt go through the
proxy or around it as said. While it is cut:

* ``schedule edit`` through the proxy exits 1 naming the unreachable database, and
  writes nothing;
* the edit written around the proxy (the database is up, the nodes cannot reach it)
  is put in place by every node once the proxy is restored: from then on each slot
  runs once, under the new revision (the slots of the outage are failed closed, none
  runs twice, none under a revision that does not govern it).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import urlparse

import pytest

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.store.entry_records import governing
from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance.cluster import summary, utc
from tests.acceptance.live import LiveCluster, check
from tests.acceptance.proj_live import TASK
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.postgres]
# two real beats cut from their database by a proxy, bounds of a few seconds
pytestmark += [pytest.mark.heavy]


@pytest.fixture
def proxied(tmp_path, pg_dsn: str, redis_url: str) -> Iterator[tuple[LiveCluster, TcpProxy]]:
    url = urlparse(pg_dsn)
    proxy = TcpProxy(url.hostname or "127.0.0.1", url.port or 5432).start()
    through = pg_dsn.replace(f"{url.hostname}:{url.port}", f"127.0.0.1:{proxy.port}")
    c = LiveCluster(tmp_path, pg_dsn=pg_dsn, broker_url=redis_url, beats=2,
                    beat_claims_dsn=through)
    c.through = through  # type: ignore[attr-defined]
    try:
        c.start()
        yield c, proxy
    except BaseException:
        print(c.tails())
        raise
    finally:
        proxy.restore()
        c.close()
        proxy.stop()


def test_an_edit_while_the_nodes_cannot_reach_the_database(proxied) -> None:
    c, proxy = proxied
    name = "tick"
    live.add_entry(c.app, name, TASK, {"cron": "*/2 * * * * *"}, args=[1],
                   kwargs={"entry": name})
    start = c.history(name)[0].effective_at
    wait_until(lambda: len(c.runs(name)) >= 2, 15, interval=0.2,
               message=lambda: f"runs of {name}\n{c.tails()}")
    proxy.cut()
    refused = c.cli("edit", name, "--args-json", "[9]",
                    env={"ELARION_ACC_CLAIMS_DSN": c.through})  # type: ignore[attr-defined]
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "unreachable" in refused.stderr or "did not answer" in refused.stderr
    assert [r.revision for r in c.history(name)] == [1]  # nothing written
    sleep_until(math.floor(time.time()) + 1.5)
    live.edit_entry(c.app, name, schedule={"cron": "*/3 * * * * *"}, args=[2],
                    reason="while the nodes are cut off")
    edited = c.history(name)[-1].effective_at
    time.sleep(5)
    proxy.restore()
    restored = time.time()
    time.sleep(10)
    end = utc(time.time() - 1)
    c.drain()
    claims = c.claims(name)
    history = c.history(name)
    runs = Counter(r.task_id for r in c.runs(name))
    wrong = [f"{x.occurrence:%H:%M:%S} under {x.revision}" for x in claims
             if governing(history, x.occurrence) is None
             or governing(history, x.occurrence).revision != x.revision]  # type: ignore[union-attr]
    settled = check(c, name, utc(restored + 3), end)  # back, and every node heard of it
    summary(c.workdir, "database down during an edit",
            f"edit at {edited:%H:%M:%S.%f} while cut; restored {utc(restored):%H:%M:%S}\n"
            f"claims {[(f'{x.occurrence:%S}', x.revision) for x in claims]}\n"
            f"after: {settled.line()}")
    assert wrong == []  # no occurrence under a revision that does not govern it
    assert all(n == 1 for n in runs.values())  # none ran twice
    assert settled.problems == [] and len(settled.expected) >= 2
    assert all(x.occurrence.second % 3 == 0 for x in claims if x.occurrence >= edited)
    assert start < edited - timedelta(seconds=2)
