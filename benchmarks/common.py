"""Shared pieces: service addresses, Celery apps, broker helpers, stats, tables, the machine.

Child processes, claims tables and the isolated-app settings come from
:mod:`celery_elarion_beat.testing`, as in the tests and the demo.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import redis
from celery import Celery

from celery_elarion_beat.testing._harness import drop_tables, isolated_conf

ROOT = Path(__file__).resolve().parents[1]

PG_DSN = (os.environ.get("ELARION_BENCH_PG_DSN") or os.environ.get("ELARION_TEST_PG_DSN")
          or "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = (os.environ.get("ELARION_BENCH_REDIS_URL") or os.environ.get("ELARION_TEST_REDIS_URL")
             or "redis://127.0.0.1:6379/0")

#: Every table, queue and Redis key of a run starts with this (and the run id).
PREFIX = "elbench"
UTC = timezone.utc


def run_id() -> str:
    return uuid.uuid4().hex[:10]


def names(kind: str) -> tuple[str, str]:
    """A fresh (claims table, broker queue) pair for one measurement."""
    rid = run_id()
    return f"{PREFIX}_{kind}_{rid}", f"{PREFIX}.{kind}.{rid}"


# -- Celery -------------------------------------------------------------------


def make_app(queue: str, *, entries: dict[str, Any] | None = None, table: str | None = None,
             node: str | None = None, main: str | None = None, **conf: Any) -> Celery:
    """An in-process app on the real Redis broker, publishing to *queue* only."""
    app = Celery(main or f"bench-{uuid.uuid4().hex[:6]}", broker=REDIS_URL,
                 set_as_current=False)
    app.conf.update(isolated_conf(REDIS_URL, queue, beat_schedule=entries or {},
                                  result_expires=None, elarion_beat_dsn=PG_DSN, **conf))
    if table:
        app.conf.elarion_beat_table = table
    if node:
        app.conf.elarion_beat_node = node
    return app


def library_default(key: str) -> Any:
    """The default of one ``elarion_beat_*`` setting, as the library documents it."""
    from celery_elarion_beat.config.settings import SETTINGS

    return next(s.default for s in SETTINGS if s.key == key)


# -- Redis --------------------------------------------------------------------


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def queue_length(queue: str) -> int:
    with redis_client() as r:
        return int(r.llen(queue))


def queue_messages(queue: str) -> list[dict[str, Any]]:
    """Every message waiting in *queue* (kombu's Redis list), oldest first."""
    with redis_client() as r:
        raw = r.lrange(queue, 0, -1)
    return [json.loads(m) for m in reversed(raw)]


def message_headers(queue: str) -> list[dict[str, Any]]:
    return [m.get("headers") or {} for m in queue_messages(queue)]


def delete_redis_keys(*patterns: str) -> int:
    """Delete the keys matching *patterns* (SCAN MATCH; our own run-unique names only)."""
    deleted = 0
    with redis_client() as r:
        for pattern in patterns:
            assert PREFIX in pattern, pattern  # never a broad pattern
            keys = list(r.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                deleted += int(r.delete(*keys[i:i + 500]))
    return deleted


def drop_queue(queue: str) -> None:
    """Remove a queue of ours from Redis: the list, its priority lists and bindings."""
    delete_redis_keys(f"*{queue}*")


class QueueReader(threading.Thread):
    """Pops every message of *queue* as it arrives (BRPOP); keeps (headers, receive time).

    Nothing else consumes the queue. *on_message*, when set, is called with each
    message's headers and receive time, on this thread.
    """

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.on_message: Callable[[dict[str, Any], float], None] | None = None
        self._received: list[tuple[dict[str, Any], float]] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        with redis_client() as r:
            while not self._halt.is_set():
                item = r.brpop([self.queue], timeout=0.2)
                if item is None:
                    continue
                at = time.time()
                headers = json.loads(item[1]).get("headers") or {}
                with self._lock:
                    self._received.append((headers, at))
                hook = self.on_message
                if hook is not None:
                    hook(headers, at)

    def snapshot(self) -> list[tuple[dict[str, Any], float]]:
        with self._lock:
            return list(self._received)

    def stop(self) -> list[tuple[dict[str, Any], float]]:
        """Stop reading; everything received."""
        self._halt.set()
        if self.is_alive():
            self.join(5)
        return self.snapshot()


# -- leftovers ----------------------------------------------------------------


def cleanup_leftovers() -> None:
    """Drop tables and Redis keys that an interrupted earlier run left behind."""
    drop_tables(PG_DSN, prefix=f"{PREFIX}_")
    delete_redis_keys(f"*{PREFIX}*")


# -- time ---------------------------------------------------------------------


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def cron_at(ts: float) -> str:
    """A 6-field cron expression (seconds first) that fires once a day at *ts* (UTC)."""
    d = utc(ts)
    return f"{d.second} {d.minute} {d.hour} * * *"


# -- stats and tables ---------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100), linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


@dataclass
class Table:
    """A result table, printed as text and written as Markdown."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def cells(self) -> list[list[str]]:
        return [[fmt(c, 3 if isinstance(c, float) and abs(c) < 1 else 2) for c in row]
                for row in self.rows]

    def text(self) -> str:
        cells = self.cells()
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        line = "  ".join(c.ljust(w) for c, w in zip(self.columns, widths))
        out = [f"== {self.title} ==", line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
        out += [f"   {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        out = ["| " + " | ".join(self.columns) + " |",
               "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns)))
               + "|"]
        out += ["| " + " | ".join(r) + " |" for r in self.cells()]
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows,
                "notes": self.notes}


# -- the machine --------------------------------------------------------------


def _first_line(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _memory() -> str:
    text = _first_line("/proc/meminfo", "MemTotal")
    try:
        return f"{int(text.split()[0]) / 1024 / 1024:.1f} GiB"
    except (ValueError, IndexError):
        return text


def machine() -> dict[str, str]:
    """nproc, memory, CPU model, PostgreSQL and Redis versions, library versions."""
    import celery
    import kombu

    import celery_elarion_beat

    info = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "memory": _memory(),
        "cpu": _first_line("/proc/cpuinfo", "model name"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "celery-elarion-beat": celery_elarion_beat.__version__,
    }
    try:
        with psycopg.connect(PG_DSN, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            info["postgresql"] = row[0] if row else "?"
    except Exception as exc:  # noqa: BLE001
        info["postgresql"] = f"unreachable ({exc})"
    try:
        with redis_client() as r:
            info["redis"] = str(r.info("server").get("redis_version"))
    except Exception as exc:  # noqa: BLE001
        info["redis"] = f"unreachable ({exc})"
    try:
        from importlib.metadata import version

        import redbeat  # type: ignore[import-untyped]  # noqa: F401
        info["celery-redbeat"] = version("celery-redbeat")
    except Exception:  # noqa: BLE001
        info["celery-redbeat"] = "not installed"
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
        info["load average at start"] = " ".join(load)
    except OSError:
        pass
    rev = commit()
    if rev:
        info["commit"] = rev
    return info


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def commit() -> str | None:
    """The commit of the work tree (short hash); None outside a git checkout."""
    out = _git("rev-parse", "--short", "HEAD")
    return out.strip() if out else None


def uncommitted() -> list[str] | None:
    """``git status --porcelain``: what the work tree changes against its commit, one
    line a path; None when git cannot tell (no checkout)."""
    out = _git("status", "--porcelain")
    return None if out is None else out.splitlines()


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def slug(text: str) -> str:
    return _SAFE.sub("-", text).strip("-").lower()
