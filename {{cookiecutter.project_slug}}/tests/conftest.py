{%- set q = cookiecutter.queue_system -%}
"""The replay suite's shared fixtures: the mode, the database, and where effects are counted.

Two modes, chosen by the environment:
- embedded (the default): a SQLite file and workers in this process; no servers needed.
- live: DATABASE_URL (PostgreSQL){{ " and CELERY_BROKER_URL (Redis)" if q == "celery" else "" }} set: real services and real
  worker processes. Point them at an empty test database: the suite creates its tables and deletes its rows.

How the queue is driven (deliver, deliver twice at once, die at a crash point, redeliver, sweep) lives in
{{ q }}_driver.py, which provides the `driver` fixture. Live, the worker processes reach PostgreSQL through a TCP
proxy (db_proxy.py) that the fault tests stop and start; the fault tests (test_faults*.py) are part of the live
suite only (SQLite has no server to lose), so embedded they are not collected at all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from alembic import command
from alembic.config import Config
from db_proxy import DbProxy
from sinks import Effects
from sqlalchemy import Engine, text

from {{ cookiecutter.project_slug }} import settings
from {{ cookiecutter.project_slug }}.claims import (
    RESOLUTIONS_TABLE,
    ClaimStore,
    connect,
    default_store,
    fingerprint,
    use_default_store,
)

# the queue's driver, and the reports written after every run (replay_reports.py)
pytest_plugins = ["{{ q }}_driver", "replay_reports"]

KIT_ROOT = Path(__file__).resolve().parents[1]
# what a command of the kit run by the suite imports from: the kit, then what the suite's process had (a host
# project's package, whose settings the commands load)
KIT_PYTHONPATH = os.pathsep.join([str(KIT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])
LIVE = bool(os.environ.get("DATABASE_URL"))
TABLE = settings.RECORD_TABLE
collect_ignore_glob = [] if LIVE else ["test_faults*.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "embedded_only: uses no live service (SQLite files of its own, workers that refuse to start"
        " before they connect); the embedded suite runs it, the live one leaves it out",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Live, the tests marked embedded_only are left out (deselected, not skipped): they would prove again what
    the embedded suite, which runs them, has proven; the live suite keeps what needs the live services."""
    if not LIVE:
        return
    left_out = [item for item in items if item.get_closest_marker("embedded_only")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("embedded_only")]


def migrate() -> None:
    """alembic upgrade head on DATABASE_URL: the suite runs on the migration, which must match schema.sql."""
    if os.environ.get("REPLAY_HOST_APP"):
        return  # the suite runs inside a host app, whose own migrations made the tables (manage.py migrate)
    config = Config(str(KIT_ROOT / "alembic.ini"))
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")


# Databases the kit cannot use, by the revision they were migrated to (None: not at all), and the line that says so.
UNUSABLE_DATABASES = [
    pytest.param(None, f"the table {TABLE} does not exist: run the kit's migration (alembic", id="no table"),
    pytest.param(
        "0002", f"the table {TABLE} is not at revision 0003 (no queued or failed records)", id="revision 0002"
    ),
    pytest.param("0003", f"the table {TABLE} is not at revision 0004 (no {RESOLUTIONS_TABLE})", id="revision 0003"),
]


def database_at(tmp_path: Path, revision: str | None) -> str:
    """The URL of a new SQLite database migrated up to `revision` (None: not at all), as `alembic upgrade` does."""
    url = f"sqlite:///{tmp_path / 'not-migrated.sqlite3'}"
    if revision:
        config = Config(str(KIT_ROOT / "alembic.ini"))
        config.attributes["configure_logger"] = False
        with mock.patch.dict(os.environ, {"DATABASE_URL": url}):
            command.upgrade(config, revision)
    return url


