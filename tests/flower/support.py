"""Helpers of the Flower tests: HTTP, Prometheus text, the claims table, the beats' JSON
log records, event capture, the controls' tables and requests (:class:`Db`,
:class:`Session`) and headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from celery_elarion_beat.config.parsers import format_duration
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.observe.events import expand
from celery_elarion_beat.observe.logformat import read_json_log
from tests.flower.app import CONTROL_JOB, CRON_JOB, make_app
from tests.helpers.ports import free_port  # noqa: F401 - the flower tests import it from here

ROOT = Path(__file__).resolve().parents[2]
FLOWERCONFIG = ROOT / "examples" / "flowerconfig.py"
INSTALL_BROWSER = ".ci/install-packages.sh"
PROBE_JOB = "elarion-probe"
PROBE_NODE = "probe"



def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def http_get(url: str, auth: str | None = None, timeout: float = 10.0) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


def get_json(url: str, auth: str | None = None) -> Any:
    status, body = http_get(url, auth)
    assert status == 200, f"GET {url}: {status} {body[:300]}"
    return json.loads(body)


# -- Prometheus --------------------------------------------------------------

_SAMPLE = re.compile(r'^(?P<name>elarion_beat_(?:node_)?occurrences_total)\{(?P<labels>[^}]*)\} '
                     r'(?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Key = tuple[str, str, str, str]  # job, node, outcome, reason (what a beat logged)
Series = tuple[str, str, str]     # job or node, outcome, reason (one metric sample)
#: ``elarion_beat_occurrences_total`` by (job, outcome, reason) and
#: ``elarion_beat_node_occurrences_total`` by (node, outcome, reason)
Counts = tuple[Counter[Series], Counter[Series]]


def occurrence_counts(metrics_text: str,
                      ignore: Iterable[str] = (PROBE_JOB, PROBE_NODE, CONTROL_JOB)) -> Counts:
    """The per-job and the per-node occurrence samples, without the probe's (nor the
    control tests' runs of :data:`CONTROL_JOB` by hand, whose node is the Flower user,
    ``... (flower)``)."""
    ignored = set(ignore)
    per_job: Counter[Series] = Counter()
    per_node: Counter[Series] = Counter()
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match["labels"]))
            node_series = match["name"].startswith("elarion_beat_node_")
            who = labels["node"] if node_series else labels["job"]
            if who not in ignored and not who.endswith(" (flower)"):
                target = per_node if node_series else per_job
                target[(who, labels["outcome"], labels["reason"])] = int(float(match["value"]))
    return per_job, per_node


def expected_counts(logged: Counter[Key]) -> Counts:
    """What the metrics should show for what the beats logged."""
    per_job: Counter[Series] = Counter()
    per_node: Counter[Series] = Counter()
    for (job, node, outcome, reason), n in logged.items():
        per_job[(job, outcome, reason)] += n
        per_node[(node, outcome, reason)] += n
    return per_job, per_node


_BUCKET = re.compile(r'^(?P<name>elarion_beat_\w+_seconds)_(?P<part>bucket|count|sum)'
                     r'\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def histograms(metrics_text: str, name: str,
               ignore: Iterable[str] = (PROBE_JOB, CONTROL_JOB),
               ) -> dict[tuple[str, str], dict[str, float]]:
    """The samples of histogram *name* by (job, outcome): ``le`` bounds (as written,
    e.g. ``"0.5"``, ``"+Inf"``), ``count`` and ``sum``."""
    ignored = set(ignore)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for line in metrics_text.splitlines():
        match = _BUCKET.match(line)
        if not match or match["name"] != name:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels["job"] in ignored:
            continue
        samples = out.setdefault((labels["job"], labels["outcome"]), {})
        key = labels["le"] if match["part"] == "bucket" else match["part"]
        samples[key] = float(match["value"])
    return out


def expected_histogram(values: Iterable[float], buckets: Iterable[float]) -> dict[str, float]:
    """What a Prometheus histogram with *buckets* shows after observing *values*."""
    values = list(values)
    out = {str(float(b)): float(sum(1 for v in values if v <= b)) for b in buckets}
    out["+Inf"] = out["count"] = float(len(values))
    out["sum"] = sum(values)
    return out


def duration_text(seconds: float | None) -> str:
    """How the page writes a duration: the server's text (the package's one formatter,
    to about two digits), or a dash."""
    if seconds is None:
        return "—"
    return format_duration(seconds, approximate=True)


def elarion_lines(metrics_text: str) -> list[str]:
    return [line for line in metrics_text.splitlines()
            if line.startswith("elarion_beat_") and "_created" not in line]


# -- the claims table ----------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    job: str
    occurrence: str  # ISO, as in the events
    node: str
    task_id: str
    kind: str
    state: str | None = None  # published, skipped (still-running), ...
    run_state: str | None = None  # what the worker recorded
    runtime: float | None = None
    worker: str | None = None
    run_error: str | None = None

    @property
    def sent(self) -> bool:
        """Published (not decided ``skipped``): a node dispatched it."""
        return self.state != "skipped"


def read_claims(dsn: str, table: str, jobs: Iterable[str]) -> list[Claim]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        try:
            rows = conn.execute(sql.SQL(
                "SELECT job_name, occurrence_utc, node, task_id, kind, state, run_state, "
                "runtime, worker, run_error FROM {} WHERE job_name = ANY(%s) "
                "ORDER BY occurrence_utc").format(sql.Identifier(table)),
                (list(jobs),)).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [Claim(job, occ.strftime("%Y-%m-%dT%H:%M:%SZ"), *rest)
            for job, occ, *rest in rows]


def drop_tables(dsn: str, *tables: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for table in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def delete_broker_keys(redis_url: str, run: str) -> None:
    """Remove what a test run left in Redis (its queues, bindings, node queues)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"*{run}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


