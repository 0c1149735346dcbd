"""The Schedule card's endpoints (``elarion_beat_flower_edit``), in process: a Flower
application served from a thread (real Tornado, real HTTP client) on the real PostgreSQL,
one claims table per test. Off: 403 naming the setting; who may edit (no
authentication, ``FLOWER_UNAUTHENTICATED_API``, a viewer, an operator); the XSRF check;
a reason required; bad input named by its field; a stale revision refused with 409;
a good change written as the Flower user; the preview across an effective time. After
every refused request the revisions table says nothing was written."""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.flower.operators import (
    EDIT_OFF,
    NO_AUTHENTICATION,
    NO_DB_ENTRIES,
    Caller,
    not_an_operator,
)
from celery_elarion_beat.store.registry import close_app_stores, open_store
from celery_elarion_beat.testing._harness import claims_tables, drop_tables
from tests.flower.support import basic
from tests.flower.test_controls_inprocess import _call, serve_flower
from tests.flower.test_operators_inprocess import FlowerOptions

pytestmark = [pytest.mark.postgres]

OPERATOR, VIEWER = ("ops", "pw-ops"), ("viewer", "pw-viewer")
ACTIONS = ("add", "edit", "override", "enable", "disable", "remove")
TASK = "proj.report"
BERLIN = ZoneInfo("Europe/Berlin")


@dataclass
class Edit:
    """A Flower with the edit form, its app and what the test reads back."""

    base: str
    app: Celery

    def revisions(self) -> list[Any]:
        """Every revision of every entry (the audit), from the database."""
        return live.entry_history(self.app, None, 1000)

    def client(self, auth: tuple[str, str] | None = OPERATOR) -> Client:
        return Client(self.base, basic(*auth) if auth else None)


class Client:
    """A browser's session: the page's XSRF cookie and token, and the credentials."""

    def __init__(self, base: str, auth: str | None) -> None:
        self.base, self.auth = base, auth
        status, page, headers = _call(base + "/elarion", headers=self.headers())
        assert status == 200, page[:300]
        self.page = page
        cookie = [c for c in headers.get_all("Set-Cookie") or () if c.startswith("_xsrf=")]
        self.token = cookie[0].split(";")[0].split("=", 1)[1]
        assert re.search(r'data-xsrf="([^"]+)"', page)

    def headers(self, token: str | None = None) -> dict[str, str]:
        out = {"Authorization": self.auth} if self.auth else {}
        if token:
            out["Cookie"] = f"_xsrf={token}"
        return out

    def get(self, path: str, **query: Any) -> tuple[int, Any]:
        url = f"{self.base}/elarion/api/schedule{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        status, text, _ = _call(url, headers=self.headers())
        return status, json.loads(text)

    def post(self, action: str, xsrf: str | None = "page", **fields: Any) -> tuple[int, Any]:
        sent = {k: str(v) for k, v in fields.items()}
        if xsrf is not None:
            sent["_xsrf"] = self.token if xsrf == "page" else xsrf
        status, text, _ = _call(f"{self.base}/elarion/api/schedule/{action}", sent,
                                self.headers(self.token))
        return status, json.loads(text)


def make_app(pg_dsn: str, table: str, **conf: Any) -> Celery:
    app = Celery(f"sched_{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(broker_url="memory://", elarion_beat_dsn=pg_dsn, elarion_beat_table=table,
                    elarion_beat_db_entries=True, elarion_beat_db_entry_tasks="proj.*",
                    elarion_beat_flower_edit=True, elarion_beat_flower_operators=["ops"],
                    timezone="Europe/Berlin", beat_schedule={
                        "nightly": {"task": "proj.nightly", "schedule": crontab(0, 3)},
                        "custom": {"task": "proj.custom", "schedule": 60.0, "args": [1]}})
    app.conf.update(conf)
    store = open_store(Settings.from_app(app))
    try:
        store.create_schema()  # as `elarion-beat init-db` (or the first beat) would
    finally:
        store.close()
    return app


