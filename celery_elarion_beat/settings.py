"""Settings: the only module that knows setting names.

Every setting is read from ``app.conf`` first (``elarion_beat_dsn``, or with a
config namespace such as Django's ``CELERY_ELARION_BEAT_DSN``), then from the
environment (``ELARION_BEAT_DSN``), then falls back to its default. The values
are validated once, when beat starts, and the error names the setting.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .exceptions import ConfigurationError
from .names import NODES_TABLE_MAX, TABLE_MAX, check_node_name

__all__ = ["DEFAULT_TABLE", "SETTINGS", "Settings", "mask_dsn", "normalize_dsn"]

DEFAULT_TABLE = "elarion_scheduler_claims"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.@:-]{1,255}$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its ``app.conf`` key, environment variable, default and meaning."""

    key: str
    default: Any
    help: str

    @property
    def env(self) -> str:
        return self.key.upper()


#: Every setting, in the order the docs list them.
SETTINGS: tuple[Setting, ...] = (
    Setting("elarion_beat_dsn", None,
            "Claims database: postgresql://user:pass@host/db (or a SQLAlchemy URL "
            "postgresql+psycopg://...), or memory:// for a single process. Required."),
    Setting("elarion_beat_node", None,
            "This node's name, shared by beat and the workers on the node. "
            "Default: the host name."),
    Setting("elarion_beat_table", DEFAULT_TABLE, "Name of the claims table."),
    Setting("elarion_beat_schema", None, "Schema of the claims table. Default: the search path."),
    Setting("elarion_beat_create_table", True,
            "Create the claims table (and schema) on first start. Set False when "
            "migrations own the schema; beat then runs no DDL."),
    Setting("elarion_beat_claim_timeout", 5.0,
            "Seconds a claim may take (connect, lock wait and statement) before the "
            "node gives up and skips with reason claim-error."),
    Setting("elarion_beat_node_queue", "elarion.node.{node}",
            "Format of the node-local queue that every-node entries are sent to and that the "
            "node's workers consume; {node} is elarion_beat_node."),
    Setting("elarion_beat_node_queue_expires", 3600.0,
            "Seconds a node queue may go unused before the broker deletes it (x-expires "
            "on RabbitMQ, a key TTL refreshed on every send on Redis)."),
    Setting("elarion_beat_nodes_table", None,
            "Name of the nodes table (one heartbeat row per beat node). Default: the claims "
            "table's name with _claims replaced by _nodes (elarion_scheduler_nodes)."),
    Setting("elarion_beat_claim_retention", 7 * 24 * 3600.0,
            "Seconds claim rows are kept. Must exceed every interval entry's period: "
            "a purged claim can no longer suppress a duplicate inside its window."),
    Setting("elarion_beat_purge_interval", 1800.0,
            "Seconds between purges; the cluster purges once per interval, not once per node."),
    Setting("elarion_beat_purge_batch", 5000,
            "Rows deleted per purge transaction, so a big table is never locked for long."),
    Setting("elarion_beat_heartbeat_interval", 30.0,
            "Seconds between node heartbeats (nodes table, drift and skew checks)."),
    Setting("elarion_beat_node_timeout", 120.0,
            "Seconds without a heartbeat after which a node counts as dead."),
    Setting("elarion_beat_node_retention", 24 * 3600.0,
            "Seconds a dead node's row stays in the nodes table before a heartbeat of "
            "another node deletes it (at least elarion_beat_node_timeout)."),
    Setting("elarion_beat_max_clock_skew", 2.0,
            "Seconds the node clock may differ from the database clock before a WARNING."),
    Setting("elarion_beat_claim_chunk", 1000,
            "Due entries claimed per store call (one database round trip). Nodes start at "
            "different chunks of a bigger batch, so they win different chunks and publish "
            "in parallel."),
    Setting("elarion_beat_events", True,
            "Send elarion-dispatched / elarion-skipped / elarion-drift Celery events."),
    Setting("elarion_beat_window_tolerance", 1.0,
            "Seconds of timer jitter forgiven by interval window claims; the effective "
            "tolerance is at most 10% of the interval."),
)
_BY_KEY = {s.key: s for s in SETTINGS}


