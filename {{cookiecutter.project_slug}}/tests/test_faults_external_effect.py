{%- from "replay_matrix.jinja" import kind, policy with context -%}
{%- set c = cookiecutter -%}
{%- set q = c.queue_system -%}
{%- set p = c.stale_claim_policy -%}
"""Faults where the effect lands outside the database, so that a claim can outlive its worker: the database
gone at the completion, a worker frozen past its lease, the sweeper and a redelivery racing over one stale
claim{{ ", a failure of the effect that passes retried a few times only" if q == "celery" else "" }}.
Each ends as the policy `{{ p }}` says. Effects are {{ kind.counted }},
counted where they arrive. Live only; faults.py and test_faults.py say how the faults are made.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Records
from db_proxy import DbProxy
from driving import RACERS, LiveWorkers{{ ", Run" if q == "celery" else "" }}, race
from faults import final_run, frozen_worker, until
from sinks import Effects
from test_replay import DETAILS

{% if q == "celery" -%}
from {{ c.project_slug }} import tasks
{% endif -%}
from {{ c.project_slug }}.claims import default_store, fingerprint

# `{{ p }}`: the record after the lease, and the effects of case 6 (died after the effect) and case 5 (before it)
AFTER_LEASE = {{ policy.after_lease|tojson }}
EFFECTS_IN_CASE_6 = {{ policy.emails["6"] }}
EFFECTS_IN_CASE_5 = {{ policy.emails["5"] }}
# what the message that comes back after the lease does
ACTION_AFTER_LEASE = {{ {"hold": "held", "resend": "performed", "skip": "abandoned", "lookup": "skipped"}[p]|tojson }}
# stale claims the sweeper and a redelivery race over, one after the other
RACES = 6
{%- if q == "celery" %}
# the runs of a message that a passing failure meets every time: the first and its retries
TRANSIENT_RUNS = tasks.TRANSIENT_RETRIES + 1
{%- endif %}


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
{%- if q == "celery" %}


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
