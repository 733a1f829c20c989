{%- set slug = cookiecutter.project_slug -%}
"""The kit's commands for people and cron inside the project:

    python manage.py {{ slug }} COMMAND

The same commands, options and exit statuses as `python -m <the kit's package>.operations` (send, sweep, status,
held, resolve, resolutions, retain), on Django's database connection, sending through the project's Celery app to
the queue its workers consume.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from {{ slug }} import operations


class Command(BaseCommand):
    help = operations.__doc__.splitlines()[0] if operations.__doc__ else ""

    def run_from_argv(self, argv: list[str]) -> None:
        # the kit's own parser, not Django's: its subcommands, and its exit status (1 when `status` finds attention)
        sys.exit(operations.main(argv[2:], prog=self.prog(argv)))

    def print_help(self, prog_name: str, subcommand: str) -> None:
        operations.parser(self.prog([prog_name, subcommand])).print_help()

    def handle(self, *args: Any, **options: Any) -> None:
        sys.exit(operations.main(list(args), prog=self.prog(["manage.py", "{{ slug }}"])))

    @staticmethod
    def prog(argv: list[str]) -> str:
        return f"{Path(argv[0]).name} {argv[1]}"
