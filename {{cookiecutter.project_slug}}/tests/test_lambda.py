{%- set slug = cookiecutter.project_slug -%}
"""The Lambda handler on events built from messages received from moto's SQS server (real receipt handles), in
both modes: the partial batch response, and what the queue and the dead-letter queue hold afterwards.

Each test has a queue and a dead-letter queue of its own, so no replay worker takes its messages.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Records
from crash_points import die
from lambda_runtime import Context, LambdaRuntime, event_of
from sinks import Effects
from sqs_driver import VISIBILITY_TIMEOUT
from test_replay import DETAILS, KEY, ONE_TRANSACTION, OTHER_KEY

from {{ slug }} import effect, settings
from {{ slug }}.claims import ClaimStore, connect, default_store, fingerprint
from {{ slug }}.consumer import create_queues, make_body, sqs_client
from {{ slug }}.lambda_handler import (
    BatchHandler,
    FunctionTimeoutOutOfRange,
    lambda_handler,
    sweep_handler,
)


@dataclass
class Queue:
    client: Any
    url: str
    dead_letter_url: str
    runtime: LambdaRuntime

    def send(self, body: str) -> str:
        return str(self.client.send_message(QueueUrl=self.url, MessageBody=body)["MessageId"])

    def receive(self, count: int, wait: float = 10.0) -> list[dict[str, Any]]:
        """`count` messages, received as the Lambda service receives them, in the order of `receive`."""
        received: list[dict[str, Any]] = []
        deadline = time.monotonic() + wait
        while len(received) < count and time.monotonic() < deadline:
            received += self.runtime.receive(max_messages=count - len(received), wait_seconds=1)
        assert len(received) == count, f"received {len(received)} of {count} messages"
        return received

    def event(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return event_of(messages, self.runtime.queue_arn)

    def counts(self) -> tuple[int, int]:
        """(visible, in flight) messages in the queue."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        found = self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)["Attributes"]
        return int(found[names[0]]), int(found[names[1]])

    def dead_letters(self) -> list[tuple[str, str]]:
        """(body, error) of each message in the dead-letter queue."""
        messages = self.client.receive_message(
            QueueUrl=self.dead_letter_url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
        ).get("Messages", [])
        return [(m["Body"], m["MessageAttributes"]["error"]["StringValue"]) for m in messages]


@pytest.fixture
def queue(sqs_server: str, engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Queue]:
    """A queue and a dead-letter queue of this test's own, made by `create-queues` (with the redrive policy)."""
    monkeypatch.setenv("SQS_QUEUE_NAME", f"{settings.JOB_TYPE}-lambda-{uuid.uuid4().hex[:8]}")
    # the handler finds the dead-letter queue by the redrive policy of the queue named in the event
    monkeypatch.delenv("SQS_QUEUE_URL", raising=False)
    monkeypatch.delenv("SQS_DEAD_LETTER_QUEUE_URL", raising=False)
    client = sqs_client()
    url, dead_letter_url = create_queues(client)
    # the handler goes by each record's eventSourceARN, not by the environment
    monkeypatch.setenv("SQS_QUEUE_NAME", "no-such-queue")
    yield Queue(client, url, dead_letter_url, LambdaRuntime(client, url, lambda_handler))
    client.delete_queue(QueueUrl=url)
    client.delete_queue(QueueUrl=dead_letter_url)


