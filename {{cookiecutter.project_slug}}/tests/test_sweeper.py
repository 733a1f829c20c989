{%- from "replay_matrix.jinja" import policy with context -%}
{#- the try-out's held operation is resolved with the command it prints: under hold, for an external effect -#}
{%- set resolved_in_try_out = cookiecutter.stale_claim_policy == "hold" and cookiecutter.effect_kind != "same_database" -%}
"""The sweeper: what the policy `{{ cookiecutter.stale_claim_policy }}` does to a stale claim when no redelivery
comes, run as the scheduled task and as the command, and in the try-out a person runs. (The tests of the kit's
other commands, which read the same under every policy, are in test_operations.py.)"""

from __future__ import annotations

{% if resolved_in_try_out -%}
import json
{% endif -%}
import os
import re
{%- if resolved_in_try_out %}
import shlex
{%- endif %}
import subprocess
import sys
import time

from conftest import KIT_PYTHONPATH, KIT_ROOT, TABLE, Records
from driving import Driver
from sinks import Effects
from sqlalchemy import text
from test_replay import DETAILS, KEY

from {{ cookiecutter.project_slug }} import settings
from {{ cookiecutter.project_slug }}.claims import default_store, fingerprint
from {{ cookiecutter.project_slug }}.job import sweep
from {{ cookiecutter.project_slug }}.operations import main


def test_the_sweeper_applies_the_policy_when_no_redelivery_comes(
    driver: Driver, effects: Effects, records: Records
) -> None:
    records.stale_claim(KEY, DETAILS)
    counts = driver.sweep()  # the task beat schedules, run by a worker
    assert counts == {"stale": 1, "settled": 1, "resent": 0}
    # as in case 5 (the worker died before the effect), without the redelivery: the record keeps the
    # message's details, so under resend or lookup the sweeper performs the effect itself
    assert records.status(KEY) == "{{ policy.after_lease }}"
    assert effects.count(KEY) == {{ policy.emails["5"] }}


def test_the_sweeper_leaves_young_claims_alone(driver: Driver, records: Records) -> None:
    default_store().claim(KEY, fingerprint(KEY, DETAILS), DETAILS)
    assert driver.sweep() == {"stale": 0, "settled": 0, "resent": 0}
    assert records.status(KEY) == "claimed"


def test_the_sweeper_command_runs(records: Records) -> None:
    records.stale_claim(KEY, DETAILS)
    assert main(["sweep"]) == 0
    assert records.status(KEY) == "{{ policy.after_lease }}"


def test_the_sweeper_goes_on_while_it_finds_stale_claims_and_starts_none_after_its_budget(records: Records) -> None:
    store = default_store()
    keys = [f"SWEPT-{n:03}" for n in range(250)]
    for key in keys:
        assert store.claim(key, fingerprint(key, DETAILS), DETAILS) is not None
    with records.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE {TABLE} SET claimed_at = {store.clock.moved_back} WHERE job_type = :job_type"),
            {"seconds": settings.LEASE_SECONDS + 1, "job_type": settings.JOB_TYPE},
        )
    assert sweep(budget=0) == {"stale": 0, "settled": 0, "resent": 0}
    assert records.count("claimed") == 250
    # 250 stale claims, 100 at a time: one sweep given the time settles them all (the kit's own budget may be a
    # second, when the longest run nearly fills the time between two sweeps)
    assert sweep(limit=100, budget=600) == {"stale": 250, "settled": 250, "resent": 0}
    assert records.count("{{ policy.after_lease }}") == 250


def test_the_try_out_kills_a_real_worker_mid_effect_and_sweeps(records: Records) -> None:
    """The try-out, as a person runs it: its own worker process, SIGKILLed after the effect."""
    env = {**os.environ, "PYTHONPATH": KIT_PYTHONPATH}
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.project_slug }}_proof", "try-out"],
        cwd=KIT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    assert time.monotonic() - started < 60
    out = completed.stdout
    sent = re.search(r"^1\. sent {{ cookiecutter.job_type }} (TRY-\S+) through the queue", out, re.MULTILINE)
    assert sent, out
    key = sent[1]
    assert re.search(r"^2\. the worker \(pid \d+\) ", out, re.MULTILINE), out
{%- if cookiecutter.effect_kind == "same_database" %}
    # the claim, the row and the completion died together with the worker's transaction
    assert "3. killed the worker with SIGKILL; the record: no record" in out
    assert (records.status(key), "the effect's rows: 0") == ("none", out.splitlines()[5].rsplit("; ", 1)[1])
{%- else %}
    assert "3. killed the worker with SIGKILL; the record: claimed, attempt 1" in out
    assert "5. ran the sweeper: stale claims 1" in out
    # case 6 after the lease, as POLICY.md has it: the sweeper applied the policy
    assert records.status(key) == "{{ policy.after_lease }}"
    assert "received: {{ policy.emails["6"] }}" in out.splitlines()[5], out
{%- if resolved_in_try_out %}
    row = next(line for line in out.splitlines() if line.startswith(key))
    assert json.dumps(DETAILS) in row and "1 held" in out
    # the command it says to type next works
    resolve = next(line.strip() for line in out.splitlines() if " resolve " in line and line.startswith("    "))
    assert resolve.startswith(f"python -m {{ cookiecutter.project_slug }}.operations resolve {key} --done "), resolve
    typed = subprocess.run(
        [sys.executable, *shlex.split(resolve)[1:]], cwd=KIT_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert typed.returncode == 0, typed.stderr
    assert records.status(key) == "completed"
{%- endif %}
{%- endif %}
