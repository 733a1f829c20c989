{%- from "replay_matrix.jinja" import kind, policy with context -%}
{%- set c = cookiecutter -%}
{%- set q = c.queue_system -%}
{%- set p = c.stale_claim_policy -%}
{%- set one = kind.one_transaction -%}
"""Faults the seven cases do not name: the database gone at the claim or at the completion, the record table gone
under a running worker, a worker frozen past its lease, the sweeper racing a redelivery. Live only (conftest.py
does not collect this file embedded: SQLite has no server to lose).

The worker processes reach PostgreSQL through a TCP proxy (db_proxy.py), and the database is taken away from them
for real: the proxy stops, new connections are refused and open ones cut. A frozen worker is a real SIGSTOP. The
suite keeps its own connection, to read and age records. Effects are {{ kind.counted }},
counted where they arrive.
{%- if one %}

The effect is a row in the same database: the claim, the row and the completion share one transaction, so no
fault leaves a claim behind. The database gone at the completion, or a worker frozen inside its transaction,
leaves nothing another run could see or take over; the message, retried, performs it once. There is no stale
claim for the sweeper and a redelivery to race over, so the fourth fault does not apply here.
{%- endif %}
"""

from __future__ import annotations

import contextlib
{%- if not one %}
import multiprocessing
{%- endif %}
import os
import signal
import time
from collections.abc import Callable, Iterator
{%- if not one %}
from dataclasses import dataclass
{%- endif %}
from pathlib import Path
from typing import {{ "Any, " if not one else "" }}TypeVar

{% if not one -%}
import pytest
{% endif -%}
{% if q == "celery" -%}
from celery_driver import LiveDriver
{% endif -%}
from conftest import TABLE, Records
from db_proxy import DbProxy
from driving import DATABASE_ERRORS, {{ "RACERS, " if not one else "" }}LiveWorkers, Run{{ ", race" if not one else "" }}
from sinks import Effects
from sqlalchemy import text
{%- if q == "sqs" %}
from sqs_driver import ENTRY_POINT
{%- endif %}
from test_replay import DETAILS

from {{ c.project_slug }} import {{ "producer, tasks" if q == "celery" else "settings" }}
from {{ c.project_slug }}.claims import MIGRATE{{ ", default_store, fingerprint" if not one else "" }}
{%- if q == "sqs" %}
from {{ c.project_slug }}.consumer import database_backoff
{%- endif %}
{%- if not one %}
{%- endif %}

T = TypeVar("T")
{%- if q == "celery" %}
# runs that meet the outage before the database comes back: more than a passing failure is retried
# (TRANSIENT_RETRIES), which was all a database outage used to get
OUTAGE_FAILURES = tasks.TRANSIENT_RETRIES + 2
# the runs of a message that a passing failure meets every time: the first and its retries
TRANSIENT_RUNS = tasks.TRANSIENT_RETRIES + 1
{%- else %}
# receives that meet the outage before the database comes back: one by each consumer (or two invocations)
OUTAGE_FAILURES = 2
{%- endif %}
{%- if not one %}
# `{{ p }}`: the record after the lease, and the effects of case 6 (died after the effect) and case 5 (before it)
AFTER_LEASE = {{ policy.after_lease|tojson }}
EFFECTS_IN_CASE_6 = {{ policy.emails["6"] }}
EFFECTS_IN_CASE_5 = {{ policy.emails["5"] }}
# what the message that comes back after the lease does
ACTION_AFTER_LEASE = {{ {"hold": "held", "resend": "performed", "skip": "abandoned", "lookup": "skipped"}[p]|tojson }}
# stale claims the sweeper and a redelivery race over, one after the other
RACES = 6
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
    """Whether the worker, a child of this process, has stopped (its stop is reported once, and not reaped)."""
    waited, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    return waited == pid and os.WIFSTOPPED(status)


def final_run(driver: LiveWorkers, message: str, pid: int | None = None) -> Callable[[], Run | None]:
    """The run of the message that settled it for good (by the process `pid`, if given), once there is one."""
    return lambda: next((run for run in driver.runs(message) if run.final and pid in (None, run.pid)), None)


def outage_runs(driver: LiveWorkers, message: str, errors: str | tuple[str, ...] = DATABASE_ERRORS) -> list[Run] | None:
    """The message's runs, once OUTAGE_FAILURES of them were retried after one of `errors` (the database unreachable,
    unless said), or one settled it for good."""
    runs = driver.runs(message)
    enough = sum(run.state == "RETRY" and run.value.startswith(errors) for run in runs) >= OUTAGE_FAILURES
    return runs if enough or any(run.final for run in runs) else None


