"""Settings: read once, validated, errors name the setting."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from celery import Celery

from celery_elarion_beat import ConfigurationError, Settings
from celery_elarion_beat.config.dsn import mask_dsn
from celery_elarion_beat.config.settings import SETTINGS, reference_table


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
    ("elarion_beat_flower_operators", 3, "elarion_beat_flower_operators"),
    ("elarion_beat_flower_operators", ["alice", None], "elarion_beat_flower_operators"),
    ("elarion_beat_flower_operators", {"alice": True}, "elarion_beat_flower_operators"),
])
def test_bad_values_name_the_setting(key: str, value: object, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named) as info:
        Settings.from_app(app_with(**{key: value}), environ={})
    assert isinstance(info.value, ValueError)


def test_flower_operators_a_list_or_a_comma_separated_string() -> None:
    assert Settings.from_app(app_with(), environ={}).flower_operators == ()
    listed = app_with(elarion_beat_flower_operators=["alice", " *@example.com ", ""])
    assert Settings.from_app(listed, environ={}).flower_operators == ("alice", "*@example.com")
    assert Settings.from_app(app_with(elarion_beat_flower_operators={"b", "a"}),
                             environ={}).flower_operators == ("a", "b")
    env = {"ELARION_BEAT_FLOWER_OPERATORS": "ops-*, carol,,"}
    assert Settings.from_app(app_with(), environ=env).flower_operators == ("ops-*", "carol")
    assert Settings.from_app(app_with(elarion_beat_flower_operators=[]),
                             environ={}).flower_operators == ()


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


def test_a_renamed_setting_keeps_its_old_name_with_one_warning(caplog) -> None:
    """``elarion_beat_one_off_poll`` (before the one spelling, ``one_offs``) still
    sets ``one_offs_poll``; the new name wins when both are set; one WARNING per old
    name names the new one."""
    from celery_elarion_beat.config import settings as settings_module

    settings_module._WARNED.discard("elarion_beat_one_off_poll")
    with caplog.at_level("WARNING", logger="celery_elarion_beat.config.settings"):
        old = Settings.from_mapping({"elarion_beat_dsn": "memory://",
                                     "elarion_beat_one_off_poll": 7})
        again = Settings.from_mapping({"elarion_beat_dsn": "memory://",
                                       "elarion_beat_one_off_poll": 7})
        both = Settings.from_mapping({"elarion_beat_dsn": "memory://",
                                      "elarion_beat_one_off_poll": 7,
                                      "elarion_beat_one_offs_poll": 3})
    assert old.one_offs_poll == again.one_offs_poll == 7.0
    assert both.one_offs_poll == 3.0
    lines = [r.getMessage() for r in caplog.records if "one_off_poll" in r.getMessage()]
    assert len(lines) == 1 and "elarion_beat_one_offs_poll" in lines[0]


def test_the_cluster_is_the_apps_main_name_unless_set() -> None:
    from celery_elarion_beat.config.settings import DEFAULT_CLUSTER

    app = Celery("proj", set_as_current=False)
    assert Settings.from_app(app, environ={}).cluster == "proj"
    # the environment, then app.conf, win over the main name (staging vs production)
    assert Settings.from_app(app, environ={"ELARION_BEAT_CLUSTER": "proj-staging"}
                             ).cluster == "proj-staging"
    app.conf.elarion_beat_cluster = "proj-prod"
    assert Settings.from_app(app, environ={"ELARION_BEAT_CLUSTER": "x"}).cluster == "proj-prod"
    # no app to derive it from: the mapping's, else the default
    assert Settings.from_mapping({}).cluster == DEFAULT_CLUSTER
    assert Settings.from_mapping({"elarion_beat_cluster": "svc_b"}).cluster == "svc_b"


@pytest.mark.parametrize("main", [None, "", "__main__"])
def test_no_main_name_and_no_cluster_is_refused_when_a_store_opens(main: str | None) -> None:
    from celery_elarion_beat import open_store

    app = Celery(main, set_as_current=False)
    app.conf.elarion_beat_dsn = "memory://"
    settings = Settings.from_app(app, environ={})
    assert settings.cluster is None
    with pytest.raises(ConfigurationError, match="elarion_beat_cluster is not set"):
        settings.require_cluster()
    with pytest.raises(ConfigurationError, match="ELARION_BEAT_CLUSTER"):
        open_store(settings)
    named = Settings.from_app(app, environ={"ELARION_BEAT_CLUSTER": "proj"})
    assert open_store(named).cluster == "proj"


@pytest.mark.parametrize(("value", "why"), [
    ("x" * 65, "more than the limit of 64"), ("a\tb", "control character"),
    ("a\x00b", "control character"), (" proj", "space"), ("proj ", "space")])
def test_a_bad_cluster_name_is_refused_naming_the_setting(value: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"elarion_beat_cluster = .*{why}"):
        Settings.from_mapping({"elarion_beat_cluster": value})
    app = Celery(value.replace("\x00", ""), set_as_current=False) if "\x00" not in value \
        else None
    if app is not None:  # a main name that cannot be a cluster: named too, with the fix
        with pytest.raises(ConfigurationError, match="the Celery app's main name"):
            Settings.from_app(app, environ={})
        assert Settings.from_app(app, environ={"ELARION_BEAT_CLUSTER": "ok"}).cluster == "ok"
    assert Settings.from_mapping({"elarion_beat_cluster": "x" * 64}).cluster == "x" * 64
