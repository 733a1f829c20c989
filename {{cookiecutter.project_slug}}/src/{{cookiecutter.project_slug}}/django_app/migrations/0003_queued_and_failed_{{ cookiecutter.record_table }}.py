"""The record of a send (queued) and of an effect that failed past its retries (failed), with the statements of the
Alembic revision 0003, which differ by database; reversed, revision 0002's table comes back."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema

from . import revision


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0002_index_claimed_{{ cookiecutter.record_table }}"),)
    operations = (revision(schema.QUEUED_AND_FAILED, schema.QUEUED_AND_FAILED_UNDO),)
