{%- from "replay_matrix.jinja" import policy with context -%}
"""The kit's metrics and spans, read as an app's OpenTelemetry SDK reads them: in memory, from deliveries and a
sweep run in this process (a worker process reports to its own SDK, configured by the app)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Records
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sinks import Effects
from test_replay import DETAILS, KEY, OTHER_KEY

from {{ cookiecutter.project_slug }} import settings
from {{ cookiecutter.project_slug }}.claims import BadMessage, default_store, fingerprint
from {{ cookiecutter.project_slug }}.job import deliver, sweep

READER = InMemoryMetricReader()
SPANS = InMemorySpanExporter()
JOB = {"job_type": settings.JOB_TYPE}
# what the sweeper's outcome is called, by the status the policy leaves (a stale claim performed again: performed)
SWEPT = {"held": "held", "abandoned": "abandoned", "completed": "performed"}["{{ policy.after_lease }}"]


@pytest.fixture(scope="module", autouse=True)
def sdk() -> Iterator[None]:
    """The SDK an app would configure, once for the process (OpenTelemetry allows one provider of each)."""
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(SPANS))
    trace.set_tracer_provider(tracing)
    yield


def points(name: str) -> list[Any]:
    data = READER.get_metrics_data()
    return [
        point
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def outcomes() -> dict[str, int]:
    """The counter's totals so far, by outcome; each carries the job type."""
    found = points("replay_matrix.operations")
    assert all(point.attributes["job_type"] == settings.JOB_TYPE for point in found)
    return {str(point.attributes["outcome"]): int(point.value) for point in found}


def counted_since(before: dict[str, int]) -> dict[str, int]:
    """What was counted since `before` (the counter's totals then), by outcome."""
    now = outcomes()
    return {outcome: now[outcome] - before.get(outcome, 0) for outcome in now if now[outcome] > before.get(outcome, 0)}


def test_each_outcome_is_counted_and_a_delivery_is_three_spans(effects: Effects, records: Records) -> None:
    before = outcomes()
    SPANS.clear()
    assert deliver(KEY, DETAILS).action == "performed"
    assert [(span.name, dict(span.attributes or {})) for span in SPANS.get_finished_spans()] == [
        (step, {**JOB, "operation_key": KEY}) for step in ("claim", "effect", "complete")
    ]
    assert deliver(KEY, DETAILS).action == "skipped"
    with pytest.raises(BadMessage):
        deliver(KEY, {"email": "someone-else@example.com"})  # the key, known with another payload
    with pytest.raises(BadMessage):
        deliver("", DETAILS)
    assert counted_since(before) == {"performed": 1, "skipped": 1, "refused": 2}
    assert effects.count(KEY) == 1
    (claims,) = points("replay_matrix.claim.duration")
    assert claims.attributes == JOB and claims.count >= 3 and claims.sum > 0


def test_the_sweepers_outcomes_are_counted(effects: Effects, records: Records) -> None:
    before = outcomes()
    records.stale_claim(KEY, DETAILS)
    # a record the app wrote whose message the broker lost, past the re-send time (sent nowhere here)
    assert default_store().enqueue(OTHER_KEY, fingerprint(OTHER_KEY, DETAILS), DETAILS)
    records.age(OTHER_KEY)
    assert sweep(publish=lambda key, details: "not sent") == {"stale": 1, "settled": 1, "resent": 1}
    assert counted_since(before) == {SWEPT: 1, "resent": 1}


def test_each_log_line_of_a_delivery_carries_its_key_attempt_and_outcome(
    effects: Effects, records: Records, caplog: pytest.LogCaptureFixture
) -> None:
    """What a JSON formatter (or any handler reading LogRecord attributes) gets from the kit's lines."""
    caplog.set_level("INFO")
    deliver(KEY, DETAILS)
    deliver(KEY, DETAILS)
    records.stale_claim(OTHER_KEY, DETAILS)
    sweep(publish=lambda key, details: "not sent")
    lines = [
        (record.operation_key, record.attempt, record.outcome, record.job_type)  # type: ignore[attr-defined]
        for record in caplog.records
        if hasattr(record, "outcome")
    ]
    assert lines[:2] == [(KEY, 1, "performed", settings.JOB_TYPE), (KEY, 1, "skipped", settings.JOB_TYPE)]
    assert lines[2][0] == OTHER_KEY and lines[2][3] == settings.JOB_TYPE, lines
    assert all(
        f"{settings.JOB_TYPE} {key!r}: " in record.getMessage()
        for record, (key, *_) in zip(
            [record for record in caplog.records if hasattr(record, "outcome")], lines, strict=True
        )
    )