# -- beat logs (JSON records: ELARION_BEAT_LOG_FORMAT=json) ---------------------------


def log_counts(node: str, log: str) -> Counter[Key]:
    """What one beat logged, in the metrics' terms (the outcome of every occurrence).

    A publish-error follows the dispatched record of the same send: that occurrence
    ends skipped with reason publish-error, as the recorder (and so the metrics) has it.
    """
    counts: Counter[Key] = Counter()
    for record in read_json_log(log):
        action, job = record.get("action"), record.get("job")
        if action == "dispatched":
            counts[(job, node, "dispatched", "")] += 1
        elif action == "skipped":
            counts[(job, node, "skipped", record["reason"])] += 1
        elif action == "invalid-entry":
            counts[(job, node, "skipped", "invalid-entry")] += 1
        elif action == "publish-error":
            counts[(job, node, "dispatched", "")] -= 1
            counts[(job, node, "skipped", "publish-error")] += 1
    return +counts


# -- events ----------------------------------------------------------------------


class EventCapture:
    """Every event of the test run's event exchange, captured in a thread."""

    def __init__(self, env: dict[str, str], app: Any = None) -> None:
        self.app = make_app(env) if app is None else app  # an app of another test package
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="event-capture")

    def start(self) -> EventCapture:
        self._thread.start()
        return self

    def _on(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(dict(event))

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def snapshot(self) -> list[dict[str, Any]]:
        """The events captured, each ``elarion-batch`` unpacked into the events it
        carries (as Flower and the exporter read them)."""
        return [dict(event) for raw in self.raw() for event in expand(raw)]

    def raw(self) -> list[dict[str, Any]]:
        """The events as they came off the exchange."""
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)
        self.app.close()


def send_events(env: dict[str, str], hostname: str,
                events: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Send *events* (type, fields) on the test run's event exchange, as *hostname*."""
    app = make_app(env)
    try:
        with app.connection_for_write() as conn:
            dispatcher = app.events.Dispatcher(conn, hostname=hostname, enabled=True)
            for type_, fields in events:
                dispatcher.send(type_, **fields)
            dispatcher.close()
    finally:
        app.close()


def send_probe(env: dict[str, str]) -> None:
    """One elarion-dispatched event from the test, to learn when every monitor listens."""
    send_events(env, f"beat@{PROBE_NODE}", [(
        "elarion-dispatched", {"job": PROBE_JOB, "task_name": "probe",
                               "task_id": str(uuid.uuid4()), "node": PROBE_NODE,
                               "placement": "cluster", "claim": "slot",
                               "occurrence": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                           time.gmtime())})])


def send_probe_states(env: dict[str, str]) -> dict[str, tuple[str, str, str, str | None]]:
    """Events of the probe job (and node) that leave one occurrence in each state the
    cluster run does not reach; returns occurrence -> (state, lateness text, runtime
    text, exception) as the page should show them."""
    start = time.time() - 120
    occ = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + 2 * i)) for i in range(6)]
    ids = [str(uuid.uuid4()) for _ in occ]
    common = {"job": PROBE_JOB, "task_name": "probe", "node": PROBE_NODE,
              "placement": "cluster", "claim": "slot"}
    beat: list[tuple[str, dict[str, Any]]] = [
        ("elarion-dispatched", {**common, "occurrence": occ[0], "task_id": ids[0],
                                "lateness": 0.34}),
        ("elarion-dispatched", {**common, "occurrence": occ[1], "task_id": ids[1],
                                "lateness": 0.0042}),
        ("elarion-dispatched", {**common, "occurrence": occ[2], "task_id": ids[2],
                                "lateness": 1.25, "catch_up": True}),
        ("elarion-skipped", {**common, "occurrence": occ[3], "reason": "claimed-elsewhere",
                             "winner": "elsewhere"}),
        ("elarion-skipped", {**common, "occurrence": occ[4], "reason": "claim-error",
                             "winner": None}),
        ("elarion-orphaned", {**common, "occurrence": occ[5], "holder": "gone",
                              "task_id": ids[5], "state": "pending", "publish_error": None,
                              "age": 31.0, "takeovers": 0, "delivery": "at_most_once",
                              "action": "reported"}),
    ]
    run = {"job": PROBE_JOB, "node": PROBE_NODE, "worker": "celery@probe",
           "placement": "cluster"}
    worker: list[tuple[str, dict[str, Any]]] = [
        ("elarion-run", {**run, "occurrence": occ[1], "task_id": ids[1], "state": "running"}),
        ("elarion-run", {**run, "occurrence": occ[2], "task_id": ids[2], "state": "running"}),
        ("elarion-run", {**run, "occurrence": occ[2], "task_id": ids[2], "state": "retried",
                         "runtime": 75.5, "exception": "Retry"}),
    ]
    send_events(env, f"beat@{PROBE_NODE}", beat)
    send_events(env, f"worker@{PROBE_NODE}", worker)
    return {occ[0]: ("published", "340ms", "—", None),
            occ[1]: ("running", "4.2ms", "—", None),
            occ[2]: ("retried", "1.3s", "76s", "Retry"),
            occ[3]: ("claimed", "—", "—", None),
            occ[4]: ("missed", "—", "—", None),
            occ[5]: ("orphaned", "—", "—", None)}


