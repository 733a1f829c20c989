"""Creates the kit's tables with the statements of its Alembic migration; reversed, drops them."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema

from . import revision


class Migration(migrations.Migration):
    initial = True
    dependencies = ()
    operations = (revision(schema.CREATE, schema.DROP),)
