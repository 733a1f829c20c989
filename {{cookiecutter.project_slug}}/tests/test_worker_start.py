{%- set slug = cookiecutter.project_slug -%}
"""A worker that would run the kit's task against the guarantee refuses to start, with one line.

Real `celery worker` processes on an existing app of a host (host_celery_app.py): one given a contradiction, one
started before the migration, one that keeps the guarantee. The worker refuses before it connects to the broker,
so none is needed. Every other contradiction, on Redis or on RabbitMQ, and every database the kit cannot use, goes
through the same check (worker_init's handler) in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from conftest import KIT_ROOT, UNUSABLE_DATABASES, database_at, store_on

from {{ slug }} import settings
from {{ slug }}.tasks import TASK_NAME, guarantee_problem, refuse_to_start_against_the_guarantee

# workers that refuse before they reach the broker or PostgreSQL: run by the embedded suite only
pytestmark = pytest.mark.embedded_only
LEASE = settings.LEASE_SECONDS
# what a host needs beside the task's own options; Redis (the broker is never reached)
GOOD = {
    "broker_url": "redis://127.0.0.1:1/0",
    "worker_prefetch_multiplier": 1,
    "broker_transport_options": {"visibility_timeout": 2 * LEASE},
}


def worker(conf: dict[str, Any], log: Path, settings_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # not CELERY_BROKER_URL, which Celery would take over the app's own broker_url; not a Django project's settings
    inherited = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env = {
        **inherited,
        "HOST_CELERY_CONF": json.dumps(conf),
        "PYTHONPATH": os.pathsep.join([str(KIT_ROOT / "src"), str(KIT_ROOT / "tests")]),
        **(settings_env or {}),
    }
    argv = [sys.executable, "-m", "celery", "-A", "host_celery_app", "worker", "-P", "solo", "-l", "INFO"]
    return subprocess.Popen(argv, cwd=KIT_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def refusal(conf: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    """The line that the check a worker runs at its start (worker_init) exits with, run in this process for a host
    app configured with `conf`: the same check, without a process's start for each contradiction (a real worker's
    refusal is proven by the tests that start one)."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery would take it over the app's own broker_url
    app = Celery("host", include=["{{ slug }}.tasks"])
    app.conf.update(conf)
    app.loader.import_default_modules()
    worker = SimpleNamespace(app=app, prefetch_multiplier=app.conf.worker_prefetch_multiplier)
    with pytest.raises(SystemExit) as exited:
        refuse_to_start_against_the_guarantee(sender=worker)
    return str(exited.value.code)


REFUSING = "{{ slug }}: refusing to start the worker: "


def test_a_worker_against_the_guarantee_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    """A real worker, its prefetch multiplier (which the worker computes from its options) against the guarantee."""
    log = tmp_path / "worker.log"
    line = "worker_prefetch_multiplier is 4; it must be 1"
    assert_refuses(worker(GOOD | {"worker_prefetch_multiplier": 4}, log), log, line)