# -- the controls: the claims database they change, and HTTP ------------------------


@dataclass(frozen=True)
class Db:
    """What the buttons change: the pauses, the audit and the runs by hand."""

    dsn: str
    table: str

    def _rows(self, table: str, columns: str, order: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            try:
                cursor = conn.execute(sql.SQL(f"SELECT {columns} FROM {{}} ORDER BY {order}")
                                      .format(sql.Identifier(table)))
            except psycopg.errors.UndefinedTable:
                return []
            names = [c.name for c in cursor.description or ()]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def pauses(self) -> dict[str, dict[str, Any]]:
        tables = Settings.from_mapping({"elarion_beat_table": self.table})
        return {r["job_name"]: r for r in self._rows(
            tables.pauses_table, "job_name, paused_at, paused_by, reason, until_utc",
            "job_name")}

    def audit(self) -> list[dict[str, Any]]:
        tables = Settings.from_mapping({"elarion_beat_table": self.table})
        return self._rows(tables.audit_table,
                          "at, actor, action, job_name, reason, until_utc, task_id, detail",
                          "id")

    def manual(self) -> list[Any]:
        return [cl for cl in read_claims(self.dsn, self.table, [CONTROL_JOB, CRON_JOB])
                if cl.kind == "manual"]

    def state(self) -> tuple[Any, ...]:
        """Everything an action could change."""
        return self.pauses(), self.audit(), self.manual()


# -- HTTP ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: str

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def call(url: str, fields: Mapping[str, str] | None = None, auth: str | None = None,
         headers: Mapping[str, str] | None = None, method: str | None = None,
         ) -> tuple[Answer, Any]:
    """One request (a POST of *fields* when given): its answer and its headers."""
    data = urllib.parse.urlencode(fields).encode() if fields is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"Authorization": auth} if auth else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return Answer(response.status, response.read().decode()), response.headers
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(errors="replace")), exc.headers


@dataclass(frozen=True)
class Session:
    """A page load's XSRF cookie and the token the page was rendered with."""

    base: str
    auth: str | None
    cookie: str
    token: str

    @classmethod
    def open(cls, base: str, auth: str | None) -> Session:
        page, headers = call(base + "/elarion", auth=auth)
        assert page.status == 200, page.body[:300]
        cookies = [c for c in headers.get_all("Set-Cookie") or () if c.startswith("_xsrf=")]
        assert cookies, "the page set no _xsrf cookie"
        found = re.search(r'data-xsrf="([^"]+)"', page.body)
        assert found, "the page carries no XSRF token"
        return cls(base, auth, cookies[0].split(";")[0].split("=", 1)[1], found[1])

    def post(self, action: str, token: str | None = "page", cookie: bool = True,
             auth: str | None = "session", headers: Mapping[str, str] | None = None,
             **fields: str) -> Answer:
        """POST *fields* to an action, with the page's token (``token=None``: none)."""
        sent = dict(fields)
        if token is not None:
            sent["_xsrf"] = self.token if token == "page" else token
        extra = {"Cookie": f"_xsrf={self.cookie}"} if cookie else {}
        return call(f"{self.base}/elarion/api/{action}", sent,
                    self.auth if auth == "session" else auth, {**extra, **(headers or {})})[0]


def controls(base: str, auth: str | None) -> dict[str, Any]:
    answer = call(base + "/elarion/api/controls", auth=auth)[0]
    assert answer.status == 200, answer
    return dict(answer.json)


# -- the browser -------------------------------------------------------------------

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                  "--window-size=1400,1100")


def chromium(user_data_dir: Path) -> Any:
    """Headless Debian Chromium driven by Debian's chromedriver (no downloads)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install selenium", pytrace=False)
    binary = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(binary).exists() and Path(driver).exists()):
        pytest.fail(f"chromium / chromedriver are missing: run {INSTALL_BROWSER}",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={user_data_dir}")
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))
