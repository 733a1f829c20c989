{%- set c = cookiecutter -%}
{%- set q = c.queue_system -%}
"""What the fault tests share: waiting for a condition, the database or the record table taken away, a worker
frozen, the runs of a message. The tests are test_faults.py (every kit) and, by where the effect lands,
test_faults_external_effect.py or test_faults_same_database.py."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from conftest import TABLE, Records
from db_proxy import DbProxy
from driving import DATABASE_ERRORS, LiveWorkers, Run
from sqlalchemy import text
{%- if q == "celery" %}

from {{ c.project_slug }} import tasks
{%- endif %}

T = TypeVar("T")
{%- if q == "celery" %}
# runs that meet the outage before the database comes back: more than a passing failure is retried
# (TRANSIENT_RETRIES), which was all a database outage used to get
OUTAGE_FAILURES = tasks.TRANSIENT_RETRIES + 2
{%- else %}
# receives that meet the outage before the database comes back: one by each consumer (or two invocations)
OUTAGE_FAILURES = 2
{%- endif %}


def until(found: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """What `found` returns once it is something; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (result := found()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
    return result


@contextlib.contextmanager
def database_gone(proxy: DbProxy) -> Iterator[None]:
    proxy.stop()
    try:
        yield
    finally:
        proxy.start()


@contextlib.contextmanager
def table_away(records: Records) -> Iterator[None]:
    """The record table renamed away, as a migration rolled back or a database restored from an older dump leave
    it: a running worker meets it missing."""
    with records.engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_away"))
    try:
        yield
    finally:
        with records.engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {TABLE}_away RENAME TO {TABLE}"))


def error_lines(workdir: Path, words: str) -> list[str]:
    """The ERROR lines of every worker's log that hold `words`."""
    lines = (line for log in workdir.glob("*.log") for line in log.read_text(errors="replace").splitlines())
    return [line for line in lines if "ERROR" in line and words in line]


def frozen_worker(driver: LiveWorkers) -> int:
    """The pid of the worker that took the freeze order, once SIGSTOP has stopped it at the crash point."""
    pid = driver.orders.paused_pid(timeout=30)
    until(lambda: stopped(pid), f"worker {pid} stopped")
    return pid


def stopped(pid: int) -> bool:
    """Whether the worker has stopped (SIGSTOP): its state, T, as the kernel (/proc) or else `ps` shows it."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():  # Linux
        state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else ""
    else:  # macOS
        state = subprocess.run(["ps", "-o", "state=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return state.startswith("T")


def final_run(driver: LiveWorkers, message: str, pid: int | None = None) -> Callable[[], Run | None]:
    """The run of the message that settled it for good (by the process `pid`, if given), once there is one."""
    return lambda: next((run for run in driver.runs(message) if run.final and pid in (None, run.pid)), None)


def outage_runs(driver: LiveWorkers, message: str, errors: str | tuple[str, ...] = DATABASE_ERRORS) -> list[Run] | None:
    """The message's runs, once OUTAGE_FAILURES of them were retried after one of `errors` (the database unreachable,
    unless said), or one settled it for good."""
    runs = driver.runs(message)
    enough = sum(run.state == "RETRY" and run.value.startswith(errors) for run in runs) >= OUTAGE_FAILURES
    return runs if enough or any(run.final for run in runs) else None
