"""Answers drawn at random from everything the rules accept give kits that pass every check of tests/kit_checks.py.

Each set of answers comes from its own seed: text answers of quotes, backslashes, braces, `%`, `$`, backticks,
`#{`, emoji, Hebrew and Arabic letters, CJK and Markdown's characters, often filling the answer's whole width;
identifiers of 1 to max_identifier_length characters, some of them names that a language, a library or the kit
itself already uses; leases from the shortest the rules allow (min_lease_seconds) to a day; every choice. Set i of a run
uses seed REPLAY_RANDOM_SEED + i, so the seed in a failure's test id reproduces it alone:

    REPLAY_RANDOM_SEED=<seed> REPLAY_RANDOM_SETS=1 tox -e random
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kit_checks
import pytest
from generate import with_cookiecutter
from matrix import CHOICES, answers, facts, problem

# CI's sets: a handful, each a new kit and its embedded suite (about a minute of machine time each).
SEED = int(os.environ.get("REPLAY_RANDOM_SEED", "29000"))
SETS = int(os.environ.get("REPLAY_RANDOM_SETS", "3"))
SEEDS = range(SEED, SEED + SETS)

RULES = facts()
MAX_IDENTIFIER = int(RULES.max_identifier_length)
IDENTIFIER_ANSWERS = ["project_slug", "job_type", "operation_key_name", "record_table"]
TEXT_WIDTHS = {name: int(rule["width"]) for name, rule in RULES.text_answers.items()}
# Pieces of text: each one a character or a run that some escape must handle (a language's quote, comment,
# interpolation, format or template, Markdown, HTML, a shell's word splitting, text that is wide or right-to-left).
TEXT_PIECES = [
    *string.ascii_letters,
    *string.digits,
    *string.punctuation,
    *["#{", "#$", "#@", "${HOME}", "$(id)", "$1", "%s", "%(x)s", "%d", "%%", "{0}", "{x!r}", "\\n", "\\u0041"],
    *["\\N{DASH}", '"""', "'''", "\\", "\\\\", "*/", "<!--", "-->", "]]", "[[", "<b>", "&amp;", "&#91;", "=begin"],
    *["__END__", "%q(", "&&", "||", ";", "1.", "- ", "# ", "> ", "| a |", "[a](b)", "**", "~~", "::", "<%= x %>"],
    *["🎉", "😀", "👍🏽", "👩‍💻", "🇮🇱", "❤️", "\u00a0", "\u3000", "é", "Ä", "ß", "İ"],
    *[chr(code) for code in range(0x05D0, 0x05EB)],  # Hebrew letters
    *[chr(code) for code in range(0x0627, 0x064B)],  # Arabic letters
    *["注", "文", "漢", "字", "日本語", "中文", "한국어", "ひらがな", "カタカナ", "\uff21", "\uff11"],
]
# Identifiers the rules accept that something already uses: a module the kit imports, a builtin, a Ruby method,
# a column or a catalog of the databases, a name of the kit's own files and classes.
NAMES_IN_USE = str.split("""
    json os sys time logging email socket signal select random string types typing uuid http queue shlex sqlite3
    smtplib threading subprocess datetime hashlib contextlib pathlib argparse test site
    celery kombu redis boto3 moto alembic sqlalchemy psycopg pytest django sidekiq rspec rails pg
    claims settings effect job tasks producer consumer operations sinks report schema soak provider crash_points
    celery_app lambda_handler tests spec src stale_claim_sweeper handled_operations held_operations database_check
    id len str list print open input hash object max min format vars filter map next iter dir help sum
    send puts raise require loop proc freeze object_id method p exit sleep logger perform sidekiq_options
    status key name value operation_key claimed_at completed_at attempt token fingerprint payload result
    reference position timestamp date text year data sqlite_master sqlite_sequence pg_class pg_stat_activity
    abort attach pragma vacuum temp glob regexp autoincrement conflict ignore indexed rowid oid
""")
# The lease in seconds: from the shortest the rules allow to a day.
SHORTEST_LEASE = int(RULES.min_lease_seconds)
LONGEST_LEASE = 86400


def accepted(name: str, given: dict[str, Any], draw: Callable[[], Any]) -> Any:
    """A value of answer `name` that the rule for it accepts, given the answers before it: drawn until one is."""
    for _ in range(1000):
        value = draw()
        if not str(RULES.answer_problem(name, {**given, name: value})).strip():
            return value
    raise AssertionError(f"no acceptable {name} in 1000 draws")


def width(text: str) -> int:
    """Columns as the rules count them: as the kit writes the text, escaped."""
    return int(RULES.written_width(text))


def draw_text(rng: random.Random, name: str) -> str:
    """Pieces up to a width: the answer's whole width as often as not, where a line is most likely to overflow."""
    limit = TEXT_WIDTHS[name] if rng.random() < 0.5 else rng.randint(1, TEXT_WIDTHS[name])
    text = ""
    for _ in range(4 * limit):
        piece = rng.choice(TEXT_PIECES)
        if width(text + piece) <= limit:
            text += piece
    return text.strip()  # an answer without leading or trailing spaces, which the rules refuse


def draw_identifier(rng: random.Random, given: dict[str, Any]) -> str:
    """1 to MAX_IDENTIFIER characters, the two ends most often; sometimes a name in use, or an earlier answer's."""
    earlier = [given[name] for name in IDENTIFIER_ANSWERS if name in given]
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(NAMES_IN_USE)
    if roll < 0.22 and earlier:
        return rng.choice(earlier)
    length = rng.choice([1, MAX_IDENTIFIER, rng.randint(1, MAX_IDENTIFIER)])
    rest = rng.choices(string.ascii_lowercase + string.digits + "_" * 8, k=length - 1)
    return rng.choice(string.ascii_lowercase) + "".join(rest)


def draw_seconds(rng: random.Random) -> tuple[int, int]:
    """longest_run_seconds and lease_seconds: the shortest lease with the shortest run and with the longest run
    under it, a lease of a day with the same two, or anything between."""
    longest = rng.randint(1, LONGEST_LEASE - 1)
    return rng.choice(
        [
            (1, SHORTEST_LEASE),
            (SHORTEST_LEASE - 1, SHORTEST_LEASE),
            (1, LONGEST_LEASE),
            (LONGEST_LEASE - 1, LONGEST_LEASE),
            (longest, rng.randint(max(longest + 1, SHORTEST_LEASE), LONGEST_LEASE)),
        ]
    )


def draw_durations(rng: random.Random, given: dict[str, Any]) -> tuple[int, int]:
    """longest_run_seconds and lease_seconds that their rules accept, given the answers before them (an SQS job
    runs for less than 12 h): drawn until a pair is."""
    for _ in range(1000):
        longest, lease = draw_seconds(rng)
        durations = {**given, "longest_run_seconds": longest, "lease_seconds": lease}
        if not any(
            str(RULES.answer_problem(name, durations)).strip() for name in ("longest_run_seconds", "lease_seconds")
        ):
            return longest, lease
    raise AssertionError("no acceptable durations in 1000 draws")


def draw_answers(seed: int) -> dict[str, Any]:
    """A whole set, in the order the questions are asked (a rule that compares two answers sits on the later one).
    The queue system goes round with the seed, so that any three seeds in a row try each one; project_slug is
    left to its default from project_name a third of the time."""
    rng = random.Random(seed)
    given: dict[str, Any] = {"project_name": accepted("project_name", {}, lambda: draw_text(rng, "project_name"))}
    if rng.random() < 2 / 3:
        given["project_slug"] = accepted("project_slug", given, lambda: draw_identifier(rng, given))
    given["queue_system"] = CHOICES["queue_system"][seed % len(CHOICES["queue_system"])]
    given["job_type"] = accepted("job_type", given, lambda: draw_identifier(rng, given))
    given["effect_description"] = accepted("effect_description", given, lambda: draw_text(rng, "effect_description"))
    given["operation_key_name"] = accepted("operation_key_name", given, lambda: draw_identifier(rng, given))
    for name in ["example_key", "other_example_key"]:
        given[name] = accepted(name, given, lambda name=name: draw_text(rng, name))
    given["effect_kind"] = rng.choice(CHOICES["effect_kind"])
    policy = accepted("stale_claim_policy", given, lambda: rng.choice(CHOICES["stale_claim_policy"]))
    given["stale_claim_policy"] = policy
    given["longest_run_seconds"], given["lease_seconds"] = draw_durations(rng, given)
    given["record_table"] = accepted("record_table", given, lambda: draw_identifier(rng, given))
    return given


@contextlib.contextmanager
def reproducible(seed: int, given: dict[str, Any]) -> Iterator[None]:
    """A failure names its seed, its answers, and the one command that draws them again."""
    try:
        yield
    except Exception as error:  # an assertion, and what a tool or a parser raised
        again = f"REPLAY_RANDOM_SEED={seed} REPLAY_RANDOM_SETS=1 tox -e random"
        detail = f"seed {seed}: {json.dumps(given, ensure_ascii=False)}\nreproduce: {again}"
        raise AssertionError(f"{error}\n{detail}") from error


@pytest.fixture(
    scope="module",
    params=[pytest.param(seed, id=f"seed={seed}", marks=pytest.mark.xdist_group(f"random-{seed}")) for seed in SEEDS],
)
def drawn(request: pytest.FixtureRequest) -> tuple[int, dict[str, Any]]:
    return request.param, draw_answers(request.param)


@pytest.fixture(scope="module")
def kit(drawn: tuple[int, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    seed, given = drawn
    with reproducible(seed, given):
        assert problem(answers(**given)) == ""
        return with_cookiecutter(tmp_path_factory.mktemp(f"random{seed}"), given)


def test_the_drawn_answers_pass_every_rule(drawn: tuple[int, dict[str, Any]]) -> None:
    seed, given = drawn
    with reproducible(seed, given):
        assert problem(answers(**given)) == ""


def test_both_tools_give_the_same_kit(drawn: tuple[int, dict[str, Any]], kit: Path, tmp_path: Path) -> None:
    seed, given = drawn
    with reproducible(seed, given):
        kit_checks.assert_copier_gives_the_same_kit(kit, given, tmp_path / kit.name)


def test_every_file_parses_and_passes_the_linters(drawn: tuple[int, dict[str, Any]], kit: Path) -> None:
    seed, given = drawn
    with reproducible(seed, given):
        kit_checks.assert_every_file_parses(kit)
        kit_checks.assert_linters_pass(kit, given["queue_system"])


def test_the_readmes_shell_lines_parse(drawn: tuple[int, dict[str, Any]], kit: Path) -> None:
    seed, given = drawn
    with reproducible(seed, given):
        kit_checks.assert_readme_shell_lines_parse(kit)
        kit_checks.assert_readme_sends_the_key_whole(kit, given["example_key"])


def test_the_kits_embedded_suite_passes(drawn: tuple[int, dict[str, Any]], kit: Path) -> None:
    seed, given = drawn
    with reproducible(seed, given):
        kit_checks.assert_embedded_suite_passes(kit, given["queue_system"])
