"""Generating a kit with either tool, the way a user would, and reading what came out."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import copier
from cookiecutter.exceptions import CookiecutterException
from cookiecutter.main import cookiecutter
from matrix import ROOT

COPIER_ANSWERS = ".copier-answers.yml"


class GenerationFailed(Exception):
    """The tool refused the answers; `message` is what the user saw."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@contextlib.contextmanager
def hook_files_in(folder: Path) -> Iterator[None]:
    """cookiecutter writes each hook it runs to a temporary file and never removes it (cookiecutter#886):
    meanwhile they go to folder, to be removed with it (absolute: cookiecutter runs hooks inside the kit)."""
    before, tempfile.tempdir = tempfile.tempdir, str(folder.resolve())
    try:
        yield
    finally:
        tempfile.tempdir = before


def settings_in(folder: Path) -> str:
    """A cookiecutter settings file for one run, in folder: its replay file (which it always writes, by default to
    ~/.cookiecutter_replay) and its clones go to folder, to be removed with it; the user's ~/.cookiecutterrc is
    not read, so its default_context cannot change an answer unseen. (A file, not default_config: cookiecutter
    2.2 reads a dict given there as True, and writes to the home folder.)"""
    settings = folder / "cookiecutterrc"
    settings.write_text(json.dumps({"replay_dir": str(folder / "replay"), "cookiecutters_dir": str(folder / "clones")}))
    return str(settings)


def with_cookiecutter(output_dir: Path, answers: dict[str, Any]) -> Path:
    """Bakes a kit in output_dir, leaving nothing in the temporary folder or the home folder; returns its folder."""
    stderr = io.StringIO()
    try:
        with tempfile.TemporaryDirectory() as scratch, hook_files_in(Path(scratch)), contextlib.redirect_stderr(stderr):
            folder = cookiecutter(
                str(ROOT),
                no_input=True,
                output_dir=str(output_dir),
                extra_context=answers,
                config_file=settings_in(Path(scratch)),
            )
    except (CookiecutterException, ValueError) as error:
        raise GenerationFailed(stderr.getvalue() + str(error)) from error
    return Path(folder)


def baked(output_dir: Path, answers: dict[str, Any]) -> Path:
    """A kit of these answers in output_dir, as with_cookiecutter bakes it. Within a test run (REPLAY_KIT_CACHE,
    shared by pytest's workers) each set of answers is baked once and copied: the suites, soaks and host apps
    test the kit, not its generation, which tests/test_generate.py and the answer tests do with_cookiecutter."""
    cache = os.environ.get("REPLAY_KIT_CACHE")
    if not cache:
        return with_cookiecutter(output_dir, answers)
    key = hashlib.sha256(json.dumps(answers, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = Path(cache) / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (Path(cache) / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process bakes it; the others wait, then copy
        if not folder.exists():
            staging = Path(tempfile.mkdtemp(dir=cache))
            with_cookiecutter(staging, answers)
            staging.rename(folder)
    (kit,) = folder.iterdir()
    return Path(shutil.copytree(kit, output_dir / kit.name, symlinks=True))


def with_copier(destination: Path, answers: dict[str, Any]) -> Path:
    """Copies the template into destination, non-interactively; returns it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # copier warns that a dirty checkout is used as it is
        try:
            copier.run_copy(str(ROOT), destination, data=answers, defaults=True, quiet=True)
        except ValueError as error:
            raise GenerationFailed(str(error)) from error
    return destination


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under folder, by relative path, with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def readme_commands(kit: Path, section: str) -> list[str]:
    """The command lines of the code blocks under the kit README's heading `## <section>`, in order."""
    lines = (kit / "README.md").read_text().splitlines()
    start = lines.index(f"## {section}") + 1
    end = next((n for n in range(start, len(lines)) if lines[n].startswith("## ")), len(lines))
    commands: list[str] = []
    fenced = False
    for line in lines[start:end]:
        if line.startswith("```"):
            fenced = not fenced  # a fenced block holds code (settings, a class), not command lines
        elif line.startswith("    ") and not fenced:
            commands.append(line.strip())
    return commands
