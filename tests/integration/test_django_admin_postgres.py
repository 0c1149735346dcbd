"""The Django admin of the database entries (celery_elarion_beat.contrib.django), driven
through Django's test client against the real PostgreSQL: add, change, a stale form
refused with the conflict shown (nothing written), enable/disable, remove with a reason,
bulk actions as one change, the next occurrences in the change view, the admin user
and the reason in the revision history, the nodes notified at commit, a view-only user,
and a misconfiguration explained."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.config.live_entries import EntryDefinition
from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.store.entry_records import EntryChange
from tests.integration.django_project import Project

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("django")]

UTC = timezone.utc
#: the run's cluster (tests/conftest.py sets ELARION_BEAT_CLUSTER for every app)
CLUSTER = DEFAULT_CLUSTER
LIST = "/admin/elarion_beat/databaseentry/"
ADD = LIST + "add/"


def change_url(name: str) -> str:
    return f"{LIST}{name}/change/"


@pytest.fixture
def client(django_project: Project) -> Iterator[Any]:
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="alice").first() \
        or User.objects.create_superuser("alice", "alice@example.com", "pw")
    client = Client()
    client.force_login(user)
    yield client


def form(**fields: Any) -> dict[str, Any]:
    data = {"task": "dj.report", "kind": "crontab", "expression": "0 6 * * *",
            "tz": "Europe/Berlin", "args": "[1]", "kwargs": "{}", "options": "{}",
            "enabled": "on", "effective": "", "reason": "a reason"}
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def text(response: Any) -> str:
    return html.unescape(response.content.decode())


def history(django_project: Project, name: str) -> list[Any]:
    return live.entry_history(django_project.app, name, store=django_project.store)


def test_add_change_a_stale_form_and_remove_with_the_admin_user_and_a_reason(
        client: Any, django_project: Project) -> None:
    response = client.post(ADD, form(name="nightly", reason=""))
    assert response.status_code == 400 and "This field is required." in text(response)
    response = client.post(ADD, form(name="nightly", expression="61 6 * * *"))
    assert response.status_code == 400 and "61" in text(response)
    response = client.post(ADD, form(name="nightly", task="other.task"))
    assert response.status_code == 400
    assert "'other.task' is not allowed for database entries" in text(response)
    assert django_project.store.entries_version(CLUSTER) == 0  # nothing written

    response = client.post(ADD, form(name="nightly", options='{"queue": "reports"}',
                                     reason="the new morning report"))
    assert response.status_code == 302 and response["Location"] == change_url("nightly")
    (added,) = history(django_project, "nightly")
    assert (added.action, added.actor, added.reason) == (
        "add", "alice (django admin)", "the new morning report")
    assert added.definition.as_json()["schedule"] == {"crontab": "0 6 * * *",
                                                      "tz": "Europe/Berlin"}
    listing = text(client.get(LIST))
    assert "nightly" in listing and "crontab 0 6 * * * Europe/Berlin" in listing

    # the change view: the next occurrences (06:00 in Berlin), the revisions
    page = text(client.get(change_url("nightly")))
    shown = [datetime.fromisoformat(u.replace("Z", "+00:00"))
             for u in re.findall(r'data-utc="([^"]+)"', page)]
    berlin = ZoneInfo("Europe/Berlin")
    assert len(shown) == 10
    assert all(s.astimezone(berlin).strftime("%H:%M") == "06:00" for s in shown)
    assert shown[0] - datetime.now(UTC) <= timedelta(days=1) and shown == sorted(shown)
    assert "the new morning report" in page and "alice (django admin)" in page

    # bob changes it meanwhile; alice's form (revision 1) is stale: refused, shown
    live.edit_entry(django_project.app, "nightly", schedule={"crontab": "30 6 * * *",
                                                      "tz": "Europe/Berlin"},
                    reason="half past", actor="bob", store=django_project.store)
    response = client.post(change_url("nightly"), form(expression="0 7 * * *",
                                                       revision=added.revision))
    assert response.status_code == 409
    page = text(response)
    assert "changed since you read it (you read revision 1; it is at revision 2, edit by bob: " \
           "'half past'). Nothing was saved" in page
    current = live.get_entry(django_project.app, "nightly", store=django_project.store)
    assert current.schedule == "crontab 30 6 * * * Europe/Berlin" and current.revision == 2

    response = client.post(change_url("nightly"), form(expression="0 7 * * *", revision=2,
                                                       reason="later"))
    assert response.status_code == 302
    response = client.post(change_url("nightly"), form(expression="0 7 * * *", revision=3,
                                                       enabled=None, reason="holiday"))
    assert response.status_code == 302
    actions = [(r.action, r.actor, r.reason) for r in history(django_project, "nightly")]
    assert actions[:2] == [("disable", "alice (django admin)", "holiday"),
                           ("edit", "alice (django admin)", "later")]

    # remove: a reason, and the revision read
    delete = f"{LIST}nightly/delete/"
    assert "reason" in text(client.get(delete))
    assert client.post(delete, {"reason": "", "revision": 4}).status_code == 400
    response = client.post(delete, {"reason": "gone", "revision": 3})
    assert response.status_code == 409 and "Nothing was saved" in text(response)
    response = client.post(delete, {"reason": "not needed any more", "revision": 4})
    assert response.status_code == 302
    assert [(r.action, r.actor, r.reason) for r in history(django_project, "nightly")][0] == (
        "remove", "alice (django admin)", "not needed any more")
    assert change_url("nightly") not in text(client.get(LIST))
    page = text(client.get(f"{LIST}nightly/history/"))
    assert page.count('class="elarion-revision"') == 5 and "half past" in page


def test_a_save_notifies_the_nodes_when_it_commits(client: Any, django_project: Project) -> None:
    with psycopg.connect(django_project.dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{django_project.store.entries_channel}"')
        response = client.post(ADD, form(name="heard", reason="wake up"))
        assert response.status_code == 302
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [CLUSTER]


def test_bulk_disable_is_one_change_with_one_reason(client: Any, django_project: Project) -> None:
    for name in ("a", "b", "c"):
        live.add_entry(django_project.app, name, "dj.report", {"every": 60},
                       store=django_project.store)
    version = django_project.store.entries_version(CLUSTER)
    response = client.post(LIST, {"action": "disable_selected",
                                  "_selected_action": ["a", "b"]})
    assert response.status_code == 200 and "Disable these database entries" in text(response)
    assert django_project.store.entries_version(CLUSTER) == version  # asked, not done
    response = client.post(LIST, {"action": "disable_selected", "_selected_action": ["a", "b"],
                                  "confirm": "yes", "reason": "maintenance",
                                  "revisions": '{"a": 1, "b": 2}'})
    assert response.status_code == 302
    assert django_project.store.entries_version(CLUSTER) == version + 1
    enabled = {e.name: e.definition.enabled
               for e in django_project.store.live_entries(CLUSTER).entries}
    assert enabled == {"a": False, "b": False, "c": True}
    assert history(django_project, "a")[0].reason == "maintenance"
    # with a revision read before a change, the whole action is refused
    live.enable_entry(django_project.app, "a", store=django_project.store)
    client.post(LIST, {"action": "enable_selected", "_selected_action": ["a", "b"],
                       "confirm": "yes", "reason": "back", "revisions": '{"a": 4, "b": 4}'})
    assert {e.name: e.definition.enabled for e in django_project.store.live_entries(
        CLUSTER).entries} == {"a": True, "b": False, "c": True}


def test_the_admin_lists_its_own_clusters_entries_only(client: Any,
                                                        django_project: Project) -> None:
    live.add_entry(django_project.app, "mine", "dj.report", {"every": 60},
                   store=django_project.store)
    django_project.store.write_entries("another-app", [EntryChange(
        "add", "theirs", EntryDefinition.of("dj.report", {"every": 60}))], "someone")
    listing = text(client.get(LIST))
    assert "mine" in listing and "theirs" not in listing
    assert client.get(change_url("theirs")).status_code == 302  # no such entry here


def test_a_view_only_user_sees_the_entry_and_cannot_change_it(django_project: Project) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    live.add_entry(django_project.app, "watched", "dj.report", {"every": 60},
                   store=django_project.store)
    user = User.objects.filter(username="viewer").first() \
        or User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.set([Permission.objects.get(codename="view_databaseentry")])
    viewer = Client()
    viewer.force_login(user)
    page = viewer.get(change_url("watched"))
    assert page.status_code == 200 and 'value="Save"' not in text(page)
    assert viewer.post(change_url("watched"), form(revision=1)).status_code == 403
    assert viewer.post(ADD, form(name="x")).status_code == 403
    assert history(django_project, "watched")[0].action == "add"


def test_database_entries_off_is_explained(client: Any, django_project: Project,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(django_project.app.conf, "elarion_beat_db_entries", False)
    response = client.get(LIST)
    assert response.status_code == 503
    assert "set CELERY_ELARION_BEAT_DB_ENTRIES = True" in text(response)


def test_the_change_view_shows_an_edit_still_to_come_from_its_effective_time(
        client: Any, django_project: Project) -> None:
    live.add_entry(django_project.app, "daily", "dj.report", {"crontab": "0 6 * * *",
                                                              "tz": "UTC"},
                   store=django_project.store)
    later = (datetime.now(UTC) + timedelta(days=3)).replace(hour=12, minute=0, second=0,
                                                            microsecond=0)
    response = client.post(change_url("daily"), form(
        expression="0 18 * * *", tz="UTC", revision=1, reason="evenings from then on",
        effective=later.isoformat()))
    assert response.status_code == 302
    page = text(client.get(change_url("daily")))
    rows = re.findall(r'data-utc="([^"]+)"><td>[^<]*</td><td>[^<]*</td>\s*<td>(\d+)</td>', page)
    shown = [(datetime.fromisoformat(u.replace("Z", "+00:00")), int(r)) for u, r in rows]
    assert len(shown) == 10
    assert all((at.hour, rev) == ((6, 1) if at < later else (18, 2)) for at, rev in shown)
    assert {rev for _, rev in shown} == {1, 2}
