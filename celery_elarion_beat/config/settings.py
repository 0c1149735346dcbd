"""Settings: the only module that knows setting names.

Every setting is declared once, in :data:`SETTINGS`: its key, default, parser
(which validates it and names it in the error) and help. The :class:`Settings`
dataclass, the reference page (docs/settings.md, checked against
:func:`reference_table`) and the validation all come from that table.

Each value is read from ``app.conf`` first (``elarion_beat_dsn``, or with a
config namespace such as Django's ``CELERY_ELARION_BEAT_DSN``), then from the
environment (``ELARION_BEAT_DSN``), then falls back to its default. The values
are validated once, when beat starts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .catch_up import CatchUp, CatchUpPolicy
from .delivery import Delivery
from .django_dsn import django_dsn
from .dsn import backend_for, mask_dsn, normalize_dsn
from .names import (
    CLUSTER_MAX,
    NODES_TABLE_MAX,
    TABLE_MAX,
    check_cluster,
    check_node_name,
)
from .parsers import (
    Parser,
    boolean,
    choice,
    count,
    format_duration,
    identifier,
    optional,
    patterns,
    seconds,
    text,
)

__all__ = ["DEFAULT_CLUSTER", "DEFAULT_TABLE", "SETTINGS", "Setting", "Settings",
           "allows_other_scheduler", "claims_configured_by", "mask_dsn", "normalize_dsn",
           "reference_table", "setting_value"]

DEFAULT_TABLE = "elarion_scheduler_claims"
#: The cluster of settings built without an app (:meth:`Settings.from_mapping`: tests,
#: tools), and of a memory store not told otherwise.
DEFAULT_CLUSTER = "default"
#: App main names that name no application (``Celery()``, a script run as ``__main__``).
_NO_MAIN = ("", "__main__")
_PREFIX = "elarion_beat_"

logger = logging.getLogger(__name__)

_QUEUE = re.compile(r"^[A-Za-z0-9_.@:-]{1,255}$")


def _dsn(name: str, value: Any) -> str | None:
    return normalize_dsn(str(value)) if value else None


def _cluster(name: str, value: Any) -> str | None:
    return check_cluster(str(value), f"{name} =") if value is not None and value != "" else None


def _node(name: str, value: Any) -> str:
    return check_node_name(str(value or socket.gethostname()))


# -- the table -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its ``app.conf`` key, default, parser and meaning."""

    key: str
    default: Any
    parse: Parser
    help: str
    #: the default as the reference page shows it (when the value itself says little)
    shown_default: str | None = None
    #: keys this setting had before a rename: still read (the new key wins), with one
    #: WARNING per process naming the new key
    renamed_from: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return self.key.upper()

    @property
    def field(self) -> str:
        """The :class:`Settings` attribute: the key without ``elarion_beat_``."""
        return self.key[len(_PREFIX):]


