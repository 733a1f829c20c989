"""Indexes only the claimed rows for the sweeper, with the statements of the Alembic revision 0002; reversed, the
index of every row by status comes back."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0001_create_{{ cookiecutter.record_table }}"),)
    operations = (migrations.RunSQL(schema.CLAIMED_INDEX, reverse_sql=schema.CLAIMED_INDEX_UNDO),)
