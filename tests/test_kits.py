"""The harness: for every combination whose queue system has a kit, run the kit's own suite, embedded and live,
then read the replay-report.json it wrote and hold it to the data; a Sidekiq kit runs on every Ruby stack
of stacks.py, the SQS kit through each of its entry points (the consumer, the Lambda handler). A live
Python kit migrates a database that already holds an application's own Alembic history (app_history.py).
Nothing is proven twice: each test file runs on every combination whose answers change its text, on every mode,
broker, entry point and stack where it can fail differently (proven_elsewhere). The Python kits run on a second
Python too (stacks.PYTHON_STACKS), whole, for a covering set of their runs (second_python_runs).
Also run each kit's own linters.

A queue system without a kit yet contributes no test here; once its kit exists, every combination runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

import kit_checks
import matrix_report
import pytest
import stacks
from app_history import assert_app_history_intact, give_app_history
from generate import baked
from matrix import combinations, combo_id, covering, expected
from services import postgres_database, rabbitmq_vhost, redis_database

# How each language's kit runs its suite and its linters, from the kit's root.
SUITES = {
    "python": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
    "ruby": ["rspec"],
}
# The seven cases alone, which write the sign-off reports: for a run whose other tests would only fail too.
REPLAY_CASES = {
    "python": [*SUITES["python"], "tests/test_replay.py"],
    "ruby": ["rspec", "spec/replay_spec.rb"],
}
# The ways into a kit that its suite can be run through (REPLAY_ENTRY_POINT); one run each.
ENTRY_POINTS = {"sqs": ["consumer", "lambda"]}
# The brokers a kit's live suite runs on, one run each (embedded, a Celery kit uses kombu's in-memory transport).
BROKERS = {"celery": ["redis", "rabbitmq"]}
# The test files that no broker or entry point goes through (the claim store on the database alone; SQS: the
# Lambda handler called directly): the combination's first run proves them, and its runs on the other brokers
# or entry points leave them out. Every test that sends through the queue or kills its workers runs on each.
SAME_ON_EVERY_VARIANT = {"celery": ["tests/test_claims.py"], "sqs": ["tests/test_claims.py", "tests/test_lambda.py"]}
# A kit's test files, by language. The stale-claim policy changes only the text of the tests about it: a test file
# that reads the same on two kits of one queue system and effect kind proves the same thing on both, and runs on
# the first of them alone (policy_leader).
TEST_FILES = {"python": "tests/test_*.py", "ruby": "spec/*_spec.rb"}


def kit_language(kit: Path) -> str | None:
    """python, ruby, or None while the kit holds only the documents (no suite yet)."""
    if (kit / "pyproject.toml").exists():
        return "python"
    if (kit / "Gemfile").exists():
        return "ruby"
    return None


def _languages() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        found = {
            queue: kit_language(baked(Path(scratch) / queue, {"queue_system": queue}))
            for queue in sorted({combo["queue_system"] for combo in combinations()})
        }
    return {queue: language for queue, language in found.items() if language}


LANGUAGES = _languages()
WITH_KIT = [combo for combo in combinations() if combo["queue_system"] in LANGUAGES]


def variants(queue_system: str, mode: str) -> list[str | None]:
    """What a kit's suite runs once on each of: an entry point, or (live) a broker; else just once."""
    if mode == "live" and queue_system in BROKERS:
        return list(BROKERS[queue_system])
    return list(ENTRY_POINTS.get(queue_system, [None]))


Run = tuple[dict[str, str], str, str | None, str]  # combination, mode, broker or entry point, stack


def second_python_runs(stack: str) -> list[Run]:
    """The Python kits' runs on a Python after the first: a few in which every effect kind, policy, mode and broker
    or entry point of each queue system appears at least once, each running the kit's whole suite. The Python
    version changes no branch that an answer picks; what it can break (the language, a library's release for it)
    fails any suite there."""
    runs = []
    for queue_system in (queue for queue, language in LANGUAGES.items() if language == "python"):
        cells = [
            combo | {"run": f"{mode} {variant or ''}"}
            for combo in WITH_KIT
            if combo["queue_system"] == queue_system
            for mode in ("embedded", "live")
            for variant in variants(queue_system, mode)
        ]
        for cell in covering(cells, ["effect_kind", "stale_claim_policy", "run"]):
            mode, variant = cell.pop("run").split(" ")
            runs.append((cell, mode, variant or None, stack))
    return runs


