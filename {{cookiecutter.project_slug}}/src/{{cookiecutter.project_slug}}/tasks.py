{%- set slug = cookiecutter.project_slug -%}
"""The task `{{ cookiecutter.job_type }}` and the sweeper, on whichever Celery app runs them.

`shared_task` registers both on every Celery app of the process: the kit's own (celery_app.py) and a host's,
e.g. a Django project's app that finds them with `autodiscover_tasks()` ({{ slug }}.django_app),
or any app that lists this module in `include` or `imports`. The guarantee's options travel with the task; the
settings that only the app or the worker can give (prefetch; against the lease, Redis's visibility timeout or
RabbitMQ's consumer timeout) are checked when a worker starts: a worker whose configuration contradicts the
guarantee refuses to start, with one line that names the setting and what it must be.
"""

from __future__ import annotations

import logging
import random
{% if cookiecutter.effect_kind == "external_no_reference" -%}
import smtplib
{% endif -%}
import sys
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import Retry
from celery.signals import worker_init

from . import settings, telemetry
from .claims import BadMessage, ClaimRace, default_store, person_needed
from .job import DATABASE_UNREACHABLE, deliver, sweep

log = telemetry.delivery_log(__name__)

TASK_NAME = "{{ slug }}.{{ cookiecutter.job_type }}"
SWEEP_TASK_NAME = "{{ slug }}.sweep_stale_claims"
{%- set other = {"external_no_reference": "the mail server", "external_with_reference": "the provider"}.get(cookiecutter.effect_kind, "") %}
# The database unreachable (job.DATABASE_UNREACHABLE) is retried with backoff for as long as it lasts: an outage
# of minutes or hours must not lose the work (a claim made before it waits for the end of its lease). Other
# failures worth a retry are retried TRANSIENT_RETRIES times: the network, {{ other + ", " if other else "" }}a race with another run.
# A bad message (BadMessage) is neither: it fails at once and is acknowledged, never retried. Past its retries, or
# at once for an error of no known kind, the operation is given up: its record ends `failed`, for a person.
TRANSIENT_ERRORS = (OSError, ClaimRace{{ ", smtplib.SMTPException" if cookiecutter.effect_kind == "external_no_reference" else "" }})
TRANSIENT_RETRIES = 5
# The backoff doubles from 1 s up to this, the longest run; the replay suite shortens it, and says so.
BACKOFF_MAX_SECONDS: float = settings.LONGEST_RUN_SECONDS
# The message's headers that count each cause's failures across its retries (Celery's own count adds up every
# retry: the database's, and the waits for the end of a lease).
FAILURES_HEADERS = {
    "database": "{{ slug }}_database_failures",
    "transient": "{{ slug }}_transient_failures",
}
# The replay suite shortens the visibility timeout below the lease, so that a killed worker's message comes back
# in seconds; it says so here. Nothing else should.
VISIBILITY_BELOW_LEASE_ALLOWED = False


@shared_task(
    bind=True,
    name=TASK_NAME,
    # Acknowledge after the run, and requeue when the worker process is lost: a worker that dies mid-run
    # leaves the message to be delivered again instead of losing it.
    acks_late=True,
    reject_on_worker_lost=True,
    # no limit of Celery's: the task limits its retries itself, by cause (retry_after)
    max_retries=None,
    throws=(BadMessage,),
    # A run is stopped before its claim could look stale (enforced by the prefork pool).
    time_limit=settings.LEASE_SECONDS,
)
def {{ cookiecutter.job_type }}(
    self: Task,
    {{ cookiecutter.operation_key_name }}: object = None,
    details: object = None,
) -> str:
    """Performs the effect once for `{{ cookiecutter.operation_key_name }}`; `details` is the rest of the message."""
    key = {{ cookiecutter.operation_key_name }}
    try:
        outcome = deliver(key, details)
    except BadMessage:
        raise
    except DATABASE_UNREACHABLE as error:
        problem = person_needed(error)
        if problem:
            log.line(
                logging.ERROR, "retrying", key, None, "the database refused: %s; the message is kept, retried", problem
            )
        raise retry_after(self, error, "database") from error
    except TRANSIENT_ERRORS as error:
        if failures(self, "transient") < TRANSIENT_RETRIES:
            raise retry_after(self, error, "transient") from error
        give_up(key, details, error, f"failed after {TRANSIENT_RETRIES + 1} attempts")
        raise
    except Exception as error:
        give_up(key, details, error, "failed with an error that no retry is expected to cure")
        raise
    if outcome.retry_in is not None:
        # A redelivery inside the lease: the claim's owner may still be working. Keep the message and come
        # back when the lease ends: then the record is completed, or stale and the policy applies.
        raise self.retry(countdown=outcome.retry_in)
    return outcome.action


def failures(task: Task, cause: str) -> int:
    """How many runs of this message failed of `cause` before this one (counted in its headers)."""
    return int(task.request.get(FAILURES_HEADERS[cause]) or 0)