@pytest.mark.parametrize(
    ("contradiction", "line"),
    [
        (
            {"task_annotations": {TASK_NAME: {"acks_late": False}}},
            f"{TASK_NAME} has acks_late=False (task_annotations?); it must be True",
        ),
        (
            {"task_annotations": {TASK_NAME: {"reject_on_worker_lost": False}}},
            f"{TASK_NAME} has reject_on_worker_lost=False (task_annotations?); it must be True",
        ),
        (
            {"task_annotations": {"*": {"time_limit": LEASE + 1}}},
            f"{TASK_NAME} has the hard time limit {LEASE + 1} s (task_time_limit, task_annotations?); it must be"
            f" the lease, {LEASE} s",
        ),
        (
            {"broker_transport_options": {"visibility_timeout": LEASE}},
            f"the Redis broker's visibility_timeout is {LEASE} s (broker_transport_options); it must be longer than"
            f" the lease, {LEASE} s",
        ),
    ],
    ids=["acks_late", "reject_on_worker_lost", "time_limit", "visibility_timeout"],
)
def test_each_contradiction_of_the_guarantee_is_refused(
    contradiction: dict[str, Any], line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert refusal(GOOD | contradiction, monkeypatch).startswith(REFUSING + line)


def test_a_worker_on_rabbitmq_whose_consumer_timeout_a_lease_outlasts_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RabbitMQ closes the channel of a delivery unacknowledged longer than its consumer_timeout: a task that waits
    for the end of a lease (a countdown held by the worker) must fit in it."""
    monkeypatch.setenv("CELERY_RABBITMQ_CONSUMER_TIMEOUT", str(LEASE))
    on_rabbitmq = GOOD | {"broker_url": "amqp://guest:guest@127.0.0.1:1//"}
    line = (
        f"RabbitMQ's consumer_timeout is {LEASE} s (CELERY_RABBITMQ_CONSUMER_TIMEOUT, default RabbitMQ's 1800 s);"
        f" it must be longer than the lease, {LEASE} s"
    )
    assert refusal(on_rabbitmq, monkeypatch).startswith(REFUSING + line)


def assert_refuses(process: subprocess.Popen[bytes], log: Path, line: str) -> None:
    assert process.wait(timeout=60) == 1
    output = log.read_text()
    refusals = [text for text in output.splitlines() if "refusing" in text]
    # one line, the last, and no traceback (a warning of Celery's own, e.g. about running as root, may precede it)
    assert refusals == [output.splitlines()[-1]] and "Traceback" not in output, output
    assert refusals[0].startswith(REFUSING + line), refusals[0]


def test_a_worker_started_before_the_migration_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    """A worker started before the migration takes no message (one it took would fail on the missing table): its
    messages wait in the queue for a worker started after it."""
    log = tmp_path / "worker.log"
    line = UNUSABLE_DATABASES[0].values[1]
    assert_refuses(worker(GOOD, log, {"DATABASE_URL": database_at(tmp_path, None)}), log, line)


@pytest.mark.parametrize(("revision", "line"), UNUSABLE_DATABASES)
def test_a_worker_on_a_database_the_kit_cannot_use_is_refused(
    tmp_path: Path, revision: str | None, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store_on(database_at(tmp_path, revision)):
        assert refusal(GOOD, monkeypatch).startswith(REFUSING + line)


def test_a_worker_that_keeps_the_guarantee_starts_and_runs_the_kits_tasks(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    # an in-memory broker, polled often: the worker starts without a server, and stops at once
    process = worker(GOOD | {"broker_url": "memory://", "broker_transport_options": {"polling_interval": 0.05}}, log)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert f". {TASK_NAME}\n" in log.read_text()


def test_the_visibility_timeout_is_checked_on_redis_only_the_consumer_timeout_on_rabbitmq_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RabbitMQ does not hand an unacknowledged message to another consumer after a timeout, Redis does; RabbitMQ
    closes the channel of a delivery unacknowledged too long, Redis does not."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)  # Celery would take it over the apps' own brokers
    monkeypatch.setenv("CELERY_RABBITMQ_CONSUMER_TIMEOUT", str(2 * LEASE))  # RabbitMQ's own default may be shorter
    short = {"worker_prefetch_multiplier": 1, "broker_transport_options": {"visibility_timeout": LEASE}}
    on_rabbitmq = Celery("host", include=["{{ slug }}.tasks"], broker="amqp://guest@127.0.0.1:1//")
    on_rabbitmq.conf.update(short)
    on_redis = Celery("host", include=["{{ slug }}.tasks"], broker="redis://127.0.0.1:1/0")
    on_redis.conf.update(short)
    on_redis.loader.import_default_modules()
    on_rabbitmq.loader.import_default_modules()
    assert guarantee_problem(on_rabbitmq, 1) is None
    assert f"visibility_timeout is {LEASE} s" in str(guarantee_problem(on_redis, 1))
    monkeypatch.setenv("CELERY_RABBITMQ_CONSUMER_TIMEOUT", str(LEASE))
    on_redis.conf.broker_transport_options = {"visibility_timeout": 2 * LEASE}
    assert guarantee_problem(on_redis, 1) is None
    assert f"consumer_timeout is {LEASE} s" in str(guarantee_problem(on_rabbitmq, 1))
