{%- from "replay_matrix.jinja" import policy as chosen_policy, kind as chosen_kind, soak as soak_facts with context -%}
{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
{%- set kind = cookiecutter.effect_kind -%}
{%- set policy = cookiecutter.stale_claim_policy -%}
"""The soak: many operations through the real queue, duplicated, while a chaos loop kills workers at random;
then the invariants of the policy `{{ policy }}`, counted where the effects arrive.

    python -m {{ slug }}_proof soak
        [--operations 2000] [--workers 4] [--kill-every 3] [--duplicates 0.3] [--kill-after-take 0.005]

It runs against the live services of the environment: DATABASE_URL (PostgreSQL) and
{%- if celery %} CELERY_BROKER_URL (Redis
or RabbitMQ).
{%- else %} SQS as the consumer
reaches it (the region, and SQS_ENDPOINT_URL or AWS's endpoint variables for a local one).
{%- endif %}
It starts these, and stops them at the end:
{%- if kind == "external_no_reference" %}
- an SMTP sink on a free local port, which answers each email a few milliseconds after it arrived, so that
  some kills land while the worker waits for it (your SMTP_HOST is not used);
{%- elif kind == "external_with_reference" %}
- a local provider (HTTP) on a free port, which answers each request a few milliseconds after it arrived, so
  that some kills land while the worker waits for it (your PROVIDER_URL is not used);
{%- endif %}
{%- if celery %}
- `--workers` processes of the kit's worker, `celery -A {{ slug }}.celery_app worker`, on a
  queue of the soak's own (deleted at the end), with the solo pool: the SIGKILL takes down the process that
  runs the task and holds its message, as the death of a machine does, and the broker's own redelivery brings
  the message back. On Redis that takes the visibility timeout, so the soak shortens it for its own workers to
  VISIBILITY_TIMEOUT seconds, below the lease, and says so: the one thing that differs from the kit's worker
  (`python -m {{ slug }}_proof.soak_celery`
  runs the worker's command with that allowed).
  RabbitMQ brings it back when the dead worker's connection closes.
{%- else %}
- a queue and its dead-letter queue of the soak's own (per-run names, made by the kit's `create-queues` with a
  visibility timeout of VISIBILITY_TIMEOUT seconds, so that a dead consumer's message comes back in seconds),
  deleted at the end; and `--workers` processes of the kit's consumer,
  `python -m {{ slug }}.consumer`, through
  `python -m {{ slug }}_proof.soak_sqs`,
  for the kills after a take below;
{%- endif %}
- a chaos loop that kills a random worker with SIGKILL every `--kill-every` seconds (jittered, counted from the
  moment the last replacement is ready) and starts another in its place;
- kills aimed where a random one seldom lands, right after a worker took a message and before its claim: a
  fraction `--kill-after-take` of the messages taken, the worker that took it SIGKILLs itself at once (the soak's
  workers run soak_{{ cookiecutter.queue_system }}.py as their command, which adds only that; it writes a line first, so the soak
  knows the death for one it ordered, and starts another in its place).
Each worker is a process of its own running that command line, forked from a server process that has imported
the libraries once (processes.py): a replacement starts in a fraction of a second, not a second of imports.

It sends the keys SOAK-<run>-00001 ... through the kit's producer (each key's record, queued, then its message;
at most BACKLOG ahead of the workers), a fraction `--duplicates` of them two or three times (half of those back
to back, at the same moment), and a few bad messages (bad keys, and known keys with another payload), which
must be refused at once. Half-way, it ends every connection to the database, as a restart of the server does.
Once every key has been claimed (a message whose worker died before its claim comes back by the broker's
redelivery; one the broker lost leaves its record queued, and the kit's sweeper sends it again; the wait is
bounded), the chaos stops, the workers stop, the claims still `claimed` are aged past the lease in SQL
(ClaimStore.age, as the replay suite does) and the kit's sweeper runs until nothing is stale. Then it checks, for
every key, counted where the effects arrive: its effects, as many as the policy allows (effects_problem); nothing
lost silently (completed, or held or abandoned with a note); a completed key had an effect; no record left
claimed or queued. And the bad messages were refused at once
{%- if not celery %}; the dead-letter queue holds them and nothing else{% endif %}.

It prints a table and then each violation on a line of its own, writes replay-soak.json in the current folder
and re-renders the sign-off reports when replay-report.json is there. Exit status 0, 1 on any violation, 2 on
bad input. The soak's records are deleted when it passes and kept for inspection when it does not.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Row, bindparam, text

from {{ cookiecutter.project_slug }} import settings
from {{ cookiecutter.project_slug }}.claims import ClaimStore, default_store
from {{ cookiecutter.project_slug }}.job import sweep
from {{ cookiecutter.project_slug }}.producer import enqueue

from . import PROG, BadInput
from .crash_points import KILL_AFTER_TAKE_VARIABLE, KILLED_AFTER_TAKE
from .processes import Forked
from .report import SOAK, rerender
from .soak_{{ cookiecutter.queue_system }} import Queue
from .try_out import DETAILS, effects_received, missing_table

TABLE = settings.RECORD_TABLE
JOB_TYPE = settings.JOB_TYPE
# Seconds the receiver takes to answer each effect, so that some kills land while the worker waits for it.
EFFECT_DELAY = 0.005
# Every wait is bounded: this long without progress ends it.
PATIENCE = 60.0
# A key still queued this long after the last claim came was lost by the queue (why it may be: each queue's
# `late`): the kit's sweeper sends it again. The claim makes whichever copy comes second a duplicate.
LOST_AFTER = 30.0
# Keys sent ahead of the workers, at most: the queue never runs dry, and never grows so long that the broker
# slows down with it (moto's SQS looks at every message of the queue, and computes the queue's attributes, on each
# receive: 40 ahead instead of 200 halves the time and CPU of a short soak there).
BACKLOG = {{ soak_facts.backlog.get(cookiecutter.queue_system) }}
# Seconds a worker has to stop after SIGTERM, once its message in hand is done; then SIGKILL.
STOP_SECONDS = 5.0
# How a key may end under this policy: completed, or as the policy leaves a stale claim (with a note saying why).
{%- if chosen_kind.one_transaction or chosen_policy.after_lease == "completed" %}
ENDS = ("completed",)
{%- else %}
ENDS = ("completed", "{{ chosen_policy.after_lease }}")
{%- endif %}
OTHER_DETAILS = {"email": "someone-else@example.com"}
# The table's rows: label, and the key in replay-soak.json.
TABLE_ROWS = (
    ("keys", "operations"),
    ("messages sent", "messages"),
    ("duplicates sent", "duplicates"),
    ("bad messages", "bad_messages"),
    ("workers killed", "workers_killed"),
    ("killed right after a take", "killed_after_take"),
    ("effects", "effects"),
    ("completed", "completed"),
    ("held", "held"),
    ("abandoned", "abandoned"),
    ("lost by the queue, sent again", "lost_resent"),
    ("violations", "violations"),
    ("seconds", "seconds"),
    ("throughput (operations/s)", "throughput"),
)


class Steps:
    """Prints each step of the soak with the seconds since it started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f} s  {line}", flush=True)