@contextmanager
def flower_edit(pg_dsn: str, auth: bool = True, **conf: Any) -> Iterator[Edit]:
    """A Flower (basic auth: an operator and a viewer, unless not *auth*) of an app with
    the edit form on (and *conf*), on a claims table of its own."""
    from flower.options import default_options

    table = f"fe_{uuid.uuid4().hex[:10]}_claims"
    app = make_app(pg_dsn, table, **conf)
    options = FlowerOptions(default_options, basic_auth=[
        f"{u}:{p}" for u, p in (OPERATOR, VIEWER)] if auth else [], auth="")
    made: list[Any] = []
    try:
        with serve_flower(app, made, options) as base:
            yield Edit(base, app)
    finally:
        held = getattr(made[0], "_elarion_panel", None) if made else None
        if held is not None and held._store is not None:
            held._store.close()  # the Flower's own pool
        close_app_stores()
        app.close()
        drop_tables(pg_dsn, *claims_tables(table))


def every_write(client: Client, name: str = "x", revision: int = 1) -> list[tuple[int, Any]]:
    """One request to each write endpoint, each well formed."""
    fields = {"name": name, "revision": revision, "reason": "r", "task": TASK,
              "kind": "cron", "expr": "0 0 6 * * *"}
    return [client.post(action, **fields) for action in ACTIONS]


def refused_with(answers: list[tuple[int, Any]], reason: str) -> None:
    assert [status for status, _ in answers] == [403] * len(answers), answers
    assert {answer["error"] for _, answer in answers} == {reason}, answers


# -- off, and who may edit ------------------------------------------------------------


def test_off_the_page_has_no_form_and_every_endpoint_answers_403(pg_dsn: str) -> None:
    with flower_edit(pg_dsn, elarion_beat_flower_edit=False) as edit:
        operator = edit.client()
        assert 'id="elarion-schedule"' not in operator.page
        assert 'id="elarion-controls"' in operator.page  # the rest of the page is there
        refused_with(every_write(operator), EDIT_OFF)
        refused_with([operator.get(""), operator.get("/history", name="x"),
                      operator.get("/preview", action="add", name="x", task=TASK,
                                   kind="every", every="30")], EDIT_OFF)
        assert "elarion_beat_flower_edit" in EDIT_OFF
        assert edit.revisions() == []
    with flower_edit(pg_dsn, elarion_beat_db_entries=False) as edit:
        operator = edit.client()
        assert 'id="elarion-schedule"' not in operator.page
        refused_with(every_write(operator), NO_DB_ENTRIES)
        refused_with([operator.get("")], NO_DB_ENTRIES)
        assert "elarion_beat_db_entries" in NO_DB_ENTRIES


