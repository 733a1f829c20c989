{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
{%- set kind = cookiecutter.effect_kind -%}
{%- set policy = cookiecutter.stale_claim_policy -%}
"""The try-out: one operation, a worker killed mid-effect, the sweeper, and what the policy makes of it.

    python -m {{ slug }}_proof try-out

Nothing in it is simulated. It starts these, and stops them at the end:
{%- if kind == "external_no_reference" %}
- an SMTP sink (aiosmtpd) on a free local port: the emails arrive there, not at your SMTP_HOST;
{%- elif kind == "external_with_reference" %}
- a local provider (HTTP, on a free port) that keeps the references it receives: not your PROVIDER_URL;
{%- endif %}
{%- if celery %}
- Celery's filesystem transport in a temporary folder, a broker with no server (your CELERY_BROKER_URL is not
  used), and a `celery worker` process that runs the kit's own task;
{%- else %}
- moto's SQS server on a free local port with a queue of its own (your AWS account is not used), and a
  consumer process that runs the kit's own consumer;
{%- endif %}
then it sends one operation through that queue. The worker performs the effect and pauses before it marks the
claim completed (case 6: the record cannot tell whether the effect happened); the try-out kills it with
SIGKILL, ages the claim past the lease in SQL as the replay suite does, runs the kit's sweeper, and shows what
the policy `{{ policy }}` made of it. The record stays in the database of DATABASE_URL (unset: the SQLite file
here), so that the command it prints next works.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
{%- if celery %}
from typing import Any
{%- endif %}

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from {{ cookiecutter.project_slug }} import operations, settings
from {{ cookiecutter.project_slug }}.claims import ClaimStore, default_store
from {{ cookiecutter.project_slug }}.job import sweep
from {{ cookiecutter.project_slug }}.producer import publish

from . import PROG
from .crash_points import PauseOrders
from .sinks import Effects

TABLE = settings.RECORD_TABLE
DETAILS = {"email": "customer@example.com"}
# the worker finds its pause orders here
FOLDER_VARIABLE = "TRY_OUT_FOLDER"
{%- if celery %}


def use_folder_broker(app: Any, folder: Path) -> None:
    """Celery's filesystem transport in `folder`, for the try-out's worker and its sender alike."""
    messages = folder / "messages"
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "data_folder_in": str(messages),
        "data_folder_out": str(messages),
        "control_folder": str(folder / "control"),
        "polling_interval": 0.1,
    }
    # one worker, no one to talk to: no remote control (it would need a fanout exchange)
    app.conf.worker_enable_remote_control = False


@contextlib.contextmanager
def local_queue(folder: Path) -> Iterator[list[str]]:
    """A broker with no server; the worker's command line."""
    for name in ("messages", "control", "results"):
        (folder / name).mkdir()
    # Celery reads these two before its configuration: the user's broker must not see the try-out
    os.environ["CELERY_BROKER_URL"] = "filesystem://localhost/"
    os.environ["CELERY_RESULT_BACKEND"] = f"file://{folder / 'results'}"
    # the sender's app: imported now, when it reads the try-out's broker
    from {{ cookiecutter.project_slug }}.celery_app import app

    use_folder_broker(app, folder)
    yield [
        *(sys.executable, "-m", "celery", "-A", "{{ slug }}_proof.try_out_worker", "worker"),
        # solo: the worker process itself runs the task, so the SIGKILL meets it mid-effect
        *("--loglevel=INFO", "--pool=solo", "--without-mingle", "--without-gossip", "--without-heartbeat"),
    ]
{%- else %}


@contextlib.contextmanager
def local_queue(folder: Path) -> Iterator[list[str]]:
    """moto's SQS server on a free port, with the kit's queues made by `create-queues`; the worker's command line."""
    from moto.server import ThreadedMotoServer

    from {{ cookiecutter.project_slug }}.consumer import create_queues

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server: a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "SQS_QUEUE_URL", "SQS_DEAD_LETTER_QUEUE_URL"):
            os.environ.pop(name, None)
        os.environ.update(
            {
                "SQS_ENDPOINT_URL": f"http://{host}:{port}",
                "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "try-out",
                "AWS_SECRET_ACCESS_KEY": "try-out",
                "SQS_QUEUE_NAME": "{{ cookiecutter.job_type }}-try-out",
                "SQS_WAIT_TIME_SECONDS": "1",
                # the try-out runs the sweeper itself, where you see it
                "SQS_SWEEP_EVERY_SECONDS": "0",
            }
        )
        queue_url, dead_letter_queue_url = create_queues()
        os.environ.update({"SQS_QUEUE_URL": queue_url, "SQS_DEAD_LETTER_QUEUE_URL": dead_letter_queue_url})
        yield [sys.executable, "-m", "{{ slug }}_proof.try_out_worker"]
    finally:
        server.stop()
{%- endif %}