def effects_problem(effects: int, attempt: int) -> str | None:
    """What is wrong with a key's effects, counted where they arrive, for the record's attempt; None when right."""
{%- if kind == "same_database" %}
    if effects != 1:
        return f"{effects} effects: a row in the claim's transaction happens exactly once"
{%- elif policy == "resend" %}
    if effects > attempt:
        return f"{effects} effects for {attempt} claim(s): `resend` allows one per claim"
{%- else %}
    if effects > 1:
        return f"{effects} effects: `{{ policy }}` allows at most one"
{%- endif %}
    return None


def key_problems(key: str, record: Row[Any] | None, effects: int, resent: bool) -> list[str]:
    """The invariants for one key, at the end: its record and its effects."""
    if record is None:
        return [f"{key}: no record{', even sent again' if resent else ''}: lost ({effects} effects)"]
    problems = []
    if record.status not in ENDS:
        problems.append(f"{key}: left {record.status}, attempt {record.attempt}; it must end {' or '.join(ENDS)}")
    elif record.status != "completed" and not (record.note or "").strip():
        problems.append(f"{key}: {record.status} with no note saying why")
    if record.status == "completed" and effects == 0:
        problems.append(f"{key}: completed with no effect")
    problem = effects_problem(effects, record.attempt)
    if problem:
        problems.append(f"{key}: {problem} (record {record.status}, attempt {record.attempt})")
    return problems


