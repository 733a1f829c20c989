{%- from "replay_matrix.jinja" import kind with context -%}
{%- set c = cookiecutter -%}
{%- set q = c.queue_system -%}
"""Faults the seven cases do not name, in every kit: the database gone at the claim, the record table gone
under a running worker{{ ", an item on the queue that is no message,\na prefork pool's processes forked from one that used the database" if q == "celery" else "" }}.
What the database gone at the completion or a frozen worker does depends on where the effect lands:
test_faults_{{ "same_database" if kind.one_transaction else "external_effect" }}.py.
Live only (conftest.py does not collect the fault tests embedded: SQLite has no server to lose).

The worker processes reach PostgreSQL through a TCP proxy (db_proxy.py), and the database is taken away from them
for real: the proxy stops, new connections are refused and open ones cut. A frozen worker is a real SIGSTOP. The
suite keeps its own connection, to read and age records. Effects are {{ kind.counted }},
counted where they arrive.
"""

from __future__ import annotations

{%- if q == "sqs" %}

import time
{%- endif %}

{% if q == "celery" -%}
from celery_driver import LiveDriver
{% endif -%}
from conftest import TABLE, Records
from db_proxy import DbProxy
from driving import LiveWorkers
from faults import {{ "OUTAGE_FAILURES, " if q == "sqs" else "" }}database_gone, error_lines, final_run, outage_runs, table_away, until
from sinks import Effects
{%- if q == "sqs" %}
from sqs_driver import ENTRY_POINT
{%- endif %}
from test_replay import DETAILS

from {{ c.project_slug }} import {{ "producer" if q == "celery" else "settings" }}
from {{ c.project_slug }}.claims import MIGRATE
{%- if q == "sqs" %}
from {{ c.project_slug }}.consumer import database_backoff
{%- endif %}


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
        # the database's own words (PostgreSQL's; MySQL's and MariaDB's), then what to do
        assert f'relation "{TABLE}" does not exist' in errors[0] or f"{TABLE}' doesn't exist" in errors[0], errors[0]
    done = until(final_run(driver, message), "the message performed once the table is back")
    assert (done.state, done.value) == ("SUCCESS", "performed")
    assert (effects.count(key), records.status(key)) == (1, "completed")
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


def test_a_prefork_worker_performs_each_operation_once_on_connections_of_its_own(
    driver: LiveDriver, effects: Effects, records: Records
) -> None:
    """The worker as the README starts it: Celery's prefork pool, whose processes are forked from one that used the
    database when it started (it checks the table). Each process opens its own connections: had they shared the
    parent's, two at once would read each other's results, and deliveries would hang or fail."""
    driver.wait_ready()
    solo = list(driver.workers)
    driver.consume(False, solo)  # the burst goes to the prefork worker alone
    prefork = driver.start_worker(["-P", "prefork", "-c", "2", "-l", "INFO"])
    try:
        driver.wait_ready()
        keys = [f"FAULT-PREFORK-{n}" for n in range(20)]
        messages = [driver.send_message(key, DETAILS) for key in keys]

        # each message performed by one of its runs, and none failed or hung: a copy that Redis hands out again after
        # the suite's 3 s visibility timeout (on a loaded machine a prefetched message can wait that long behind a
        # busy process) meets the claim and waits, as it should
        def each_performed() -> bool | None:
            runs = [[run.value for run in driver.runs(message) if run.state == "SUCCESS"] for message in messages]
            return True if all("performed" in values for values in runs) else None

        until(each_performed, "each message performed by one of its runs", timeout=60)
        failed = [run for message in messages for run in driver.runs(message) if run.state == "FAILURE"]
        assert not failed, failed
    finally:
        driver.stop_worker(prefork)
        driver.consume(True, solo)
    assert [effects.count(key) for key in keys] == [1] * len(keys)
    assert records.count("completed") == len(keys)
    runs = [run for message in messages for run in driver.runs(message)]
    assert len({run.pid for run in runs}) == 2, "both of the pool's processes ran some"
{%- endif %}
