{%- set slug = cookiecutter.project_slug -%}
"""What the Lambda service does around the kit's handler for an SQS event source mapping, as the suite plays it.

The service polls the queue (long polling, up to the batch size; each message received stays invisible for the
queue's visibility timeout), builds one event from the messages received, invokes the function with a context
that knows the function's timeout, and then deletes the records that the partial batch response does not name
as failed. When the invocation raises, or the function dies, it deletes nothing: the messages come back after
their visibility timeout. Messages are received from the real queue (moto's server), so the records carry real
receipt handles.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from {{ slug }} import settings

Handler = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
# A function's timeout in the suite: within the range the handler accepts (the longest run to the lease).
FUNCTION_TIMEOUT = settings.LEASE_SECONDS


class Context:
    """Lambda's context object for one invocation of a function with `timeout` seconds."""

    def __init__(self, timeout: float = FUNCTION_TIMEOUT, function_name: str = settings.JOB_TYPE) -> None:
        self.deadline = time.monotonic() + timeout
        self.function_name = function_name
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def event_of(messages: list[Mapping[str, Any]], queue_arn: str) -> dict[str, Any]:
    """The SQS event that Lambda builds from received messages (the fields the documentation shows)."""
    region = queue_arn.split(":")[3]
    return {
        "Records": [
            {
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "attributes": dict(message.get("Attributes", {})),
                "messageAttributes": dict(message.get("MessageAttributes", {})),
                "md5OfBody": message.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for message in messages
        ]
    }


class LambdaRuntime:
    """An event source mapping of one queue to one execution environment of the function."""

    def __init__(
        self, client: Any, queue_url: str, handler: Handler, *, batch_size: int = 10, timeout: float = FUNCTION_TIMEOUT
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.handler = handler
        self.batch_size = batch_size
        self.timeout = timeout
        attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]
        self.queue_arn = str(attributes["QueueArn"])

    def receive(self, max_messages: int | None = None, wait_seconds: int = 20) -> list[dict[str, Any]]:
        """One long poll, as the service's poller does it: no visibility timeout of its own (the queue's)."""
        response = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max_messages or self.batch_size,
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(response.get("Messages", []))

    def invoke(self, messages: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        """One invocation with the messages as its event; then the records not reported failed are deleted."""
        response = self.handler(event_of(messages, self.queue_arn), Context(self.timeout))
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        done = [message for message in messages if message["MessageId"] not in failed]
        if done:
            self.client.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(index), "ReceiptHandle": message["ReceiptHandle"]} for index, message in enumerate(done)
                ],
            )
        return response

    def process(self, message: Mapping[str, Any]) -> Mapping[str, Any]:
        """One received message, as an invocation of its own."""
        return self.invoke([message])

    def poll_once(self, wait_seconds: int = 20) -> Mapping[str, Any] | None:
        """The poll step: one receive, and an invocation when it brought messages; the partial batch response."""
        messages = self.receive(wait_seconds=wait_seconds)
        return self.invoke(messages) if messages else None
