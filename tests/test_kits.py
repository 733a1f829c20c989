"""The harness: for every combination whose queue system has a kit, run the kit's own suite, embedded and live,
then read the replay-report.json it wrote and hold it to the data. Also run each kit's own linters.

A queue system without a kit yet contributes no test here; once its kit exists, every combination runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from generate import with_cookiecutter
from matrix import combinations, combo_id, expected

# How each language's kit runs its suite and its linters, from the kit's root.
SUITES = {
    "python": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
    "ruby": ["rspec"],
}
LINTERS = {
    "python": [[sys.executable, "-m", "ruff", "check", "."], [sys.executable, "-m", "ruff", "format", "--check", "."]],
    "ruby": [["rubocop", "--no-server", "--cache", "false"]],
}
POSTGRES = "postgresql://postgres@127.0.0.1:5432"
REDIS = "redis://127.0.0.1:6379"


def kit_language(kit: Path) -> str | None:
    """python, ruby, or None while the kit holds only the documents (no suite yet)."""
    if (kit / "pyproject.toml").exists():
        return "python"
    if (kit / "Gemfile").exists():
        return "ruby"
    return None


def _languages() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        found = {
            queue: kit_language(with_cookiecutter(Path(scratch) / queue, {"queue_system": queue}))
            for queue in sorted({combo["queue_system"] for combo in combinations()})
        }
    return {queue: language for queue, language in found.items() if language}


LANGUAGES = _languages()
WITH_KIT = [combo for combo in combinations() if combo["queue_system"] in LANGUAGES]


def _worker_number() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql],
        check=True,
        capture_output=True,
        timeout=60,
    )


def live_services(name: str) -> dict[str, str]:
    """A fresh PostgreSQL database and a Redis database of this xdist worker's own, for one live run."""
    _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _psql(f"CREATE DATABASE {name}")
    redis_db = 10 + _worker_number()
    subprocess.run(["redis-cli", "-n", str(redis_db), "FLUSHDB"], check=True, capture_output=True, timeout=30)
    return {
        "DATABASE_URL": f"{POSTGRES}/{name}",
        "CELERY_BROKER_URL": f"{REDIS}/{redis_db}",
        "REDIS_URL": f"{REDIS}/{redis_db}",
    }


@pytest.mark.parametrize("mode", ["embedded", "live"])
@pytest.mark.parametrize("combo", WITH_KIT, ids=combo_id)
def test_kit_suite_proves_the_policy(tmp_path: Path, combo: dict[str, str], mode: str) -> None:
    kit = with_cookiecutter(tmp_path, combo)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")}
    database = f"rm_kit_{combo_id(combo).replace('-', '_')}"
    if mode == "live":
        env |= live_services(database)
    started = time.monotonic()
    try:
        result = subprocess.run(
            SUITES[LANGUAGES[combo["queue_system"]]],
            cwd=kit,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        if mode == "live":
            _psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    print(f"{combo_id(combo)} {mode}: suite passed in {seconds:.1f} s")

    report = json.loads((kit / "replay-report.json").read_text())
    assert {k: report[k] for k in ("queue_system", "effect_kind", "stale_claim_policy")} == combo
    assert report["mode"] == mode
    assert report["database"] == ("postgresql" if mode == "live" else "sqlite")
    rows = report["rows"]
    assert [row["case"] for row in rows] == [1, 2, 3, 4, 5, 6, 7]
    for row, want in zip(rows, expected(combo["effect_kind"], combo["stale_claim_policy"]), strict=True):
        assert row["attempt"] == want["attempt"]
        assert row["expected"] == {"emails": want["emails"], "record": want["record"]}, row
        assert row["observed"] == row["expected"], row
        assert row["passed"] is True, row


@pytest.mark.parametrize("combo", WITH_KIT, ids=combo_id)
def test_kit_passes_its_own_linters(tmp_path: Path, combo: dict[str, str]) -> None:
    kit = with_cookiecutter(tmp_path, combo)
    for command in LINTERS[LANGUAGES[combo["queue_system"]]]:
        assert shutil.which(command[0]), f"{command[0]} is not installed"
        result = subprocess.run(command, cwd=kit, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, " ".join(command) + "\n" + result.stdout[-4000:] + result.stderr[-2000:]