@contextlib.contextmanager
def effects_received(store: ClaimStore, delay: float = 0.0) -> Iterator[Effects]:
    """Where the effect arrives, started here; workers and the sweeper are pointed at it. `delay`: seconds the
    receiver takes to answer each effect (the soak's)."""
{%- if kind == "same_database" %}
    effects = Effects(store.engine)  # a row in the claim's own transaction: nothing answers, nothing to delay
{%- else %}
    effects = Effects(delay)
{%- endif %}
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd's line per connection
    effects.start()
    os.environ.update(effects.env())
    try:
        yield effects
    finally:
        effects.stop()


def missing_table(store: ClaimStore, command: str = "try-out") -> str | None:
    """One line when the record table is not there yet (the migration has not run), for `command`'s message."""
    try:
        with store.engine.connect() as conn:
            conn.execute(text(f"SELECT count(*) FROM {TABLE}"))
    except SQLAlchemyError:
        database = store.engine.url.render_as_string(hide_password=True)
        return f"{PROG} {command}: {database} has no table {TABLE}: run `alembic upgrade head` first"
    return None


def record(store: ClaimStore, key: str) -> str:
    """The record as a person reads it: status, attempt, note."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(f"SELECT status, attempt, note FROM {TABLE} WHERE job_type = :job_type AND operation_key = :key"),
            {"job_type": settings.JOB_TYPE, "key": key},
        ).one_or_none()
    if row is None:
        return "no record"
    return f"{row.status}, attempt {row.attempt}" + (f" ({row.note})" if row.note else "")


def try_out() -> int:
    store = default_store()
    problem = missing_table(store)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    started = time.monotonic()
    # a key of its own, so that the try-out never meets an operation of yours
    key = time.strftime("TRY-%Y%m%d-%H%M%S")
    step = iter(range(1, 10))

    def say(line: str) -> None:
        print(f"{next(step)}. {line}", flush=True)

    with (
        tempfile.TemporaryDirectory(prefix="try-out-") as scratch,
        effects_received(store) as effects,
        local_queue(Path(scratch)) as worker_command,
    ):
        folder = Path(scratch)
        orders = PauseOrders(folder)
        orders.give("after_effect")
        with (folder / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                worker_command, env={**os.environ, FOLDER_VARIABLE: scratch}, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            say(f"sent {settings.JOB_TYPE} {key} through the queue: message {publish(key, DETAILS)}")
            try:
                pid = orders.paused_pid(timeout=60, running=lambda: worker.poll() is None)
            except AssertionError as error:
                tail = (folder / "worker.log").read_text(errors="replace")[-3000:]
                print(f"{PROG} try-out: {error}. The worker's log:\n{tail}", file=sys.stderr)
                return 1
{%- if kind == "same_database" %}
            say(
                f"the worker (pid {pid}) claimed it and wrote the effect's row in the claim's transaction,"
                " and stopped before it committed"
            )
{%- else %}
            say(
                f"the worker (pid {pid}) performed the effect (received: {effects.count(key)})"
                " and stopped before it marked the claim completed"
            )
{%- endif %}
            os.kill(pid, signal.SIGKILL)
            worker.wait(timeout=30)
            say(f"killed the worker with SIGKILL; the record: {record(store, key)}")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        if store.age(key, settings.LEASE_SECONDS + 1):
            say(f"aged the claim past the lease in SQL ({settings.LEASE_SECONDS + 1} s older), as if the lease ran out")
        else:
            say("no claim to age past the lease")
        counts = sweep(store)
        say(f"ran the sweeper: stale claims {counts['stale']}, settled {counts['settled']}")
        received = effects.count(key)
{%- if kind == "same_database" %}
    say(f"the record: {record(store, key)}; the effect's rows: {received}")
{%- else %}
    say(f"policy `{settings.STALE_CLAIM_POLICY}`: the record: {record(store, key)}; received: {received}")
{%- endif %}
    print()
    print(operations.held_table(store))
    print()
{%- if kind == "same_database" %}
    print(
        "The claim, the effect's row and the completion share one transaction: the SIGKILL rolled them all back,\n"
        "so nothing was left to hold or sweep, and a redelivery of the message performs it once."
    )
{%- elif policy == "hold" %}
    print(
        f"Held for a person: nothing more happens until someone decides. The effect was received ({received}),\n"
        "so the decision is that it is done; type:\n\n"
        f'    python -m {operations.PROG} resolve {key} --done --by you --why "the effect was received"\n\n'
        "(--release instead allows one more attempt, when the effect did not happen.)"
    )
{%- elif policy == "resend" %}
    print(
        f"Taken over and performed again by the sweeper: received {received} times, the rare duplicate that\n"
        "`resend` accepts so that nothing is lost. Nothing is held."
    )
{%- elif policy == "skip" %}
    print(
        f"Abandoned: given up for good. Here the effect had happened (received {received}); had the worker died\n"
        "before it, it would be missed: the rare miss that `skip` accepts. Nothing more happens; nothing is held."
    )
{%- else %}
    print(
        f"Looked up: the provider holds the reference, so the sweeper completed the record without sending\n"
        f"again (received {received}). Nothing is held."
    )
{%- endif %}
    print(f"\n(the try-out took {time.monotonic() - started:.0f} s)")
    return 0
