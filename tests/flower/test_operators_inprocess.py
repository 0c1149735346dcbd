"""Who may act under OAuth, in process (no services): a Flower application served from a
thread with Flower's ``--auth`` set, whose own ``get_current_user`` reads the signed
``user`` cookie that Flower's OAuth login sets (the e-mail address it authenticated).
A real HTTP client carries that cookie, as a browser would after the login; the
operator and the viewer are told apart by their e-mail against
``elarion_beat_flower_operators``, case-insensitively."""

from __future__ import annotations

import json
from typing import Any

from celery import Celery
from tornado.web import create_signed_value

from celery_elarion_beat.flower.controls import panel
from celery_elarion_beat.operate import control
from tests.flower.test_controls_inprocess import _call, serve_flower

OPERATOR, VIEWER = "alice@example.com", "eve@other.org"


class FlowerOptions:
    """Flower's options with some of them changed (Flower reads them as attributes)."""

    def __init__(self, base: Any, **changed: Any) -> None:
        self._base, self._changed = base, changed

    def __getattr__(self, name: str) -> Any:
        if name in self._changed:
            return self._changed[name]
        return getattr(self._base, name)


class OAuthClient:
    """Requests as the user Flower's OAuth login let in: its signed ``user`` cookie, and
    the ``_xsrf`` cookie and token of the page it loaded."""

    def __init__(self, base: str, secret: str, email: str) -> None:
        self.base = base
        self.user = create_signed_value(secret, "user", email).decode()
        status, _, headers = _call(base + "/elarion", headers=self.cookies())
        assert status == 200, f"{email}: GET /elarion answered {status}"
        xsrf = [c for c in headers.get_all("Set-Cookie") or () if c.startswith("_xsrf=")]
        self.token = xsrf[0].split(";")[0].split("=", 1)[1]

    def cookies(self, token: str | None = None) -> dict[str, str]:
        extra = f"; _xsrf={token}" if token else ""
        return {"Cookie": f"user={self.user}{extra}"}

    def controls(self) -> Any:
        status, text, _ = _call(self.base + "/elarion/api/controls", headers=self.cookies())
        assert status == 200, text
        return json.loads(text)

    def post(self, action: str, **fields: str) -> tuple[int, Any]:
        status, text, _ = _call(f"{self.base}/elarion/api/{action}",
                                {**fields, "_xsrf": self.token}, self.cookies(self.token))
        return status, json.loads(text)


def test_oauth_users_are_matched_by_their_email() -> None:
    from flower.options import default_options

    app = Celery("elarion_oauth", set_as_current=False)
    app.conf.update(broker_url="memory://", elarion_beat_dsn="memory://",
                    elarion_beat_flower_operators=["*@EXAMPLE.com"],
                    beat_schedule={"nightly": {"task": "proj.nightly", "schedule": 3600.0}})
    options = FlowerOptions(default_options, auth=f"{OPERATOR}|{VIEWER}", basic_auth=[])
    made: list[Any] = []
    try:
        with serve_flower(app, made, options) as base:
            secret = made[0].settings["cookie_secret"]
            viewer = OAuthClient(base, secret, VIEWER)  # the page itself is readable
            status, answer = viewer.post("pause", job="nightly", reason="not mine")
            assert status == 403, answer
            assert viewer.post("trigger", job="nightly")[0] == 403
            assert viewer.post("pause", all="1")[0] == 403
            reason = answer["error"]
            assert reason.startswith(f"{VIEWER} may watch this page but not act") and \
                "elarion_beat_flower_operators" in reason, reason
            shown = viewer.controls()
            assert (shown["actions"], shown["actions_reason"], shown["caller"]) == (
                False, reason, f"{VIEWER} (flower)"), shown
            store = panel(made[0]).store
            assert control.audit_log(store) == [] and control.active_pauses(store)[1] == []

            operator = OAuthClient(base, secret, OPERATOR)
            assert operator.controls()["actions"] is True
            status, answer = operator.post("pause", job="nightly", reason="migration")
            assert status == 200 and answer["pause"]["paused_by"] == f"{OPERATOR} (flower)"
            assert [(a.actor, a.action) for a in control.audit_log(store)] == [
                (f"{OPERATOR} (flower)", "pause")]
    finally:
        app.close()
