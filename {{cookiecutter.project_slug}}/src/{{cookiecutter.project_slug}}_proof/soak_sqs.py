{%- from "replay_matrix.jinja" import soak as soak_facts with context -%}
{%- set slug = cookiecutter.project_slug -%}
"""The soak on SQS (soak.py is the soak itself): its own queue and dead-letter queue, made with the kit's redrive
policy and deleted after, and its workers,
`python -m {{ slug }}_proof.soak_sqs`,
the kit's consumer with the kills right after a take."""

from __future__ import annotations

import os
import sys
from typing import Any

from {{ slug }} import settings

from . import BadInput
from .crash_points import die_after_some_takes

# Seconds before SQS hands a dead consumer's message out again: the soak's own queue only.
VISIBILITY_TIMEOUT = 5


class Queue:
    """The soak's own SQS queue and dead-letter queue, made with the kit's redrive policy, and deleted after."""

    # what a worker writes once it takes messages
    ready = b"consumer ready"

    def __init__(self, run: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        from {{ slug }}.consumer import create_queues, sqs_client

        # the kit's names, with the run's: the queue's name fits SQS's 80 characters with its dead-letter suffix
        for name in ("SQS_QUEUE_URL", "SQS_DEAD_LETTER_QUEUE_URL", "SQS_DEAD_LETTER_QUEUE_NAME"):
            os.environ.pop(name, None)
        os.environ.update(
            {
                "SQS_QUEUE_NAME": f"{settings.JOB_TYPE[:40]}-soak-{run}",
                "SQS_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT),
                "SQS_WAIT_TIME_SECONDS": "1",
                # the soak runs the sweeper itself, once the workers have stopped
                "SQS_SWEEP_EVERY_SECONDS": "0",
            }
        )
        try:
            self.client = sqs_client()
            self.url, self.dead_letter_url = create_queues(self.client)
        except (BotoCoreError, ClientError) as error:
            raise BadInput(f"SQS refused to make the soak's queues: {error}") from None
        os.environ.update({"SQS_QUEUE_URL": self.url, "SQS_DEAD_LETTER_QUEUE_URL": self.dead_letter_url})
        endpoint = settings.sqs_endpoint_url()
        self.broker = f"SQS at {endpoint}" if endpoint else f"Amazon SQS, {self.client.meta.region_name}"
        self.bad: list[str] = []
        # why a key may stay queued, said when it happens
        self.late = (
            "{{ soak_facts.late.sqs|wordwrap(100, wrapstring=' "\n            "') }}"
        )

    def worker_command(self, number: int) -> list[str]:
        """The kit's consumer, by this module as its command (worker()), which adds only the kills after a take."""
        return [sys.executable, "-m", __name__]

    def describe(self) -> str:
        return (
            f"{self.broker}, queue {settings.queue_name()} and its dead-letter queue, with a visibility timeout of"
            f" {VISIBILITY_TIMEOUT} s, so that a dead consumer's message comes back in seconds"
        )

    def send_bodies(self, bodies: list[str]) -> list[str]:
        ids = []
        for start in range(0, len(bodies), 10):  # SQS takes ten at a time
            entries = [{"Id": str(n), "MessageBody": body} for n, body in enumerate(bodies[start : start + 10])]
            sent = self.client.send_message_batch(QueueUrl=self.url, Entries=entries)
            if sent.get("Failed"):
                raise RuntimeError(f"SQS did not take messages: {sent['Failed']}")
            ids += [entry["MessageId"] for entry in sorted(sent["Successful"], key=lambda entry: int(entry["Id"]))]
        return ids

    def send_bad(self, args: list[Any]) -> None:
        from {{ slug }}.consumer import make_body

        self.bad += self.send_bodies([make_body(*args)])

    def send_bad_keys(self) -> None:
        self.bad += self.send_bodies(["not JSON"])
        self.send_bad(["", {}])

    def refused(self) -> int:
        attributes = self.client.get_queue_attributes(
            QueueUrl=self.dead_letter_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def bad_message_problems(self) -> list[str]:
        """The dead-letter queue must hold the bad messages, and nothing else."""
        found: dict[str, tuple[str, str]] = {}
        empty = 0
        while empty < 2:
            received = self.client.receive_message(
                QueueUrl=self.dead_letter_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                VisibilityTimeout=120,
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            empty = 0 if received else empty + 1
            for message in received:
                # the consumer names the original; a message that SQS's redrive moved keeps its own id
                attributes = message.get("MessageAttributes", {})
                original = attributes.get("original_message_id", {}).get("StringValue", message["MessageId"])
                found[message["MessageId"]] = (original, message["Body"])
        dead = {original for original, _ in found.values()}
        healthy = [body for original, body in found.values() if original not in self.bad]
        missing = [message_id for message_id in self.bad if message_id not in dead]
        return [f"a healthy message in the dead-letter queue: {body}" for body in healthy] + [
            f"bad message {message_id} is not in the dead-letter queue" for message_id in missing
        ]

    def close(self) -> None:
        for url in (self.url, self.dead_letter_url):
            self.client.delete_queue(QueueUrl=url)


def worker() -> None:
    """The soak's worker, `python -m {{ slug }}_proof.soak_sqs`: the kit's consumer
    (`python -m {{ slug }}.consumer`), which dies right after some of the messages it receives."""
    from {{ slug }}.consumer import Consumer, main

    maybe_die = die_after_some_takes()
    receive = Consumer.receive

    def receive_or_die(self: Consumer, max_messages: int = 1, wait_seconds: int | None = None) -> list[dict[str, Any]]:
        messages = receive(self, max_messages, wait_seconds)
        for message in messages:
            maybe_die(str(message["MessageId"]))
        return messages

    Consumer.receive = receive_or_die  # type: ignore[method-assign]
    sys.exit(main([]))


if __name__ == "__main__":
    worker()
