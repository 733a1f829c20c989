"""Bad messages: a clear error, no effect, no claim left in the claimed state, and no retry."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Records
from driving import Driver
from sinks import Effects
from test_replay import DETAILS, KEY, OTHER_DETAILS

from {{ cookiecutter.project_slug }}.settings import OPERATION_KEY_NAME, max_details_bytes


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        pytest.param([], f"{OPERATION_KEY_NAME} is missing", id="missing key"),
        pytest.param(["", DETAILS], f"{OPERATION_KEY_NAME} is empty", id="empty key"),
        pytest.param([1001, DETAILS], f"{OPERATION_KEY_NAME} must be a string, not int", id="non-string key"),
        pytest.param(["K" * 256, DETAILS], f"{OPERATION_KEY_NAME} has 256 characters", id="over-long key"),
        pytest.param(["ORD\x00-1", DETAILS], f"{OPERATION_KEY_NAME} contains a NUL character", id="NUL in the key"),
        pytest.param(["ORD-\ud800", DETAILS], "a character that UTF-8 cannot encode", id="lone surrogate in the key"),
        pytest.param(
            ["ORD-BIG", {"blob": "x" * max_details_bytes()}],
            f"details are {max_details_bytes() + 11} bytes as JSON; at most {max_details_bytes()} (MAX_DETAILS_BYTES)",
            id="over-size details",
        ),
    ],
)
def test_a_bad_key_is_refused(
    driver: Driver, effects: Effects, records: Records, args: list[Any], problem: str
) -> None:
    delivery = driver.deliver_raw(args)
    # FAILURE at the first run: a retry would show as RETRY
    assert delivery.state == "FAILURE"
    assert delivery.value.startswith("BadMessage: ")
    assert problem in delivery.value
    assert records.count("claimed") == records.count("failed") == 0
    assert effects.count(KEY) == 0
    # the queue is not stuck behind it
    assert driver.deliver(KEY, DETAILS).action == "performed"


def test_a_known_key_with_another_payload_is_a_conflict(driver: Driver, effects: Effects, records: Records) -> None:
    assert driver.deliver(KEY, DETAILS).action == "performed"
    delivery = driver.deliver(KEY, OTHER_DETAILS)
    assert delivery.state == "FAILURE"
    assert delivery.value.startswith("PayloadConflict: ")
    assert "already known with a different payload" in delivery.value
    assert effects.count(KEY) == 1
    assert records.status(KEY) == "completed"
    assert records.count("claimed") == 0


def test_a_conflict_with_a_claim_in_progress_leaves_the_claim_alone(
    driver: Driver, effects: Effects, records: Records
) -> None:
    from {{ cookiecutter.project_slug }}.claims import default_store, fingerprint

    token = default_store().claim(KEY, fingerprint(KEY, DETAILS), DETAILS)
    assert token is not None
    delivery = driver.deliver(KEY, OTHER_DETAILS)
    assert delivery.value.startswith("PayloadConflict: ")
    assert records.row(KEY)["claim_token"] == token
    assert effects.count(KEY) == 0
