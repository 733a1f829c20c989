"""Gives cookiecutter the macros of templates/replay_matrix.jinja, the file copier imports directly.

cookiecutter renders cookiecutter.json and the hooks without a template loader, so this extension loads
the macro file once and puts its macros in the Jinja globals: the rules for answers are written once.

It also stops cookiecutter, with one line and before anything is written, when an answer breaks a rule:
cookiecutter.json's last entry, `__rules`, is a private variable, which cookiecutter renders after every
question is answered (its documented "private rendered variables"); rendering it calls `refuse_broken`, which
raises the exception cookiecutter's command line prints alone (one line, exit status 1).
hooks/pre_gen_project.py stays as the guard for a run that renders no questions (a replay), and for one where
Python holds an older revision of this module (`cruft update` renders the old template and then the new one in one
process, and imports this file once): `__rules` then finds no `refuse_broken` and renders empty.

One check has no public way in: the answers as given (command line, API, cruft's `extra_context`) before
cookiecutter renders them or drops the names that are no question (`queue_sytem=sidekiq` would silently give
the default). `given_answers` reads them from its callers; should a cookiecutter release rename that argument,
it finds nothing and cookiecutter behaves as it does for any template (test_rules fails first). `tox -e
generate` checks the given answers itself before it calls cookiecutter.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from cookiecutter.exceptions import FailedHookException
from jinja2 import Environment, FileSystemLoader
from jinja2.ext import Extension

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _callers() -> Iterator[FrameType]:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def given_answers() -> dict[str, Any]:
    """The answers given to the cookiecutter (or cruft) call that is building this environment, by name."""
    for frame in _callers():
        if "extra_context" in frame.f_locals:
            given: Any = frame.f_locals["extra_context"]
            return {str(name): value for name, value in given.items()} if isinstance(given, dict) else {}
    return {}


@functools.cache
def replay_matrix_macros() -> Any:
    """The macro file's module, compiled once per process: cookiecutter builds its environment several times per kit."""
    return Environment(loader=FileSystemLoader(TEMPLATES)).get_template("replay_matrix.jinja").module


class ReplayMatrix(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        macros = replay_matrix_macros()
        given = given_answers()
        refuse(str(macros.unknown_answer(given)).strip() or str(macros.given_problem(given)).strip())
        environment.globals.update(
            slug=macros.slug,
            answer_problem=macros.answer_problem,
            first_problem=macros.first_problem,
            lease_default=macros.lease_default,
            refuse_broken=refuse_broken,
        )


def refuse_broken(answers: dict[str, Any]) -> str:
    """Nothing, for answers that keep every rule; cookiecutter.json's `__rules` renders it after the questions."""
    refuse(str(replay_matrix_macros().first_problem(answers)).strip())
    return ""


def refuse(problem: str) -> None:
    if problem:
        # cookiecutter's command line prints this exception's message alone and exits 1; nothing is written
        raise FailedHookException(f"replay-matrix: {problem}")
