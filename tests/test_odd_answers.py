"""Text answers that the rules accept, however odd (quotes, backslashes, braces, `$`, backticks, Markdown's
characters, emoji, right-to-left text), give the same kit from both tools, and a kit that compiles, passes its
linters, parses, and passes its own embedded suite: each answer reaches each file through an escape fit for the
place (templates/replay_matrix.jinja: py, quoted, rb, sh, md, code_span, html, doc).

"""

from __future__ import annotations

from pathlib import Path

import kit_checks
import pytest
from generate import baked, with_cookiecutter
from matrix import combinations, combo_id, facts, problem

# The longest identifier the rules accept: each lands in longer names (indexes, modules, classes, files) and in
# lines that the kit's linters bound, which must hold at this length as at the defaults'.
LONGEST = int(facts().max_identifier_length)


def longest(name: str) -> str:
    """name made up to the longest identifier the rules accept."""
    return (name + "_" + "x" * LONGEST)[:LONGEST]


# The identifiers at their longest: every one passes the rules.
LONG_IDENTIFIERS = {
    "project_slug": longest("odd_kit"),
    "job_type": longest("send_odd"),
    "operation_key_name": longest("odd_key"),
    "record_table": longest("odd_operations"),
}
# The answers of issue 29, and more of the same kind: every one passes the rules.
ODD = {
    **LONG_IDENTIFIERS,
    "project_name": 'O\'Brien "Ä" $HOME `id` \\n %s {x} 🎉 שלום',
    "effect_description": "send O'Brien's \"mail\" \\ {x} #{y} `z` $P %d <b>&amp;</b> *x*|[a](b)🎉",
    "example_key": 'O\'Brien "ÄÖ" 注文',
    "other_example_key": "ORD {x} #{y} \\ `z` $P",
    # a valid pair far from the defaults (the kits' tests once expected the default lease's numbers)
    "longest_run_seconds": "5",
    "lease_seconds": "20",
}
QUEUE_SYSTEMS = ["celery", "sqs", "sidekiq"]


def test_the_odd_answers_pass_every_rule() -> None:
    assert {len(name) for name in LONG_IDENTIFIERS.values()} == {LONGEST}
    for queue_system in QUEUE_SYSTEMS:
        assert problem({**ODD, "queue_system": queue_system}) == ""


@pytest.mark.parametrize("combo", combinations(), ids=combo_id)
def test_every_combination_passes_its_linters_with_the_longest_identifiers(
    combo: dict[str, str], tmp_path: Path
) -> None:
    """Lines that hold an identifier stay within the linters' bounds at its longest, for every combination (the
    first of a queue system linted whole, the others where they differ from it)."""
    kit = with_cookiecutter(tmp_path / "kit", {**LONG_IDENTIFIERS, **combo})
    first = next(other for other in combinations() if other["queue_system"] == combo["queue_system"])
    linted = baked(tmp_path / "first", {**LONG_IDENTIFIERS, **first}) if combo != first else None
    kit_checks.assert_linters_pass_beside(kit, combo["queue_system"], linted)


@pytest.fixture(scope="module", params=QUEUE_SYSTEMS)
def queue_system(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def odd_kit(queue_system: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_cookiecutter(tmp_path_factory.mktemp("odd"), {**ODD, "queue_system": queue_system})


def test_both_tools_give_the_same_kit(queue_system: str, odd_kit: Path, tmp_path: Path) -> None:
    kit_checks.assert_copier_gives_the_same_kit(odd_kit, {**ODD, "queue_system": queue_system}, tmp_path / odd_kit.name)


def test_every_file_parses_and_passes_the_linters(queue_system: str, odd_kit: Path) -> None:
    kit_checks.assert_every_file_parses(odd_kit)
    kit_checks.assert_linters_pass(odd_kit, queue_system)


def test_the_readme_names_the_answers_as_written_and_its_commands_parse(odd_kit: Path) -> None:
    kit_checks.assert_readme_shell_lines_parse(odd_kit)
    kit_checks.assert_readme_sends_the_key_whole(odd_kit, ODD["example_key"])


def test_the_kits_embedded_suite_passes(queue_system: str, odd_kit: Path) -> None:
    kit_checks.assert_embedded_suite_passes(odd_kit, queue_system)
