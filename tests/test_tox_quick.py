"""The README's `tox -e quick`: it runs, and it selects what the README says (every rule, every combination's
generation and embedded suite, nothing that needs a live service). `tox` runs all of it too, so CI does not run
it a second time in full: here tox builds its environment and collects its tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from matrix import ROOT, combinations, combo_id

README = (ROOT / "README.md").read_text()


def collected(command: list[str]) -> set[str]:
    # Outside the outer tox's environment, as a person's shell would run it.
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TOX_", "VIRTUAL_ENV"))}
    # collected by one process (-n 0): pytest's workers would each collect the same again
    result = subprocess.run([*command, "-n", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_tox_quick_selects_the_rules_and_every_embedded_suite_and_nothing_live() -> None:
    assert re.search(r"^    tox -e quick$", README, re.MULTILINE)
    quick = collected([sys.executable, "-m", "tox", "-e", "quick", "--", "--collect-only", "-q"])
    live = collected(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "live", "tests"]
    )

    assert not quick & live, sorted(quick & live)[:5]
    suites = {item for item in quick if "test_kit_suite_proves_the_policy" in item}
    for combo in combinations():
        assert any(f"[{combo_id(combo)}-embedded" in suite for suite in suites), combo_id(combo)
    assert all("-embedded" in suite for suite in suites)
    assert any(item.startswith("tests/test_rules.py::") for item in quick)


def test_tox_leaves_the_long_soaks_to_the_readmes_long_command() -> None:
    """`tox` collects no long run; `tox -- -m long`, as the README writes it, collects each queue system's long
    soak and nothing else (collected only: running them is the long run itself)."""
    assert re.search(r"^    tox -- -m long$", README, re.MULTILINE)
    tox = [sys.executable, "-m", "tox", "--"]
    everything = collected([*tox, "--collect-only", "-q"])
    long = collected([*tox, "-m", "long", "--collect-only", "-q"])
    assert not everything & long, sorted(everything & long)
    assert sorted(item.split("[")[1].split("-")[0] for item in long) == ["celery", "sidekiq", "sqs"], long
    assert all(item.startswith("tests/test_soak.py::test_long_soak_passes[") for item in long), long


def test_the_readmes_longer_random_run_draws_the_sets_it_names() -> None:
    """`REPLAY_RANDOM_SETS=200 REPLAY_RANDOM_SEED=1 tox -e random`, as the README writes it, collects 200 sets from
    seed 1 (collected only: running them is the longer run itself)."""
    (command,) = re.findall(
        r"^    (REPLAY_RANDOM_SETS=\d+ REPLAY_RANDOM_SEED=\d+ tox -e random)$", README, re.MULTILINE
    )
    settings = dict(word.split("=") for word in command.split()[:2])
    sets, seed = int(settings["REPLAY_RANDOM_SETS"]), int(settings["REPLAY_RANDOM_SEED"])
    argv = [sys.executable, "-m", "tox", "-e", "random", "--", "--collect-only", "-q"]
    items = collected(["env", *command.split()[:2], *argv])
    seeds = {re.search(r"\[seed=(\d+)\]", item)[1] for item in items if "[seed=" in item}  # type: ignore[index]
    assert seeds == {str(n) for n in range(seed, seed + sets)}


def test_tox_speed_prints_each_tool_and_queue_system_against_a_one_file_template() -> None:
    """`tox -e speed`, as the README writes it: a line per tool and queue system, with its ratio."""
    assert re.search(r"^    tox -e speed$", README, re.MULTILINE)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TOX_", "VIRTUAL_ENV"))}
    result = subprocess.run(
        [sys.executable, "-m", "tox", "-e", "speed"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = re.findall(
        r"^(cookiecutter|copier) +(\w+) +[\d.]+ s a kit, +\d+ times the one-file template$", result.stdout, re.MULTILINE
    )
    assert sorted(figures) == sorted(
        (tool, queue) for tool in ("cookiecutter", "copier") for queue in ("celery", "sidekiq", "sqs")
    ), result.stdout
    assert re.search(r"^a one-file template: cookiecutter [\d.]+ ms, copier [\d.]+ ms", result.stdout, re.MULTILINE)
