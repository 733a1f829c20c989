"""The record of a send (queued) and of an effect that failed past its retries (failed), with the statements of the
Alembic revision 0003, which differ by database; reversed, revision 0002's table comes back."""

from typing import Any

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema


def _run(statements: dict[str, list[str]]) -> Any:
    def run(_apps: Any, schema_editor: Any) -> None:
        for statement in statements[schema_editor.connection.vendor]:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0002_index_claimed_{{ cookiecutter.record_table }}"),)
    operations = (migrations.RunPython(_run(schema.QUEUED_AND_FAILED), _run(schema.QUEUED_AND_FAILED_UNDO)),)