def normalize_dsn(dsn: str) -> str:
    """Return *dsn* as a SQLAlchemy URL string using psycopg 3 for PostgreSQL.

    ``memory://`` and ``memory://name`` are returned unchanged.
    """
    dsn = dsn.strip()
    if dsn.startswith("memory://"):
        return dsn
    try:
        url = make_url(dsn)
    except ArgumentError:
        raise ConfigurationError(
            "elarion_beat_dsn is not a URL; use postgresql://user:password@host:5432/dbname "
            "(a SQLAlchemy URL) or memory://"
        ) from None
    backend, _, driver = url.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise ConfigurationError(
                f"elarion_beat_dsn uses the driver {driver!r}; celery-elarion-beat talks to "
                "PostgreSQL through psycopg 3: use postgresql:// or postgresql+psycopg://"
            )
        url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)
    if backend in ("mysql", "mariadb"):
        if driver not in ("", "pymysql"):
            raise ConfigurationError(
                f"elarion_beat_dsn uses the driver {driver!r}; use mysql:// (PyMySQL) for "
                "MariaDB and MySQL"
            )
        return url.set(drivername="mysql+pymysql").render_as_string(hide_password=False)
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if not url.database or url.database == ":memory:":
            raise ConfigurationError(
                "elarion_beat_dsn = sqlite:// needs a file shared by the beat processes: "
                "use sqlite:////path/to/claims.db (memory:// is the in-process store)"
            )
        return url.render_as_string(hide_password=False)
    raise ConfigurationError(
        f"elarion_beat_dsn has the unsupported scheme {url.drivername!r}; use "
        "postgresql://... (production), mysql://... (MariaDB/MySQL), sqlite:////path "
        "(one host) or memory:// (one process)"
    )


#: Query parameters whose value is a credential (``?password=``, PyMySQL's ``passwd``,
#: libpq's ``sslpassword``, ``...token``, ``...secret``): masked like the URL password.
_CREDENTIAL_PARAM = re.compile(r"passw(?:or)?d|pwd|secret|token", re.IGNORECASE)


def mask_dsn(dsn: str | None) -> str:
    """Return *dsn* with its password replaced by ``***``, safe to log.

    Both places a driver takes a password from are masked: the URL's own
    (``postgresql://u:***@h/db``) and every credential query parameter
    (``?password=***``, ``?passwd=***``, ``?sslpassword=***``; see
    ``_CREDENTIAL_PARAM``). Other query parameters are kept.
    """
    if not dsn:
        return "(not configured)"
    if dsn.startswith("memory://"):
        return dsn
    try:
        url: URL = make_url(dsn)
    except ArgumentError:
        return "(unparsable DSN)"
    query = _masked_query(url.query)
    base = url.set(query={}).render_as_string(hide_password=True)
    return f"{base}?{query}" if query else base


def _masked_query(query: Mapping[str, str | tuple[str, ...]]) -> str:
    """*query* (as SQLAlchemy parsed it) as URL text, credential values as ``***``."""
    parts = []
    for key, value in query.items():
        name = quote(key, safe="/:@,")
        if _CREDENTIAL_PARAM.search(key):
            parts.append(f"{name}=***")  # once, however many values it had
            continue
        for item in (value,) if isinstance(value, str) else value:
            parts.append(f"{name}={quote(item, safe='/:@,')}")
    return "&".join(parts)


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{name} must be true or false, not {value!r}")


def _number(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}")
    try:
        number = float(getattr(value, "total_seconds", lambda: value)())
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be {what}, not {value!r}")
    return number