def retry_after(task: Task, error: Exception, cause: str) -> Retry:
    """The task's retry after a failure: in 1, 2, 4 ... s (half of it jittered), at most BACKOFF_MAX_SECONDS,
    counted by `cause` in the message's headers."""
    failed = failures(task, cause) + 1
    delay = min(2.0 ** (failed - 1), BACKOFF_MAX_SECONDS)
    countdown = delay / 2 + random.uniform(0, delay / 2)
    headers = {**(task.request.headers or {}), FAILURES_HEADERS[cause]: failed}
    return task.retry(exc=error, countdown=countdown, headers=headers)


def give_up(key: object, details: object, error: Exception, why: str) -> None:
    """The task fails and its message is acknowledged: the record ends `failed`, with the error, where the person's
    command lists it (operations held), instead of `released` with no retry to come."""
    note = f"{why}: {error!r}"[:1000]
    try:
        failed = default_store().fail(str(key), details if isinstance(details, dict) else {}, note)
    except Exception:
        log.exception("%s %r: %s; the record could not be marked failed", settings.JOB_TYPE, key, why)
        return
    if failed:
        telemetry.count("failed")
        log.line(logging.ERROR, "failed", key, None, "%s; the record is failed, for a person (operations held)", note)


@shared_task(name=SWEEP_TASK_NAME)
def sweep_stale_claims() -> dict[str, int]:
    """The sweeper on beat's schedule: settles claims older than the lease whose redelivery has not come."""
    return sweep()


def guarantee_problem(app: Celery, prefetch_multiplier: int) -> str | None:
    """The first setting of `app` (and its worker's prefetch multiplier) that contradicts the guarantee, as one
    line naming the setting and what it must be; None when there is none."""
    task = app.tasks[TASK_NAME]
    lease = settings.LEASE_SECONDS
    if not task.acks_late:
        return (
            f"{TASK_NAME} has acks_late={task.acks_late!r} (task_annotations?); it must be True, so that a worker"
            " that dies mid-run leaves its message to be delivered again"
        )
    if not task.reject_on_worker_lost:
        return (
            f"{TASK_NAME} has reject_on_worker_lost={task.reject_on_worker_lost!r} (task_annotations?); it must be"
            " True, so that the message of a worker process that was killed goes back to the queue"
        )
    time_limit = task.time_limit or app.conf.task_time_limit
    if time_limit is None or time_limit > lease:
        has = "no hard time limit" if time_limit is None else f"the hard time limit {time_limit} s"
        return (
            f"{TASK_NAME} has {has} (task_time_limit, task_annotations?); it must be the lease, {lease} s, so that"
            " a run is stopped before its claim could look stale"
        )
    if prefetch_multiplier != 1:
        return (
            f"worker_prefetch_multiplier is {prefetch_multiplier}; it must be 1 (CELERY_WORKER_PREFETCH_MULTIPLIER"
            f" or --prefetch-multiplier 1): with acks_late, a message prefetched behind other runs waits"
            " unacknowledged and could outwait the broker's visibility timeout"
        )
    broker = app.connection_for_read()
    if broker.transport.driver_type == "redis" and not VISIBILITY_BELOW_LEASE_ALLOWED:
        # Redis hands an unacknowledged message to another worker after the visibility timeout
        visibility = broker.transport_options.get("visibility_timeout", broker.transport.Channel.visibility_timeout)
        if visibility <= lease:
            return (
                f"the Redis broker's visibility_timeout is {visibility} s (broker_transport_options); it must be"
                f" longer than the lease, {lease} s, or Redis hands a message that is still running, or waits for"
                " the end of a lease, to a second worker"
            )
    if broker.transport.driver_type == "amqp":
        # RabbitMQ closes the channel of a delivery left unacknowledged longer than its consumer_timeout: a run
        # (up to the lease) or a retry waiting for the end of a lease (a countdown of up to the lease) must fit
        consumer_timeout = settings.rabbitmq_consumer_timeout()
        if consumer_timeout <= lease:
            return (
                f"RabbitMQ's consumer_timeout is {consumer_timeout} s (CELERY_RABBITMQ_CONSUMER_TIMEOUT, default"
                f" RabbitMQ's 1800 s); it must be longer than the lease, {lease} s (raise consumer_timeout in"
                " rabbitmq.conf and say so in CELERY_RABBITMQ_CONSUMER_TIMEOUT), or RabbitMQ closes the channel of"
                " a task that waits unacknowledged for the end of a lease"
            )
    return None


@worker_init.connect
def refuse_to_start_against_the_guarantee(sender: Any = None, **_: Any) -> None:
    """Stops a worker that would run the kit's task against the guarantee, or on a database the kit cannot use (the
    table missing or not migrated, a failed login): one line, no traceback. Its messages wait in the queue."""
    app = getattr(sender, "app", None)
    if app is None or TASK_NAME not in app.tasks:
        return  # a worker of an app that does not run the kit's task
    problem = guarantee_problem(app, sender.prefetch_multiplier) or default_store().schema_problem()
    if problem:
        sys.exit(f"{{ slug }}: refusing to start the worker: {problem}")
