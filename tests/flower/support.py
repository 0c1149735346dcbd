"""Helpers of the Flower tests: HTTP, Prometheus text, the claims table, the beats' JSON
log records, event capture and headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from celery_elarion_beat.logformat import read_json_log
from tests.flower.app import make_app

ROOT = Path(__file__).resolve().parents[2]
FLOWERCONFIG = ROOT / "examples" / "flowerconfig.py"
INSTALL_BROWSER = ".ci/install-browser.sh"
PROBE_JOB = "elarion-probe"
PROBE_NODE = "probe"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def occurrence_counts(metrics_text: str, ignore: Iterable[str] = (PROBE_JOB, PROBE_NODE),
                      ) -> Counts:
    """The per-job and the per-node occurrence samples, without the probe's."""
    ignored = set(ignore)
    per_job: Counter[Series] = Counter()
    per_node: Counter[Series] = Counter()
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match["labels"]))
            node_series = match["name"].startswith("elarion_beat_node_")
            who = labels["node"] if node_series else labels["job"]
            if who not in ignored:
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


def read_claims(dsn: str, table: str, jobs: Iterable[str]) -> list[Claim]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        try:
            rows = conn.execute(sql.SQL(
                "SELECT job_name, occurrence_utc, node, task_id, kind FROM {} "
                "WHERE job_name = ANY(%s) ORDER BY occurrence_utc").format(sql.Identifier(table)),
                (list(jobs),)).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [Claim(job, occ.strftime("%Y-%m-%dT%H:%M:%SZ"), node, task_id, kind)
            for job, occ, node, task_id, kind in rows]


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
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)
        self.app.close()


def send_probe(env: dict[str, str]) -> None:
    """One elarion-dispatched event from the test, to learn when every monitor listens."""
    app = make_app(env)
    try:
        with app.connection_for_write() as conn:
            dispatcher = app.events.Dispatcher(conn, hostname="beat@probe", enabled=True)
            dispatcher.send("elarion-dispatched", job=PROBE_JOB, task_name="probe",
                            task_id=str(uuid.uuid4()), node=PROBE_NODE, placement="cluster",
                            claim="slot", occurrence=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()))
            dispatcher.close()
    finally:
        app.close()


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