def suite_runs() -> list[pytest.param]:
    """Every combination with a kit, in both modes: SQS through each entry point, Celery live on each broker, a
    Ruby kit on every Ruby stack, a Python kit on the first Python; and second_python_runs on each other Python."""
    runs: list[Run] = [
        (combo, mode, variant, stack)
        for combo in WITH_KIT
        for mode in ("embedded", "live")
        for variant in variants(combo["queue_system"], mode)
        for stack in (stacks.RUBY_STACKS if LANGUAGES[combo["queue_system"]] == "ruby" else stacks.PYTHON_STACKS[:1])
    ]
    runs += [run for stack in stacks.PYTHON_STACKS[1:] for run in second_python_runs(stack)]
    return [
        pytest.param(
            combo,
            mode,
            variant,
            stack,
            id="-".join(filter(None, [combo_id(combo), mode, variant, stack])),
            marks=[pytest.mark.live] if mode == "live" else [],
        )
        for combo, mode, variant, stack in runs
    ]


def policy_leader(combo: dict[str, str]) -> dict[str, str]:
    """The first combination of this one's queue system and effect kind: it runs every test file of the kit."""
    return next(
        other
        for other in WITH_KIT
        if (other["queue_system"], other["effect_kind"]) == (combo["queue_system"], combo["effect_kind"])
    )


def proven_elsewhere(kit: Path, combo: dict[str, str], first_variant: bool, scratch: Path) -> set[str]:
    """The kit's test files that another run of the same mode proves: on a later broker or entry point, those no
    broker or entry point goes through (SAME_ON_EVERY_VARIANT); on a later policy, those whose text is the same,
    word for word, on the policy leader's kit."""
    left_out = set()
    if not first_variant:
        left_out |= set(SAME_ON_EVERY_VARIANT.get(combo["queue_system"], []))
        assert all((kit / path).exists() for path in left_out), left_out  # a file renamed would run again
    leader = policy_leader(combo)
    if leader != combo:
        theirs = baked(scratch, leader)
        pattern = TEST_FILES[LANGUAGES[combo["queue_system"]]]
        left_out |= {
            str(path.relative_to(kit))
            for path in kit.glob(pattern)
            if (theirs / path.relative_to(kit)).is_file()
            and (theirs / path.relative_to(kit)).read_bytes() == path.read_bytes()
        }
    return left_out


def suite_argv(kit: Path, language: str, left_out: set[str]) -> list[str]:
    """The kit's suite without the files left out: pytest ignores them, rspec is given the others."""
    if not left_out:
        return SUITES[language]
    if language == "python":
        return SUITES[language] + [f"--ignore={path}" for path in sorted(left_out)]
    kept = sorted(str(path.relative_to(kit)) for path in kit.glob(TEST_FILES[language]))
    return SUITES[language] + [path for path in kept if path not in left_out]


def run_suite(
    kit: Path, language: str, stack: str | None, env: dict[str, str], argv: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The kit's own suite (or argv), on the stack (a Ruby stack, or a Python's), or with this interpreter."""
    argv = argv or SUITES[language]
    if stack:
        stacks.require(stack, language)
        if argv[0] == sys.executable:  # the stack's own Python
            argv = [stacks.python(stack), *argv[1:]]
        argv = stacks.command(stack, argv, kit, env)
    return subprocess.run(argv, cwd=kit, env=env, capture_output=True, text=True, timeout=900)


def children_cpu() -> float:
    """The CPU seconds of every process this one has waited for: a suite's, with its workers and commands."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_name(request: pytest.FixtureRequest) -> str:
    """A short name for this test that no other test of the run shares, for what it creates."""
    return hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]


def assert_report(
    kit: Path, combo: dict[str, str], mode: str, entry_point: str | None = None, broker: str | None = None
) -> None:
    """replay-report.json says that every one of the seven rows was observed as the data expects."""
    report = json.loads((kit / "replay-report.json").read_text())
    assert {k: report[k] for k in ("queue_system", "effect_kind", "stale_claim_policy")} == combo
    assert report["mode"] == mode
    if entry_point:
        assert report["entry_point"] == entry_point
    if broker:  # named, with the version its server gave
        named = next(fact["value"] for fact in report["environment"] if fact["name"] == "Broker")
        assert re.fullmatch(r"\S+ \d+\.\d+\.\d+", named) and named.split()[0].lower() == broker, named
    assert report["database"] == ("postgresql" if mode == "live" else "sqlite")
    rows = report["rows"]
    assert [row["case"] for row in rows] == [1, 2, 3, 4, 5, 6, 7]
    for row, want in zip(rows, expected(combo["effect_kind"], combo["stale_claim_policy"]), strict=True):
        assert row["attempt"] == want["attempt"]
        assert row["expected"] == {"emails": want["emails"], "record": want["record"]}, row
        assert row["observed"] == row["expected"], row
        assert row["passed"] is True, row
    names = [fact["name"] for fact in report["environment"]]
    assert names[:4] == ["Queue system", "Broker", "Database", "Language"]
    # the settings the guarantee rests on, beside the verdict
    assert "Broker settings" in names, names
    # the sign-off reports made from it: the verdict first, and the seven cases as passed tests for any CI
    verdict = "Passed: all seven cases behaved as POLICY.md says."
    assert verdict in (kit / "replay-report.html").read_text()
    assert verdict in (kit / "replay-report.md").read_text()
    junit = ElementTree.parse(kit / "replay-junit.xml").getroot()
    assert [len(junit.findall(".//testcase")), junit.get("failures"), junit.get("errors")] == [7, "0", "0"]


