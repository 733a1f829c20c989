"""Indexes only the claimed rows for the sweeper, with the statements of the Alembic revision 0002; reversed, the
index of every row by status comes back."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema

from . import revision


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0001_create_{{ cookiecutter.record_table }}"),)
    operations = (revision(schema.CLAIMED_INDEX, schema.CLAIMED_INDEX_UNDO),)
