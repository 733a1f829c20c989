{%- set slug = cookiecutter.project_slug -%}
"""What only SQS asks of the consumer: bodies that are not a message, the dead-letter queue and its redrive
policy, long polling, the visibility timeout, and the wait inside a lease within SQS's 12 hours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KIT_ROOT, UNUSABLE_DATABASES, Records, database_at
from sinks import Effects
from sqs_driver import SqsDriver
from test_replay import KEY

from {{ slug }} import settings
from {{ slug }}.claims import ClaimStore, connect
from {{ slug }}.consumer import RECEIVE_MARGIN, Consumer, backoff, visibility_for_waiting


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param("not json {", "the body is not JSON", id="not JSON"),
        pytest.param(json.dumps([KEY]), "the body must be a JSON object, not list", id="not an object"),
        pytest.param(
            json.dumps({settings.OPERATION_KEY_NAME: KEY, "details": {}, "extra": 1}),
            "the body has unknown fields: extra",
            id="unknown field",
        ),
    ],
)
def test_a_body_that_is_not_a_message_goes_to_the_dead_letter_queue(
    driver: SqsDriver, effects: Effects, records: Records, body: str, problem: str
) -> None:
    delivery = driver.deliver_body(body)
    assert delivery.state == "FAILURE"
    assert delivery.value.startswith("BadMessage: ") and problem in delivery.value
    assert (records.count("claimed"), effects.count(KEY)) == (0, 0)
    # moved at once, with its error, on its first receive: it does not loop
    assert driver.check_dead_letters() == {delivery.message_id: delivery.value}


def test_a_bad_key_goes_to_the_dead_letter_queue_with_its_error(driver: SqsDriver) -> None:
    delivery = driver.deliver_raw([])
    assert driver.check_dead_letters() == {delivery.message_id: delivery.value}
    assert f"{settings.OPERATION_KEY_NAME} is missing" in delivery.value


def test_the_queue_has_a_redrive_policy_long_polling_and_a_visibility_timeout(driver: SqsDriver) -> None:
    attributes = driver.client.get_queue_attributes(QueueUrl=driver.queue_url, AttributeNames=["All"])["Attributes"]
    dead_letter_arn = driver.client.get_queue_attributes(
        QueueUrl=driver.dead_letter_queue_url, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    redrive = json.loads(attributes["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dead_letter_arn
    assert int(redrive["maxReceiveCount"]) == settings.max_receive_count()
    assert int(attributes["ReceiveMessageWaitTimeSeconds"]) == settings.wait_time_seconds()
    assert int(attributes["VisibilityTimeout"]) == settings.visibility_timeout()


def test_the_defaults_cover_the_longest_run_and_poll_long(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SQS_VISIBILITY_TIMEOUT", "SQS_WAIT_TIME_SECONDS", "SQS_MAX_RECEIVE_COUNT"):
        monkeypatch.delenv(name, raising=False)
    assert settings.LONGEST_RUN_SECONDS < settings.visibility_timeout() <= settings.SQS_MAX_VISIBILITY_SECONDS
    assert settings.wait_time_seconds() == 20
    # a healthy message's receives: the first, a death, a wait inside the lease, the one after it, retries
    assert settings.max_receive_count() >= 10


def test_a_wait_inside_the_lease_lasts_to_its_end_within_12_hours_of_the_receive() -> None:
    longest = 43200 - RECEIVE_MARGIN  # SQS refuses a visibility past 12 h from the receive
    assert visibility_for_waiting(settings.LEASE_SECONDS + 0.2) == min(settings.LEASE_SECONDS + 1, longest)
    assert visibility_for_waiting(0.01) == 1
    assert visibility_for_waiting(10**9) == longest
    assert visibility_for_waiting(10**9, held=100.5) == longest - 101
    assert [backoff(n) for n in (1, 2, 3)] == [min(seconds, settings.LONGEST_RUN_SECONDS) for seconds in (1, 2, 4)]
    assert backoff(100) == settings.LONGEST_RUN_SECONDS


def test_the_consumer_finds_the_dead_letter_queue_by_the_redrive_policy(
    driver: SqsDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SQS_DEAD_LETTER_QUEUE_URL")
    monkeypatch.delenv("SQS_QUEUE_URL")
    consumer = Consumer(driver.client)
    assert (consumer.queue_url, consumer.dead_letter_queue_url) == (driver.queue_url, driver.dead_letter_queue_url)


@pytest.mark.embedded_only
@pytest.mark.parametrize(("revision", "line"), UNUSABLE_DATABASES)
def test_a_consumer_on_a_database_the_kit_cannot_use_refuses_to_start_with_one_line(
    driver: SqsDriver, tmp_path: Path, revision: str | None, line: str
) -> None:
    """A consumer started before the migration receives nothing: the queue keeps its messages for one started after
    it."""
    store = ClaimStore(connect(database_at(tmp_path, revision)))
    consumer = Consumer(driver.client, queue_url=driver.queue_url, store=store)
    with pytest.raises(SystemExit) as refused:
        consumer.run()
    refusal = "{{ slug }}: refusing to start the consumer: " + line
    assert str(refused.value).startswith(refusal), refused.value


def test_the_create_queues_command_runs(driver: SqsDriver) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "{{ slug }}.consumer", "create-queues"],
        cwd=KIT_ROOT,
        env={**os.environ, "PYTHONPATH": str(KIT_ROOT / "src"), "SQS_QUEUE_NAME": "create-queues-check"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert "SQS_QUEUE_URL=" in completed.stdout and "create-queues-check-dead-letter" in completed.stdout
