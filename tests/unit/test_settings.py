"""Settings: read once, validated, errors name the setting."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from celery import Celery

from celery_elarion_beat import ConfigurationError, Settings
from celery_elarion_beat.settings import SETTINGS, mask_dsn, reference_table


def app_with(**conf: object) -> Celery:
    app = Celery("settings", broker="memory://", set_as_current=False)
    app.conf.update(**conf)
    return app


def test_defaults() -> None:
    s = Settings.from_app(app_with(), environ={})
    assert s.dsn is None and s.node == socket.gethostname()
    assert (s.table, s.schema, s.create_table) == ("elarion_scheduler_claims", None, True)
    assert (s.claim_timeout, s.window_tolerance) == (5.0, 1.0)


def test_app_conf_wins_over_the_environment() -> None:
    s = Settings.from_app(app_with(elarion_beat_node="conf-node"),
                          environ={"ELARION_BEAT_NODE": "env-node",
                                   "ELARION_BEAT_TABLE": "env_table"})
    assert s.node == "conf-node" and s.table == "env_table"


def test_environment_values_are_parsed() -> None:
    s = Settings.from_app(app_with(), environ={
        "ELARION_BEAT_DSN": "postgres://u:p@db:5432/x", "ELARION_BEAT_CREATE_TABLE": "false",
        "ELARION_BEAT_CLAIM_TIMEOUT": "2.5", "ELARION_BEAT_SCHEMA": "ops"})
    assert s.dsn == "postgresql+psycopg://u:p@db:5432/x"
    assert s.create_table is False and s.claim_timeout == 2.5
    assert s.qualified_table == "ops.elarion_scheduler_claims"


def test_django_style_namespace_is_honoured() -> None:
    app = app_with()
    app.namespace = "CELERY"
    app.conf.update(CELERY_ELARION_BEAT_NODE="ns-node")
    assert Settings.from_app(app, environ={}).node == "ns-node"


@pytest.mark.parametrize(("key", "value", "named"), [
    ("elarion_beat_table", "claims; drop table x", "elarion_beat_table"),
    ("elarion_beat_schema", "1ops", "elarion_beat_schema"),
    ("elarion_beat_create_table", "maybe", "elarion_beat_create_table"),
    ("elarion_beat_claim_timeout", "soon", "elarion_beat_claim_timeout"),
    ("elarion_beat_claim_timeout", 0, "elarion_beat_claim_timeout"),
    ("elarion_beat_window_tolerance", -1, "elarion_beat_window_tolerance"),
    ("elarion_beat_node", "has space", "elarion_beat_node"),
    ("elarion_beat_dsn", "oracle://scott@db/x", "elarion_beat_dsn"),
    ("elarion_beat_dsn", "mysql+mysqldb://root@db/x", "PyMySQL"),
    ("elarion_beat_dsn", "sqlite://", "sqlite:////path"),
    ("elarion_beat_dsn", "postgresql+psycopg2://u@db/x", "psycopg"),
    ("elarion_beat_dsn", "not a url", "elarion_beat_dsn"),
])
def test_bad_values_name_the_setting(key: str, value: object, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named) as info:
        Settings.from_app(app_with(**{key: value}), environ={})
    assert isinstance(info.value, ValueError)


def test_passwords_are_masked_and_kept_out_of_repr() -> None:
    s = Settings.from_mapping({"elarion_beat_dsn": "postgresql://beat:s3cret@db/prod"})
    assert "s3cret" not in repr(s) and "s3cret" not in s.safe_dsn
    assert mask_dsn(s.dsn) == "postgresql+psycopg://beat:***@db/prod"


def test_every_setting_is_documented() -> None:
    """The reference page holds the table SETTINGS renders, verbatim (regenerate it with
    `python -m celery_elarion_beat.settings`)."""
    page = (Path(__file__).parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert reference_table() in page
    for setting in SETTINGS:
        assert f"`{setting.key}`" in page and f"`{setting.env}`" in page, setting.key


@pytest.mark.parametrize(("dsn", "masked"), [
    ("postgresql://postgres@127.0.0.1:5432/test?password=s3cret",
     "postgresql://postgres@127.0.0.1:5432/test?password=***"),
    ("postgresql://u:URLSECRET@h/db?password=QUERYSECRET",
     "postgresql://u:***@h/db?password=***"),
    ("mysql://root@h/db?passwd=s3cret", "mysql://root@h/db?passwd=***"),
    ("postgresql://u@h/db?sslmode=require&sslpassword=s3cret&application_name=beat",
     "postgresql://u@h/db?sslmode=require&sslpassword=***&application_name=beat"),
    ("postgresql://u@h/db?PASSWORD=s3cret&Api_Token=s3cret&client_secret=s3cret&PWD=s3cret",
     "postgresql://u@h/db?PASSWORD=***&Api_Token=***&client_secret=***&PWD=***"),
    ("postgresql://u@h/db?password=a&password=s3cret", "postgresql://u@h/db?password=***"),
    ("postgresql://u@h/db?password=s3%26cret%3D%20x", "postgresql://u@h/db?password=***"),
])
def test_credentials_in_query_parameters_are_masked(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert "s3" not in mask_dsn(dsn) and "SECRET" not in mask_dsn(dsn)


def test_query_parameters_without_credentials_are_kept_as_given() -> None:
    dsn = "postgresql://u@/db?host=/var/run/postgresql&connect_timeout=5&options=-c%20x%3Dy"
    assert mask_dsn(dsn) == dsn


def test_a_password_query_parameter_stays_out_of_the_settings_repr() -> None:
    s = Settings.from_mapping({"elarion_beat_dsn": "postgresql://beat@db/prod?password=s3cret"})
    assert "s3cret" not in repr(s) and "s3cret" not in s.safe_dsn
    assert s.safe_dsn == "postgresql+psycopg://beat@db/prod?password=***"


@pytest.mark.parametrize(("dsn", "url"), [
    ("host=db.internal port=6432 user=beat password=s3cret dbname=app sslmode=require",
     "postgresql+psycopg://beat:s3cret@db.internal:6432/app?sslmode=require"),
    ("host=/var/run/postgresql dbname=app",
     "postgresql+psycopg:///app?host=%2Fvar%2Frun%2Fpostgresql"),
    ("host=a,b port=5432,5433 user=beat dbname=app",
     "postgresql+psycopg://beat@/app?host=a%2Cb&port=5432%2C5433"),
])
def test_libpq_key_value_dsns_become_postgresql_urls(dsn: str, url: str) -> None:
    settings = Settings.from_mapping({"elarion_beat_dsn": dsn})
    assert settings.dsn == url
    assert "s3cret" not in settings.safe_dsn and "s3cret" not in repr(settings)


def test_a_broken_key_value_dsn_names_the_setting_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError, match="elarion_beat_dsn is neither a URL nor") as err:
        Settings.from_mapping({"elarion_beat_dsn": "host=db password='s3cret"})
    assert "s3cret" not in str(err.value)