def test_the_database_unreachable_at_the_claim_loses_nothing(
    driver: LiveWorkers, database_proxy: DbProxy, effects: Effects, records: Records
) -> None:
    key = "FAULT-1"
    with database_gone(database_proxy):
        message = driver.send_message(key, DETAILS)
        # retried or kept, not acknowledged away, dead-lettered or given up
        runs = until(lambda: outage_runs(driver, message), "runs that met the database unreachable")
        assert not any(run.final for run in runs), f"given up during the outage: {runs[-1]}"
{%- if q == "sqs" %}
        if ENTRY_POINT == "consumer":
            # A consumer that met the outage receives nothing more until the database answers: the message,
            # visible again after its backoff, waits in the queue and spends no more of its receives.
            time.sleep(database_backoff(OUTAGE_FAILURES) + 1)
            runs = driver.runs(message)
            assert len(runs) == len({run.pid for run in runs}) == OUTAGE_FAILURES, runs
{%- endif %}
        assert (effects.count(key), records.status(key)) == (0, "none")
    done = until(final_run(driver, message), "the message performed once the database is back")
    assert (done.state, done.value) == ("SUCCESS", "performed")
    assert (effects.count(key), records.status(key)) == (1, "completed")
{%- if q == "sqs" %}
    # Through Lambda every return is a receive: growing threefold, the returns that the redrive policy's
    # maxReceiveCount allows a message span an outage of 20 hours before it would be dead-lettered.
    assert sum(database_backoff(n) for n in range(1, settings.max_receive_count() + 1)) >= 20 * 3600
{%- endif %}


def test_the_record_table_missing_under_a_running_worker_loses_nothing(
    driver: {{ "LiveDriver" if q == "celery" else "LiveWorkers" }}, effects: Effects, records: Records
) -> None:
    """A worker that started on a migrated database (it refuses to start on one without the table) meets the table
    gone: the message is kept and retried, never acknowledged away, and every run logs at ERROR what a person must
    do; once the table is back, it is performed once."""
    key = "FAULT-NO-TABLE"
    {%- if q == "celery" %}
    driver.wait_ready()
    {%- endif %}
    with table_away(records):
        message = driver.send_message(key, DETAILS)
        runs = until(lambda: outage_runs(driver, message, "ProgrammingError: "), "runs that met the table missing")
        assert not any(run.final for run in runs), f"given up while the table was missing: {runs[-1]}"
        assert effects.count(key) == 0
        errors = until(lambda: error_lines(driver.workdir, MIGRATE), "an ERROR line saying what to do", timeout=10)
        assert f'relation "{TABLE}" does not exist' in errors[0], errors[0]
    done = until(final_run(driver, message), "the message performed once the table is back")
    assert (done.state, done.value) == ("SUCCESS", "performed")
    assert (effects.count(key), records.status(key)) == (1, "completed")
{%- if q == "celery" and not one %}


def test_a_passing_failure_is_retried_a_few_times_only_then_waits_for_a_person(
    driver: LiveWorkers, effects: Effects, records: Records
) -> None:
    # the other side of the database's unlimited retries: the {{ "mail server" if c.effect_kind == "external_no_reference" else "provider" }} refusing, every time
    effects.fail_next(100)
    message = driver.send_message("FAULT-1-PASSING", DETAILS)
    done = until(final_run(driver, message), "the task given up")
    assert done.state == "FAILURE"
    # A run writes its line after it has sent its retry: the last retry's line may come after the failure's.
    runs = until(lambda: at_least(TRANSIENT_RUNS, driver.runs(message)), "every run written down", timeout=10)
    assert sorted(run.state for run in runs) == ["FAILURE"] + ["RETRY"] * tasks.TRANSIENT_RETRIES
    # given up: failed, with the last error, where the person's command lists it (not `released`, out of sight)
    row = records.row("FAULT-1-PASSING")
    assert row["status"] == "failed" and row["note"].startswith(f"failed after {TRANSIENT_RUNS} attempts: "), row


def at_least(count: int, runs: list[Run]) -> list[Run] | None:
    return runs if len(runs) >= count else None
{%- endif %}
{%- if q == "celery" %}