@pytest.mark.parametrize(("combo", "mode", "variant", "stack"), suite_runs())
def test_kit_suite_proves_the_policy(
    request: pytest.FixtureRequest, tmp_path: Path, combo: dict[str, str], mode: str, variant: str | None, stack: str
) -> None:
    kit = baked(tmp_path, combo)
    language = LANGUAGES[combo["queue_system"]]
    entry_point = variant if variant in ENTRY_POINTS.get(combo["queue_system"], []) else None
    broker = variant if variant in BROKERS.get(combo["queue_system"], []) else None
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")}
    if entry_point:
        env["REPLAY_ENTRY_POINT"] = entry_point
    with contextlib.ExitStack() as services:
        if mode == "live":
            database = services.enter_context(postgres_database(run_name(request)))
            env["DATABASE_URL"] = database
            if broker == "rabbitmq":
                env["CELERY_BROKER_URL"] = services.enter_context(rabbitmq_vhost())
            else:
                redis_url = services.enter_context(redis_database())
                env |= {"CELERY_BROKER_URL": redis_url, "REDIS_URL": redis_url}
            if language == "python":
                give_app_history(database)
        first_variant = variant == variants(combo["queue_system"], mode)[0]
        # a second Python's few runs are whole: nothing of theirs is proven elsewhere on that Python
        second_python = language == "python" and stack != stacks.PYTHON_STACKS[0]
        left_out = set() if second_python else proven_elsewhere(kit, combo, first_variant, tmp_path / "leader")
        started, cpu_before = time.monotonic(), children_cpu()
        result = run_suite(kit, language, stack, env, suite_argv(kit, language, left_out))
        seconds, cpu = time.monotonic() - started, children_cpu() - cpu_before
        matrix_report.record(combo, mode, variant, stack, seconds, result.returncode == 0, kit, cpu)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
        # nothing skipped or pending: what a mode cannot run is left out of it, and said in the kit's README
        assert not re.search(r"\d+ (skipped|pending)", result.stdout), result.stdout[-3000:]
        if mode == "live" and language == "python":
            assert_app_history_intact(database)
    print(f"{combo_id(combo)} {mode} {variant or ''} {stack}: suite passed in {seconds:.1f} s")
    assert_report(kit, combo, mode, entry_point, broker)


@pytest.mark.parametrize("combo", WITH_KIT, ids=combo_id)
def test_kit_passes_its_own_linters(tmp_path: Path, combo: dict[str, str]) -> None:
    """The kit's own linters: the first combination of its queue system's whole, another's beside it."""
    kit = baked(tmp_path / "kit", combo)
    first = next(other for other in WITH_KIT if other["queue_system"] == combo["queue_system"])
    kit_checks.assert_linters_pass_beside(
        kit, combo["queue_system"], baked(tmp_path / "first", first) if combo != first else None
    )


@pytest.mark.parametrize(
    ("combo", "stack"),
    [
        pytest.param(combo, stack, id=f"{combo_id(combo)}-{stack}")
        for combo in WITH_KIT
        if LANGUAGES[combo["queue_system"]] == "ruby" and policy_leader(combo) == combo
        for stack in stacks.RUBY_STACKS[1:]
    ],
)
def test_the_sidekiq_kit_passes_the_rubocop_of_each_stack(tmp_path: Path, combo: dict[str, str], stack: str) -> None:
    """The Gemfile takes the newest rubocop: each stack's too, on each effect kind's first kit (every kit passes this
    machine's rubocop in test_kit_passes_its_own_linters)."""
    stacks.require(stack)
    kit = baked(tmp_path, combo)
    (rubocop,) = kit_checks.linters("ruby")
    result = subprocess.run(stacks.command(stack, rubocop, kit, {}), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
