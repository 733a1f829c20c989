{%- set slug = cookiecutter.project_slug -%}
"""`{{ cookiecutter.job_type }}` as an AWS Lambda function behind an SQS event source mapping.

    handler: {{ slug }}.lambda_handler.lambda_handler
    event source mapping: FunctionResponseTypes = ["ReportBatchItemFailures"]
    the sweeper, on a schedule more often than the lease: {{ slug }}.lambda_handler.sweep_handler

Each record of the event is handled as the long-running consumer handles a message (consumer.Consumer.process,
the same job.handle, body parsing, dead-lettering and visibility changes), and the answer is a partial batch
response, {"batchItemFailures": [{"itemIdentifier": messageId}, ...]}:

    performed, skipped, held, abandoned -> deleted at once; not reported (Lambda would delete it too)
    waiting (a claim younger than the lease) -> reported failed, invisible until the lease ends (case 7)
    bad message (BadMessage, PayloadConflict) -> moved to the dead-letter queue with its error; not reported,
        so it is not retried
    the database unreachable -> reported failed; back after 1, 3, 9 ... s (consumer.database_backoff: each return
        is a receive, and growing threefold they outlast an outage of hours within the redrive policy's
        maxReceiveCount)
    any other error (the network, the mail server) -> reported failed; back after a backoff
    not started: too little time left for the longest run -> reported failed; back after the visibility timeout

A record is settled (deleted) as soon as its outcome is known, as the consumer does, so a function killed later
in the batch (its timeout, out of memory) brings back only the records it had not settled.

The function's timeout must lie between the longest run and the lease, {{ cookiecutter.longest_run_seconds }} to {{ cookiecutter.lease_seconds }} s: a shorter one cuts
normal runs off mid-effect, and a longer one lets a run still working look dead to a redelivery, which would then
apply the stale-claim policy to live work. Lambda tells a function its timeout only in the context of an
invocation (the init phase, when this module is imported, has no context, and no environment variable carries
the timeout), so "at start" means at the start of every invocation, before any record is touched: the first
invocation of each execution environment refuses a timeout out of range with one line naming both values, and
the whole batch comes back after the visibility timeout, unclaimed.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from . import settings
from .claims import ClaimStore, default_store
from .consumer import Consumer, Settled, sqs_client
from .job import Perform, sweep

log = logging.getLogger(__name__)
JOB_TYPE = settings.JOB_TYPE


class LambdaContext(Protocol):
    """The part of Lambda's context object that the handler reads."""

    def get_remaining_time_in_millis(self) -> int: ...


class FunctionTimeoutOutOfRange(RuntimeError):
    """The function's timeout does not fit between the longest run and the lease: no record is touched."""


def check_function_timeout(context: LambdaContext) -> int:
    """The function's timeout in whole seconds, read at the start of an invocation; refused when out of range."""
    # only milliseconds have passed since the invocation began
    timeout = seconds_left(context)
    lease, longest = settings.LEASE_SECONDS, settings.LONGEST_RUN_SECONDS
    if timeout > lease:
        raise FunctionTimeoutOutOfRange(
            f"the function's timeout, {timeout} s, is longer than the lease, {lease} s: a run still working would"
            f" look dead; set the timeout between {longest} and {lease} s"
        )
    if timeout < longest:
        raise FunctionTimeoutOutOfRange(
            f"the function's timeout, {timeout} s, is shorter than the longest run, {longest} s: normal runs would"
            f" be cut off mid-effect; set the timeout between {longest} and {lease} s"
        )
    return timeout


def seconds_left(context: LambdaContext) -> int:
    """The invocation's time left, rounded up to whole seconds as Lambda's timeouts are."""
    return math.ceil(context.get_remaining_time_in_millis() / 1000)


def room_for_a_run(context: LambdaContext) -> bool:
    """Whether the longest run still fits in the time left: a run cut off by the timeout leaves its claim behind."""
    return seconds_left(context) >= settings.LONGEST_RUN_SECONDS


def message_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """An SQS event record in the shape of a message received by the consumer."""
    return {
        "MessageId": record["messageId"],
        "ReceiptHandle": record["receiptHandle"],
        "Body": record["body"],
        "Attributes": dict(record.get("attributes", {})),
    }


class BatchHandler:
    """Handles the records of SQS events with a Consumer per source queue, each made at first use and kept while
    the execution environment lives (its SQS client, queue URL and dead-letter queue URL are looked up once)."""

    def __init__(
        self,
        client: Any = None,
        *,
        store: ClaimStore | None = None,
        perform: Perform | None = None,
        on_settled: Callable[[Settled], None] | None = None,
    ) -> None:
        self.client = client
        self.store = store
        self.perform = perform
        self.on_settled = on_settled
        self.consumers: dict[str, Consumer] = {}

    def consumer_for(self, queue_arn: str) -> Consumer:
        """The consumer of the queue named by an event source ARN, arn:aws:sqs:<region>:<account>:<name>."""
        if queue_arn not in self.consumers:
            self.client = self.client or sqs_client()
            *_, account, name = queue_arn.split(":")
            url = self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
            self.consumers[queue_arn] = Consumer(
                self.client, queue_url=str(url), store=self.store, perform=self.perform, on_settled=self.on_settled
            )
        return self.consumers[queue_arn]

    def __call__(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, list[dict[str, str]]]:
        check_function_timeout(context)
        invoked_at = time.monotonic()
        failed: list[str] = []
        for record in event["Records"]:
            message_id = str(record["messageId"])
            if not room_for_a_run(context):
                # Started now, the run could be cut off mid-effect by the timeout and leave its claim to the
                # policy: better that the record comes back, untouched, to another invocation.
                left = seconds_left(context)
                log.warning("%s message %s not started: %d s left; reported failed", JOB_TYPE, message_id, left)
                failed.append(message_id)
                continue
            try:
                settled = self.consumer_for(str(record["eventSourceARN"])).process(message_of(record), invoked_at)
            except Exception:
                # e.g. the dead-letter queue unreachable: the record comes back (maxReceiveCount is the backstop)
                log.exception("%s message %s could not be settled; reported failed", JOB_TYPE, message_id)
                failed.append(message_id)
                continue
            if settled.state == "RETRY":
                failed.append(message_id)
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed]}


@functools.cache
def _handler() -> BatchHandler:
    # made at the first invocation, so that importing the module needs no region or credentials; not on a database
    # the kit cannot use (the invocation fails and its messages come back, untouched, once that is fixed)
    problem = default_store().schema_problem()
    if problem:
        raise RuntimeError(f"{{ cookiecutter.project_slug }}: refusing to handle messages: {problem}")
    return BatchHandler()


def lambda_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, list[dict[str, str]]]:
    """The function's handler: the records of one SQS event; the records to retry, as a partial batch response."""
    return _handler()(event, context)


def sweep_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, int]:
    """The sweeper as a scheduled function (job.sweep): the policy for stale claims whose message has not come
    back, in batches, starting each claim while the longest run still fits in the time left; what is left waits
    for the next schedule."""
    check_function_timeout(context)
    counts = sweep(budget=context.get_remaining_time_in_millis() / 1000 - settings.LONGEST_RUN_SECONDS)
    log.info("%s sweeper: %s", JOB_TYPE, counts)
    return counts