def failures(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def test_each_record_claims_performs_and_completes(queue: Queue, effects: Effects, records: Records) -> None:
    queue.send(make_body(KEY, DETAILS))
    queue.send(make_body(OTHER_KEY, DETAILS))
    response = lambda_handler(queue.event(queue.receive(2)), Context())
    assert response == {"batchItemFailures": []}
    assert (effects.count(KEY), effects.count(OTHER_KEY)) == (1, 1)
    assert (records.status(KEY), records.status(OTHER_KEY)) == ("completed", "completed")
    # deleted by the handler itself, as soon as settled: nothing left for a redelivery
    assert queue.counts() == (0, 0)


def test_a_young_claim_is_reported_failed_and_waits_to_the_end_of_the_lease(
    queue: Queue, effects: Effects, records: Records
) -> None:
    # another run's claim, a moment old (case 7)
    default_store().claim(KEY, fingerprint(KEY, DETAILS), DETAILS)
    message_id = queue.send(make_body(KEY, DETAILS))
    response = lambda_handler(queue.event(queue.receive(1)), Context())
    assert failures(response) == [message_id]
    assert (effects.count(KEY), records.status(KEY)) == (0, "claimed")
    # past the queue's visibility timeout, the message is still invisible: it waits for the end of the lease
    time.sleep(VISIBILITY_TIMEOUT + 1)
    assert queue.counts() == (0, 1)
    assert queue.runtime.receive(wait_seconds=0) == []


def test_a_bad_record_goes_to_the_dead_letter_queue_and_is_not_retried(
    queue: Queue, effects: Effects, records: Records
) -> None:
    queue.send("not json {")
    queue.send(make_body(KEY, DETAILS))
    response = lambda_handler(queue.event(queue.receive(2)), Context())
    assert response == {"batchItemFailures": []}
    assert effects.count(KEY) == 1 and records.status(KEY) == "completed"
    ((body, error),) = queue.dead_letters()
    assert body == "not json {" and error.startswith("BadMessage: the body is not JSON")
    # both deleted at once, not merely in flight: neither comes back
    assert queue.counts() == (0, 0)


def test_a_transient_failure_is_reported_failed_and_comes_back(
    queue: Queue, effects: Effects, records: Records
) -> None:
    def unreachable(*_: Any) -> None:
        raise ConnectionRefusedError("the provider is unreachable")

    message_id = queue.send(make_body(KEY, DETAILS))
    response = BatchHandler(queue.client, perform=unreachable)(queue.event(queue.receive(1)), Context())
    assert failures(response) == [message_id]
    assert effects.count(KEY) == 0 and records.status(KEY) != "completed"
    # back after the backoff (1 s at the first receive), and this time it goes through
    (again,) = queue.receive(1, wait=VISIBILITY_TIMEOUT + 10)
    assert (again["MessageId"], again["Attributes"]["ApproximateReceiveCount"]) == (message_id, "2")
    assert lambda_handler(queue.event([again]), Context()) == {"batchItemFailures": []}
    assert (effects.count(KEY), records.status(KEY)) == (1, "completed")
    assert queue.dead_letters() == []


@pytest.mark.parametrize(
    ("timeout", "problem"),
    [
        pytest.param(
            settings.LEASE_SECONDS + 1,
            f"the function's timeout, {settings.LEASE_SECONDS + 1} s, is longer than the lease,"
            f" {settings.LEASE_SECONDS} s",
            id="longer than the lease",
        ),
        pytest.param(
            settings.LONGEST_RUN_SECONDS - 1,
            f"the function's timeout, {settings.LONGEST_RUN_SECONDS - 1} s, is shorter than the longest run,"
            f" {settings.LONGEST_RUN_SECONDS} s",
            id="shorter than the longest run",
        ),
    ],
)
def test_a_function_timeout_out_of_range_is_refused_at_start(
    queue: Queue, effects: Effects, records: Records, timeout: int, problem: str
) -> None:
    queue.send(make_body(KEY, DETAILS))
    with pytest.raises(FunctionTimeoutOutOfRange) as refused:
        lambda_handler(queue.event(queue.receive(1)), Context(timeout))
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert f"set the timeout between {settings.LONGEST_RUN_SECONDS} and {settings.LEASE_SECONDS} s" in str(
        refused.value
    )
    # nothing touched; the failed invocation deletes nothing: the message is in flight, back after its visibility
    # timeout
    assert (effects.count(KEY), records.status(KEY)) == (0, "none")
    assert queue.counts() == (0, 1)


class RunningOut:
    """A context whose invocation started with the lease as its timeout and has now less than the longest run left."""

    def __init__(self) -> None:
        self.calls = 0

    def get_remaining_time_in_millis(self) -> int:
        self.calls += 1
        seconds = settings.LEASE_SECONDS if self.calls == 1 else settings.LONGEST_RUN_SECONDS - 1
        return seconds * 1000


def test_a_record_is_not_started_without_time_for_the_longest_run(
    queue: Queue, effects: Effects, records: Records
) -> None:
    sent = {queue.send(make_body(KEY, DETAILS)), queue.send(make_body(OTHER_KEY, DETAILS))}
    response = lambda_handler(queue.event(queue.receive(2)), RunningOut())
    assert set(failures(response)) == sent
    assert (records.status(KEY), records.status(OTHER_KEY), effects.count(KEY)) == ("none", "none", 0)


def test_a_function_killed_mid_invocation_brings_back_only_the_records_it_had_not_settled(
    queue: Queue, effects: Effects, records: Records
) -> None:
    first = queue.send(make_body(KEY, DETAILS))
    second = queue.send(make_body(OTHER_KEY, DETAILS))
    batch = sorted(queue.receive(2), key=lambda message: message["MessageId"] != first)
    pid = os.fork()
    if pid == 0:  # the function's process: settles the first record, dies at the second one's effect
        try:

            def dies_at_the_second(*args: Any) -> None:
                # the key comes before the details, whatever else the effect takes
                if args[-2] == OTHER_KEY:
                    die()
                effect.perform(*args)

            handler = BatchHandler(sqs_client(), store=ClaimStore(connect()), perform=dies_at_the_second)
            handler(queue.event(batch), Context())
        finally:
            os._exit(3)  # reached only if it did not die: the parent fails the test
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"wait status {status}"
    assert (effects.count(KEY), records.status(KEY)) == (1, "completed")
    assert (effects.count(OTHER_KEY), records.status(OTHER_KEY)) == (0, "none" if ONE_TRANSACTION else "claimed")
    # after the visibility timeout the unsettled record alone comes back, to another invocation
    (again,) = queue.receive(1, wait=VISIBILITY_TIMEOUT + 10)
    assert (again["MessageId"], again["Attributes"]["ApproximateReceiveCount"]) == (second, "2")
    response = lambda_handler(queue.event([again]), Context())
    # it meets the dead run's young claim and waits (case 7); a one-transaction effect left none, and runs
    assert failures(response) == ([] if ONE_TRANSACTION else [second])
    assert effects.count(OTHER_KEY) == (1 if ONE_TRANSACTION else 0)
    assert queue.counts() == (0, 0 if ONE_TRANSACTION else 1)


def test_the_sweeper_runs_as_a_scheduled_function(effects: Effects, records: Records) -> None:
    token = default_store().claim(KEY, fingerprint(KEY, DETAILS), DETAILS)
    assert token is not None
    records.age(KEY)
    assert sweep_handler({}, Context()) == {"stale": 1, "settled": 1, "resent": 0}
    assert records.status(KEY) != "claimed"
    with pytest.raises(FunctionTimeoutOutOfRange):
        sweep_handler({}, Context(settings.LEASE_SECONDS + 1))
