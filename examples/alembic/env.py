"""Alembic environment with celery-elarion-beat's claims, nodes, pauses, audit, one-offs
and foreign beats tables, and the live schedules' entries, revisions and versions tables.

The nine ``*_table(metadata)`` calls are all a project needs: they declare the
tables on the metadata Alembic compares against, so ``alembic revision
--autogenerate`` writes (or checks) their migration like any other table's.
Then set ``elarion_beat_create_table = False``: beat runs no DDL, and refuses to
start, naming the table, if a migration has not created it.
"""

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import MetaData, engine_from_config, pool

from celery_elarion_beat import (
    audit_table,
    claims_table,
    entries_table,
    foreign_beats_table,
    nodes_table,
    one_offs_table,
    pauses_table,
    revisions_table,
    versions_table,
)

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name)

# In a real project this is your models' metadata (for example Base.metadata).
target_metadata = MetaData()
# Same names as beat's defaults (elarion_beat_table / elarion_beat_nodes_table; the pauses
# and audit tables are named after the claims table). If you set elarion_beat_schema,
# pass schema="..." to all nine and to the migration.
claims_table(target_metadata)  # elarion_scheduler_claims
nodes_table(target_metadata)   # elarion_scheduler_nodes
pauses_table(target_metadata)  # elarion_scheduler_pauses: elarion-beat pause
audit_table(target_metadata)   # elarion_scheduler_audit: who paused, resumed, triggered
one_offs_table(target_metadata)  # elarion_scheduler_oneoffs: schedule_once
foreign_beats_table(target_metadata)  # elarion_scheduler_foreign_beats: status, foreign-beat
# live schedules (elarion_beat_db_entries); their triggers are in a migration of their own
entries_table(target_metadata)    # elarion_scheduler_entries
revisions_table(target_metadata)  # elarion_scheduler_revisions: the audit, the change feed
versions_table(target_metadata)   # elarion_scheduler_versions

url = os.environ.get("ALEMBIC_DATABASE_URL")
if url:
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))


def run_migrations_offline() -> None:
    """``alembic upgrade head --sql``: print the DDL instead of running it."""
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True,
                      dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        connectable = engine_from_config(config.get_section(config.config_ini_section, {}),
                                         prefix="sqlalchemy.", poolclass=pool.NullPool)
        with connectable.connect() as connection:
            _run(connection)
    else:  # a connection handed in by the caller (tests, a deploy script)
        _run(connectable)


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
