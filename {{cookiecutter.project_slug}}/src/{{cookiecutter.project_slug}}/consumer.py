{%- from "replay_matrix.jinja" import doc, quoted -%}
{%- set slug = cookiecutter.project_slug -%}
"""The SQS consumer of `{{ cookiecutter.job_type }}`: receive, handle (job.py), then settle the message.

    python -m {{ slug }}.consumer                  # consumes until SIGTERM or SIGINT
    python -m {{ slug }}.consumer create-queues    # makes the queue and its dead-letter queue

A message's body is a JSON object, e.g.

    {"{{ cookiecutter.operation_key_name }}": {{ doc(quoted(cookiecutter.example_key)) }}, "details": {...}}

How each message is settled, once its outcome is known and not before:

    performed, skipped, held, abandoned -> deleted
    waiting (a claim younger than the lease) -> left in the queue, invisible until the lease ends (case 7)
    bad message (BadMessage, PayloadConflict) -> moved to the dead-letter queue at once, with the error
    the database unreachable -> left in the queue; back after 1, 3, 9 ... s, and this consumer receives nothing
        more until the database answers again
    any other error (the network, the mail server) -> left in the queue; back after a backoff; at the last
        receive the redrive policy allows, the record is marked failed (for a person: `operations held`) and the
        message moved to the dead-letter queue with the error

A consumer that dies leaves its message invisible for the visibility timeout; then SQS delivers it again.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import ClientError
from sqlalchemy import text

from . import settings, telemetry
from .claims import BadMessage, ClaimStore, default_store, person_needed
from .job import DATABASE_UNREACHABLE, Perform, deliver, sweep

log = telemetry.delivery_log(__name__)
JOB_TYPE = settings.JOB_TYPE
KEY_NAME = settings.OPERATION_KEY_NAME
# While the database is unreachable, a consumer asks it again after 0.5, 1, 2 ... s, at most this far apart; the
# replay suite shortens it, and says so.
DATABASE_PROBE_MAX_SECONDS = 5.0
BODY_FIELDS = (KEY_NAME, "details")


@dataclass(frozen=True)
class Settled:
    """How one received message was settled: SUCCESS with the outcome's action (deleted), FAILURE with the error
    (dead-lettered), or RETRY (left in the queue: waiting for the end of a lease, or after a transient error)."""

    message_id: str
    state: str
    value: str
    receive_count: int
    receipt_handle: str


def make_body(key: object, details: Mapping[str, Any] | None = None) -> str:
    """The body of a message for one operation."""
    return json.dumps({KEY_NAME: key, "details": dict(details or {})})


def parse_body(body: str) -> tuple[object, object]:
    """The key and details of a message's body, or BadMessage; the key itself is checked by the job."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise BadMessage(f"the body is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadMessage(f"the body must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(BODY_FIELDS))
    if unknown:
        raise BadMessage(f"the body has unknown fields: {', '.join(unknown)}")
    return data.get(KEY_NAME), data.get("details")


def sqs_client() -> Any:
    """A boto3 SQS client for the region and endpoint in settings (credentials: boto3's usual chain).

    Every SQS client of the kit is made here, so AWS_REGION and the endpoint variables mean the same everywhere.
    """
    session = boto3.session.Session()
    return session.client("sqs", region_name=settings.aws_region(), endpoint_url=settings.sqs_endpoint_url())


# Seconds between SQS's receive and the moment a run sees the message that it cannot know: Lambda's poller
# receives before it invokes the function.
RECEIVE_MARGIN = 60


def visibility_for_waiting(retry_in: float, held: float = 0.0) -> int:
    """Seconds to keep a message that met a young claim invisible: to the end of the lease, within the 12 h that SQS
    allows from the receive, less the `held` seconds since it and RECEIVE_MARGIN (SQS refuses a longer one, and the
    message would come back at once)."""
    room = settings.SQS_MAX_VISIBILITY_SECONDS - math.ceil(held) - RECEIVE_MARGIN
    return max(1, min(math.ceil(retry_in), room))