def test_without_authentication_nobody_edits_unless_flower_opens_its_api(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", "false")
    with flower_edit(pg_dsn, auth=False, elarion_beat_flower_operators=[]) as edit:
        anonymous = edit.client(None)
        assert 'id="elarion-schedule"' in anonymous.page
        refused_with(every_write(anonymous), NO_AUTHENTICATION)
        status, shown = anonymous.get("")
        assert status == 200 and (shown["edit"], shown["edit_reason"]) == (
            False, NO_AUTHENTICATION), shown
        assert edit.revisions() == []
        monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", "true")
        status, answer = anonymous.post("add", name="opened", reason="on a private network",
                                        task=TASK, kind="every", every="30")
        assert status == 200, answer
        assert [(r.name, r.actor) for r in edit.revisions()] == [
            ("opened", "anonymous@127.0.0.1 (flower)")]


def test_a_viewer_reads_the_entries_without_arguments_and_may_not_edit(pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        live.add_entry(edit.app, "report", TASK, {"cron": "0 0 6 * * *"}, args=["s3cret"],
                       reason="seed", actor="test")
        viewer, operator = edit.client(VIEWER), edit.client()
        before = edit.revisions()
        refused_with(every_write(viewer, "report", before[0].revision),
                     not_an_operator(Caller("127.0.0.1", user="viewer", authenticated=True)))
        assert edit.revisions() == before, "a refused request wrote a revision"
        status, shown = viewer.get("")
        assert status == 200 and shown["edit"] is False, shown
        assert shown["edit_reason"].startswith("viewer may watch this page but not act")
        assert "s3cret" not in json.dumps(shown) and all(
            "definition" not in e for e in shown["entries"]), shown
        status, history = viewer.get("/history", name="report")
        assert status == 200 and history["revisions"][0]["actor"] == "test"
        assert "s3cret" not in json.dumps(history)
        status, answer = viewer.get("/preview", action="edit", name="report",
                                    revision=before[0].revision, kind="every", every="30")
        assert status == 403, answer

        status, shown = operator.get("")
        assert status == 200 and (shown["edit"], shown["caller"]) == (True, "ops (flower)")
        entries = {e["name"]: e for e in shown["entries"]}
        assert entries["report"]["definition"]["args"] == ["s3cret"]
        assert entries["report"]["revision"] == before[0].revision
        assert (entries["nightly"]["source"], entries["nightly"]["overridable"]) == (
            "code", True)
        assert entries["nightly"]["definition"]["schedule"] == {"crontab": "0 3 * * *"}
        assert shown["allowed_tasks"] == ["proj.*"]


def test_a_write_without_the_pages_xsrf_token_is_refused(pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        operator = edit.client()
        fields = {"name": "x", "reason": "r", "task": TASK, "kind": "every", "every": "30"}
        for xsrf in (None, "forged-token"):
            status, answer = operator.post("add", xsrf=xsrf, **fields)
            assert status == 403 and "xsrf" in answer["error"].lower(), answer
        assert edit.revisions() == []
        assert operator.post("add", **fields)[0] == 200  # the same with the page's token


# -- bad input, conflicts, good changes --------------------------------------------------


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"reason": ""}, "reason", "say why"),
    ({"reason": "   "}, "reason", "say why"),
    ({"reason": "x" * 501}, "reason", "under 500"),
    ({"name": ""}, "name", "missing"),
    ({"task": "other.task"}, "task", "elarion_beat_db_entry_tasks"),
    ({"expr": "0 6 * * *"}, "expr", "six fields"),
    ({"tz": "Mars/Olympus"}, "tz", "IANA"),
    ({"kind": "every", "every": "soon"}, "every", "number"),
    ({"kind": "every", "every": "-5"}, "every", "more than 0"),
    ({"kind": "weekly"}, "kind", "cron, crontab, every, solar"),
    ({"args": "[1,"}, "args", "not JSON"),
    ({"kwargs": "[1]"}, "kwargs", "object"),
    ({"options": '{"overlap": "sometimes"}'}, "options", "overlap"),
    ({"effective": "tomorrow"}, "effective", "ISO"),
    ({"effective": "2030-01-01T06:00:00"}, "effective", "offset"),
    ({"effective": "2001-01-01T06:00:00Z"}, "effective", "before the database clock"),
    ({"enabled": "maybe"}, "enabled", "true or false"),
])
def test_bad_input_is_400_naming_the_field_and_nothing_is_written(
        pg_dsn: str, fields: dict[str, str], field: str, words: str) -> None:
    good = {"name": "report", "reason": "morning numbers", "task": TASK, "kind": "cron",
            "expr": "0 0 6 * * *", "tz": "Europe/Berlin", "args": "[]", "kwargs": "{}",
            "options": "{}", "enabled": "1"}
    with flower_edit(pg_dsn) as edit:
        operator = edit.client()
        status, answer = operator.post("add", **{**good, **fields})
        assert (status, answer.get("field")) == (400, field), answer
        assert words in answer["error"], answer
        assert edit.revisions() == []
        if field != "reason":  # the preview names the same field
            status, answer = operator.get("/preview", action="add", **{**good, **fields})
            assert (status, answer.get("field")) == (400, field), answer


