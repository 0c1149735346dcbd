"""Acceptance: a real ``celery beat`` of :mod:`tests.acceptance.proj` refuses to run
uncoordinated, and its banner masks the password.

(The cluster scenarios that lived here moved where one run proves them with the
others: a ``kill -9`` of the node holding the interval, to
``tests/acceptance/test_reconcile.py``; a cut of the claims database, with an interval
entry failing closed and resuming, to ``tests/fault/test_database_faults.py``.)
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.testing._harness import ProcessManager
from tests.acceptance.cluster import delete_queue

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

# -- configuration: refuses to run uncoordinated; masks the password --------


def test_beat_without_dsn_exits_and_names_the_setting(workdir, redis_url) -> None:
    run_id = uuid.uuid4().hex[:10]
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_QUEUE": f"elarion-acc-{run_id}"}
    with ProcessManager(workdir, "tests.acceptance.proj", env) as pm:
        beat = pm.beat("beat-no-dsn", scheduler="elarion")
        rc = beat.wait(90)
        output = beat.log()
        assert rc is not None, f"beat without elarion_beat_dsn kept running\n{beat.tail()}"
        assert rc != 0, f"beat without elarion_beat_dsn exited 0\n{beat.tail()}"
        assert "elarion_beat_dsn" in output, f"the error does not name the setting\n{beat.tail()}"
    delete_queue(env)


def test_beat_banner_masks_the_password_and_names_the_node(workdir, pg_dsn, redis_url,
                                                            table_name) -> None:
    run_id = uuid.uuid4().hex[:10]
    secret = "s3cret"
    dsn = make_url(pg_dsn).set(password=secret).render_as_string(hide_password=False)
    node = f"banner-node-{run_id}"
    # settings through the library's environment fallbacks (proj sets no elarion conf)
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_QUEUE": f"elarion-acc-{run_id}",
           "ELARION_BEAT_DSN": dsn, "ELARION_BEAT_NODE": node, "ELARION_BEAT_TABLE": table_name}
    try:
        with ProcessManager(workdir, "tests.acceptance.proj", env) as pm:
            beat = pm.beat("beat-banner", scheduler="elarion")
            # it really claims with that DSN (trust auth ignores the password)
            beat.wait_for_log(r"beat: Sending due task .* won\]", 90)
            assert beat.alive(), beat.tail()
        output = beat.log()
        masked = make_url(dsn).set(drivername="postgresql+psycopg").render_as_string(
            hide_password=True)
        assert ":***@" in masked
        assert f". claims -> {masked} (table {table_name})" in output, beat.tail(60)
        assert f". node -> {node}" in output, beat.tail(60)
        assert f"as node {node}" in output, beat.tail(60)
        assert secret not in output, f"the password leaked into the output\n{beat.tail(60)}"
        assert beat.returncode is not None
    finally:
        delete_queue(env)
