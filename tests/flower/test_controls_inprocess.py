"""In-process checks of the controls (no services): the board's ``paused`` state and
runs by hand, the actor, and a Flower application served from a thread whose claims
database is unreachable or not configured (503, as JSON, never a hung I/O loop)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_elarion_beat.flower.board import STATES, Board
from celery_elarion_beat.flower.controls import actor_of
from celery_elarion_beat.flower.templates import STATE_BADGES
from tests.helpers.ports import free_port

OCC = "2026-11-29T03:00:00Z"


def event(kind: str, node: str, **fields: Any) -> dict[str, Any]:
    return {"type": f"elarion-{kind}", "hostname": f"beat@{node}", "job": "report",
            "task_name": "proj.report", "occurrence": OCC, "node": node,
            "placement": "cluster", "claim": "slot", "local_received": 100.0, **fields}


def test_a_paused_occurrence_and_a_run_by_hand_on_the_board() -> None:
    board = Board()
    board.observe(event("skipped", "a", reason="paused", winner="a"))
    board.observe(event("skipped", "b", reason="paused", winner="a"))
    (occ,) = board.snapshot()["jobs"][0]["occurrences"]
    assert occ["state"] == "paused" and occ["task_id"] is None
    board.observe(event("dispatched", "alice@ops (cli)", occurrence="2026-11-29T03:00:07Z",
                        task_id="t-9", manual=True))
    state = board.snapshot()
    by_hand = state["jobs"][0]["occurrences"][0]
    assert (by_hand["state"], by_hand["winner"], by_hand["notes"]) == (
        "published", "alice@ops (cli)", ["run by hand"])
    assert state["jobs"][0]["dispatched"] == 1
    assert [n["node"] for n in state["nodes"]] == ["a", "b"]  # the operator is no beat node


def test_every_state_has_a_badge() -> None:
    assert set(STATES) == set(STATE_BADGES)


def _handler(basic_auth: list[str] | None, auth: str | None, header: str | None,
             user: str | None = None) -> Any:
    return SimpleNamespace(
        application=SimpleNamespace(options=SimpleNamespace(basic_auth=basic_auth, auth=auth)),
        request=SimpleNamespace(headers={"Authorization": header} if header else {},
                                remote_ip="10.0.0.7"),
        current_user=user)


def test_the_actor_is_the_flower_user() -> None:
    header = "Basic " + base64.b64encode(b"bob:pa:ss").decode()
    assert actor_of(_handler(["bob:pa:ss"], None, header)) == "bob (flower)"
    assert actor_of(_handler(None, r".*@example\.com", None, "carol@example.com")) == \
        "carol@example.com (flower)"
    assert actor_of(_handler(None, None, None)) == "anonymous@10.0.0.7 (flower)"


# -- a Flower application in a thread ----------------------------------------------------



@contextmanager
def serve_flower(app: Celery, made: list[Any] | None = None,
                 options: Any = None) -> Iterator[str]:
    """A Flower application of *app* (with the extension) on a free port, served by a
    thread; the Flower application object goes into *made*. *options*: Flower's
    (``default_options`` when not given)."""
    from flower.app import Flower
    from flower.options import default_options
    from flower.urls import settings
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop

    import celery_elarion_beat.flower  # noqa: F401  (adds the handlers)

    port, ready, stop = free_port(), threading.Event(), threading.Event()

    def serve() -> None:
        async def main() -> None:
            web = Flower(options=options or default_options, capp=app, events=object(),
                         io_loop=IOLoop.current(), **settings)
            if made is not None:
                made.append(web)
            server = HTTPServer(web)
            server.listen(port, "127.0.0.1")
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            server.stop()
            await server.close_all_connections()  # keep-alive sockets of the clients

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True, name="flower-inprocess")
    thread.start()
    assert ready.wait(10), "Flower did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def flower(conf: dict[str, Any]) -> Iterator[str]:
    """A Flower application (with the extension) on a free port, served by a thread."""
    app = Celery("elarion_inprocess", set_as_current=False)
    app.conf.update(broker_url="memory://", beat_schedule={
        "nightly": {"task": "proj.nightly", "schedule": 3600.0}}, **conf)
    try:
        with serve_flower(app) as url:
            yield url
    finally:
        app.close()


def _call(url: str, data: dict[str, str] | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


def _post_with_token(base: str, action: str, **fields: str) -> tuple[int, Any]:
    status, _, headers = _call(base + "/elarion")
    assert status == 200
    cookie = [c for c in headers.get_all("Set-Cookie") if c.startswith("_xsrf=")][0]
    token = cookie.split(";")[0].split("=", 1)[1]
    status, text, _ = _call(f"{base}/elarion/api/{action}", {**fields, "_xsrf": token},
                            {"Cookie": f"_xsrf={token}"})
    return status, json.loads(text)


def test_an_unreachable_or_unset_claims_database_answers_503(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_UNAUTHENTICATED_API", "true")  # no authentication here
    down = {"elarion_beat_dsn": "postgresql://elarion:x@127.0.0.1:1/none",
            "elarion_beat_claim_timeout": 2}
    unset = {"elarion_beat_dsn": ""}  # set, but empty: not even $ELARION_BEAT_DSN is read
    with flower(down) as base, flower(unset) as unset_base:
        status, text, _ = _call(base + "/elarion/api/controls")
        assert status == 503 and json.loads(text)["error"].startswith(
            "the claims database failed: "), text
        status, answer = _post_with_token(base, "pause", job="nightly", until="1h")
        assert status == 503 and answer["error"].startswith("the claims database failed"), \
            answer
        status, text, _ = _call(unset_base + "/elarion/api/controls")
        assert status == 503 and "elarion_beat_dsn is not set" in json.loads(text)["error"]
        status, answer = _post_with_token(unset_base, "resume", job="nightly")
        assert status == 503 and "elarion_beat_dsn is not set" in answer["error"], answer
        assert _call(base + "/elarion")[0] == 200  # the page itself still renders
