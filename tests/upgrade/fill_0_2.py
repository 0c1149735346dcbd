"""Run by the release before clusters (:mod:`.old_release`): makes its tables and
writes a row of each kind in them, as a cluster of 0.2 would have.

``python fill_0_2.py DSN TABLE LAYOUT``: claims of ``nightly`` (two slots) and of
``poll`` (a window), a published report, a heartbeat of ``old-node``, a pause of
``report`` (and its audit row), a one-off with the key ``invoice-42``.
"""

import sys
import uuid
from datetime import datetime, timedelta, timezone

from celery_elarion_beat.store.base import NodeState
from celery_elarion_beat.store.oneoff_rows import NewOneOff

import celery_elarion_beat
from celery_elarion_beat import ClaimRequest, PublishReport, Settings, open_store

SLOT = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)

dsn, table, layout = sys.argv[1:4]
assert "cluster" not in celery_elarion_beat.Settings.__dataclass_fields__, \
    f"not the release before clusters: {celery_elarion_beat.__file__}"
store = open_store(Settings.from_mapping({"elarion_beat_dsn": dsn, "elarion_beat_table": table,
                                          "elarion_beat_claims_layout": layout}))
store.ensure_schema()
won = store.claim("old-node", [ClaimRequest.for_slot("nightly", SLOT, "t-1"),
                               ClaimRequest.for_slot("nightly", SLOT + timedelta(days=1), "t-2"),
                               ClaimRequest.for_window("poll", timedelta(hours=1), "t-3")])
assert all(r.won for r in won), won
store.report([PublishReport("nightly", SLOT, won[0].token or "")])
store.heartbeat(NodeState(node="old-node", boot_id=str(uuid.uuid4()), version="0.2",
                          fingerprint="f-old", entries={"nightly": "d"}))
store.pause("report", "ops (cli)", "before the upgrade")
store.add_one_off(NewOneOff(id=str(uuid.uuid4()), task="proj.tasks.bill",
                            content_type="application/json", content_encoding="utf-8",
                            body=b"[[], {}]", options={}, delay=3600.0, key="invoice-42"))
store.close()
print("filled by", celery_elarion_beat.__file__)
