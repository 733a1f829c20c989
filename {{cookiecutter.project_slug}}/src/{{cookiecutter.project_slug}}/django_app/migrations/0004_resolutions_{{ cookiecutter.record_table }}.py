"""Keeps every resolution by a person, with the statements of the Alembic revision 0004; reversed, the table goes."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema

from . import revision


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0003_queued_and_failed_{{ cookiecutter.record_table }}"),)
    operations = (revision(schema.RESOLUTIONS, schema.RESOLUTIONS_UNDO),)
