"""Helpers of the operations tests: settings for a table, the CLI through click."""

from __future__ import annotations

from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_elarion_beat import Settings

__all__ = ["invoke", "settings_for"]


def settings_for(pg_dsn: str, table: str, node: str = "node-a", **extra: object) -> Settings:
    return Settings.from_mapping({"elarion_beat_dsn": pg_dsn, "elarion_beat_table": table,
                                  "elarion_beat_node": node, **extra})


def invoke(*args: str, app: str = "tests.operate.proj_ops") -> tuple[int, str]:
    """``celery -A app elarion-beat *args``: the exit code and what it printed."""
    result = CliRunner().invoke(celery_cli, ["-A", app, "elarion-beat", *args],
                                catch_exceptions=False)
    return result.exit_code, result.output