def test_a_change_of_an_entry_needs_the_revision_it_was_read_at(pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        live.add_entry(edit.app, "report", TASK, {"every": 60}, reason="seed", actor="test")
        operator = edit.client()
        for action in ("edit", "enable", "disable", "remove"):
            status, answer = operator.post(action, name="report", reason="r")
            assert (status, answer["field"]) == (400, "revision"), answer
            assert "revision the entry had when the form was loaded" in answer["error"]
        assert len(edit.revisions()) == 1


def test_a_stale_revision_is_refused_with_409_and_nothing_is_written(pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        live.add_entry(edit.app, "report", TASK, {"cron": "0 0 6 * * *"}, reason="seed",
                       actor="test")
        operator = edit.client()
        status, shown = operator.get("")
        loaded = {e["name"]: e for e in shown["entries"]}["report"]["revision"]
        # someone else edits it between the form's load and its save
        other = live.edit_entry(edit.app, "report", schedule={"cron": "0 30 6 * * *"},
                                reason="later", actor="alice@host (cli)")
        before = edit.revisions()
        for action, extra in (("edit", {"kind": "cron", "expr": "0 0 7 * * *"}),
                              ("disable", {}), ("enable", {}), ("remove", {})):
            status, answer = operator.post(action, name="report", revision=loaded,
                                           reason="mine", **extra)
            assert status == 409, (action, answer)
            assert (answer["conflict"], answer["current_revision"]) == (
                "revision", other.revision), answer
            assert answer["entry"]["schedule"] == {"cron": "0 30 6 * * *"}
            assert answer["entry"]["actor"] == "alice@host (cli)"
            assert f"revision {other.revision}" in answer["error"], answer
        status, answer = operator.get("/preview", action="edit", name="report",
                                      revision=loaded, kind="every", every="30")
        assert (status, answer["current_revision"]) == (409, other.revision), answer
        assert edit.revisions() == before, "a stale change wrote a revision"
        # a name taken: a conflict too
        status, answer = operator.post("add", name="report", reason="again", task=TASK,
                                       kind="every", every="30")
        assert (status, answer["conflict"]) == (409, "name"), answer
        status, answer = operator.post("add", name="nightly", reason="taken by code",
                                       task=TASK, kind="every", every="30")
        assert (status, answer["conflict"], answer["current_revision"]) == (
            409, "name", None), answer
        assert edit.revisions() == before


def test_good_changes_bump_the_revision_and_record_the_flower_user(pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        operator = edit.client()
        status, added = operator.post("add", name="report", reason="morning numbers",
                                      task=TASK, kind="cron", expr="0 0 6 * * *",
                                      tz="Europe/Berlin", args='["eu"]', kwargs='{"days": 7}')
        assert status == 200 and added["ok"], added
        first = added["entry"]["revision"]
        assert added["entry"]["args"] == ["eu"] and added["entry"]["actor"] == "ops (flower)"
        status, edited = operator.post("edit", name="report", revision=first,
                                       reason="half an hour later", task=TASK, kind="cron",
                                       expr="0 30 6 * * *", tz="Europe/Berlin",
                                       args='["eu"]', kwargs='{"days": 7}', options="")
        assert status == 200, edited
        assert edited["entry"]["revision"] == first + 1
        assert edited["message"].startswith("report: edited by ops (flower): revision")
        # only the fields sent change (a script may send a few)
        status, partial = operator.post("edit", name="report", revision=first + 1,
                                        reason="only its kwargs", kwargs='{"days": 1}')
        assert status == 200 and partial["entry"]["schedule"] == {
            "cron": "0 30 6 * * *", "tz": "Europe/Berlin"} and partial["entry"]["kwargs"] == {
            "days": 1}, partial
        revision = partial["entry"]["revision"]
        status, same = operator.post("edit", name="report", revision=revision,
                                     reason="nothing", kwargs='{"days": 1}')
        assert (status, same["unchanged"], same["version"]) == (200, True, None), same
        for action in ("disable", "enable"):
            status, answer = operator.post(action, name="report", revision=revision,
                                           reason=f"{action} it")
            assert status == 200 and answer["entry"]["revision"] == revision + 1, answer
            revision += 1
        status, answer = operator.post("override", name="nightly", reason="run at 4",
                                       task="proj.nightly", kind="crontab", expr="0 4 * * *")
        assert status == 200 and answer["entry"]["overrides"] is True, answer
        status, answer = operator.post("remove", name="report", revision=revision,
                                       reason="not needed")
        assert status == 200 and answer["entry"] is None, answer
        assert answer["message"] == "report: removed by ops (flower)"
        history = [(r.name, r.action, r.actor, r.reason) for r in reversed(edit.revisions())]
        assert history == [
            ("report", "add", "ops (flower)", "morning numbers"),
            ("report", "edit", "ops (flower)", "half an hour later"),
            ("report", "edit", "ops (flower)", "only its kwargs"),
            ("report", "disable", "ops (flower)", "disable it"),
            ("report", "enable", "ops (flower)", "enable it"),
            ("nightly", "override", "ops (flower)", "run at 4"),
            ("report", "remove", "ops (flower)", "not needed")]
        status, shown = operator.get("/history", name="report")
        assert [h["action"] for h in shown["revisions"]] == [
            "remove", "enable", "disable", "edit", "edit", "add"], shown


# -- the preview ------------------------------------------------------------------------


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_preview_lists_the_old_definition_before_the_effective_time_and_the_new_after(
        pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        entry = live.add_entry(edit.app, "hourly", TASK, {"cron": "0 0 * * * *"},
                               reason="seed", actor="test")
        operator = edit.client()
        effective = (datetime.now(timezone.utc) + timedelta(hours=3)).replace(
            minute=10, second=0, microsecond=0)
        status, p = operator.get("/preview", action="edit", name="hourly",
                                 revision=entry.revision, kind="cron", expr="0 30 * * * *",
                                 effective=effective.isoformat(), limit=5)
        assert status == 200, p
        assert _utc(p["effective"]) == effective and p["unchanged"] is False
        before = [_utc(o["utc"]) for o in p["before"]["occurrences"]]
        after = [_utc(o["utc"]) for o in p["after"]["occurrences"]]
        assert len(before) in (3, 4) and all(t < effective and t.minute == 0 for t in before)
        assert len(after) == 5 and all(t >= effective and t.minute == 30 for t in after)
        assert after[0] - effective == timedelta(minutes=20)
        assert {o["governs"] for o in p["before"]["occurrences"]} == {
            f"revision {entry.revision}"}
        assert {o["governs"] for o in p["after"]["occurrences"]} == {"the edit"}
        assert p["after"]["more"] is True
        assert edit.revisions()[0].revision == entry.revision  # a preview writes nothing

        # disabled from the effective time: nothing after it
        status, p = operator.get("/preview", action="disable", name="hourly",
                                 revision=entry.revision, effective=effective.isoformat())
        assert status == 200 and p["after"]["occurrences"] == [], p
        assert p["after"]["governs"] == ["nothing runs (disabled)"]
        assert p["before"]["occurrences"]
        # an override of a code entry: the code entry now, the override from its time
        status, p = operator.get("/preview", action="override", name="nightly",
                                 task="proj.nightly", kind="crontab", expr="0 5 * * *",
                                 effective=effective.isoformat(), limit=3)
        assert status == 200, p
        assert {o["governs"] for o in p["before"]["occurrences"]} <= {"the code entry"}
        assert [_utc(o["utc"]).astimezone(BERLIN).hour
                for o in p["after"]["occurrences"]] == [5, 5, 5]


def _spring_forward(after: datetime) -> datetime:
    """The first instant of Europe/Berlin's next summer time after *after*."""
    def offset(at: datetime) -> timedelta | None:
        return at.astimezone(BERLIN).utcoffset()

    at = after.replace(minute=0, second=0, microsecond=0)
    while not (offset(at) == timedelta(hours=1) and
               offset(at + timedelta(hours=1)) == timedelta(hours=2)):
        at += timedelta(hours=1)
    return at + timedelta(hours=1)


def test_the_preview_marks_a_daylight_saving_change_after_the_effective_time(
        pg_dsn: str) -> None:
    with flower_edit(pg_dsn) as edit:
        entry = live.add_entry(edit.app, "early", TASK,
                               {"crontab": "30 1 * * *", "tz": "Europe/Berlin"},
                               reason="seed", actor="test")
        jump = _spring_forward(datetime.now(timezone.utc) + timedelta(days=6))
        effective = (jump - timedelta(days=4)).replace(hour=12, minute=0)
        operator = edit.client()
        status, p = operator.get("/preview", action="edit", name="early",
                                 revision=entry.revision, kind="crontab", expr="30 2 * * *",
                                 tz="Europe/Berlin", effective=effective.isoformat(), limit=8)
        assert status == 200, p
        after = {_utc(o["utc"]).astimezone(BERLIN).date(): o
                 for o in p["after"]["occurrences"]}
        day = jump.astimezone(BERLIN).date()
        assert "02:30 does not exist" in after[day]["dst_mark"], after[day]
        assert after[day]["offset"] == "+02:00" and after[day]["local"].endswith("+02:00")
        assert all(not o["dst_mark"] for d, o in after.items() if d < day), after
        # the old definition governs until then; the last of it before the effective time
        last = p["before"]["last"] or p["before"]["occurrences"][-1]
        assert _utc(last["utc"]) < effective and last["local"][11:16] == "01:30", last
        assert (effective - _utc(last["utc"])) < timedelta(days=1)
