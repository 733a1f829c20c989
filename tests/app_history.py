"""An application's own Alembic history in a live database, as a client's database already has one.

The Python kits keep their history in a version table of their own (`<project_slug>_alembic_version`), so that
`alembic upgrade head` in the kit works beside the application's `alembic_version` and leaves it alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from services import psql

APP = Path(__file__).resolve().parent / "alembic_host"
APP_REVISION = "a1b2c3d4e5f6"


def alembic(cwd: Path, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`alembic <args>` run in cwd on database_url; fails the test with Alembic's output when it fails."""
    env = {**os.environ, "DATABASE_URL": database_url}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"alembic {' '.join(args)} in {cwd}:\n{result.stdout}{result.stderr}"
    return result


def give_app_history(database_url: str) -> None:
    """Migrates the application's own history (a customers table) into the database, and adds a customer."""
    alembic(APP, database_url, "upgrade", "head")
    psql("INSERT INTO customers (email) VALUES ('customer@example.com')", database=database_url.rsplit("/", 1)[1])


def versions(database: str) -> dict[str, str]:
    """Every Alembic version table in the database and the revision it holds."""
    tables = psql(
        "SELECT table_name FROM information_schema.tables WHERE table_name LIKE '%alembic_version' ORDER BY 1",
        database=database,
    ).split()
    return {table: psql(f"SELECT version_num FROM {table}", database=database).strip() for table in tables}


def assert_app_history_intact(database_url: str) -> None:
    """The application's history is where it was, and its table still holds its customer."""
    database = database_url.rsplit("/", 1)[1]
    assert versions(database).get("alembic_version") == APP_REVISION, versions(database)
    assert psql("SELECT count(*) FROM customers", database=database).strip() == "1"
