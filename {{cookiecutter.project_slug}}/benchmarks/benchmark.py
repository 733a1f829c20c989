{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
{%- set one_transaction = cookiecutter.effect_kind == "same_database" -%}
"""What the claim costs against the physical floor, measured in the same run: figures printed, not a test.

{%- if celery %}

    python benchmarks/benchmark.py       # DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis or RabbitMQ) set
{%- else %}

    python benchmarks/benchmark.py       # DATABASE_URL (PostgreSQL) set; it starts moto's SQS server itself
{%- endif %}

1. claim + complete: handle() with a no-op effect, against the statements it sends, replayed on one raw psycopg
   connection ({{ "in one transaction: one durable commit" if one_transaction else "two durable commits" }}). Goal: at most 1.25 times.
2. a duplicate: handle() on a completed key, against one raw round trip of the statement it sends first.
   Goal: at most 1.5 times. Also shown: that round trip plus the Python work every duplicate must do (the
   payload's fingerprint, the skip's log line), which the goal's floor leaves out. The kit's log lines are
   written to a file at INFO, as its worker writes them.
3. throughput of the kit's real {{ "worker, `celery worker` (prefork, one process, prefetch 1)" if celery else "consumer, `python -m " ~ slug ~ ".consumer`, on moto's SQS server" }}, one
   effect per message to a local sink, with the claim against the same {{ "worker running a bare task" if celery else "receive loop with a bare handler" }}
   that only performs the effect. Goal: at least 0.85 times.

Each pair takes turns in one run, so that both see the same machine. Use a test database: the benchmark
writes records whose keys start with "bench-" and deletes them at the end.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
{%- if not celery %}
import socket
{%- endif %}
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
{%- if celery %}
from collections.abc import Mapping, Sequence
{%- else %}
from collections.abc import Callable, Mapping, Sequence
{%- endif %}
from pathlib import Path
from typing import Any, TypeVar

from measure import (
    DETAILS,
{%- if not one_transaction %}
    FLOOR_FILE,
{%- endif %}
    IMPORT_PATHS,
    JOB_TYPE,
    KIT_ROOT,
    TABLE,
    Floor,
    alternating,
    claim_token,
    first_line,
{%- if not celery %}
    free_port,
{%- endif %}
    header,
    in_the_driver,
    kit_connection,
    load,
    log_as_the_worker,
    logged,
    migrate,
    raw_connection,
    statements_sent,
    the_claim,
    verdict,
)

from {{ slug }}.claims import {{ "default_store, " if one_transaction else "" }}encode_details, fingerprint
from {{ slug }}.job import handle

T = TypeVar("T")
RUN = uuid.uuid4().hex[:8]
PREFIX = f"bench-{RUN}-"
# the figures' column
WIDTH = 80


def no_effect(*_: Any) -> None:
    """The effect of goals 1 and 2: nothing, so that only the claim is timed."""


def print_split(split: Mapping[str, tuple[float, float]]) -> None:
    """Where the time went: in psycopg's execute (the round trips) and around it (the Python on the way)."""
    (kit_in, kit_around), (floor_in, floor_around) = split["handle()"], split["floor"]
    print(
        f"   where it goes (a pass timing psycopg's execute): handle() {kit_in * 1e6:.0f} µs in execute,"
        f" {kit_around * 1e6:.0f} µs around it; floor {floor_in * 1e6:.0f} µs in execute, {floor_around * 1e6:.0f} µs"
        " around it\n"
    )


def claim_and_complete(operations: int) -> tuple[Floor, float]:
    """Goal 1; the floor, and its seconds per operation, for goal 3."""
    handle(f"{PREFIX}first", DETAILS, perform=no_effect)  # the process's first connection is made outside
    with statements_sent() as sent:
        assert handle(f"{PREFIX}probe", DETAILS, perform=no_effect).action == "performed"
    # the floor replays what handle() sent for a new key, for another key and another token
    with raw_connection() as raw:
        token = claim_token(raw, f"{PREFIX}probe")
    floor = Floor(f"{PREFIX}probe", token, sent)
    # a new key for every operation, across the passes
    keys = itertools.count()

    def at_the_floor(_: int) -> None:
        floor.run(f"{PREFIX}floor-{next(keys)}")

    def kit(_: int) -> None:
        assert handle(f"{PREFIX}handle-{next(keys)}", DETAILS, perform=no_effect).action == "performed"

    variants = {"handle()": kit, "floor": at_the_floor}
    alternating(variants, 100)  # warm-up: connections made, statements prepared
    figures = alternating(variants, operations)
    split = in_the_driver(variants, min(operations, 500))
    statements = ", then ".join(first_line(query) for query, _ in sent)
    print("1. claim + complete: handle() with a no-op effect, against the floor")
    print(f"   handle(), a new key each time{figures.median('handle()') * 1e6:>{WIDTH - 29}.1f} µs")
    floor_is = f"floor: the {len(sent)} statements it sent, raw, on the kit's connection"
    print(f"   {floor_is}{figures.median('floor') * 1e6:>{WIDTH - len(floor_is)}.1f} µs")
    print(f"     {statements} ({{ "one transaction, one commit, as sent" if one_transaction else "autocommit, a commit each" }})")
    print(f"   {verdict(figures.ratio('handle()', 'floor'), 1.25)}")
    print_split(split)
    return floor, figures.median("floor")


def duplicate(operations: int) -> None:
    raw = kit_connection()
    done = f"{PREFIX}done"
    assert handle(done, DETAILS, perform=no_effect).action == "performed"
    with statements_sent() as sent, logged() as records:
        assert handle(done, DETAILS, perform=no_effect).action == "skipped"
    query, params = sent[the_claim(sent, done)]
    lines = [(logging.getLogger(record.name), record.levelno, record.msg, record.args) for record in records]

    def floor(_: int) -> None:
        raw.execute(query, params).fetchall()

    def kit(_: int) -> None:
        handle(done, DETAILS, perform=no_effect)

    def required(_: int) -> None:
{%- if one_transaction %}
        # what any duplicate must do: the round trip in the claim's own transaction (BEGIN, COMMIT: the claim opens
        # the transaction that the effect shares, before it knows whether the key is new), its payload's
        # fingerprint, its skip's log line
{%- else %}
        # what any duplicate must do: the round trip, its payload's fingerprint, its skip's log line
{%- endif %}
        fingerprint(done, encode_details(DETAILS))
        for statement, statement_params in sent:
            rows = raw.execute(statement, statement_params)
            if statement == query:
                rows.fetchall()
        for logger, level, message, args in lines:
            logger.log(level, message, *args)

    variants = {"handle()": kit, "floor": floor, "required": required}
    alternating(variants, 100)
    figures = alternating(variants, operations)
    split = in_the_driver(variants, min(operations, 500))
    print("2. a duplicate: handle() on a completed key, against one raw round trip of the statement that claims")
    kit_is = f"handle(), the same completed key ({len(sent)} statement{'s' if len(sent) > 1 else ''} sent)"
    print(f"   {kit_is}{figures.median('handle()') * 1e6:>{WIDTH - len(kit_is)}.1f} µs")
    floor_is = "floor: one round trip, raw, on the same connection"
    print(f"   {floor_is}{figures.median('floor') * 1e6:>{WIDTH - len(floor_is)}.1f} µs")
    print(f"     {first_line(query)}")
    print(f"   {verdict(figures.ratio('handle()', 'floor'), 1.5)}")
    print(
{%- if one_transaction %}
        "   the statements it sent, raw (BEGIN, the round trip, COMMIT: the claim opens the transaction that the effect"
        " shares), with the work every duplicate must do in Python (the payload's fingerprint, the skip's log"
{%- else %}
        "   the round trip with the work every duplicate must do in Python (the payload's fingerprint, the skip's log"
{%- endif %}
        f" line): {figures.median('required') * 1e6:.1f} µs, {figures.ratio('required', 'floor'):.2f} times the"
        f" floor; handle() is {figures.ratio('handle()', 'required'):.2f} times that"
    )
    print_split(split)


def effects_sink() -> Any:
    """Where the effects arrive, as the replay suite counts them: {{ "a local SMTP sink" if cookiecutter.effect_kind == "external_no_reference" else ("a local provider" if cookiecutter.effect_kind == "external_with_reference" else "the effects table") }}."""
    from {{ slug }}_proof.sinks import Effects
{% if one_transaction %}
    sink = Effects(default_store().engine)
{%- else %}
    sink = Effects()
{%- endif %}
    sink.start()
    return sink


def start(command: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, cwd=KIT_ROOT, env={**env}, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def in_turn(variants: Sequence[T], number: int) -> list[T]:
    """The variants, each round another going first."""
    shift = number % len(variants)
    return [*variants[shift:], *variants[:shift]]


def median_ratio(rates: Mapping[str, list[float]], name: str, base: str) -> float:
    """The median over the rounds of one variant's rate over another's: a round's variants ran one after the other."""
    return statistics.median(a / b for a, b in zip(rates[name], rates[base], strict=True))


def report_throughput(where: str, rates: Mapping[str, list[float]], floor: float) -> None:
    print(f"3. throughput of {where}, {len(rates['claimed'])} round(s), the medians")
    shown = {
        "claimed": "with the claim (the kit's own)",
        "floor": "floor: its statements, raw, around the effect",
        "bare": "bare: the effect alone",
    }
    for name, rate in rates.items():
        median = statistics.median(rate)
        print(f"   {shown[name]}{median:>{WIDTH - len(shown[name])}.1f} tasks/s  {1e3 / median:6.2f} ms a task")
    rounds = ", ".join(f"{c / b:.2f}" for c, b in zip(rates["claimed"], rates["bare"], strict=True))
    print(f"   each round, with the claim over bare: {rounds}")
    if "floor" in rates:
        # the best the claim can do here: the floor variant runs the kit's statements, raw, on the kit's connection
        print(
            f"   the floor over bare: {median_ratio(rates, 'floor', 'bare'):.2f}; with the claim over the floor:"
            f" {median_ratio(rates, 'claimed', 'floor'):.2f}"
        )
    else:
        bare = 1 / statistics.median(rates["bare"])
        print(f"   the floor here, a bare task plus goal 1's floor ({floor * 1e3:.2f} ms): {bare / (bare + floor):.2f}")
    print(f"   {verdict(median_ratio(rates, 'claimed', 'bare'), 0.85, at_most=False)}\n")


{%- if celery %}


def waited(result: Any, timeout: float) -> None:
    """Waits for a task's result, then removes it from the result backend: the benchmark leaves nothing there."""
    try:
        result.get(timeout=timeout)
    finally:
        result.forget()


def throughput(tasks: int, rounds: int, pool: str, floor: Floor, floor_seconds: float) -> None:
    """Tasks per second of one real worker process, prefetch 1: the kit's task, a bare one, and the floor's (its
    statements, raw, around the effect; not where the effect writes in the claim's transaction)."""
    # a queue of the benchmark's own, so that nothing else is purged or run
    os.environ["CELERY_QUEUE"] = f"{PREFIX}queue"
{%- if not one_transaction %}
    floor_file = Path(tempfile.gettempdir()) / f"{PREFIX}floor.json"
    floor.save(floor_file)
    os.environ[FLOOR_FILE] = str(floor_file)
{%- endif %}
    sink = effects_sink()
    env = {**os.environ, **sink.env(), "PYTHONPATH": os.pathsep.join(IMPORT_PATHS)}
    from bench_tasks import BARE_TASK, {{ "" if one_transaction else "FLOOR_TASK, " }}broker_name, drop_queue

    from {{ slug }}.celery_app import app
    from {{ slug }}.tasks import TASK_NAME

    log = Path(tempfile.gettempdir()) / f"{PREFIX}worker.log"
    options = ["-P", pool, "-c", "1", "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip"]
    command = [sys.executable, "-m", "celery", "-A", "bench_tasks", "worker", "-n", f"{PREFIX}@%h", *options]
    worker = start([*command, "-l", "WARNING"], env, log)
    try:
        variants = [("claimed", TASK_NAME), {{ "" if one_transaction else '("floor", FLOOR_TASK), ' }}("bare", BARE_TASK)]
        for _, name in variants:
            waited(app.send_task(name, args=[f"{PREFIX}warm-{name}", DETAILS]), 120)
        rates: dict[str, list[float]] = {variant: [] for variant, _ in variants}
        for number in range(rounds):
            for variant, name in in_turn(variants, number):
                keys = [f"{PREFIX}{variant}-{number}-{i}" for i in range(tasks)]
                began = time.perf_counter()
                # no result is kept, as `operations send` keeps none; the last one's result says all are done:
                # one worker process with prefetch 1 takes the messages in order
                for key in keys[:-1]:
                    app.send_task(name, args=[key, DETAILS], ignore_result=True)
                waited(app.send_task(name, args=[keys[-1], DETAILS]), 600)
                rates[variant].append(tasks / (time.perf_counter() - began))
                assert all(sink.count(key) == 1 for key in keys), "an effect is missing at the sink"
        where = f"one `celery worker` (-P {pool} -c 1, prefetch 1) on {broker_name(app)}"
        report_throughput(where, rates, floor_seconds)
    finally:
        stop(worker)
        drop_queue(app)
        sink.stop()
{%- if not one_transaction %}
        floor_file.unlink(missing_ok=True)
{%- endif %}
        print(f"   (the worker's log: {log})")
{%- else %}


def queue_depth(client: Any, url: str) -> int:
    """Messages waiting or in flight: 0 once every message was handled and deleted."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[name]) for name in names)


def run_through(client: Any, url: str, keys: list[str], make_body: Callable[..., str]) -> float:
    """Seconds from the first message sent until the queue is empty. The queue is fed 10 at a time and kept short
    (moto's server looks at every message it holds on each call; SQS does not), and looked at every 50 ms: each
    call to moto's server costs it milliseconds that the consumer would wait for."""
    began = progress = time.perf_counter()
    sent, last = 0, -1
    while True:
        depth = queue_depth(client, url)
        if sent == len(keys) and depth == 0:
            return time.perf_counter() - began
        if (depth, sent) != last:
            last, progress = (depth, sent), time.perf_counter()
        elif time.perf_counter() - progress > 120:
            raise RuntimeError(f"{url}: no message handled for 2 minutes; see the consumer's log")
        while sent < len(keys) and depth < 30:
            batch = keys[sent : sent + 10]
            entries = [{"Id": str(i), "MessageBody": make_body(key, DETAILS)} for i, key in enumerate(batch)]
            client.send_message_batch(QueueUrl=url, Entries=entries)
            sent += len(batch)
            depth += len(batch)
        time.sleep(0.05)


def moto_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's SQS server in a process of its own (not a thread of this one, which runs the sink), and its URL."""
    port = free_port()
    server = start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], os.environ, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)


def throughput(tasks: int, rounds: int, floor: Floor, floor_seconds: float) -> None:
    """Messages per second of one real consumer process: the kit's, a bare one, and the floor's (its statements on a
    raw, around the effect; not where the effect writes in the claim's transaction)."""
    from {{ slug }}.consumer import create_queues, make_body, sqs_client

    consumers = {
        "claimed": [sys.executable, "-m", "{{ slug }}.consumer"],
{%- if not one_transaction %}
        "floor": [sys.executable, str(KIT_ROOT / "benchmarks" / "bench_consumer.py"), "floor"],
{%- endif %}
        "bare": [sys.executable, str(KIT_ROOT / "benchmarks" / "bench_consumer.py"), "bare"],
    }
    logs = {name: Path(tempfile.gettempdir()) / f"{PREFIX}{name}.log" for name in ("moto", *consumers)}
    server, endpoint = moto_server(logs["moto"])
    # moto's server, the benchmark's own queues; the environment's AWS and SQS settings are left alone
    for name in ("SQS_QUEUE_URL", "SQS_DEAD_LETTER_QUEUE_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"):
        os.environ.pop(name, None)
    os.environ.update(
        {
            "SQS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            # no sweeps while timed; a short long poll, so that a consumer stops soon after SIGTERM
            "SQS_SWEEP_EVERY_SECONDS": "0",
            "SQS_WAIT_TIME_SECONDS": "1",
        }
    )
{%- if not one_transaction %}
    floor_file = Path(tempfile.gettempdir()) / f"{PREFIX}floor.json"
    floor.save(floor_file)
    os.environ[FLOOR_FILE] = str(floor_file)
{%- endif %}
    sink = effects_sink()
    env = {**os.environ, **sink.env(), "PYTHONPATH": os.pathsep.join(IMPORT_PATHS)}
    client = sqs_client()
    urls: dict[str, str] = {}
    started: list[subprocess.Popen[bytes]] = [server]
    try:
        for variant, command in consumers.items():
            os.environ["SQS_QUEUE_NAME"] = f"{PREFIX}{variant}"
            urls[variant], _ = create_queues(client)
            started.append(start(command, {**env, "SQS_QUEUE_NAME": f"{PREFIX}{variant}"}, logs[variant]))
        for variant in consumers:
            run_through(client, urls[variant], [f"{PREFIX}warm-{variant}"], make_body)
        rates: dict[str, list[float]] = {variant: [] for variant in consumers}
        for number in range(rounds):
            for variant in in_turn(list(consumers), number):
                keys = [f"{PREFIX}{variant}-{number}-{i}" for i in range(tasks)]
                rates[variant].append(tasks / run_through(client, urls[variant], keys, make_body))
                assert all(sink.count(key) == 1 for key in keys), "an effect is missing at the sink"
        where = "one consumer process (`python -m {{ slug }}.consumer`) on moto's SQS server"
        report_throughput(where, rates, floor_seconds)
    finally:
        for process in reversed(started):
            stop(process)
        sink.stop()
{%- if not one_transaction %}
        floor_file.unlink(missing_ok=True)
{%- endif %}
        print(f"   (logs: {', '.join(str(log) for log in logs.values())})")
{%- endif %}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--operations", type=int, default=2000, help="operations per variant, goals 1 and 2")
    parser.add_argument("--tasks", type=int, default={{ 200 if celery else 60 }}, help="tasks per variant and round, goal 3")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of goal 3, each variant once a round")
{%- if celery %}
    parser.add_argument("--pool", choices=["prefork", "solo"], default="prefork", help="the worker's pool, goal 3")
{%- endif %}
    args = parser.parse_args()
{%- if celery %}
    if not os.environ.get("CELERY_BROKER_URL"):
        sys.exit("set CELERY_BROKER_URL (Redis or RabbitMQ) too: goal 3 runs a worker on it")
{%- endif %}
    kit_log = Path(tempfile.gettempdir()) / f"{PREFIX}kit.log"
    log_as_the_worker(kit_log)
    raw = raw_connection()
    header(
        "{{ slug }} ({{ cookiecutter.queue_system }}, {{ cookiecutter.effect_kind }}, {{ cookiecutter.stale_claim_policy }}): the claim's cost against the floor",
        raw,
    )
    migrate()
    try:
        floor, floor_seconds = claim_and_complete(args.operations)
        duplicate(args.operations)
        throughput(args.tasks, args.rounds{{ ", args.pool" if celery else "" }}, floor, floor_seconds)
    finally:
        raw.execute(f"DELETE FROM {TABLE} WHERE job_type = %s AND operation_key LIKE %s", (JOB_TYPE, f"{PREFIX}%"))
{%- if one_transaction %}
        raw.execute("DELETE FROM {{ cookiecutter.job_type }}_effects WHERE operation_key LIKE %s", (f"{PREFIX}%",))
{%- endif %}
        raw.close()
    print(f"{load()} at the end; the kit's log: {kit_log}")


if __name__ == "__main__":
    main()
