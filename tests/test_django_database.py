"""The ledger's URL from a Django ``DATABASES`` entry (workledger.contrib.django.database):
plain Python, checked without a Django project, and read back the way the ledger reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from workledger.contrib.django.database import url_for
from workledger.errors import UsageError
from workledger.storage import sqlite_path

pytestmark = pytest.mark.unit

PG = "django.db.backends.postgresql"


def test_a_sqlite_name_becomes_the_absolute_file_the_ledger_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "with space, 100% and ?.db"
    url = url_for("default", {"ENGINE": "django.db.backends.sqlite3", "NAME": odd})
    assert url.startswith("sqlite:////")
    assert sqlite_path(url) == str(odd)
    monkeypatch.chdir(tmp_path)
    relative = url_for("default", {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})
    assert sqlite_path(relative) == str(tmp_path / "db.sqlite3")


@pytest.mark.parametrize("name", [":memory:", "file:memdb1?mode=memory&cache=shared", "", None])
def test_a_sqlite_database_no_worker_can_open_is_refused(name: str | None) -> None:
    with pytest.raises(UsageError, match="not a SQLite file.*WORKLEDGER_DB"):
        url_for("default", {"ENGINE": "django.db.backends.sqlite3", "NAME": name})


def test_a_postgres_entry_keeps_every_libpq_parameter_and_the_password_only_in_the_url() -> None:
    url = url_for("default", {
        "ENGINE": PG, "NAME": "shop db", "USER": "app@corp", "PASSWORD": "p@ss:w/rd?#%",
        "HOST": "db.internal", "PORT": 6432,
        "OPTIONS": {"sslmode": "require", "options": "-c search_path=ledger",
                    "server_side_binding": True, "pool": {"min_size": 2},
                    "isolation_level": 1},
    })
    info = conninfo_to_dict(url)
    assert info == {"user": "app@corp", "password": "p@ss:w/rd?#%", "host": "db.internal",
                    "port": "6432", "dbname": "shop db", "sslmode": "require",
                    "options": "-c search_path=ledger"}


@pytest.mark.parametrize(("host", "port", "expected"), [
    ("/var/run/postgresql", "5433", {"host": "/var/run/postgresql", "port": "5433"}),
    ("::1", "", {"host": "::1"}),
    ("", "", {}),
])
def test_a_postgres_host_may_be_a_socket_folder_an_ipv6_address_or_none(
        host: str, port: str, expected: dict[str, str]) -> None:
    url = url_for("default", {"ENGINE": PG, "NAME": "app", "USER": "u", "HOST": host,
                              "PORT": port})
    assert conninfo_to_dict(url) == {"user": "u", "dbname": "app", **expected}


def test_another_engine_is_refused_with_the_setting_to_use() -> None:
    with pytest.raises(UsageError, match=r"'legacy' uses django.db.backends.mysql.*WORKLEDGER_DB"):
        url_for("legacy", {"ENGINE": "django.db.backends.mysql", "NAME": "x"})
