"""The template's facts, read from templates/replay_matrix.jinja: the same source the kits are drawn from.

The tests never restate a case or a policy; they ask this module, which asks the Jinja file.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import FileSystemLoader
from jinja2.sandbox import SandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS: dict[str, Any] = json.loads((ROOT / "cookiecutter.json").read_text())
DEFAULTS = {
    name: value[0] if isinstance(value, list) else value
    for name, value in QUESTIONS.items()
    if not name.startswith("_")
}
CHOICES = {name: value for name, value in QUESTIONS.items() if isinstance(value, list) and not name.startswith("_")}


@cache
def _template() -> Any:
    env = SandboxedEnvironment(loader=FileSystemLoader(ROOT / "templates"))
    return env.get_template("replay_matrix.jinja")


def facts() -> Any:
    """The module of replay_matrix.jinja: cases, policies, effect_kinds, queue_systems, the rule macros."""
    return _template().module


def answers(**overrides: Any) -> dict[str, Any]:
    """A full set of answers: the defaults, project_slug and lease_seconds derived as the template derives them."""
    given = {**DEFAULTS, **overrides}
    if "project_slug" not in overrides:
        given["project_slug"] = str(facts().slug(given["project_name"]))
    if "lease_seconds" not in overrides:
        given["lease_seconds"] = int(str(facts().lease_default(given["longest_run_seconds"])))
    return given


def problem(given: dict[str, Any]) -> str:
    return str(facts().first_problem(given)).strip()


def expected(effect_kind: str, stale_claim_policy: str) -> list[dict[str, Any]]:
    """The seven rows the kit's suite must observe for one effect kind and policy."""
    context = {"cookiecutter": {"effect_kind": effect_kind, "stale_claim_policy": stale_claim_policy}}
    return list(_template().make_module(context).expected)


def combinations() -> list[dict[str, str]]:
    """Every combination of the choice answers, read from cookiecutter.json, split by the rules."""
    names = list(CHOICES)
    every = [dict(zip(names, values, strict=True)) for values in itertools.product(*CHOICES.values())]
    return [combo for combo in every if not problem(answers(**combo))]


def invalid_combinations() -> list[dict[str, str]]:
    names = list(CHOICES)
    every = [dict(zip(names, values, strict=True)) for values in itertools.product(*CHOICES.values())]
    return [combo for combo in every if problem(answers(**combo))]


def covering(cells: list[dict[str, str]], names: list[str]) -> list[dict[str, str]]:
    """A few of `cells` in which every value of each of `names` appears at least once: the first cell, then each
    time the one that adds the most values not yet seen (the earliest among equals). For what is proven apart
    from the whole matrix (a kit inside a host app): every policy, effect kind and broker once, not every cell."""
    values = [{(name, cell[name]) for name in names} for cell in cells]
    wanted = set().union(*values)
    chosen, seen = [0], set(values[0])
    while seen != wanted:
        best = max(range(len(cells)), key=lambda n: len(values[n] - seen))
        chosen.append(best)
        seen |= values[best]
    return [cells[n] for n in chosen]


def combo_id(combo: dict[str, str]) -> str:
    return "-".join(combo.values())
