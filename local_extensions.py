"""Gives cookiecutter the macros of templates/replay_matrix.jinja, the file copier imports directly.

cookiecutter renders cookiecutter.json and the hooks without a template loader, so this extension loads
the macro file once and puts its macros in the Jinja globals: the rules for answers are written once.
"""

from pathlib import Path

from jinja2 import Environment, FileSystemLoader
from jinja2.ext import Extension

TEMPLATES = Path(__file__).resolve().parent / "templates"


class ReplayMatrix(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        macros = Environment(loader=FileSystemLoader(TEMPLATES)).get_template("replay_matrix.jinja").module
        environment.globals.update(
            slug=macros.slug, answer_problem=macros.answer_problem, first_problem=macros.first_problem
        )