@dataclass
class Plan:
    """What the soak sends: the keys, in groups sent at the same moment (one key each, or a duplicate's copies)."""

    prefix: str
    keys: list[str]
    groups: list[list[str]]
    # keys that get a second message with another payload, once their record exists
    conflicts: list[str]

    @property
    def messages(self) -> int:
        return sum(len(group) for group in self.groups)


def make_plan(operations: int, duplicates: float, rng: random.Random, run: str) -> Plan:
    prefix = f"SOAK-{run}-"
    keys = [f"{prefix}{number:05d}" for number in range(1, operations + 1)]
    groups: list[list[str]] = []
    for key in keys:
        copies = rng.choice((2, 3)) if rng.random() < duplicates else 1
        if copies > 1 and rng.random() < 0.5:
            groups.append([key] * copies)  # back to back: two workers may take them at the same moment
        else:
            groups.extend([key] for _ in range(copies))
    rng.shuffle(groups)
    first = list(dict.fromkeys(key for group in groups for key in group))
    return Plan(prefix, keys, groups, conflicts=first[:2])


@dataclass
class Workers:
    """The worker processes, and the chaos loop that kills them."""

    # the command line of the worker of a number, and what it writes once it takes messages
    command: Callable[[int], list[str]]
    ready_line: bytes
    folder: Path
    rng: random.Random
    processes: list[Forked] = field(default_factory=list)
    logs: dict[int, Path] = field(default_factory=dict)
    ready: set[int] = field(default_factory=set)
    started: int = 0
    killed: int = 0
    # workers that SIGKILLed themselves right after taking a message, as the soak asked (--kill-after-take)
    killed_after_take: int = 0
    # workers that exited by themselves (not killed): each is a violation
    exits: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Forked:
        self.started += 1
        path = self.folder / f"worker-{self.started}.log"
        # the environment as it is now: the soak's queue, and where the effects arrive
        process = Forked(self.command(self.started), os.environ, Path.cwd(), path)
        self.processes.append(process)
        self.logs[process.pid] = path
        return process

    def is_ready(self, process: Forked) -> bool:
        if process.pid not in self.ready and self.ready_line in self.logs[process.pid].read_bytes()[:200_000]:
            self.ready.add(process.pid)
        return process.pid in self.ready

    def start_all(self, count: int, timeout: float = PATIENCE) -> None:
        """Starts `count` workers and waits until each is ready; BadInput when one exits or is not ready in time."""
        for _ in range(count):
            self.start()
        deadline = time.monotonic() + timeout
        with self.lock:
            for process in self.processes:
                while not self.is_ready(process):
                    if process.poll() is not None:
                        raise BadInput(f"a worker exited before it was ready; its log ends:\n{self.tail(process)}")
                    if time.monotonic() > deadline:
                        raise BadInput(f"a worker not ready in {timeout:.0f} s; its log ends:\n{self.tail(process)}")
                    time.sleep(0.05)

    def tail(self, process: Forked) -> str:
        return self.logs[process.pid].read_text(errors="replace")[-3000:]

    def kill_one(self) -> Forked | None:
        """SIGKILL to a random worker that is ready (so at a random point of its work), and another in its place;
        that one, or None when no worker was ready."""
        with self.lock:
            living = [process for process in self.processes if process.poll() is None and self.is_ready(process)]
            if not living:
                return None
            victim = self.rng.choice(living)
            victim.kill()
            victim.wait()
            self.killed += 1
            self.processes.remove(victim)
            return self.start()

    def starting(self, process: Forked) -> bool:
        with self.lock:
            return process.poll() is None and not self.is_ready(process)

    def replace_exited(self) -> None:
        """A worker that died right after a take, as asked, is counted; one that exited by itself otherwise is a
        failure of the kit's worker: noted. Each is replaced."""
        with self.lock:
            for process in [process for process in self.processes if process.poll() is not None]:
                if process.returncode == -signal.SIGKILL and KILLED_AFTER_TAKE in self.tail(process):
                    self.killed_after_take += 1
                else:
                    self.exits.append(
                        f"a worker (pid {process.pid}) exited by itself with status {process.returncode}; its log"
                        f" ends: {self.tail(process)[-500:]!r}"
                    )
                self.processes.remove(process)
                self.start()

    def stop(self) -> int:
        """SIGTERM: each finishes the message in hand and stops. SIGKILL to those still there after STOP_SECONDS
        (a Celery worker holding messages for the end of a lease takes ~10 s to close on RabbitMQ); how many."""
        self.replace_exited()
        with self.lock:
            for process in self.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
            killed = 0
            for process in self.processes:
                try:
                    process.wait(timeout=max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    killed += 1
            return killed


def chaos(workers: Workers, kill_every: float, rng: random.Random, stopping: threading.Event) -> None:
    """A kill every `kill_every` seconds (jittered, half to one and a half times), counted from the moment the last
    replacement is ready: a worker starts in about a second, and on a busy machine a kill every second would
    otherwise leave no worker time to work."""
    while not stopping.wait(kill_every * rng.uniform(0.5, 1.5)):
        replacement = workers.kill_one()
        started = time.monotonic()
        while replacement and workers.starting(replacement) and time.monotonic() - started < PATIENCE:
            if stopping.wait(0.05):
                return


class Records:
    """The soak's records, read in SQL."""

    def __init__(self, store: ClaimStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self.mine = "job_type = :job_type AND substr(operation_key, 1, :length) = :prefix"
        self.params = {"job_type": JOB_TYPE, "length": len(prefix), "prefix": prefix}

    def rows(self, sql: str, **params: Any) -> list[Row[Any]]:
        with self.store.engine.connect() as conn:
            return list(conn.execute(text(sql), {**self.params, **params}))

    def count(self, status: str | None = None) -> int:
        where = self.mine + ("" if status is None else " AND status = :status")
        return int(self.rows(f"SELECT count(*) FROM {TABLE} WHERE {where}", status=status)[0][0])

    def having(self, keys: list[str]) -> set[str]:
        """Which of `keys` have a record."""
        sql = text(f"SELECT operation_key FROM {TABLE} WHERE job_type = :job_type AND operation_key IN :keys")
        sql = sql.bindparams(bindparam("keys", expanding=True))
        with self.store.engine.connect() as conn:
            return {row.operation_key for row in conn.execute(sql, {"job_type": JOB_TYPE, "keys": keys})}

    def by_key(self) -> dict[str, Row[Any]]:
        rows = self.rows(f"SELECT operation_key, status, attempt, note FROM {TABLE} WHERE {self.mine}")
        return {row.operation_key: row for row in rows}

    def claimed(self) -> list[str]:
        rows = self.rows(f"SELECT operation_key FROM {TABLE} WHERE {self.mine} AND status = 'claimed'")
        return [row.operation_key for row in rows]

    def queued(self) -> list[str]:
        """The keys whose record the producer wrote and no run has claimed, in order."""
        rows = self.rows(f"SELECT operation_key FROM {TABLE} WHERE {self.mine} AND status = 'queued'")
        return sorted(row.operation_key for row in rows)

    def delete(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {TABLE} WHERE {self.mine}"), self.params)
{%- if kind == "same_database" %}
            effects = "{{ cookiecutter.job_type }}_effects"
            conn.execute(text(f"DELETE FROM {effects} WHERE substr(operation_key, 1, :length) = :prefix"), self.params)
{%- endif %}


def other_claims(store: ClaimStore) -> int:
    """Claims of operations that are not a soak's: the soak's sweeper would settle them with its own receiver."""
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    f"SELECT count(*) FROM {TABLE}"
                    " WHERE job_type = :job_type AND status = 'claimed' AND operation_key NOT LIKE 'SOAK-%'"
                ),
                {"job_type": JOB_TYPE},
            ).scalar_one()
        )


