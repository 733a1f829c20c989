"""Text answers that the rules accept, however odd (quotes, backslashes, braces, `$`, backticks, Markdown's
characters, emoji, right-to-left text), give the same kit from both tools, and a kit that compiles, passes its
linters, parses, and passes its own embedded suite: each answer reaches each file through an escape fit for the
place (templates/replay_matrix.jinja: py, quoted, rb, sh, md, code_span, html, doc).

"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from generate import COPIER_ANSWERS, readme_commands, with_cookiecutter, with_copier
from matrix import problem

# The answers of issue 29, and more of the same kind: every one passes the rules.
ODD = {
    "project_name": 'O\'Brien "Ä" $HOME `id` \\n %s {x} 🎉 שלום',
    "project_slug": "odd_kit",
    "effect_description": "send O'Brien's \"mail\" \\ {x} #{y} `z` $P %d <b>&amp;</b> *x* | [a](b) 🎉",
    "example_key": 'O\'Brien "ÄÖ" 注文',
    "other_example_key": "ORD {x} #{y} \\ `z` $P",
}
QUEUE_SYSTEMS = ["celery", "sqs", "sidekiq"]
# The programs the README's shell lines start with (its code blocks hold Python and settings too).
SHELL_PROGRAMS = {"python", "pip", "celery", "alembic", "export", "cd", "aws", "bundle", "bin/rails", "ruby", "sidekiq"}


def test_the_odd_answers_pass_every_rule() -> None:
    for queue_system in QUEUE_SYSTEMS:
        assert problem({**ODD, "queue_system": queue_system}) == ""


@pytest.fixture(scope="module", params=QUEUE_SYSTEMS)
def queue_system(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def odd_kit(queue_system: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_cookiecutter(tmp_path_factory.mktemp("odd"), {**ODD, "queue_system": queue_system})


def files(folder: Path) -> dict[Path, bytes]:
    return {
        path.relative_to(folder): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and path.name != COPIER_ANSWERS and "__pycache__" not in path.parts
    }


def test_both_tools_give_the_same_kit(queue_system: str, odd_kit: Path, tmp_path: Path) -> None:
    ours = files(odd_kit)
    theirs = files(with_copier(tmp_path / odd_kit.name, {**ODD, "queue_system": queue_system}))
    assert sorted(ours) == sorted(theirs)
    assert [path for path in ours if ours[path] != theirs[path]] == []


def test_every_file_parses_and_passes_the_linters(queue_system: str, odd_kit: Path) -> None:
    for path in odd_kit.rglob("*.py"):
        ast.parse(path.read_text(), str(path))
    for path in [*odd_kit.rglob("*.rb"), *odd_kit.rglob("*.rake")]:
        checked = subprocess.run(["ruby", "-c", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    for path in odd_kit.rglob("*.toml"):
        tomllib.loads(path.read_text())
    for path in [*odd_kit.rglob("*.yml"), *odd_kit.rglob("*.yaml")]:
        yaml.safe_load(path.read_text())
    linters = (
        [["rubocop", "--no-server", "--cache", "false"]]
        if queue_system == "sidekiq"
        else [[sys.executable, "-m", "ruff", "check", "."], [sys.executable, "-m", "ruff", "format", "--check", "."]]
    )
    for linter in linters:
        result = subprocess.run(linter, cwd=odd_kit, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_readme_names_the_answers_as_written_and_its_commands_parse(odd_kit: Path) -> None:
    readme = (odd_kit / "README.md").read_text()
    lines = readme.splitlines()
    sections = [line[3:] for line in lines if line.startswith("## ")]
    for section in sections:
        for command in readme_commands(odd_kit, section):
            if command.split()[0] not in SHELL_PROGRAMS:
                continue  # a line of Python, a crontab's or a config file's
            parsed = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert parsed.returncode == 0, (section, command, parsed.stderr)
    # a command that sends the example key gives it to the program whole, as one word
    commands = [command for section in sections for command in readme_commands(odd_kit, section)]
    send = shlex.split(next(command for command in commands if " send " in command or ":enqueue " in command))
    assert ODD["example_key"] in send or f"KEY={ODD['example_key']}" in send, send


def test_the_kits_embedded_suite_passes(queue_system: str, odd_kit: Path) -> None:
    services = ("DATABASE_URL", "CELERY_", "REDIS_URL", "SQS_", "AWS_", "SMTP_", "PROVIDER_URL")
    env = {name: value for name, value in os.environ.items() if not name.startswith(services)}
    env |= {"PYTHONPATH": str(odd_kit / "src")}
    result = subprocess.run(
        ["rspec"] if queue_system == "sidekiq" else [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=odd_kit,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