def test_an_item_on_the_queue_that_is_no_message_loses_nothing_else(
    driver: LiveDriver, effects: Effects, records: Records
) -> None:
    """Something other than Celery puts a raw item (not JSON) on the queue. On Redis the worker that takes it stops
    (kombu cannot decode it; Celery calls that unrecoverable) and one started in its place goes on; on RabbitMQ
    the worker refuses it and goes on. Either way the operations sent after it are performed once."""
    driver.wait_ready()
    queue = driver.app.conf.task_default_queue
    with driver.app.connection_for_write() as connection:
        on_redis = connection.transport.driver_type == "redis"
        channel = connection.default_channel
        if on_redis:
            channel.client.lpush(queue, "not a message")
        else:
            raw = channel.prepare_message("not a message", content_type="application/json", content_encoding="utf-8")
            channel.basic_publish(raw, exchange="", routing_key=queue)
    keys = ["FAULT-RAW-1", "FAULT-RAW-2"]
    for key in keys:
        producer.enqueue(key, DETAILS)
    stopped: list[str] = []

    def replace_stopped() -> list[str] | None:
        """The workers that stopped, each replaced by a new one, as a supervisor does."""
        for name, worker in list(driver.workers.items()):
            if worker.poll() is not None:
                stopped.append(name)
                del driver.workers[name]
                driver.start_worker()
        return stopped or None

    def all_performed() -> bool | None:
        replace_stopped()
        return True if [records.status(key) for key in keys] == ["completed"] * len(keys) else None

    until(all_performed, "the operations after the raw item performed", timeout=60)
    assert [effects.count(key) for key in keys] == [1, 1]
    if on_redis:
        # the worker that took the raw item ends in its own time, maybe after the others performed the rest
        until(replace_stopped, "the worker that took the raw item stopped", timeout=60)
        driver.wait_ready()
        assert len(stopped) == 1, stopped
        log = (driver.workdir / f"{stopped[0]}.log").read_text()
        assert "Unrecoverable error: JSONDecodeError" in log, log[-3000:]
    else:
        assert stopped == []
{%- endif %}
{%- if not one %}


def test_the_database_unreachable_at_the_completion_leaves_the_claim_to_the_policy(
    driver: LiveWorkers, database_proxy: DbProxy, effects: Effects, records: Records
) -> None:
    key = "FAULT-2"

    def cut_the_database(arrived: str) -> None:
        if arrived == key:
            database_proxy.stop()  # before the sender hears back: its completion meets the database gone

    effects.on_arrival = cut_the_database
    try:
        message = driver.send_message(key, DETAILS)
        until(lambda: any(run.database_unreachable for run in driver.runs(message)), "the completion failed")
        # the effect happened and its completion did not: the claim stays as it was, nothing is released
        assert (effects.count(key), records.status(key)) == (1, "claimed")
    finally:
        effects.on_arrival = None
        database_proxy.start()
    # back in reach, the message meets the claim, younger than the lease: it waits for the lease's end (case 7)
    until(lambda: any(run.value == "waiting" for run in driver.runs(message)), "the message waiting for the lease")
    assert (effects.count(key), records.status(key)) == (1, "claimed")
    # the lease runs out (aged in SQL), the message comes back, and case 6's path applies
    records.age(key)
    assert driver.redeliver(key, DETAILS).action == ACTION_AFTER_LEASE
    assert (effects.count(key), records.status(key)) == (EFFECTS_IN_CASE_6, AFTER_LEASE)
{%- if p != "resend" %}


def settled_by_policy(row: dict[str, Any]) -> dict[str, Any] | None:
    """The record, once the policy has settled the stale claim."""
    return row if (row["status"], row["attempt"]) == (AFTER_LEASE, {{ 2 if p == "lookup" else 1 }}) else None
{%- endif %}


def test_a_worker_frozen_past_the_lease_cannot_complete_late(
    driver: LiveWorkers, effects: Effects, records: Records
) -> None:
    key = "FAULT-3"
    driver.orders.give("after_effect", freeze=True)
    message = driver.send_message(key, DETAILS)
    frozen = frozen_worker(driver)
    to_wake = [frozen]
    try:
        claim = records.row(key)
        assert (claim["status"], effects.count(key)) == ("claimed", 1)
        records.age(key)  # the lease runs out while the worker is frozen
{%- if p == "resend" %}
        # the takeover performs the effect again and freezes too, before its completion: the frozen worker wakes
        # up while the record is claimed again, by another token
        driver.orders.give("after_effect", freeze=True)
        driver.send_message(key, DETAILS)  # the message again, to a worker that is not frozen
        to_wake.append(frozen_worker(driver))
        settled = records.row(key)
        assert (settled["status"], settled["attempt"], effects.count(key)) == ("claimed", 2, 2)
        assert settled["claim_token"] != claim["claim_token"]
{%- else %}
        driver.send_message(key, DETAILS)  # the message again, to a worker that is not frozen
        # {{ "taken over (attempt 2), the provider asked, completed" if p == "lookup" else "marked " ~ policy.after_lease ~ " (attempt 1)" }}
        settled = until(lambda: settled_by_policy(records.row(key)), f"the policy applied: {AFTER_LEASE}")
{%- endif %}
        os.kill(frozen, signal.SIGCONT)
        to_wake.remove(frozen)
        # awake, the worker tries to complete its old claim: the token guard refuses it
        late = until(final_run(driver, message, frozen), "the frozen worker's run, once it woke up")
        assert (late.state, late.value) == ("SUCCESS", "performed")
        assert records.row(key) == settled
    finally:
        for pid in to_wake:
            os.kill(pid, signal.SIGCONT)
{%- if p == "resend" %}
    until(lambda: records.status(key) == "completed", "the takeover completed")
    assert records.row(key)["attempt"] == 2
{%- endif %}
    assert effects.count(key) == EFFECTS_IN_CASE_6