def wait_for(
    what: Callable[[], int], goal: int, on_wait: Callable[[], None] = lambda: None, patience: float = PATIENCE
) -> int:
    """Polls `what` until it reaches `goal`, or until it made no progress for `patience` seconds; its last value."""
    last, since = what(), time.monotonic()
    while last < goal and time.monotonic() - since < patience:
        time.sleep(0.2)
        on_wait()
        now = what()
        if now != last:
            last, since = now, time.monotonic()
    return last


def send_through_the_producer(groups: list[list[str]]) -> None:
    """Each key as the app asks for it (producer.enqueue): its record, queued, then its message; a duplicate's
    copies find the record and are sent again, as an app that asks twice sends them."""
    for group in groups:
        for key in group:
            enqueue(key, DETAILS)


def restart_the_database(store: ClaimStore) -> int:
    """Ends every other connection to the soak's database, as a restart of the server ends them (the workers' held
    connections among them); how many. The soak's own pooled connections go too, and are opened again."""
    with store.engine.connect() as conn:
        ended = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    store.engine.dispose()
    store.close()
    return int(ended)


def check_options(operations: int, workers: int, kill_every: float, duplicates: float, kill_after_take: float) -> None:
    if operations < 1:
        raise BadInput(f"--operations must be at least 1, not {operations}")
    if not 1 <= workers <= 64:
        raise BadInput(f"--workers must be 1 to 64, not {workers}")
    if not kill_every > 0:
        raise BadInput(f"--kill-every must be a number of seconds above 0, not {kill_every}")
    if not 0 <= duplicates <= 1:
        raise BadInput(f"--duplicates must be a fraction from 0 to 1, not {duplicates}")
    # at a half, too few messages would get past their takes for the soak to end
    if not 0 <= kill_after_take <= 0.5:
        raise BadInput(f"--kill-after-take must be a fraction from 0 to 0.5, not {kill_after_take}")