def backoff(receive_count: int) -> int:
    """Seconds before a message whose run failed transiently comes back: 1, 2, 4 ... up to the longest run."""
    doubled = int(2 ** min(max(receive_count - 1, 0), 16))
    return max(1, min(doubled, settings.LONGEST_RUN_SECONDS))


def database_backoff(receive_count: int) -> int:
    """Seconds before a message that met the database unreachable comes back: 1, 3, 9 ... up to SQS's 12 hours.

    Each return is a receive, and the redrive policy moves a message to the dead-letter queue after
    `maxReceiveCount` of them: growing threefold, the returns span far longer than the doubling backoff's, so that
    a database outage of hours does not dead-letter a good message (the consumer, unlike Lambda, also stops
    receiving until the database answers: Consumer.wait_for_database).
    """
    tripled = 3 ** min(max(receive_count - 1, 0), 16)
    return max(1, min(tripled, settings.SQS_MAX_VISIBILITY_SECONDS))


class Consumer:
    """Receives `{{ cookiecutter.job_type }}` messages from one queue with long polling, one at a time."""

    def __init__(
        self,
        client: Any = None,
        *,
        queue_url: str | None = None,
        dead_letter_queue_url: str | None = None,
        store: ClaimStore | None = None,
        perform: Perform | None = None,
        on_settled: Callable[[Settled], None] | None = None,
    ) -> None:
        self.client = client or sqs_client()
        self.queue_url = queue_url or settings.queue_url() or self._url_of(settings.queue_name())
        named = dead_letter_queue_url or settings.dead_letter_queue_url()
        self.dead_letter_queue_url = named or self._redrive_target()
        self.store = store
        self.perform = perform
        self.on_settled = on_settled
        self.stopping = False
        # set when a run met the database unreachable: run() receives nothing more until it answers
        self.database_unreachable = False

    def _url_of(self, name: str) -> str:
        return str(self.client.get_queue_url(QueueName=name)["QueueUrl"])

    def _redrive_target(self) -> str:
        attributes = self.client.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["RedrivePolicy"])
        policy = attributes.get("Attributes", {}).get("RedrivePolicy")
        if not policy:
            raise SystemExit(
                f"{self.queue_url} has no redrive policy and SQS_DEAD_LETTER_QUEUE_URL is unset: bad messages"
                " would have nowhere to go. Run `create-queues`, or set one of them."
            )
        # arn:aws:sqs:<region>:<account>:<name>
        *_, account, name = json.loads(policy)["deadLetterTargetArn"].split(":")
        return str(self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"])

    def receive(self, max_messages: int = 1, wait_seconds: int | None = None) -> list[dict[str, Any]]:
        """One long poll; each message received stays invisible to others for the visibility timeout."""
        response = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=settings.wait_time_seconds() if wait_seconds is None else wait_seconds,
            VisibilityTimeout=settings.visibility_timeout(),
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        return list(response.get("Messages", []))

    def poll_once(self, wait_seconds: int | None = None) -> list[Settled]:
        """The poll step: one receive, and each message it brought handled and settled."""
        messages = self.receive(wait_seconds=wait_seconds)
        received_at = time.monotonic()
        return [self.process(message, received_at) for message in messages]

    def process(self, message: Mapping[str, Any], received_at: float | None = None) -> Settled:
        """Handles one received message and settles it: delete, keep invisible, or dead-letter. `received_at`:
        time.monotonic() when it was received (a wait inside the lease counts from it)."""
        message_id = str(message["MessageId"])
        receipt = str(message["ReceiptHandle"])
        receive_count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))

        def settled(state: str, value: str) -> Settled:
            result = Settled(message_id, state, value, receive_count, receipt)
            if self.on_settled is not None:
                self.on_settled(result)
            return result

        key: object = None
        details: object = None
        try:
            key, details = parse_body(str(message["Body"]))
            outcome = deliver(key, details, store=self.store, perform=self.perform)
        except BadMessage as error:
            # It can never succeed as it is: to the dead-letter queue now, rather than back again and again.
            log.error("%s message %s refused: %s; moved to the dead-letter queue", JOB_TYPE, message_id, error)
            self.dead_letter(message, error)
            return settled("FAILURE", f"{type(error).__name__}: {error}")
        except Exception as error:
            # Not deleted: SQS delivers it again after the backoff. An effect that raised released its claim; a
            # claim whose completion did not reach the database stays claimed, for the policy after the lease.
            if isinstance(error, DATABASE_UNREACHABLE):
                self.database_unreachable = True
                delay = database_backoff(receive_count)
                problem = person_needed(error)
                if problem:
                    log.error("%s message %s: the database refused: %s; kept", JOB_TYPE, message_id, problem)
            elif receive_count >= settings.max_receive_count():
                # the redrive policy would move it to the dead-letter queue at the next receive, with no record of
                # why: given up here, the record failed with the error, where the person's command lists it
                self.give_up(message, key, details, error)
                return settled("FAILURE", f"{type(error).__name__}: {error}")
            else:
                delay = backoff(receive_count)
            log.warning("%s message %s failed (%r); back in %d s", JOB_TYPE, message_id, error, delay)
            self.keep_invisible(receipt, delay)
            return settled("RETRY", f"{type(error).__name__}: {error}")
        if outcome.retry_in is not None:
            # Case 7: a claim younger than the lease belongs to a run that may still be working. Taking over
            # could do the work twice, and deleting could lose it if that run died: keep the message, invisible
            # until the lease ends; then the record is completed (it is skipped) or stale (the policy applies).
            held = time.monotonic() - received_at if received_at is not None else 0.0
            seconds = visibility_for_waiting(outcome.retry_in, held)
            log.info("%s message %s waits %d s for the end of the lease; not deleted", JOB_TYPE, message_id, seconds)
            self.keep_invisible(receipt, seconds)
            return settled("RETRY", outcome.action)
        # The outcome is settled in the record: only now may the message go.
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        return settled("SUCCESS", outcome.action)

    def give_up(self, message: Mapping[str, Any], key: object, details: object, error: Exception) -> None:
        """The last receive failed: the record ends `failed` with the error, and the message goes to the dead-letter
        queue with it."""
        note = f"failed after {settings.max_receive_count()} receives: {error!r}"[:1000]
        if (self.store or default_store()).fail(str(key), details if isinstance(details, dict) else {}, note):
            telemetry.count("failed")
        log.line(logging.ERROR, "failed", key, None, "%s; the record is failed, for a person (operations held)", note)
        self.dead_letter(message, error)

    def keep_invisible(self, receipt: str, seconds: int) -> None:
        try:
            self.client.change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=receipt, VisibilityTimeout=seconds
            )
        except ClientError as error:
            # e.g. beyond the 12 h that SQS allows per receive: the message comes back sooner and waits again
            log.warning("%s: visibility not changed (%s); the message comes back sooner", JOB_TYPE, error)

    def dead_letter(self, message: Mapping[str, Any], error: BaseException) -> None:
        """Sends the message to the dead-letter queue with its error, then deletes it here (in that order)."""
        self.client.send_message(
            QueueUrl=self.dead_letter_queue_url,
            MessageBody=str(message["Body"]) or "(empty body)",
            MessageAttributes={
                "error": {"DataType": "String", "StringValue": f"{type(error).__name__}: {error}"[:1000]},
                "original_message_id": {"DataType": "String", "StringValue": str(message["MessageId"])},
            },
        )
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=str(message["ReceiptHandle"]))

    def sweep(self) -> dict[str, int]:
        """The sweeper (job.sweep): the policy for stale claims whose message has not come back."""
        counts = sweep(self.store)
        log.info("%s sweeper: %s", JOB_TYPE, counts)
        return counts

    def stop(self, *_: object) -> None:
        self.stopping = True

    def run(self) -> None:
        """Consumes until SIGTERM or SIGINT, which stop it after the message in hand; sweeps between messages.
        Refuses to start, with one line, on a database the kit cannot use: its messages wait in the queue."""
        problem = (self.store or default_store()).schema_problem()
        if problem:
            raise SystemExit(f"{{ cookiecutter.project_slug }}: refusing to start the consumer: {problem}")
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        every = settings.sweep_every_seconds()
        next_sweep = time.monotonic() + every
        log.info("%s consumer ready on %s", JOB_TYPE, self.queue_url)
        while not self.stopping:
            try:
                self.poll_once()
                if every and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + every
                    self.sweep()
            except DATABASE_UNREACHABLE:
                log.exception("%s consumer: the sweeper failed", JOB_TYPE)
                self.database_unreachable = True
            except Exception:
                # SQS unreachable: log, wait a little, go on; the messages wait in the queue
                log.exception("%s consumer: poll failed; trying again in 5 s", JOB_TYPE)
                time.sleep(5)
            if self.database_unreachable:
                self.wait_for_database()
        log.info("%s consumer stopped", JOB_TYPE)

    def wait_for_database(self) -> None:
        """Receives nothing until the database answers again (or the consumer is stopped).

        Every receive counts towards the redrive policy's `maxReceiveCount`: a consumer that went on receiving
        through an outage would spend a message's receives one backoff after another, and the queue would move
        good messages to the dead-letter queue. Waiting here, an outage of any length costs the message in hand
        one receive; the others wait in the queue, untouched.
        """
        store = self.store or default_store()
        delay = min(0.5, DATABASE_PROBE_MAX_SECONDS)
        log.warning("%s consumer: the database is unreachable; receiving nothing until it answers", JOB_TYPE)
        while not self.stopping:
            try:
                with store.engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                    conn.invalidate()  # a probe's connection: closed, not kept idle in the pool
            except DATABASE_UNREACHABLE:
                time.sleep(delay)
                delay = min(2 * delay, DATABASE_PROBE_MAX_SECONDS)
                continue
            self.database_unreachable = False
            log.info("%s consumer: the database answers again; receiving", JOB_TYPE)
            return


