"""The questions: copier.yml mirrors cookiecutter.json, and both agree with the data."""

from __future__ import annotations

import configparser
import re
from typing import Any

import yaml
from matrix import CHOICES, DEFAULTS, QUESTIONS, ROOT, facts

COPIER = yaml.safe_load((ROOT / "copier.yml").read_text())
COPIER_QUESTIONS = {
    name: spec for name, spec in COPIER.items() if not name.startswith("_") and spec.get("when") is not False
}


def copier_choices(spec: dict[str, Any]) -> list[Any] | None:
    """A question's choice values, whether copier.yml lists them or maps each to its value and validator."""
    choices = spec.get("choices")
    if isinstance(choices, dict):
        return [choice["value"] if isinstance(choice, dict) else choice for choice in choices.values()]
    return choices


def test_copier_asks_the_same_questions_in_the_same_order() -> None:
    assert list(COPIER_QUESTIONS) == list(DEFAULTS)


def test_the_rules_know_every_question_in_order() -> None:
    # unknown_answer() refuses any other name, so this list must be exactly the questions
    assert list(facts().questions) == list(DEFAULTS)


def test_copier_has_the_same_defaults_choices_and_prompts() -> None:
    for name, spec in COPIER_QUESTIONS.items():
        assert spec["help"] == QUESTIONS["__prompts__"][name], name
        assert copier_choices(spec) == CHOICES.get(name), name
        if "{" not in str(QUESTIONS[name]):  # derived defaults are compared by generating (test_generate)
            assert spec["default"] == DEFAULTS[name], name


def test_derived_defaults_use_the_same_macro_in_both_tools() -> None:
    for name, macro, source in (
        ("project_slug", "slug", "project_name"),
        ("lease_seconds", "lease_default", "longest_run_seconds"),
    ):
        assert QUESTIONS[name] == f"{{{{ {macro}(cookiecutter.{source}) }}}}", name
        assert COPIER_QUESTIONS[name]["default"].endswith(f"{{{{ {macro}({source}) }}}}"), name
        # the answer it is derived from is asked first
        assert list(DEFAULTS).index(source) < list(DEFAULTS).index(name)


def test_every_stale_claim_policy_choice_carries_the_rule() -> None:
    """copier asked interactively runs no question validator on a choice: each choice must carry its own."""
    choices = COPIER_QUESTIONS["stale_claim_policy"]["choices"]
    for name, choice in choices.items():
        assert choice["value"] == name
        assert (
            f"answer_problem('stale_claim_policy', {{'effect_kind': effect_kind, 'stale_claim_policy': '{name}'}})"
            in (choice["validator"])
        )


def test_durations_are_integers_in_both_tools() -> None:
    assert isinstance(QUESTIONS["longest_run_seconds"], int)
    assert int(str(facts().lease_default(QUESTIONS["longest_run_seconds"]))) == 600
    for name in ("lease_seconds", "longest_run_seconds"):
        assert COPIER_QUESTIONS[name]["type"] == "int"


def test_min_copier_version_is_the_one_the_oldest_env_runs() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    pinned = dict(re.findall(r"^\s*([a-z0-9_-]+)==([0-9.]+)", tox["testenv:oldest"]["deps"], re.M))
    assert COPIER["_min_copier_version"] == pinned["copier"]
    requirements = (ROOT / "tests" / "requirements.txt").read_text()
    for tool in ("copier", "cookiecutter", "cruft"):
        assert f"{tool}>={pinned[tool]}" in requirements, tool


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
