{%- from "replay_matrix.jinja" import kind with context -%}
"""Faults where the effect is a row in the same database ({{ kind.counted }}):
the claim, the row and the completion share one transaction, so no fault leaves a claim behind. The database
gone at the completion, or a worker frozen inside its transaction, leaves nothing another run could see or
take over; the message, retried, performs it once. There is no stale claim for the sweeper and a redelivery
to race over. Live only; faults.py and test_faults.py say how the faults are made.
"""

from __future__ import annotations

import os
import signal

from conftest import Records
from db_proxy import DbProxy
from driving import LiveWorkers
from faults import final_run, frozen_worker, until
from sinks import Effects
from sqlalchemy import text
from test_replay import DETAILS


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
