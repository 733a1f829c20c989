"""The questions: copier.yml mirrors cookiecutter.json, and both agree with the data."""

from __future__ import annotations

import yaml
from matrix import CHOICES, DEFAULTS, QUESTIONS, ROOT, facts

COPIER = yaml.safe_load((ROOT / "copier.yml").read_text())
COPIER_QUESTIONS = {
    name: spec for name, spec in COPIER.items() if not name.startswith("_") and spec.get("when") is not False
}


def test_copier_asks_the_same_questions_in_the_same_order() -> None:
    assert list(COPIER_QUESTIONS) == list(DEFAULTS)


def test_copier_has_the_same_defaults_choices_and_prompts() -> None:
    for name, spec in COPIER_QUESTIONS.items():
        assert spec["help"] == QUESTIONS["__prompts__"][name], name
        assert spec.get("choices") == CHOICES.get(name), name
        if "{" not in str(QUESTIONS[name]):  # the derived slug is compared by generating (test_generate)
            assert spec["default"] == DEFAULTS[name], name


def test_durations_are_integers_in_both_tools() -> None:
    for name in ("lease_seconds", "longest_run_seconds"):
        assert isinstance(QUESTIONS[name], int)
        assert COPIER_QUESTIONS[name]["type"] == "int"


def test_every_answer_has_a_prompt() -> None:
    assert set(QUESTIONS["__prompts__"]) == set(DEFAULTS)


def test_choices_are_the_data() -> None:
    data = facts()
    assert {
        "queue_system": list(data.queue_systems),
        "effect_kind": list(data.effect_kinds),
        "stale_claim_policy": list(data.policies),
    } == CHOICES


def test_copier_mapping_passes_every_answer_to_the_kit() -> None:
    """The computed `cookiecutter` mapping must carry every answer, or a kit file would see it undefined."""
    default = COPIER["cookiecutter"]["default"]
    for name in DEFAULTS:
        assert f'"{name}": {name}' in default, name
    assert COPIER["cookiecutter"]["when"] is False