@dataclass
class Racers:
    """The sweeper and a redelivery, each in a process of its own (spawned: this one runs threads), meeting at a
    barrier for each key they are given (driving.race)."""

    keys: dict[str, Any]
    results: Any
    processes: list[Any]


@pytest.fixture(scope="module", autouse=True)
def racers(effects: Effects) -> Iterator[Racers]:
    """Started with this module, so that starting them (a Python process each, importing the kit) overlaps the
    tests before theirs."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(RACERS))
    keys = {role: context.Queue() for role in RACERS}
    results = context.Queue()
    processes = [context.Process(target=race, args=(role, DETAILS, keys[role], barrier, results)) for role in RACERS]
    for process in processes:
        process.start()
    yield Racers(keys, results, processes)
    for role in RACERS:
        keys[role].put(None)
    for process in processes:
        process.join(timeout=30)
        if process.exitcode is None:
            process.kill()


def test_the_sweeper_and_a_redelivery_at_the_same_stale_claim_one_wins(
    racers: Racers, effects: Effects, records: Records
) -> None:
    for number in range(RACES):
        key = f"FAULT-4-{number}"
        # a worker died with this claim, and its lease has run out
        assert default_store().claim(key, fingerprint(key, DETAILS), DETAILS) is not None
        records.age(key)
        for role in RACERS:
            racers.keys[role].put(key)
        ended = dict(racers.results.get(timeout=60) for _ in RACERS)
        assert sorted(ended.values()) == ["lost", "won"], f"{key}: {ended}"
        assert (records.status(key), effects.count(key)) == (AFTER_LEASE, EFFECTS_IN_CASE_5), key
    assert all(process.is_alive() for process in racers.processes)
{%- else %}


def test_the_database_unreachable_at_the_completion_rolls_everything_back(
    driver: LiveWorkers, database_proxy: DbProxy, effects: Effects, records: Records
) -> None:
    key = "FAULT-2"
    driver.orders.give("after_effect", freeze=True)
    message = driver.send_message(key, DETAILS)
    frozen = frozen_worker(driver)
    # the effect's row is written, not committed: the database goes in the middle of the worker's transaction
    try:
        database_proxy.stop()
    finally:
        os.kill(frozen, signal.SIGCONT)
    try:
        until(lambda: any(run.database_unreachable for run in driver.runs(message)), "the completion failed")
        # PostgreSQL rolled the claim and the row back together: nothing claimed, nothing done
        assert (effects.count(key), records.status(key)) == (0, "none")
    finally:
        database_proxy.start()
    done = until(final_run(driver, message), "the message performed once the database is back")
    assert (done.state, done.value) == ("SUCCESS", "performed")
    assert (effects.count(key), records.status(key), records.row(key)["attempt"]) == (1, "completed", 1)


def test_a_frozen_worker_holds_its_transaction_and_the_redelivery_waits(
    driver: LiveWorkers, effects: Effects, records: Records
) -> None:
    key = "FAULT-3"
    driver.orders.give("after_effect", freeze=True)
    message = driver.send_message(key, DETAILS)
    frozen = frozen_worker(driver)
    try:
        # nothing of the frozen transaction is visible: no claim to age, none to take over
        assert (effects.count(key), records.status(key)) == (0, "none")
        redelivery = driver.send_message(key, DETAILS)
        # its claim waits for the frozen transaction's row (the unique key), however long the worker sleeps
        until(lambda: waiting_on_a_lock(records) > 0, "the redelivery waiting on the frozen transaction")
        assert (driver.runs(redelivery), effects.count(key)) == ([], 0)
    finally:
        os.kill(frozen, signal.SIGCONT)
    late = until(final_run(driver, message, frozen), "the frozen worker's run, once it woke up")
    assert (late.state, late.value) == ("SUCCESS", "performed")
    after = until(final_run(driver, redelivery), "the redelivery's run")
    assert (after.state, after.value) == ("SUCCESS", "skipped")
    assert (effects.count(key), records.status(key), records.row(key)["attempt"]) == (1, "completed", 1)


def waiting_on_a_lock(records: Records) -> int:
    """Sessions of this database that wait for a lock another transaction holds."""
    with records.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )
{%- endif %}
