{%- set slug = cookiecutter.project_slug -%}
"""The kit's metrics and traces, through the OpenTelemetry API, as a library reports them: nothing leaves the
process until the app configures an SDK (a MeterProvider with a reader, a TracerProvider with an exporter);
without one, every call here does nothing.

- `replay_matrix.operations` (counter): what became of each operation, with the attributes `job_type` and
  `outcome`: performed; skipped (a duplicate: the work was done, or another run holds it); waiting (a redelivery
  inside the lease, which comes back at its end); held or abandoned (a stale claim, by the policy); resent (the
  sweeper sent a queued record's message again); failed (the effect failed past the queue's retries); refused (a
  bad message, or a key known with another payload).
- `replay_matrix.claim.duration` (histogram, seconds): the claim's statement, a round trip to the database.
- spans `claim`, `effect` and `complete` (attributes `job_type`, `operation_key`), inside the current span of the
  app or of its queue's instrumentation.

And the kit's log lines about an operation (DeliveryLog) carry its fields as LogRecord attributes, which a JSON
formatter shows: `job_type`, `operation_key`, `attempt` (the record's attempt the line is about; None where the
record is not known) and `outcome` (what the line reports).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace

from . import settings

# the instrumentation scope: the kit's package
_meter = metrics.get_meter("{{ slug }}")
_tracer = trace.get_tracer("{{ slug }}")
_operations = _meter.create_counter(
    "replay_matrix.operations", unit="{operation}", description="What became of each operation, by outcome"
)
_claim_duration = _meter.create_histogram(
    "replay_matrix.claim.duration", unit="s", description="The claim's statement, a round trip to the database"
)
_JOB = {"job_type": settings.JOB_TYPE}


def count(outcome: str) -> None:
    """One operation's outcome (see the module's list)."""
    _operations.add(1, {**_JOB, "outcome": outcome})


@contextmanager
def span(step: str, key: str) -> Iterator[None]:
    """A span around one step of a delivery: effect or complete (the claim's is claim_span)."""
    with _tracer.start_as_current_span(step, attributes={**_JOB, "operation_key": key}):
        yield


@contextmanager
def claim_span(key: str) -> Iterator[None]:
    """The claim's span, and its duration in the histogram."""
    started = time.perf_counter()
    with span("claim", key):
        yield
    _claim_duration.record(time.perf_counter() - started, _JOB)


class DeliveryLog(logging.LoggerAdapter[logging.Logger]):
    """A module's logger, whose lines about an operation say what became of it, as text and as fields."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        # a line's own fields, which LoggerAdapter would replace with the adapter's (none)
        return msg, kwargs

    def line(self, level: int, outcome: str, key: object, attempt: int | None, message: str, *args: Any) -> None:
        """One line, "<job type> <key>: <message>", with the fields job_type, operation_key, attempt and outcome:
        performed, skipped, waiting, held, abandoned, refused, released (the claim freed for a retry), taking over,
        retrying (the database), failed, resent, resolved."""
        fields = {**_JOB, "operation_key": key, "attempt": attempt, "outcome": outcome}
        self.log(level, "%s %r: " + message, settings.JOB_TYPE, key, *args, extra=fields)


def delivery_log(name: str) -> DeliveryLog:
    return DeliveryLog(logging.getLogger(name))
