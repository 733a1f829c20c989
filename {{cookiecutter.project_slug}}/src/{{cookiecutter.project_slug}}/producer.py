{%- from "replay_matrix.jinja" import doc, py -%}
{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
"""The kit's way to send an operation: its record first, as `queued`, then its message.

    from {{ slug }}.producer import enqueue

    enqueue({{ doc(py(cookiecutter.example_key)) }}, {"email": "customer@example.com"})
    # inside the app's SQLAlchemy Session (a line of its own: the key may fill the line)
    enqueue({{ doc(py(cookiecutter.example_key)) }}, {...}, session=session)

Because the record exists before the message, an operation the broker loses is not lost: the sweeper sends every
record still queued after RESEND_QUEUED_AFTER_SECONDS again, and the claim makes an extra copy harmless. Inside the
app's Session (on the kit's database), the record is written in the app's transaction and the message sent only
once it commits: rolled back, neither exists. A message sent any other way still works; it has no record until a
run claims it.
"""

from __future__ import annotations

import contextlib
{% if not celery -%}
import functools
{% endif -%}
import logging
from collections.abc import Iterator, Mapping
from typing import Any

{% if celery -%}
from celery import Celery, current_app
from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url
{% else -%}
from botocore.exceptions import BotoCoreError, ClientError
{% endif -%}
from sqlalchemy import event
from sqlalchemy.orm import Session

from . import settings
from .claims import (
    ClaimStore,
    PayloadConflict,
    QueueUnreachable,
    default_store,
    encode_details,
    fingerprint,
    validate_details,
    validate_key,
)

log = logging.getLogger(__name__)
{%- if celery %}
# the kit's task, by name: a producer needs its name, not its code
TASK_NAME = "{{ slug }}.{{ cookiecutter.job_type }}"
{%- endif %}


def publish(key: str, details: Mapping[str, Any]) -> str:
    """Hands one operation's message to the queue, without a record; the id the queue gave it. QueueUnreachable when
    the queue cannot take it now."""
{%- if celery %}
    # to the app's queue for the task (its routes, or its default queue); a producer does not wait for the outcome
    # (the record has it): no result is stored for it
    with talking_to_the_queue():
        message = celery_app().send_task(TASK_NAME, args=[key, dict(details)], ignore_result=True)
    return str(message.id)


def check_queue() -> None:
    """QueueUnreachable unless the broker answers now: a person's `send` asks before it writes the record."""
    with talking_to_the_queue(), celery_app().connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, interval_start=0.5)  # a moment to come back, not kombu's 2 s


@contextlib.contextmanager
def talking_to_the_queue() -> Iterator[None]:
    """The broker's connection errors (kombu raises them once its retries are spent) as QueueUnreachable, in one
    line that says what to check."""
    try:
        yield
    except OperationalError as error:
        broker = maybe_sanitize_url(celery_app().conf.broker_write_url or "")  # broker_url unless set apart
        raise QueueUnreachable(
            f"the queue {queue()} cannot be reached ({one_line(error)}): check that the broker at {broker} runs"
            " (CELERY_BROKER_URL)"
        ) from error


def queue() -> str:
    """The queue the operation's messages go to: where the app's routes (or its default queue) send the task."""
    return str(celery_app().amqp.router.route({}, TASK_NAME)["queue"].name)


def celery_app() -> Celery:
    """The Celery app of this process: the one it made (a Django project's, whose settings set it up; a host's
    worker), so that the message goes where that app's workers listen; else the kit's own (celery_app.py)."""
    app = current_app._get_current_object()
    # Celery's fallback app (named "default"), made when this process made none of its own
    if app.main == "default":
        # imported here: the kit's app reads the broker from the environment when it is imported
        from .celery_app import app
    return app
{%- else %}
    from .consumer import make_body

    with talking_to_the_queue():
        client, url = _queue(*_where())
        return str(client.send_message(QueueUrl=url, MessageBody=make_body(key, details))["MessageId"])


def check_queue() -> None:
    """QueueUnreachable unless the queue answers now: a person's `send` asks before it writes the record."""
    with talking_to_the_queue():
        client, url = _queue(*_where())
        client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])


@contextlib.contextmanager
def talking_to_the_queue() -> Iterator[None]:
    """boto3's errors (no region or credentials, the endpoint down once its retries are spent, the queue missing or
    refusing) as QueueUnreachable, in one line that says what to check."""
    try:
        yield
    except (BotoCoreError, ClientError) as error:
        raise QueueUnreachable(
            f"the queue {queue()} cannot be reached ({one_line(error)}): check AWS_REGION, the AWS credentials,"
            " SQS_QUEUE_URL or SQS_QUEUE_NAME, and SQS_ENDPOINT_URL for a local SQS"
        ) from error


def _where() -> tuple[str | None, str | None, str | None, str]:
    return settings.aws_region(), settings.sqs_endpoint_url(), settings.queue_url(), settings.queue_name()


@functools.cache
def _queue(region: str | None, endpoint: str | None, url: str | None, name: str) -> tuple[Any, str]:
    """The SQS client and the queue's URL, made once per place the settings point at: a client takes tens of
    milliseconds to make, a message a few to send."""
    from .consumer import sqs_client

    client = sqs_client()
    return client, url or str(client.get_queue_url(QueueName=name)["QueueUrl"])


def queue() -> str:
    """The queue the operation's messages go to."""
    return settings.queue_url() or settings.queue_name()
{%- endif %}


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def enqueue(
    key: object, details: object = None, *, session: Session | None = None, store: ClaimStore | None = None
) -> str | None:
    """Asks for one operation: writes its record as `queued`, then sends its message; the message's id. With
    `session`, the record is written in the session's transaction and the message sent after its commit (None is
    returned: it has no id yet). BadMessage for a bad key or details, PayloadConflict for a known key with other
    details; a known key with the same details is sent again, which its claim makes harmless. QueueUnreachable when
    the queue cannot take the message: the record stays queued, for the sweeper."""
    operation_key = validate_key(key)
    payload = validate_details(details)
    encoded = encode_details(payload)
    payload_fingerprint = fingerprint(operation_key, encoded)
    store = store or default_store()
    if session is None:
        if not store.enqueue(operation_key, payload_fingerprint, encoded):
            check_known(operation_key, payload_fingerprint, store)
        # A failure to send leaves the record queued: the sweeper sends it later, and the caller hears of it now.
        return publish(operation_key, payload)
    if not store.enqueue(operation_key, payload_fingerprint, encoded, conn=session.connection()):
        check_known(operation_key, payload_fingerprint, store)

    def sent_after_commit(_session: Session) -> None:
        event.remove(session, "after_rollback", nothing_after_rollback)
        publish(operation_key, payload)

    def nothing_after_rollback(_session: Session) -> None:
        event.remove(session, "after_commit", sent_after_commit)
        log.info("%s %r: the app's transaction rolled back; neither record nor message", settings.JOB_TYPE, key)

    event.listen(session, "after_commit", sent_after_commit, once=True)
    event.listen(session, "after_rollback", nothing_after_rollback, once=True)
    return None


def check_known(key: str, payload_fingerprint: str, store: ClaimStore | None = None) -> None:
    """A key that has a record already: the same operation asked for again, or PayloadConflict for another one
    reusing the key."""
    record = (store or default_store()).read(key)
    if record is not None and record.payload_fingerprint != payload_fingerprint:
        raise PayloadConflict(
            f"{settings.OPERATION_KEY_NAME} {key!r} is already known with a different payload"
            f" (status {record.status}); refused, nothing sent"
        )