def check_database(store: ClaimStore) -> None:
    if store.engine.dialect.name != "postgresql":
        raise BadInput(
            "DATABASE_URL must be PostgreSQL (postgresql://...): the soak's worker processes claim at once in one"
            " table, and SQLite is for trying the kit out"
        )
    problem = missing_table(store, "soak")
    if problem:
        raise BadInput(problem.removeprefix(f"{PROG} soak: "))
    others = other_claims(store)
    if others:
        raise BadInput(
            f"{TABLE} holds {others} claims of operations that are not a soak's: the soak's sweeper would settle"
            " them with its own effect receiver; run it against a database of its own"
        )


def stop_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the soak as Ctrl-C does: its workers stop and its queue goes, on the way out."""
    raise SystemExit(128 + signum)


def process(
    plan: Plan, queue: Queue, pool: Workers, records: Records, kill_every: float, rng: random.Random, say: Steps
) -> tuple[float, list[str]]:
    """Sends everything while the chaos loop kills workers, until every key has a record; the seconds it took,
    and the keys the queue lost, sent again."""
    stopping = threading.Event()
    killer = threading.Thread(target=chaos, args=(pool, kill_every, random.Random(rng.random()), stopping))
    killer.start()
    started = time.monotonic()
    conflicts_sent = False

    def progress() -> int:
        """Keys a run has claimed (no longer queued), plus one once the conflicts are sent (the same key with
        another payload, once the key's record exists)."""
        nonlocal conflicts_sent
        if not conflicts_sent and len(records.having(plan.conflicts)) == len(plan.conflicts):
            for key in plan.conflicts:
                queue.send_bad([key, OTHER_DETAILS])
            conflicts_sent = True
        return records.count() - records.count("queued") + int(conflicts_sent)

    try:
        sent: set[str] = set()
        restarted = False
        for start in range(0, len(plan.groups), 20):
            chunk = plan.groups[start : start + 20]
            send_through_the_producer(chunk)
            sent.update(key for group in chunk for key in group)
            wait_for(progress, len(sent) - BACKLOG, pool.replace_exited)
            if not restarted and len(sent) >= len(plan.keys) // 2:
                restarted = True
                ended = restart_the_database(records.store)
                say(f"the database restarted, as the workers see it: {ended} connections ended (pg_terminate_backend)")
        queue.send_bad_keys()
        say(f"sent {plan.messages} messages for {len(plan.keys)} keys, and bad keys; waiting for their claims")
        wait_for(progress, len(plan.keys) + 1, pool.replace_exited, patience=LOST_AFTER)
    finally:
        stopping.set()
        killer.join()
    claimed = records.count() - records.count("queued")
    say(f"{claimed} of {len(plan.keys)} keys claimed; {pool.killed} workers killed; the chaos stopped")
    lost = records.queued()
    if lost:
        # Their message never came: the broker lost it. The record from the send says so: aged past the re-send
        # time in SQL (as claims are aged past the lease below), the kit's sweeper sends them again.
        for key in lost:
            records.store.age(key, settings.resend_queued_after_seconds() + 1)
        resent = sweep(records.store)["resent"]
        say(
            f"{len(lost)} keys still queued {LOST_AFTER:g} s after the last claim came: {queue.late}; aged past the"
            f" re-send time in SQL, the kit's sweeper sent {resent} of them again: {', '.join(lost)}"
        )
        wait_for(progress, len(plan.keys) + 1, pool.replace_exited)
    return time.monotonic() - started, lost


def settle(store: ClaimStore, queue: Queue, pool: Workers, records: Records, effects: Any, say: Steps) -> None:
    """The bad messages refused, the workers stopped; then the claims that deaths left, aged past the lease in
    SQL, and the sweeper until nothing is stale."""
    refused = wait_for(queue.refused, len(queue.bad), pool.replace_exited)
    wait_for(lambda: -records.count("released"), 0)
    unstopped = pool.stop()
    say(
        f"{refused} of {len(queue.bad)} bad messages refused; the workers stopped (SIGTERM"
        + (f"; {unstopped} still there after {STOP_SECONDS:g} s: SIGKILL)" if unstopped else ")")
    )
    claimed = records.claimed()
    counts = effects.counts(records.prefix)
    after_effect = sum(1 for key in claimed if counts[key])
    for key in claimed:
        store.age(key, settings.LEASE_SECONDS + 1)
    swept: Counter[str] = Counter()
    for _ in range(1000):
        found = sweep(store)
        swept.update(found)
        if not found["stale"]:
            break
    say(
        f"deaths left {len(claimed)} claims ({after_effect} after the effect, {len(claimed) - after_effect}"
        f" before it); aged past the lease in SQL; the sweeper settled {swept['settled']} of {swept['stale']}"
    )


def soak(
    operations: int,
    workers: int,
    kill_every: float,
    duplicates: float,
    seed: int | None,
    kill_after_take: float = 0.005,
) -> int:
    """The command; its exit status."""
    say = Steps()
    try:
        check_options(operations, workers, kill_every, duplicates, kill_after_take)
        store = default_store()
        check_database(store)
    except BadInput as error:
        print(f"{PROG} soak: {error}", file=sys.stderr)
        return 2
    for noisy in ("mail.log", "kombu", "celery", "botocore", "amqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, stop_on_signal)
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    plan = make_plan(operations, duplicates, rng, run)
    records = Records(store, plan.prefix)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        queue = Queue(run)
    except BadInput as error:
        print(f"{PROG} soak: {error}", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    os.environ[KILL_AFTER_TAKE_VARIABLE] = str(kill_after_take)
    pool = Workers(queue.worker_command, queue.ready, folder, rng)
    try:
        with effects_received(store, EFFECT_DELAY) as effects:
            say(f"soak {run}: {operations} operations of {JOB_TYPE}, policy {settings.STALE_CLAIM_POLICY}, seed {seed}")
            say(f"the queue: {queue.describe()}")
            try:
                pool.start_all(workers)
            except BadInput as error:
                print(f"{PROG} soak: {error}", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
                return 2
            say(
                f"{workers} workers ready; a random one is killed every {kill_every:g} s (jittered) and replaced, and"
                f" a worker dies right after {kill_after_take:.1%} of the messages it takes"
            )
            seconds, lost = process(plan, queue, pool, records, kill_every, rng, say)
            say(f"{records.count() - records.count('queued')} of {operations} keys claimed after {seconds:.1f} s")
            settle(store, queue, pool, records, effects, say)
            counts = effects.counts(plan.prefix)
            by_key = records.by_key()
            violations = [
                problem for key in plan.keys for problem in key_problems(key, by_key.get(key), counts[key], key in lost)
            ]
            violations += queue.bad_message_problems() + pool.exits
    except KeyboardInterrupt:
        print(f"{PROG} soak: interrupted; its records stay (keys {plan.prefix}...)", file=sys.stderr)
        return 130
    finally:
        pool.stop()
        queue.close()
    statuses = Counter(row.status for row in by_key.values())
    result = {
        "command": (
            f"python -m {PROG} soak --operations {operations} --workers {workers} --kill-every {kill_every:g}"
            f" --duplicates {duplicates:g} --kill-after-take {kill_after_take:g} --seed {seed}"
        ),
        "started_at": started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "queue_system": "{{ cookiecutter.queue_system }}",
        "broker": queue.broker,
        "stale_claim_policy": settings.STALE_CLAIM_POLICY,
        "effect_kind": settings.EFFECT_KIND,
        "operations": operations,
        "messages": plan.messages,
        "duplicates": plan.messages - operations,
        "bad_messages": len(queue.bad),
        "workers": workers,
        "kill_every": kill_every,
        "workers_killed": pool.killed,
        "kill_after_take": kill_after_take,
        "killed_after_take": pool.killed_after_take,
        "effects": sum(counts.values()),
        "completed": statuses["completed"],
        "held": statuses["held"],
        "abandoned": statuses["abandoned"],
        "lost_resent": len(lost),
        "violations": violations,
        "seconds": round(seconds, 1),
        "throughput": round(operations / seconds, 1),
        "passed": not violations,
    }
    print()
    for label, name in TABLE_ROWS:
        value = result[name]
        print(f"  {label:<31}{len(value) if isinstance(value, list) else value:>10}")
    print()
    for violation in violations:
        print(f"violation: {violation}")
    Path(SOAK).write_text(json.dumps(result, indent=2) + "\n")
    rendered = rerender(Path.cwd())
    say(f"wrote {SOAK}" + (" and the sign-off reports (replay-report.html, .md, replay-junit.xml)" if rendered else ""))
    if violations:
        say(
            f"the soak's records stay for inspection, and its workers' logs in {folder}; when done:"
            f" DELETE FROM {TABLE} WHERE operation_key LIKE '{plan.prefix}%'"
        )
        return 1
    records.delete()
    shutil.rmtree(folder, ignore_errors=True)
    say(f"passed: {'; '.join(['no violation', *(f'{v} {k}' for k, v in statuses.items())])}")
    return 0
