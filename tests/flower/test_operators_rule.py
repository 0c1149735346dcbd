"""Who may act, as a rule (no services): :func:`celery_elarion_beat.flower.operators.refusal`
for every kind of caller, how a caller is read from Flower's request handler (basic
auth, OAuth, none; ``FLOWER_UNAUTHENTICATED_API`` and an ``unauthenticated_api``
option), and that every write endpoint of the page is checked."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
import tornado.web

from celery_elarion_beat.flower.controls import ActionHandler
from celery_elarion_beat.flower.operators import (
    EDIT_OFF,
    NO_AUTHENTICATION,
    NO_DB_ENTRIES,
    NOBODY_MATCHES,
    READ_ONLY,
    Caller,
    caller_of,
    edit_refusal,
    not_an_operator,
    refusal,
    unauthenticated_api,
)

ANONYMOUS = Caller("10.0.0.7")
OPENED = Caller("10.0.0.7", open_api=True)


def basic_user(name: str) -> Caller:
    return Caller("10.0.0.7", user=name, authenticated=True)


def oauth_user(email: str) -> Caller:
    return Caller("10.0.0.7", email=email, authenticated=True)


@pytest.mark.parametrize(("caller", "operators", "actions", "refused"), [
    # elarion_beat_flower_actions = False: nobody, whoever they are
    (basic_user("ops-alice"), (), False, READ_ONLY),
    (OPENED, (), False, READ_ONLY),
    # no authentication: nobody, unless FLOWER_UNAUTHENTICATED_API, and then no list
    (ANONYMOUS, (), True, NO_AUTHENTICATION),
    (ANONYMOUS, ("ops-*",), True, NO_AUTHENTICATION),
    (OPENED, (), True, None),
    (OPENED, ("ops-*",), True, NOBODY_MATCHES),
    (OPENED, ("*",), True, NOBODY_MATCHES),
    # authentication, no list: everyone Flower lets in
    (basic_user("bob"), (), True, None),
    (oauth_user("eve@other.org"), (), True, None),
    # basic-auth user names match exactly
    (basic_user("ops-alice"), ("carol", "ops-*"), True, None),
    (basic_user("carol"), ("carol", "ops-*"), True, None),
    (basic_user("Ops-Alice"), ("ops-*",), True, "Ops-Alice"),
    (basic_user("bob"), ("ops-*",), True, "bob"),
    (basic_user("ops"), ("ops-*",), True, "ops"),
    # OAuth e-mail addresses match whatever their case, on either side
    (oauth_user("Alice@Example.COM"), ("*@example.com",), True, None),
    (oauth_user("alice@example.com"), ("ALICE@EXAMPLE.COM",), True, None),
    (oauth_user("eve@other.org"), ("*@example.com",), True, "eve@other.org"),
    (oauth_user("eve@example.com.evil.org"), ("*@example.com",), True,
     "eve@example.com.evil.org"),
    # both: either name may match
    (Caller("h", user="bob", email="alice@example.com", authenticated=True),
     ("*@example.com",), True, None),
])
def test_the_rule(caller: Caller, operators: tuple[str, ...], actions: bool,
                  refused: str | None) -> None:
    found = refusal(caller, operators, actions)
    if refused is None or refused in (READ_ONLY, NO_AUTHENTICATION, NOBODY_MATCHES):
        assert found == refused
    else:  # a user who is no operator: named, with the setting that would let them act
        assert found == not_an_operator(caller)
        assert found.startswith(f"{refused} may watch this page but not act")
        assert "elarion_beat_flower_operators" in found and "ops-*" not in found


@pytest.mark.parametrize(("caller", "operators", "actions", "edit", "entries", "refused"), [
    # off: nobody, whoever they are, named first
    (basic_user("ops-alice"), (), True, False, True, EDIT_OFF),
    (OPENED, (), False, False, False, EDIT_OFF),
    (basic_user("ops-alice"), (), True, True, False, NO_DB_ENTRIES),
    # on: the buttons' rule
    (basic_user("ops-alice"), ("ops-*",), True, True, True, None),
    (basic_user("bob"), ("ops-*",), True, True, True, not_an_operator(basic_user("bob"))),
    (ANONYMOUS, (), True, True, True, NO_AUTHENTICATION),
    (OPENED, (), True, True, True, None),
    (basic_user("ops-alice"), (), False, True, True, READ_ONLY),
])
def test_the_edit_forms_rule(caller: Caller, operators: tuple[str, ...], actions: bool,
                             edit: bool, entries: bool, refused: str | None) -> None:
    assert edit_refusal(caller, operators, actions, edit, entries) == refused
    assert "elarion_beat_flower_edit" in EDIT_OFF and "ELARION_BEAT_FLOWER_EDIT" in EDIT_OFF
    assert "elarion_beat_db_entries" in NO_DB_ENTRIES


def test_the_refusals_name_the_fix() -> None:
    assert "FLOWER_UNAUTHENTICATED_API=true" in NO_AUTHENTICATION
    assert "--basic_auth" in NO_AUTHENTICATION and "--auth" in NO_AUTHENTICATION
    assert "elarion_beat_flower_operators" in NOBODY_MATCHES and "--basic_auth" in NOBODY_MATCHES
    assert "ELARION_BEAT_FLOWER_OPERATORS" in not_an_operator(basic_user("bob"))


def _handler(header: str | None = None, current_user: Any = True, **options: Any) -> Any:
    return SimpleNamespace(
        application=SimpleNamespace(options=SimpleNamespace(
            **{"basic_auth": [], "auth": "", **options})),
        request=SimpleNamespace(headers={"Authorization": header} if header else {},
                                remote_ip="10.0.0.7"),
        current_user=current_user)


def test_the_caller_of_a_flower_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWER_UNAUTHENTICATED_API", raising=False)
    header = "Basic " + base64.b64encode(b"bob:pa:ss").decode()
    assert caller_of(_handler(header, basic_auth=["bob:pa:ss"])) == Caller(
        "10.0.0.7", user="bob", authenticated=True)
    # OAuth: Flower's get_current_user answers the e-mail address it authenticated
    oauth = caller_of(_handler(current_user="carol@example.com", auth=r".*@example\.com"))
    assert oauth == Caller("10.0.0.7", email="carol@example.com", authenticated=True)
    assert oauth.actor == "carol@example.com (flower)"
    assert caller_of(_handler()) == ANONYMOUS and ANONYMOUS.actor == \
        "anonymous@10.0.0.7 (flower)"


@pytest.mark.parametrize(("env", "opened"), [
    (None, False), ("true", True), ("1", True), ("yes", True), ("false", False),
    ("0", False), ("", False), ("maybe", False)])
def test_flower_unauthenticated_api_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, env: str | None, opened: bool) -> None:
    from flower.views import BaseHandler

    if env is None:
        monkeypatch.delenv("FLOWER_UNAUTHENTICATED_API", raising=False)
    else:
        monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", env)
    assert unauthenticated_api(_handler()) is opened  # a Flower without the property

    class Handler(BaseHandler):  # type: ignore[misc]  # Flower 2.x: the property
        def __init__(self) -> None:
            self.application = _handler().application

    assert unauthenticated_api(Handler()) is opened


def test_an_unauthenticated_api_option_opens_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWER_UNAUTHENTICATED_API", raising=False)
    assert unauthenticated_api(_handler(unauthenticated_api=True)) is True
    assert unauthenticated_api(_handler(unauthenticated_api=False)) is False
    assert caller_of(_handler(unauthenticated_api=True)).open_api is True


def test_every_write_endpoint_of_the_page_is_checked() -> None:
    from flower import urls

    import celery_elarion_beat.flower  # noqa: F401  (adds the handlers)

    writers = {}
    for spec in urls.handlers:
        if not str(getattr(spec, "name", "") or "").startswith("elarion"):
            continue
        cls = spec.handler_class
        if any(getattr(cls, method) is not getattr(tornado.web.RequestHandler, method)
               for method in ("post", "put", "patch", "delete")):
            writers[spec.name] = cls
    assert set(writers) >= {"elarion-pause", "elarion-resume", "elarion-trigger"} | {
        f"elarion-schedule-{action}" for action in ("add", "edit", "override", "enable",
                                                    "disable", "remove")}, writers
    assert all(issubclass(cls, ActionHandler) for cls in writers.values()), writers
