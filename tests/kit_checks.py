"""What every generated kit must satisfy, whatever the answers it was made with: both tools give the same kit, its
code compiles and passes its linters, its settings parse, its README's shell lines parse, its embedded suite passes.

tests/test_odd_answers.py runs these on one fixed set of odd answers, tests/test_random_answers.py on answers drawn
at random; each check raises AssertionError naming the file and the error.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from generate import COPIER_ANSWERS, readme_commands, tree, with_copier

# The programs the README's shell lines start with (its code blocks hold Python and settings too).
SHELL_PROGRAMS = {"python", "pip", "celery", "alembic", "export", "cd", "aws", "bundle", "bin/rails", "ruby", "sidekiq"}
# The environment that would point an embedded suite at a live service: left out, so that it runs on its own.
SERVICE_VARIABLES = ("DATABASE_URL", "CELERY_", "REDIS_URL", "SQS_", "AWS_", "SMTP_", "PROVIDER_URL")


def kit_files(folder: Path) -> dict[Path, bytes]:
    """Every file of a kit by relative path, without copier's answers file (cookiecutter writes none)."""
    return {
        path.relative_to(folder): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and path.name != COPIER_ANSWERS and "__pycache__" not in path.parts
    }


def assert_copier_gives_the_same_kit(kit: Path, answers: dict[str, Any], destination: Path) -> None:
    """kit was made by cookiecutter from answers; copier, given the same answers, must write the same files."""
    ours = kit_files(kit)
    theirs = kit_files(with_copier(destination, answers))
    assert sorted(ours) == sorted(theirs)
    assert [path for path in ours if ours[path] != theirs[path]] == []


def ruby_files(kit: Path) -> list[Path]:
    return [*kit.rglob("*.rb"), *kit.rglob("*.rake"), *kit.rglob("Rakefile")]


def assert_every_file_parses(kit: Path) -> None:
    """Python compiles (compile, not only parse: it also finds a misplaced return or nonlocal), Ruby passes
    `ruby -c`, TOML and YAML load."""
    for path in kit.rglob("*.py"):
        compile(path.read_text(), str(path), "exec", dont_inherit=True)
    for path in ruby_files(kit):
        checked = subprocess.run(["ruby", "-c", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    for path in kit.rglob("*.toml"):
        tomllib.loads(path.read_text())
    for path in [*kit.rglob("*.yml"), *kit.rglob("*.yaml")]:
        yaml.safe_load(path.read_text())


def linters(language: str) -> list[list[str]]:
    """A kit's own linters, run from its root with its own settings."""
    if language == "ruby":
        return [["rubocop", "--no-server", "--cache", "false"]]
    return [[sys.executable, "-m", "ruff", "check", "."], [sys.executable, "-m", "ruff", "format", "--check", "."]]


# Where a kit's linters read their settings.
LINTER_SETTINGS = (".rubocop.yml", "pyproject.toml")
# What each language's linter inspects (the same files it finds by itself in a kit).
LINTED = {"python": ("*.py",), "ruby": ("*.rb", "*.rake", "Gemfile", "Rakefile")}


def assert_linters_pass(kit: Path, queue_system: str, only: list[str] | None = None) -> None:
    """The kit's own linters, with the kit's own settings: rubocop, or ruff check and ruff format --check; on every
    file, or on `only` (paths from the kit's root) of those the linter inspects."""
    language = "ruby" if queue_system == "sidekiq" else "python"
    files: list[str] = []
    if only is not None:
        files = [
            path for path in only if any(fnmatch.fnmatch(Path(path).name, pattern) for pattern in LINTED[language])
        ]
        if not files:
            return
    for linter in linters(language):
        assert shutil.which(linter[0]), f"{linter[0]} is not installed"
        argv = [*linter[:-1], *files] if files and linter[-1] == "." else [*linter, *files]
        if files and language == "ruby":
            argv.insert(1, "--force-exclusion")  # as when it finds them itself: its settings' exclusions hold
        result = subprocess.run(argv, cwd=kit, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, " ".join(argv) + "\n" + result.stdout[-3000:] + result.stderr[-2000:]


def assert_linters_pass_beside(kit: Path, queue_system: str, linted: Path | None) -> None:
    """The kit's own linters on the whole kit; or, beside `linted` (a kit of the same queue system that another test
    lints whole), on the files that differ from it, when the linter settings are the same: same path, text and
    settings give the same verdict, and rubocop spends some 10 s of CPU on a whole kit."""
    ours = tree(kit)
    theirs = tree(linted) if linted else {}
    if not theirs or any(ours.get(name) != theirs.get(name) for name in LINTER_SETTINGS):
        assert_linters_pass(kit, queue_system)
        return
    assert_linters_pass(kit, queue_system, only=sorted(name for name, text in ours.items() if theirs.get(name) != text))


def readme_command_lines(kit: Path) -> list[str]:
    """The lines of every code block in the kit's README, section by section."""
    sections = [line[3:] for line in (kit / "README.md").read_text().splitlines() if line.startswith("## ")]
    return [command for section in sections for command in readme_commands(kit, section)]


def assert_readme_shell_lines_parse(kit: Path) -> None:
    for command in readme_command_lines(kit):
        if command.split()[0] not in SHELL_PROGRAMS:
            continue  # a line of Python, a crontab's or a config file's
        parsed = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert parsed.returncode == 0, (command, parsed.stderr)


def assert_readme_sends_the_key_whole(kit: Path, example_key: str) -> None:
    """A command that sends the example key gives it to the program whole, as one word."""
    commands = readme_command_lines(kit)
    send = shlex.split(next(command for command in commands if " send " in command or ":enqueue " in command))
    assert example_key in send or f"KEY={example_key}" in send, send


def assert_embedded_suite_passes(kit: Path, queue_system: str) -> None:
    """The kit's own suite, embedded: no service is named in its environment."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(SERVICE_VARIABLES)}
    env |= {"PYTHONPATH": str(kit / "src")}
    result = subprocess.run(
        ["rspec"] if queue_system == "sidekiq" else [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=kit,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
