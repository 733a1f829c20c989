{%- from "replay_matrix.jinja" import soak as soak_facts with context -%}
{%- set slug = cookiecutter.project_slug -%}
"""The soak on Celery (soak.py is the soak itself): its own queue on the broker of CELERY_BROKER_URL, and its
workers,
`python -m {{ slug }}_proof.soak_celery <options>`,
the kit's worker with the soak's short visibility timeout allowed and the kills right after a take."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from {{ slug }} import settings
from {{ slug }}.producer import TASK_NAME

from . import BadInput
from .crash_points import die_after_some_takes

# Seconds before the broker hands a dead worker's message out again: the soak's own workers only.
VISIBILITY_TIMEOUT = 5


class Queue:
    """The soak's own Celery queue on the broker of CELERY_BROKER_URL, and its workers' command."""

    # what a worker writes once it takes messages
    ready = b" ready."

    def __init__(self, run: str) -> None:
        url = os.environ.get("CELERY_BROKER_URL", "")
        if not url.startswith(("redis://", "rediss://", "amqp://", "amqps://", "pyamqp://")):
            raise BadInput(f"CELERY_BROKER_URL must be a Redis or RabbitMQ URL (redis://, amqp://), not {url!r}")
        # The workers and this process use the soak's queue; on Redis, the soak's visibility timeout.
        os.environ["CELERY_QUEUE"] = f"{settings.JOB_TYPE}-soak-{run}"
        os.environ["CELERY_VISIBILITY_TIMEOUT"] = str(VISIBILITY_TIMEOUT)
        from .report import broker

        self.broker = broker()
        if " unknown (" in self.broker:
            raise BadInput(f"the broker of CELERY_BROKER_URL does not answer: {self.broker}")
        from {{ slug }}.celery_app import app

        self.app = app
        self.redis = not settings.on_rabbitmq()
        # why a key may stay queued, said when it happens
        self.late = (
            "{{ soak_facts.late.redis|wordwrap(100, wrapstring=' "\n            "') }}"
            if self.redis
            else "{{ soak_facts.late.rabbitmq|wordwrap(100, wrapstring=' "\n            "') }}"
        )
        self.run = run
        self.bad: list[str] = []

    def worker_command(self, number: int) -> list[str]:
        """The kit's worker (solo pool: one process runs the task and holds its message), by this module as its
        command, which only allows the shortened visibility timeout. Its heartbeat stays on: that timer turns the
        event loop, where a solo worker sends its acknowledgements (RabbitMQ, prefetch 1, waits for them)."""
        return [
            *(sys.executable, "-m", __name__, "--pool=solo", "--loglevel=INFO"),
            *("-n", f"soak-{self.run}-{number}@%h", "--without-mingle", "--without-gossip"),
        ]

    def describe(self) -> str:
        if self.redis:
            return (
                f"{self.broker}, queue {settings.queue_name()}; the soak's workers have a visibility timeout of"
                f" {VISIBILITY_TIMEOUT} s, below the lease ({settings.LEASE_SECONDS} s; the kit's is"
                f" {settings.VISIBILITY_TIMEOUT_SECONDS} s), so that a killed worker's message comes back in seconds,"
                f" and the lock on putting messages back expires after {VISIBILITY_TIMEOUT} s (Redis's default: 300 s)"
            )
        return (
            f"{self.broker}, queue {settings.queue_name()}; a killed worker's message comes back when its connection"
            " closes"
        )

    def send_bad(self, args: list[Any]) -> None:
        """A message the task must refuse; its result is kept, to see that it was refused, not retried."""
        self.bad.append(str(self.app.send_task(TASK_NAME, args=args, queue=settings.queue_name()).id))

    def send_bad_keys(self) -> None:
        self.send_bad(["", {}])
        self.send_bad([12345, {}])

    def refused(self) -> int:
        return sum(self.app.backend.get_task_meta(task_id)["status"] == "FAILURE" for task_id in self.bad)

    def bad_message_problems(self) -> list[str]:
        problems = []
        for task_id in self.bad:
            meta = self.app.backend.get_task_meta(task_id)
            error = type(meta["result"]).__name__
            if meta["status"] != "FAILURE" or error not in ("BadMessage", "PayloadConflict"):
                problems.append(f"bad message {task_id}: {meta['status']} ({error}), not refused at once")
        return problems

    def forget_unacknowledged(self, channel: Any) -> None:
        """Redis keeps a killed worker's unacknowledged messages aside until a worker puts them back: those of the
        soak's queue go with it (the others, of other queues on this Redis database, are left alone)."""
        client = channel.client
        for tag, entry in client.hscan_iter(channel.unacked_key):
            _message, _exchange, routing_key = json.loads(entry)
            if routing_key == settings.queue_name():
                client.hdel(channel.unacked_key, tag)
                client.zrem(channel.unacked_index_key, tag)

    def close(self) -> None:
        from celery.result import AsyncResult

        for task_id in self.bad:
            AsyncResult(task_id, app=self.app).forget()
        with self.app.connection_for_write() as connection:
            channel = connection.default_channel
            if self.redis:
                self.forget_unacknowledged(channel)
            queue = self.app.amqp.queues[settings.queue_name()](channel)
            queue.declare()  # the channel learns the queue's bindings, which delete() then removes
            queue.purge()
            queue.delete()


def worker() -> None:
    """The soak's worker, `python -m {{ slug }}_proof.soak_celery <options>`:
    `celery -A {{ slug }}.celery_app worker <options>`, the kit's app and task, with the soak's
    visibility timeout below the lease allowed, and the kills after a take."""
    from celery.bin.celery import main
    from celery.signals import task_received

    from {{ slug }} import tasks
    from {{ slug }}.celery_app import app

    # what differs from the kit's worker, said where it is made (as the replay suite's worker says it): on Redis
    # the visibility timeout (CELERY_VISIBILITY_TIMEOUT) below the lease, and the lock on putting unacknowledged
    # messages back expires as fast: a worker killed while it held the lock would stop every redelivery for the
    # lock's 300 s otherwise
    tasks.VISIBILITY_BELOW_LEASE_ALLOWED = True
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "unacked_mutex_expire": VISIBILITY_TIMEOUT,
    }
    # task_received: the consumer holds the message, unacknowledged (acks_late), and the task has not started
    maybe_die = die_after_some_takes()
    task_received.connect(lambda request, **_: maybe_die(request.id), weak=False)
    sys.argv = ["celery", "-A", "{{ slug }}.celery_app", "worker", *sys.argv[1:]]
    main()


if __name__ == "__main__":
    worker()
