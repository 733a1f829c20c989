"""The data against the specification: the facts every kit is drawn from."""

from __future__ import annotations

import pytest
from matrix import combinations, expected, facts

# The specification's figures for cases 5 and 6 (spec/000_*.txt, GUIDE.md section 3), restated here on purpose:
# this test checks the data, so it must not read its expectation from the data.
SPEC_CASE_5_AND_6 = {"hold": (0, 1), "resend": (1, 2), "skip": (0, 1), "lookup": (1, 1)}


@pytest.mark.parametrize("policy", SPEC_CASE_5_AND_6)
def test_policies_send_what_the_spec_says(policy: str) -> None:
    effect_kind = "external_with_reference"  # the one kind that allows every policy
    rows = {row["case"]: row for row in expected(effect_kind, policy)}
    assert (rows[5]["emails"], rows[6]["emails"]) == SPEC_CASE_5_AND_6[policy]
    assert rows[5]["record"] == rows[6]["record"] == f"claimed, then {facts().policies[policy]['after_lease']}"
    assert (rows[7]["emails"], rows[7]["record"]) == (0, "claimed")


@pytest.mark.parametrize("combo", combinations(), ids=lambda c: f"{c['effect_kind']}-{c['stale_claim_policy']}")
def test_rows_1_to_4_are_the_same_for_every_policy(combo: dict[str, str]) -> None:
    rows = expected(combo["effect_kind"], combo["stale_claim_policy"])
    assert [row["case"] for row in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert [(row["emails"], row["record"]) for row in rows[:4]] == [
        (1, "completed"),
        (1, "completed"),
        (1, "completed"),
        (2, "completed, completed"),
    ]


def test_same_database_leaves_no_claim_whatever_the_policy() -> None:
    for policy in ("hold", "resend", "skip"):
        rows = expected("same_database", policy)
        assert [(row["emails"], row["record"]) for row in rows[4:]] == [
            (1, "none, then completed"),
            (1, "none, then completed"),
            (1, "completed"),
        ]


def test_lookup_is_only_for_an_effect_that_takes_a_reference() -> None:
    kinds = {combo["effect_kind"] for combo in combinations() if combo["stale_claim_policy"] == "lookup"}
    assert kinds == {"external_with_reference"}