@contextlib.contextmanager
def store_on(url: str) -> Iterator[ClaimStore]:
    """The kit's store on the database at `url` for this process (default_store), as a command started with
    DATABASE_URL=url has it; then the suite's store again."""
    suite_store = default_store()
    with mock.patch.dict(os.environ, {"DATABASE_URL": url}):  # read as a command reads it (settings.database_url)
        store = ClaimStore(connect())
    use_default_store(lambda: store)
    try:
        yield store
    finally:
        use_default_store(lambda: suite_store)
        store.engine.dispose()


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if not LIVE:
        # WAL needs a real file, and worker processes forked from this one share it
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp_path_factory.mktemp('db') / 'replay.sqlite3'}"
    migrate()
    engine = default_store().engine
    with engine.connect() as conn:
        if conn.execute(text(f"SELECT count(*) FROM {TABLE}")).scalar_one():
            pytest.exit(f"{TABLE} holds rows: DATABASE_URL must point at an empty test database", returncode=2)
    yield engine
    Records(engine).clear()
    engine.dispose()


@pytest.fixture(scope="session")
def database_proxy(engine: Engine) -> Iterator[DbProxy | None]:
    """Live: the proxy in front of PostgreSQL that the worker processes go through (the driver gives them its URL)."""
    if not LIVE:
        yield None
        return
    proxy = DbProxy(os.environ["DATABASE_URL"]).start()
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def effects(engine: Engine) -> Iterator[Effects]:
{%- if cookiecutter.effect_kind == "same_database" %}
    sink = Effects(engine)
{%- else %}
    sink = Effects()
{%- endif %}
    sink.start()
    # workers in this process read these; worker processes get them from the driver
    os.environ.update(sink.env())
    yield sink
    sink.stop()


class Records:
    """Reads and ages the record table, in SQL, with the database's clock."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def status(self, key: str) -> str:
        """The record's status, or "none" when there is no record."""
        with self.engine.connect() as conn:
            status = conn.execute(
                text(f"SELECT status FROM {TABLE} WHERE job_type = :job_type AND operation_key = :key"),
                {"job_type": settings.JOB_TYPE, "key": key},
            ).scalar_one_or_none()
        return status or "none"

    def row(self, key: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = conn.execute(
                text(f"SELECT * FROM {TABLE} WHERE job_type = :job_type AND operation_key = :key"),
                {"job_type": settings.JOB_TYPE, "key": key},
            ).one()
        return dict(row._mapping)

    def count(self, status: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text(f"SELECT count(*) FROM {TABLE} WHERE job_type = :job_type AND status = :status"),
                    {"job_type": settings.JOB_TYPE, "status": status},
                ).scalar_one()
            )

    def stale_claim(self, key: str, details: dict[str, Any]) -> str:
        """A claim older than the lease whose worker died and whose message never came back; its token."""
        token = default_store().claim(key, fingerprint(key, details), details)
        assert token is not None, f"{key!r} was claimed already"
        self.age(key)
        return token

    def age(self, key: str) -> None:
        """Moves the claim back past the lease (lease + 1 s), as if the lease had run out."""
        assert default_store().age(key, settings.LEASE_SECONDS + 1), f"no record of {key!r} to age"

    def database_role(self) -> str | None:
        """The role the database sees the kit's connections as (None on SQLite, which has no roles)."""
        role = default_store().clock.role
        if role == "NULL":
            return None
        with self.engine.connect() as conn:
            return str(conn.execute(text(f"SELECT {role}")).scalar_one())

    def clear(self) -> None:
        with self.engine.begin() as conn:
            for table in (TABLE, RESOLUTIONS_TABLE):
                conn.execute(text(f"DELETE FROM {table} WHERE job_type = :job_type"), {"job_type": settings.JOB_TYPE})


@pytest.fixture(scope="session")
def records(engine: Engine) -> Records:
    return Records(engine)


@pytest.fixture(autouse=True)
def clean_slate(records: Records, effects: Effects, database_proxy: DbProxy | None) -> None:
    """Each test starts with no record and no effect, and with the database within the workers' reach."""
    records.clear()
    effects.reset()
    if database_proxy is not None:
        database_proxy.start()
