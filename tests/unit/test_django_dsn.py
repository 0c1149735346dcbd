"""elarion_beat_django_database: Django's DATABASES[alias] -> the claims DSN."""

from __future__ import annotations

from typing import Any

import pytest

from celery_elarion_beat import ConfigurationError, Settings
from celery_elarion_beat.config.django_dsn import dsn_from_databases

PG = "django.db.backends.postgresql"


def dsn(db: dict[str, Any], alias: str = "default") -> str:
    return dsn_from_databases(alias, {alias: db})


def test_postgresql_with_credentials_port_and_libpq_options() -> None:
    url = dsn({"ENGINE": PG, "NAME": "app", "USER": "beat", "PASSWORD": "p@ss/w:rd",
               "HOST": "db.internal", "PORT": "6432",
               "OPTIONS": {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem",
                           "isolation_level": 2, "pool": {"min_size": 2}}})
    # the password is quoted; Django's own OPTIONS (isolation_level, pool) are left out
    assert url == ("postgresql://beat:p%40ss%2Fw%3Ard@db.internal:6432/app"
                   "?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem")
    settings = Settings.from_mapping({"elarion_beat_dsn": url})
    assert settings.dsn is not None and settings.dsn.startswith("postgresql+psycopg://beat:")
    assert settings.safe_dsn == ("postgresql+psycopg://beat:***@db.internal:6432/app"
                                 "?sslmode=verify-full&sslrootcert=/etc/ca.pem")


def test_postgresql_over_a_unix_socket_and_without_credentials() -> None:
    assert dsn({"ENGINE": "django.db.backends.postgresql_psycopg2", "NAME": "app",
                "HOST": "/var/run/postgresql", "PORT": ""}) == \
        "postgresql:///app?host=%2Fvar%2Frun%2Fpostgresql"


def test_mysql_with_charset_and_ssl() -> None:
    assert dsn({"ENGINE": "django.db.backends.mysql", "NAME": "app", "USER": "u",
                "PASSWORD": "x", "HOST": "maria", "PORT": 3306,
                "OPTIONS": {"charset": "utf8mb4", "ssl": {"ca": "/ca.pem"},
                            "init_command": "SET sql_mode='STRICT_TRANS_TABLES'"}}) == \
        "mysql://u:x@maria:3306/app?charset=utf8mb4&ssl_ca=%2Fca.pem"


def test_sqlite_file_made_absolute_and_memory_refused(tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert dsn({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}) == \
        f"sqlite:///{tmp_path}/db.sqlite3"
    with pytest.raises(ConfigurationError, match="elarion_beat_django_database = 'default': "
                                                 "its SQLite NAME ':memory:' is not a file"):
        dsn({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})


def test_a_missing_alias_names_the_setting_and_the_aliases_there_are() -> None:
    with pytest.raises(ConfigurationError) as caught:
        dsn_from_databases("claims", {"default": {"ENGINE": PG}, "replica": {"ENGINE": PG}})
    assert str(caught.value) == (
        "elarion_beat_django_database = 'claims', but Django's DATABASES has no such alias "
        "(it has 'default', 'replica'); name one of them")
    assert isinstance(caught.value, ValueError)


def test_an_unsupported_engine_names_it_and_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"its ENGINE 'django\.db\.backends\.oracle' "
                                                 r"is not supported.*set elarion_beat_dsn"):
        dsn({"ENGINE": "django.db.backends.oracle", "NAME": "xe"})


def test_a_port_that_is_no_number_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="its PORT 'fivefour' is not a number"):
        dsn({"ENGINE": PG, "NAME": "app", "PORT": "fivefour"})


def test_the_setting_without_configured_django_settings_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    if settings.configured:  # pragma: no cover - another test left Django configured
        pytest.fail("Django's settings are configured in this process: a test leaked them")
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    with pytest.raises(ConfigurationError, match="elarion_beat_django_database = 'default', "
                                                 "but Django's settings are not configured"):
        Settings.from_mapping({"elarion_beat_django_database": "default"})


def test_elarion_beat_dsn_wins_over_the_django_database() -> None:
    settings = Settings.from_mapping({"elarion_beat_django_database": "default",
                                      "elarion_beat_dsn": "memory://"})
    assert settings.dsn == "memory://"  # Django is never asked


def test_same_database_compares_where_two_dsns_connect() -> None:
    from celery_elarion_beat.config.django_dsn import same_database

    base = "postgresql://beat:secret@db.internal/app"
    assert same_database(base, "postgresql+psycopg://other@db.internal:5432/app?sslmode=require")
    assert same_database("postgresql://u@127.0.0.1/app", "postgres://v@localhost:5432/app")
    assert not same_database(base, "postgresql://beat@db.internal/app2")
    assert not same_database(base, "postgresql://beat@db.internal:6432/app")  # a pooler
    assert not same_database(base, "mysql://beat@db.internal/app")
    assert same_database("sqlite:////tmp/a.db", "sqlite:////tmp/../tmp/a.db")
    assert not same_database("memory://", "memory://")  # no database to share


def test_django_alias_of_finds_the_claims_database_among_databases() -> None:
    from celery_elarion_beat.config.django_dsn import django_alias_of

    databases = {"replica": {"ENGINE": PG, "NAME": "app", "HOST": "db.internal"},
                 "default": {"ENGINE": PG, "NAME": "app", "HOST": "db.internal"},
                 "cache": {"ENGINE": "django.db.backends.dummy"}}
    assert django_alias_of("postgresql://beat@db.internal/app", databases) == "default"
    assert django_alias_of("postgresql://beat@elsewhere/app", databases) is None
