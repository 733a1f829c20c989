"""The kit's Django migrations: its tables, from the statements in schema.py."""

from typing import Any

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema


def revision(forward: dict[str, list[str]], backward: dict[str, list[str]]) -> migrations.RunPython:
    """A revision of schema.py as one operation: the statements for the database Django migrates (MySQL and
    MariaDB have their own), and what undoes them."""

    def run(statements: dict[str, list[str]]) -> Any:
        def execute(_apps: Any, schema_editor: Any) -> None:
            for statement in schema.statements(statements, schema_editor.connection):
                schema_editor.execute(statement)

        return execute

    return migrations.RunPython(run(forward), run(backward))
