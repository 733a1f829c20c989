"""Gives cookiecutter the macros of templates/replay_matrix.jinja, the file copier imports directly.

cookiecutter renders cookiecutter.json and the hooks without a template loader, so this extension loads
the macro file once and puts its macros in the Jinja globals: the rules for answers are written once.

It also stops cookiecutter, with one line and before anything is written, when
- an answer is given under a name that is not a question (`queue_sytem=sidekiq`): cookiecutter drops such a
  name without a word, before any hook could see it, and the kit would silently get the default. The answers
  given reach cookiecutter as `extra_context` (command line, API, cruft); this extension reads them from its
  callers when cookiecutter first builds its environment, before any question is asked;
- an answer breaks a rule: cookiecutter builds a new environment in `generate_files`, after the questions and
  before the kit's folder is made, and this extension checks the answers there. A failed hook would do the
  same, but cookiecutter prints a traceback after it; hooks/pre_gen_project.py stays as the guard for a
  caller this extension does not recognise.
The exception raised is the one cookiecutter's command line prints alone (one line, exit status 1).
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


def answers_being_generated() -> dict[str, Any] | None:
    """The answers of the kit cookiecutter's `generate_files` is about to write, or None outside it."""
    for frame in _callers():
        if frame.f_code.co_name == "generate_files" and frame.f_globals.get("__name__") == "cookiecutter.generate":
            context: Any = frame.f_locals.get("context")
            if isinstance(context, dict) and isinstance(context.get("cookiecutter"), dict):
                return dict(context["cookiecutter"])
    return None


@functools.cache
def replay_matrix_macros() -> Any:
    """The macro file's module, compiled once per process: cookiecutter builds its environment several times per kit."""
    return Environment(loader=FileSystemLoader(TEMPLATES)).get_template("replay_matrix.jinja").module


class ReplayMatrix(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        macros = replay_matrix_macros()
        given = given_answers()
        problem = str(macros.unknown_answer(given)).strip() or str(macros.given_problem(given)).strip()
        answers = answers_being_generated()
        if not problem and answers is not None:
            problem = str(macros.first_problem(answers)).strip()
        if problem:
            # cookiecutter's command line prints this exception's message alone and exits 1; nothing is written
            raise FailedHookException(f"replay-matrix: {problem}")
        environment.globals.update(
            slug=macros.slug,
            answer_problem=macros.answer_problem,
            first_problem=macros.first_problem,
            lease_default=macros.lease_default,
        )
