{%- set slug = cookiecutter.project_slug -%}
"""The kit's Lambda handler as the live replay suite runs it: `python -m sqs_lambda_worker` (tests on PYTHONPATH).

One process plays the Lambda service and one execution environment of the function (lambda_runtime.py): it polls
the queue, builds each event from the messages received, invokes the handler and deletes what the response does
not name as failed, until SIGTERM. The handler is lambda_handler.BatchHandler, the object behind
`lambda_handler`, given the two things sqs_live_worker.py gives the consumer: the effect with a crash point, where
the process pauses for the suite to kill it with SIGKILL mid-invocation (or stops itself with SIGSTOP until
the suite sends SIGCONT), and a file of settled records.
"""

import logging
import signal
from typing import Any

from lambda_runtime import LambdaRuntime
from sqs_live_worker import perform, record

from {{ slug }} import settings
from {{ slug }}.consumer import sqs_client
from {{ slug }}.lambda_handler import BatchHandler

log = logging.getLogger("sqs_lambda_worker")
stopping = False


def stop(*_: Any) -> None:
    global stopping
    stopping = True


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, stop)
    client = sqs_client()
    queue_url = settings.queue_url()
    assert queue_url, "SQS_QUEUE_URL is unset"
    # one record per invocation: two of these processes are two concurrent invocations (case 3)
    runtime = LambdaRuntime(client, queue_url, BatchHandler(client, perform=perform, on_settled=record), batch_size=1)
    log.info("lambda runner ready on %s", queue_url)
    while not stopping:
        try:
            runtime.poll_once(wait_seconds=settings.wait_time_seconds())
        except Exception:
            # a failed invocation: the service deletes nothing and polls on; the messages come back
            log.exception("invocation failed")
