"""The Python kits' migration beside an application's own Alembic history in the same database.

Before the kits kept a version table of their own, `alembic upgrade head` on such a database failed with
"Can't locate revision identified by 'a1b2c3d4e5f6'". Every live run of a Python kit (tests/test_kits.py) also
starts from a database with the application's history; this test follows the README's command and goes back down.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from app_history import APP_REVISION, alembic, assert_app_history_intact, give_app_history, versions
from generate import baked
from services import postgres_database, psql
from test_kits import run_name


@pytest.mark.live
@pytest.mark.parametrize("queue_system", ["celery", "sqs"])
def test_kit_migrates_beside_an_app_history(request: pytest.FixtureRequest, tmp_path: Path, queue_system: str) -> None:
    kit = baked(tmp_path, {"queue_system": queue_system})
    with postgres_database(run_name(request)) as url:
        database = url.rsplit("/", 1)[1]
        give_app_history(url)

        alembic(kit, url, "upgrade", "head")
        assert versions(database) == {"alembic_version": APP_REVISION, "order_confirmation_alembic_version": "0004"}
        assert psql("SELECT count(*) FROM handled_operations", database=database).strip() == "0"
        assert_app_history_intact(url)
        # the application goes on with its own history as before
        assert APP_REVISION in alembic(Path(__file__).parent / "alembic_host", url, "current").stdout

        alembic(kit, url, "downgrade", "base")
        assert "handled_operations" not in psql("SELECT tablename FROM pg_tables", database=database).split()
        assert_app_history_intact(url)