def _as_seconds(name: str, value: Any, maximum: float | None = None) -> float:
    seconds = _number(name, value, "a number of seconds")
    if not seconds > 0:
        raise ConfigurationError(f"{name} must be greater than 0 seconds, not {value!r}")
    if maximum is not None and seconds > maximum:
        raise ConfigurationError(f"{name} must be at most {maximum:g} seconds, not {value!r}")
    return seconds


def _as_count(name: str, value: Any, maximum: int) -> int:
    number = _number(name, value, "a whole number")
    if number != int(number):
        raise ConfigurationError(f"{name} must be a whole number, not {value!r}")
    if not 1 <= number <= maximum:
        raise ConfigurationError(f"{name} must be between 1 and {maximum}, not {value!r}")
    return int(number)


def _identifier(name: str, value: Any, maximum: int = 63) -> str:
    text = str(value)
    if not _IDENTIFIER.match(text) or len(text) > maximum:
        raise ConfigurationError(
            f"{name} = {value!r} is not a usable SQL identifier; use letters, digits and "
            f"underscores, starting with a letter or underscore, at most {maximum} characters"
            + (" (the name of the table's index is longer)" if maximum < 63 else "")
        )
    return text


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated settings of one beat process."""

    dsn: str | None = dataclasses.field(default=None, repr=False)
    node: str = dataclasses.field(default_factory=socket.gethostname)
    table: str = DEFAULT_TABLE
    schema: str | None = None
    create_table: bool = True
    claim_timeout: float = 5.0
    window_tolerance: float = 1.0
    node_queue: str = ""
    node_queue_expires: float = 3600.0
    nodes_table: str = ""
    claim_retention: float = 7 * 24 * 3600.0
    purge_interval: float = 1800.0
    purge_batch: int = 5000
    heartbeat_interval: float = 30.0
    node_timeout: float = 120.0
    node_retention: float = 24 * 3600.0
    max_clock_skew: float = 2.0
    events: bool = True
    claim_chunk: int = 1000

    def __post_init__(self) -> None:
        if not self.node_queue:
            object.__setattr__(self, "node_queue", _node_queue("elarion.node.{node}", self.node))
        if not self.nodes_table:
            object.__setattr__(self, "nodes_table", default_nodes_table(self.table))

    @property
    def safe_dsn(self) -> str:
        """The DSN with its password masked."""
        return mask_dsn(self.dsn)

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def qualified_nodes_table(self) -> str:
        return f"{self.schema}.{self.nodes_table}" if self.schema else self.nodes_table

    def require_dsn(self) -> str:
        """Return the DSN or refuse to run uncoordinated."""
        if not self.dsn:
            raise ConfigurationError(
                "elarion_beat_dsn is not set, and celery-elarion-beat never runs "
                "uncoordinated: set app.conf.elarion_beat_dsn (or the ELARION_BEAT_DSN "
                "environment variable) to postgresql://user:password@host:5432/dbname, "
                "or to memory:// for a single process"
            )
        return self.dsn

    @classmethod
    def from_app(cls, app: Any, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the settings of *app* (environment as the fallback)."""
        conf = getattr(app, "conf", {}) or {}
        namespace = getattr(app, "namespace", None)
        env = os.environ if environ is None else environ
        return cls.from_lookup(lambda key: _lookup(conf, namespace, env, key))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Settings:
        """Build settings from a plain mapping of setting keys (tests, tools)."""
        unknown = set(values) - set(_BY_KEY)
        if unknown:
            raise ConfigurationError(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls.from_lookup(values.get)

    @classmethod
    def from_lookup(cls, get: Callable[[str], Any]) -> Settings:
        def value(key: str) -> Any:
            found = get(key)
            return _BY_KEY[key].default if found is None or found == "" else found

        dsn = value("elarion_beat_dsn")
        node = check_node_name(str(value("elarion_beat_node") or socket.gethostname()))
        schema = value("elarion_beat_schema")
        table = _identifier("elarion_beat_table", value("elarion_beat_table"), TABLE_MAX)
        heartbeat = _as_seconds("elarion_beat_heartbeat_interval",
                                value("elarion_beat_heartbeat_interval"), 24 * 3600)
        node_timeout = _as_seconds("elarion_beat_node_timeout",
                                   value("elarion_beat_node_timeout"))
        if node_timeout <= heartbeat:
            raise ConfigurationError(
                f"elarion_beat_node_timeout ({node_timeout:g}s) must be longer than "
                f"elarion_beat_heartbeat_interval ({heartbeat:g}s), or live nodes would count "
                "as dead between two heartbeats; raise the timeout (3-4 heartbeats is usual)")
        node_retention = _as_seconds("elarion_beat_node_retention",
                                     value("elarion_beat_node_retention"))
        if node_retention < node_timeout:
            raise ConfigurationError(
                f"elarion_beat_node_retention ({node_retention:g}s) must be at least "
                f"elarion_beat_node_timeout ({node_timeout:g}s): a node's row may only be "
                "deleted once the node counts as dead")
        return cls(
            dsn=normalize_dsn(str(dsn)) if dsn else None,
            node=node,
            table=table,
            schema=_identifier("elarion_beat_schema", schema) if schema else None,
            create_table=_as_bool("elarion_beat_create_table", value("elarion_beat_create_table")),
            claim_timeout=_as_seconds("elarion_beat_claim_timeout",
                                      value("elarion_beat_claim_timeout"), 3600),
            window_tolerance=_as_seconds("elarion_beat_window_tolerance",
                                         value("elarion_beat_window_tolerance")),
            node_queue=_node_queue(str(value("elarion_beat_node_queue")), node),
            node_queue_expires=_as_seconds("elarion_beat_node_queue_expires",
                                           value("elarion_beat_node_queue_expires")),
            nodes_table=_identifier("elarion_beat_nodes_table",
                                    value("elarion_beat_nodes_table")
                                    or default_nodes_table(table), NODES_TABLE_MAX),
            claim_retention=_as_seconds("elarion_beat_claim_retention",
                                        value("elarion_beat_claim_retention")),
            purge_interval=_as_seconds("elarion_beat_purge_interval",
                                       value("elarion_beat_purge_interval")),
            purge_batch=_as_count("elarion_beat_purge_batch",
                                  value("elarion_beat_purge_batch"), 1_000_000),
            heartbeat_interval=heartbeat,
            node_timeout=node_timeout,
            node_retention=node_retention,
            max_clock_skew=_as_seconds("elarion_beat_max_clock_skew",
                                       value("elarion_beat_max_clock_skew")),
            events=_as_bool("elarion_beat_events", value("elarion_beat_events")),
            claim_chunk=_as_count("elarion_beat_claim_chunk",
                                  value("elarion_beat_claim_chunk"), 100_000),
        )


def default_nodes_table(claims_table: str) -> str:
    """The nodes table that goes with a claims table: ``x_claims`` -> ``x_nodes``."""
    base = claims_table[: -len("_claims")] if claims_table.endswith("_claims") else claims_table
    return f"{base}_nodes"[:63]


def _node_queue(template: str, node: str) -> str:
    try:
        name = template.format(node=node)
    except (KeyError, IndexError, ValueError):
        raise ConfigurationError(
            f"elarion_beat_node_queue = {template!r} is not a valid format string; "
            "use {node} for the node name, e.g. 'elarion.node.{node}'"
        ) from None
    if not _QUEUE.match(name):
        raise ConfigurationError(
            f"elarion_beat_node_queue = {template!r} gives the queue name {name!r}, which is "
            "not a usable queue name; use 1-255 letters, digits or the characters _ . @ : -"
        )
    return name


def _lookup(conf: Any, namespace: str | None, env: Mapping[str, str], key: str) -> Any:
    candidates = [key, key.upper()]
    if namespace:
        candidates.append(f"{namespace}_{key}".upper())
    for candidate in candidates:
        try:
            found = conf.get(candidate)
        except Exception:  # a broken lazy setting must not hide the environment
            found = None
        if found is not None:
            return found
    return env.get(key.upper())