#: Every setting, in the order the docs list them.
SETTINGS: tuple[Setting, ...] = (
    Setting("elarion_beat_dsn", None, _dsn,
            'The claims database. `postgresql://user:password@host:5432/db` (production;'
            ' `postgres://`, the SQLAlchemy form `postgresql+psycopg://` and libpq\'s'
            ' key/value form `host=db user=beat password=... dbname=app` work too),'
            ' `mysql://user:password@host:3306/db` (MariaDB or MySQL through PyMySQL: `pip install'
            " 'celery-elarion-beat[mysql]'`), `sqlite:////path/claims.db` (the beat processes of"
            ' one host), or `memory://` (one process). Beat refuses to start without it: it never'
            ' runs uncoordinated.',
            '*(required)*'),
    Setting("elarion_beat_django_database", None, optional(text),
            'A Django database alias (e.g. `default`): when `elarion_beat_dsn` is not set, the'
            ' DSN is built from `django.conf.settings.DATABASES[alias]` (ENGINE postgresql,'
            ' mysql or sqlite3; NAME, USER, PASSWORD, HOST, PORT and the libpq `OPTIONS` such'
            ' as `sslmode`). See [Django projects](howto/django.md).',
            '*(none)*'),
    Setting("elarion_beat_cluster", None, _cluster,
            'The application these beats, workers and operators belong to: part of every'
            ' row and key the library writes (claims, nodes, pauses, audit, one-offs), so'
            ' several apps (or the staging and production deployments of one app) can share'
            ' one database and one set of tables and never claim, pause, report, purge or'
            f' lease each other\'s rows. 1-{CLUSTER_MAX} printable characters. Set it alike'
            ' on every process of the app (beat, workers, Flower, the CLI); see'
            ' [Several apps, one database](howto/several-apps.md).',
            "the Celery app's main name (`Celery(\"proj\")` -> `proj`); beat refuses to"
            " start when the app has none"),
    Setting("elarion_beat_node", None, _node,
            "This node's name: recorded as the winner of its claims and sent in the"
            ' `elarion_node` header. Letters, digits and `_ . @ : -`, at most 191 characters (the'
            " key column's width). Give each replica a distinct name: two beats under one name"
            ' still never send a slot twice (each claim call carries its own token), but their'
            ' heartbeats share one row.',
            'the host name'),
    Setting("elarion_beat_table", DEFAULT_TABLE, identifier(TABLE_MAX),
            "The claims table's name (a plain SQL identifier of at most 49 characters: its index"
            ' is named `ix_<table>_claimed_at`, and identifiers have 63).'),
    Setting("elarion_beat_schema", None, optional(identifier()),
            "The claims table's schema. Created with the table when `elarion_beat_create_table`"
            ' is true.',
            'the search path'),
    Setting("elarion_beat_create_table", True, boolean,
            'Create the schema and table on first start (serialized with an advisory lock, so'
            ' nodes may start together). With `False`, beat runs no DDL and refuses to start when'
            ' the table is missing, naming `celery_elarion_beat.claims_table(metadata)` for your'
            ' migrations.'),
    Setting("elarion_beat_startup_errors", "refuse", choice("refuse", "fail_closed"),
            'What beat does when the claims database refuses it at start (wrong password, no'
            ' such database or role, no right on the schema or table): `refuse` logs one'
            ' CRITICAL line and exits with code 77, so an orchestrator shows a crash loop;'
            ' `fail_closed` starts anyway and skips every cluster occurrence until the database'
            ' lets it in. An outage (connection refused, a timeout, too many connections) always'
            ' starts fail-closed. See [Start-up errors](startup.md).'),
    Setting("elarion_beat_allow_other_scheduler", False, boolean,
            'Whether a beat of this app may run another scheduler than `ClaimingScheduler`.'
            ' In an app that uses the library (it sets `elarion_beat_dsn` or'
            ' `elarion_beat_django_database`, or calls `install_worker(app)`), a `celery beat`'
            ' or the embedded beat of `celery worker -B` that would run another scheduler (the'
            ' stock one, after `worker -B -S elarion`: on `celery worker`, `-S` is'
            ' `--statedb`) refuses to start with one CRITICAL line and exit code 78: it would'
            ' send every occurrence again beside the claiming beats. `True` lets it start'
            ' (with a WARNING), for a beat that is meant to run apart. See'
            ' [Embedded beat](howto/embedded-beat.md).'),
    Setting("elarion_beat_claim_timeout", 5.0, seconds(3600),
            'Seconds a claim may take: the connect timeout, `statement_timeout`, `lock_timeout`'
            ' and `tcp_user_timeout` of the claims connection. A claim that takes longer is'
            ' skipped with reason `claim-error` (fail closed).',
            '`5`'),
    Setting("elarion_beat_pgbouncer", False, boolean,
            'Set it when `elarion_beat_dsn` points at PgBouncer in transaction pooling mode:'
            ' psycopg prepares no statement on the server (another transaction may get another'
            ' server connection), and the timeouts of `elarion_beat_claim_timeout` are set per'
            ' transaction (`SET LOCAL`) instead of in the startup `options`, which PgBouncer'
            ' refuses. Statement pooling mode is not supported (a claim is a transaction). See'
            ' [Capacity](capacity.md#pgbouncer).'),
    Setting("elarion_beat_node_queue", "elarion.node.{node}", text,
            "Format of this node's queue, where beat sends the node's `every_node` entries and"
            " the node's workers consume (`{node}` is `elarion_beat_node`, `{cluster}`"
            ' `elarion_beat_cluster`: two apps on one broker and the same hosts give their'
            " nodes' queues apart with `elarion.node.{cluster}.{node}`). The result must be a"
            ' plain queue name.'),
    Setting("elarion_beat_node_queue_expires", 3600.0, seconds(),
            'Seconds a node queue may go unused before the broker deletes it: `x-expires` on'
            ' RabbitMQ (the worker and beat declare the queue alike; change it only with the queue'
            ' deleted), a key TTL re-armed on every send on Redis.',
            '`3600`'),
    Setting("elarion_beat_nodes_table", None, optional(identifier(NODES_TABLE_MAX)),
            'The nodes table: one heartbeat row per beat node.',
            "the claims table's name with `_claims` replaced by `_nodes` "
            "(`elarion_scheduler_nodes`)"),
    Setting("elarion_beat_claim_retention", 7 * 24 * 3600.0, seconds(),
            "Seconds claim rows are kept (each job's newest claim is kept whatever its age)."
            " Beat refuses to start when an interval entry's period is not shorter: a purged"
            " claim can no longer suppress a duplicate inside its window.",
            '`604800` (7 days)'),
    Setting("elarion_beat_purge_interval", 1800.0, seconds(),
            'Seconds between purges. The nodes elect the purging node with a window claim on the'
            ' reserved job `elarion.purge`, so the cluster purges once per interval.',
            '`1800`'),
    Setting("elarion_beat_purge_batch", 5000, count(1_000_000),
            'Rows deleted per purge transaction, so a big table is never locked for long. A whole'
            " number from 1 to 1,000,000. The purge always keeps each job's newest claim."),
    Setting("elarion_beat_purge_budget", 2.0, seconds(3600),
            'Seconds the purge may run inside one beat tick. The elected node deletes batch after'
            ' batch until the budget is spent, then goes on at its next ticks (no new election)'
            ' until the pass is done, so a big backlog never holds up the claims of a tick for'
            ' long. `celery -A proj elarion-beat purge` is not bounded.',
            '`2`'),
    Setting("elarion_beat_claims_layout", "plain", choice("plain", "partitioned"),
            'The claims table\'s layout. `plain`: one table, purged with batched deletes.'
            ' `partitioned` (PostgreSQL only): `PARTITION BY RANGE (occurrence_utc)` with one'
            ' partition per UTC day (`<table>_pYYYYMMDD`) and a DEFAULT partition'
            ' (`<table>_pdefault`); the nodes create the partitions ahead and the purge drops the'
            ' expired ones whole. An existing table keeps its layout: beat refuses to start when'
            ' it differs; see [Large claims tables](howto/large-claims-tables.md) to switch.'),
    Setting("elarion_beat_partitions_ahead", 3, count(90),
            'With `elarion_beat_claims_layout = "partitioned"`: the day partitions the nodes'
            ' create ahead of today (UTC), at start and once a day after. A whole number from 1'
            ' to 90.'),
    Setting("elarion_beat_heartbeat_interval", 30.0, seconds(24 * 3600),
            'Seconds between node heartbeats (nodes table, drift and skew checks). Beat wakes at'
            ' least this often.',
            '`30`'),
    Setting("elarion_beat_node_timeout", 120.0, seconds(),
            'Seconds without a heartbeat after which `status` calls a node dead (and drift checks'
            ' ignore it). Must be longer than `elarion_beat_heartbeat_interval`.',
            '`120`'),
    Setting("elarion_beat_node_retention", 24 * 3600.0, seconds(),
            "Seconds a dead node's row stays in the nodes table; each heartbeat deletes the rows"
            ' of nodes not seen for this long (pods that are gone after a rollout), and reads only'
            ' the nodes seen within `elarion_beat_node_timeout`. At least'
            ' `elarion_beat_node_timeout`.',
            '`86400`'),
    Setting("elarion_beat_max_clock_skew", 2.0, seconds(),
            "Seconds the node's clock may differ from the database clock before a WARNING (the"
            " node corrects for it: it decides when slots are due on the database clock). Also"
            " the most an exact slot's claim may come before the slot on the database clock:"
            " an earlier claim is refused (`clock-fenced`).",
            '`2`'),
    Setting("elarion_beat_clock", "database", choice("database", "node"),
            "`database`: every node decides when an occurrence is due, and names it, on the"
            " database clock (its own clock corrected by the offset its heartbeats measure);"
            " a node too far off fences itself (`elarion_beat_max_clock_offset`), and an exact"
            " slot's claim made before its time is refused. `node`: each node trusts its own"
            " clock, as 0.2 did (for nodes under a time sync you trust more than the database"
            " server's, or a test that fakes a node's clock); a node ahead then sends early.",
            '`"node"`'),
    Setting("elarion_beat_max_clock_offset", 60.0, seconds(),
            "Seconds the node's clock may be off the database clock before the node fences"
            " itself: it claims nothing (skips `clock-fenced`; every-node entries go on), says"
            " so once, and resumes by itself when its clock is back within. Also fenced: a node"
            " that has not measured its offset yet (the claims database did not answer).",
            '`60`'),
    Setting("elarion_beat_claim_chunk", 1000, count(100_000),
            "A whole number from 1 to 100,000. Due entries claimed per store call: a tick's due"
            ' entries cost one database round trip per this many entries. A bigger batch is sorted'
            " by job name and claimed chunk after chunk, each chunk's winners published before the"
            ' next claim; every node starts at its own rank among the live nodes (from the nodes'
            ' table), so the nodes win different chunks and publish in parallel, and a node killed'
            ' mid-batch loses at most one chunk.'),
    Setting("elarion_beat_events", True, boolean,
            'Send `elarion-dispatched`, `elarion-skipped` and `elarion-drift` Celery events'
            ' (hostname `beat@<node>`).'),
    Setting("elarion_beat_event_batch", 500, count(10_000, minimum=0),
            "Beat sends each tick's dispatched and skipped outcomes as `elarion-batch` events of"
            ' at most this many items (one event per node per tick, split when bigger), which'
            ' the Flower page and the metrics unpack. `0` sends one `elarion-dispatched` or'
            ' `elarion-skipped` event per outcome instead (as 0.1 did), for a consumer of'
            ' those events of your own. A whole number from 0 to 10,000.'),
    Setting("elarion_beat_window_tolerance", 1.0, seconds(),
            'Seconds of timer jitter an interval window forgives: the window checked is the'
            ' interval less `min(tolerance, 10% of the interval)`. Two runs of an interval job are'
            ' never closer than the interval less this tolerance.',
            '`1`'),
    Setting("elarion_beat_catch_up", "skip", choice("skip", "latest", "all"),
            'What an entry replays of the slots the whole cluster missed (every node down, the'
            ' claims database down), unless its `catch_up` option says otherwise: `skip` nothing,'
            ' `latest` the most recent missed slot, `all` each missed slot oldest first, up to'
            ' `elarion_beat_catch_up_max`. Missed slots are found in the ledger when beat starts'
            ' and when the database comes back; see [When things are missed](missed.md).'),
    Setting("elarion_beat_catch_up_window", 3600.0, seconds(),
            'Seconds back from now within which a missed slot may still be replayed (or an'
            ' orphan taken over); the `catch_up_window` option overrides it per entry.',
            '`3600`'),
    Setting("elarion_beat_catch_up_max", 10, count(100_000),
            'Missed slots an `all` entry replays at most (the most recent ones); the'
            ' `catch_up_max` option overrides it per entry. A whole number from 1 to 100,000.'),
    Setting("elarion_beat_catch_up_per_tick", 100, count(100_000),
            'Missed slots claimed per tick at most, oldest first across entries, so an outage'
            ' does not end in a burst; while slots wait, beat ticks at least once a second.'),
    Setting("elarion_beat_delivery", "at_most_once", choice("at_most_once", "at_least_once"),
            'What happens to an orphan (a claim not published within'
            ' `elarion_beat_publish_timeout`: its winner died, or the broker refused it), unless'
            ' the entry\'s `delivery` option says otherwise: `at_most_once` reports it (log,'
            ' `elarion-orphaned` event, `status`); `at_least_once` has a live node take it over'
            ' and publish it with the same task id.'),
    Setting("elarion_beat_publish_timeout", 30.0, seconds(3600),
            'Seconds a won claim may stay unpublished before every node calls it orphaned. Each'
            ' node looks for orphans after each heartbeat, so an orphan is handled within this'
            ' plus `elarion_beat_heartbeat_interval`.',
            '`30`'),
    Setting("elarion_beat_interval_anchor", "cluster", choice("cluster", "node"),
            '`cluster`: an interval entry runs one interval after its newest claim in the ledger,'
            ' whichever node made it, so restarts neither postpone nor double it. `node`: each'
            " node counts from its own start, as stock beat and 0.1 did (a restart resets it)."),
    Setting("elarion_beat_overlap_timeout", 3600.0, seconds(30 * 24 * 3600),
            'Seconds after its claim an unfinished run of an `overlap: skip` entry counts as'
            ' dead (its worker may have died), unless the entry sets `overlap_timeout` or its'
            ' task has a hard time limit (then the limit plus `elarion_beat_publish_timeout`).',
            '`3600`'),
    Setting("elarion_beat_track_runs", True, boolean,
            'Whether the workers of an app that calls `celery_elarion_beat.install_worker(app)`'
            ' record each run of a beat occurrence (started, finished, outcome, runtime) in the'
            ' claims table and send `elarion-run` events.'),
    Setting("elarion_beat_trigger_window", 10.0, seconds(24 * 3600),
            'Seconds within which a second `elarion-beat trigger` of the same job (from any'
            ' machine, the CLI or Flower) is refused as a duplicate of the first, unless it is'
            ' given `--force`: two operators pressing "run now" together get one run.',
            '`10`'),
    Setting("elarion_beat_one_offs", True, boolean,
            'Whether beat sends the one-offs of `celery_elarion_beat.schedule_once` (a table'
            ' `<stem>_oneoffs` beside the claims table). `False`: this node leaves them to the'
            ' others.'),
    Setting("elarion_beat_one_offs_lease", 60.0, seconds(3600),
            'Seconds a node holds the one-offs it took before another node may take them over'
            ' (the node died between taking and publishing them): the task is then sent again'
            ' under the same task id (at least once).',
            '`60`',
            renamed_from=("elarion_beat_one_off_lease",)),
    Setting("elarion_beat_one_offs_batch", 500, count(100_000),
            'One-offs a node takes per statement; beat takes batch after batch until fewer come'
            ' back (or one second of the tick is spent). A whole number from 1 to 100,000.',
            renamed_from=("elarion_beat_one_off_batch",)),
    Setting("elarion_beat_one_offs_poll", 1.0, seconds(3600),
            'Seconds beat sleeps at most while it may have one-offs to send: a one-off scheduled'
            ' for now is sent within about this long (on PostgreSQL a NOTIFY, heard at the next'
            ' wake, spares the idle nodes the query for the next due time).',
            '`1`',
            renamed_from=("elarion_beat_one_off_poll",)),
    Setting("elarion_beat_db_entries", False, boolean,
            'Whether beat also runs the entries kept in the database (`celery -A proj'
            ' elarion-beat schedule add ...`, or `celery_elarion_beat.live_schedules`), edited'
            ' while the cluster runs; tables `<stem>_entries`, `<stem>_revisions` and'
            ' `<stem>_versions` beside the claims table. Off: code entries only, as before. See'
            ' [Live schedules](howto/live-schedules.md).'),
    Setting("elarion_beat_db_entry_tasks", (), patterns,
            'The tasks a database entry may start: task names or glob patterns'
            ' (`proj.tasks.report`, `proj.reports.*`), a list, or one comma-separated string in'
            ' the environment. Checked when an entry is written and again when beat loads it:'
            ' a row may start any registered task with any arguments, so nothing is allowed'
            ' until you list it.',
            '*(empty: no task)*'),
    Setting("elarion_beat_db_entries_poll", 1.0, seconds(3600),
            'Seconds between two reads of the database entries\' version counter (one'
            ' primary-key read). On PostgreSQL a NOTIFY wakes the nodes at once and this is the'
            ' safety net; on MariaDB, SQLite and behind PgBouncer it is how soon a change is'
            ' seen.',
            '`1`'),
    Setting("elarion_beat_db_override_policy", "keep", choice("keep", "code"),
            'What a node does when a code entry that a database entry overrides'
            ' (`schedule override NAME`) has changed in code since the override was written:'
            ' `keep` runs the override and warns; `code` runs the code entry and warns.'),
    Setting("elarion_beat_flower_actions", True, boolean,
            'Whether the Flower page (`import celery_elarion_beat.flower`) offers the pause,'
            ' resume and run-now buttons. `False` is read-only mode: no buttons, and the action'
            ' requests are refused with 403.'),
    Setting("elarion_beat_flower_operators", (), patterns,
            'Who may use those buttons: Flower\'s basic-auth user names or OAuth e-mail'
            ' addresses, as glob patterns (`alice`, `ops-*`, `*@example.com`; e-mail addresses'
            ' match whatever their case, user names exactly): a list, or one comma-separated'
            ' string in the environment. Everyone else Flower lets in sees the page read-only'
            ' (the buttons disabled, with why), and the action requests are refused with 403.'
            ' Empty: every user Flower lets in. Without Flower authentication nobody can be'
            ' matched, so nobody may act while it is set; see'
            ' [Who may act](flower.md#who-may-act).',
            '*(empty: every user Flower lets in)*'),
    Setting("elarion_beat_flower_edit", False, boolean,
            'Whether the Flower page offers the Schedule card\'s edit form: add, edit,'
            ' override, enable, disable and remove database entries (needs'
            ' `elarion_beat_db_entries`), each with a reason, the revision it was read'
            ' at as a conflict token (a stale form is refused with 409) and a preview of the'
            ' next occurrences across its effective time. The same callers as the buttons may'
            ' edit (`elarion_beat_flower_actions`, `elarion_beat_flower_operators`). Off: no'
            ' form, and its requests are refused with 403; see'
            ' [Edit the schedule](flower.md#edit-the-schedule).'),
    Setting("elarion_beat_log_format", "text", choice("text", "json"),
            "text: beat's usual log lines. json: one JSON object per line with the"
            ' machine-readable fields (action, job, reason, ...), for Loki or ELK.'),
)
_BY_KEY = {s.key: s for s in SETTINGS}
#: An old key -> the setting that has it now (:attr:`Setting.renamed_from`).
_RENAMED = {old: s for s in SETTINGS for old in s.renamed_from}
#: The old keys already warned about in this process (one WARNING each).
_WARNED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated settings of one beat process (built by :meth:`from_app`)."""

    dsn: str | None = dataclasses.field(repr=False)
    django_database: str | None
    #: None: not set, and the app has no main name to derive it from (see require_cluster)
    cluster: str | None
    node: str
    table: str
    schema: str | None
    create_table: bool
    startup_errors: str
    allow_other_scheduler: bool
    claim_timeout: float
    pgbouncer: bool
    node_queue: str
    node_queue_expires: float
    nodes_table: str
    claim_retention: float
    purge_interval: float
    purge_batch: int
    purge_budget: float
    claims_layout: str
    partitions_ahead: int
    heartbeat_interval: float
    node_timeout: float
    node_retention: float
    max_clock_skew: float
    clock: str
    max_clock_offset: float
    claim_chunk: int
    events: bool
    event_batch: int
    window_tolerance: float
    catch_up: str
    catch_up_window: float
    catch_up_max: int
    catch_up_per_tick: int
    delivery: str
    publish_timeout: float
    interval_anchor: str
    overlap_timeout: float
    track_runs: bool
    trigger_window: float
    one_offs: bool
    one_offs_lease: float
    one_offs_batch: int
    one_offs_poll: float
    db_entries: bool
    db_entry_tasks: tuple[str, ...]
    db_entries_poll: float
    db_override_policy: str
    flower_actions: bool
    flower_operators: tuple[str, ...]
    flower_edit: bool
    log_format: str

    @property
    def catch_up_policy(self) -> CatchUpPolicy:
        """The catch-up policy of an entry that sets no catch-up option."""
        return CatchUpPolicy(CatchUp(self.catch_up), timedelta(seconds=self.catch_up_window),
                             self.catch_up_max)

    @property
    def default_delivery(self) -> Delivery:
        """The delivery of an entry that sets no ``delivery`` option."""
        return Delivery(self.delivery)

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

    @property
    def pauses_table(self) -> str:
        """The pauses table (``elarion-beat pause``): named after the claims table."""
        return related_table(self.table, "pauses", TABLE_MAX)

    @property
    def audit_table(self) -> str:
        """The audit table (every pause, resume and trigger): named after the claims table."""
        return related_table(self.table, "audit", TABLE_MAX)

    @property
    def one_offs_table(self) -> str:
        """The one-offs table (``schedule_once``): named after the claims table."""
        return related_table(self.table, "oneoffs", TABLE_MAX)

    @property
    def foreign_beats_table(self) -> str:
        """The foreign beats table (senders of beat messages that claim nothing, as the
        workers saw them): named after the claims table."""
        return related_table(self.table, "foreign_beats", TABLE_MAX)

    @property
    def entries_table(self) -> str:
        """The database entries table (live schedules): named after the claims table."""
        return related_table(self.table, "entries", TABLE_MAX)

    @property
    def revisions_table(self) -> str:
        """Every change of a database entry (the audit and the change feed)."""
        return related_table(self.table, "revisions", TABLE_MAX)

    @property
    def versions_table(self) -> str:
        """The database entries' version counter, one row per cluster."""
        return related_table(self.table, "versions", TABLE_MAX)

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

    def require_cluster(self) -> str:
        """Return the cluster, or refuse: no ``elarion_beat_cluster`` and no app main
        name to derive it from."""
        if self.cluster is None:
            raise ConfigurationError(
                "elarion_beat_cluster is not set and the Celery app has no main name to "
                "derive it from (Celery() or an app named '__main__'): name the app, "
                "Celery(\"proj\"), or set elarion_beat_cluster = \"proj\" (or the "
                "ELARION_BEAT_CLUSTER environment variable) alike on every beat, worker and "
                "operator of the app; apps that share a database need different names")
        return self.cluster

    @classmethod
    def from_app(cls, app: Any, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate the settings of *app* (environment as the fallback); the
        cluster defaults to the app's main name."""
        conf, namespace, env = _sources(app, environ)
        main = getattr(app, "main", None)
        return cls.from_lookup(lambda key: _lookup(conf, namespace, env, key),
                               cluster=lambda: _main_cluster(main))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None = None) -> Settings:
        """Build settings from a plain mapping of setting keys (tests, tools). There is
        no app to name the cluster: it is ``elarion_beat_cluster`` of the mapping, else
        :data:`DEFAULT_CLUSTER`."""
        values = values or {}
        unknown = set(values) - set(_BY_KEY) - set(_RENAMED)
        if unknown:
            raise ConfigurationError(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls.from_lookup(values.get, cluster=lambda: DEFAULT_CLUSTER)

    @classmethod
    def from_lookup(cls, get: Callable[[str], Any],
                    cluster: Callable[[], str | None] = lambda: None) -> Settings:
        """Settings from *get* (a setting key -> its raw value or None); *cluster* gives
        the cluster when ``elarion_beat_cluster`` is not set (None: none to derive)."""
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = get(setting.key)
            if raw is None or raw == "":
                raw = _renamed(setting, get)
            values[setting.field] = setting.parse(
                setting.key, setting.default if raw is None or raw == "" else raw)
        if values["dsn"] is None and values["django_database"]:
            values["dsn"] = normalize_dsn(django_dsn(values["django_database"]))
        if values["cluster"] is None:
            values["cluster"] = cluster()
        values["node_queue"] = _node_queue(values["node_queue"], values["node"],
                                           values["cluster"] or "")
        values["nodes_table"] = values["nodes_table"] or default_nodes_table(values["table"])
        _check_together(values)
        return cls(**values)


def _renamed(setting: Setting, get: Callable[[str], Any]) -> Any:
    """The value *setting* has under a key it had before a rename, if any; one WARNING
    per old key and process says to use the new key."""
    for old in setting.renamed_from:
        raw = get(old)
        if raw is not None and raw != "":
            if old not in _WARNED:
                _WARNED.add(old)
                logger.warning("elarion: the setting %s (%s) is now named %s (%s); the old "
                               "name keeps working until 1.0, rename it", old, old.upper(),
                               setting.key, setting.env,
                               extra={"action": "renamed-setting", "setting": setting.key})
            return raw
    return None


def _check_together(values: Mapping[str, Any]) -> None:
    """The rules that tie two settings together."""
    heartbeat, timeout = values["heartbeat_interval"], values["node_timeout"]
    if timeout <= heartbeat:
        raise ConfigurationError(
            f"elarion_beat_node_timeout ({format_duration(timeout)}) must be longer than "
            f"elarion_beat_heartbeat_interval ({format_duration(heartbeat)}), or live nodes "
            "would count "
            "as dead between two heartbeats; raise the timeout (3-4 heartbeats is usual)")
    if values["node_retention"] < timeout:
        raise ConfigurationError(
            f"elarion_beat_node_retention ({format_duration(values['node_retention'])}) must "
            f"be at least elarion_beat_node_timeout ({format_duration(timeout)}): a node's "
            "row may only be "
            "deleted once the node counts as dead")
    dsn = values["dsn"]
    if values["claims_layout"] == "partitioned" and dsn and \
            backend_for(dsn).name != "postgresql":
        raise ConfigurationError(
            "elarion_beat_claims_layout = 'partitioned' needs PostgreSQL, and "
            f"elarion_beat_dsn is {backend_for(dsn).name}: set elarion_beat_claims_layout = "
            "'plain', or point elarion_beat_dsn at PostgreSQL")


def reference_table() -> str:
    """The settings reference as a Markdown table (docs/settings.md holds it verbatim)."""
    rows = ["| setting | environment | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = s.shown_default or f"`{s.default}`"
        renamed = "".join(f" (Named `{old}` before 0.3: the old name still works.)"
                          for old in s.renamed_from)
        rows.append(f"| `{s.key}` | `{s.env}` | {default} | {s.help}{renamed} |")
    return "\n".join(rows)


def default_nodes_table(claims_table: str) -> str:
    """The nodes table that goes with a claims table: ``x_claims`` -> ``x_nodes``."""
    return related_table(claims_table, "nodes")


def related_table(claims_table: str, what: str, most: int = NODES_TABLE_MAX) -> str:
    """A table that goes with a claims table: ``x_claims`` -> ``x_<what>``, at most
    *most* characters (room for the names of its key and indexes)."""
    base = claims_table[: -len("_claims")] if claims_table.endswith("_claims") else claims_table
    return f"{base}_{what}"[:most]


def _main_cluster(main: Any) -> str | None:
    """The cluster an app's main name gives: itself, checked; None when it names no app."""
    if main is None or str(main) in _NO_MAIN:
        return None
    return check_cluster(str(main), "the Celery app's main name (the default of "
                                    "elarion_beat_cluster)")


def _node_queue(template: str, node: str, cluster: str = "") -> str:
    try:
        name = template.format(node=node, cluster=cluster)
    except (KeyError, IndexError, ValueError):
        raise ConfigurationError(
            f"elarion_beat_node_queue = {template!r} is not a valid format string; "
            "use {node} for the node name (and {cluster} for the cluster), e.g. "
            "'elarion.node.{node}'"
        ) from None
    if not _QUEUE.match(name):
        raise ConfigurationError(
            f"elarion_beat_node_queue = {template!r} gives the queue name {name!r}, which is "
            "not a usable queue name; use 1-255 letters, digits or the characters _ . @ : -"
        )
    return name


def _lookup(conf: Any, namespace: str | None, env: Mapping[str, str], key: str) -> Any:
    found = _where(conf, namespace, env, key)
    return None if found is None else found[1]


def _where(conf: Any, namespace: str | None, env: Mapping[str, str],
           key: str) -> tuple[str, Any] | None:
    """Where *key* is set and its raw value: the ``app.conf`` key that holds it (``key``,
    ``KEY`` or ``NAMESPACE_KEY``), else its environment variable; None when unset."""
    candidates = [key, key.upper()]
    if namespace:
        candidates.append(f"{namespace}_{key}".upper())
    for candidate in candidates:
        try:
            found = conf.get(candidate)
        except Exception:  # a broken lazy setting must not hide the environment
            found = None
        if found is not None:
            return candidate, found
    value = env.get(key.upper())
    return None if value is None else (key.upper(), value)


def _sources(app: Any, environ: Mapping[str, str] | None,
             ) -> tuple[Any, str | None, Mapping[str, str]]:
    conf = getattr(app, "conf", {}) or {}
    return conf, getattr(app, "namespace", None), os.environ if environ is None else environ


def setting_value(app: Any, key: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the one setting *key* of *app* (``app.conf``, then the environment,
    then its default), validated by its parser: for a check that must not fail on
    another setting's bad value. Raises :class:`ConfigurationError` naming *key*."""
    setting = _BY_KEY[key]
    conf, namespace, env = _sources(app, environ)

    def get(name: str) -> Any:
        return _lookup(conf, namespace, env, name)

    raw = get(key)
    if raw is None or raw == "":
        raw = _renamed(setting, get)
    return setting.parse(key, setting.default if raw is None or raw == "" else raw)


def allows_other_scheduler(app: Any, environ: Mapping[str, str] | None = None) -> bool:
    """``elarion_beat_allow_other_scheduler`` of *app*, read alone (the scheduler guard)."""
    return bool(setting_value(app, "elarion_beat_allow_other_scheduler", environ))


def claims_configured_by(app: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Where *app* names a claims database, if it does: the ``app.conf`` key or the
    environment variable that sets ``elarion_beat_dsn``, else
    ``elarion_beat_django_database``; None when neither is set (a wrong value counts:
    it still says the app means to use the library)."""
    conf, namespace, env = _sources(app, environ)
    for key in ("elarion_beat_dsn", "elarion_beat_django_database"):
        found = _where(conf, namespace, env, key)
        if found is not None and found[1] != "":
            return found[0]
    return None


if __name__ == "__main__":  # python -m celery_elarion_beat.config.settings: the reference table
    print(reference_table())