def create_queues(client: Any = None) -> tuple[str, str]:
    """Creates (or finds) the dead-letter queue and the queue, with the redrive policy; their URLs."""
    client = client or sqs_client()
    # a message waiting for the end of a lease must not expire meanwhile (retain's minimum age reads it too)
    retention = str(settings.SQS_MESSAGE_RETENTION_SECONDS)
    dead_letter_url = client.create_queue(
        QueueName=settings.dead_letter_queue_name(), Attributes={"MessageRetentionPeriod": retention}
    )["QueueUrl"]
    attributes = client.get_queue_attributes(QueueUrl=dead_letter_url, AttributeNames=["QueueArn"])
    dead_letter_arn = attributes["Attributes"]["QueueArn"]
    queue_url = client.create_queue(
        QueueName=settings.queue_name(),
        Attributes={
            "VisibilityTimeout": str(settings.visibility_timeout()),
            "ReceiveMessageWaitTimeSeconds": str(settings.wait_time_seconds()),
            "MessageRetentionPeriod": retention,
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": str(settings.max_receive_count())}
            ),
        },
    )["QueueUrl"]
    return str(queue_url), str(dead_letter_url)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="{{ slug }}.consumer", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", choices=["run", "create-queues"], default="run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "create-queues":
        queue_url, dead_letter_url = create_queues()
        print(f"SQS_QUEUE_URL={queue_url}")
        print(f"SQS_DEAD_LETTER_QUEUE_URL={dead_letter_url}")
        return 0
    Consumer().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
