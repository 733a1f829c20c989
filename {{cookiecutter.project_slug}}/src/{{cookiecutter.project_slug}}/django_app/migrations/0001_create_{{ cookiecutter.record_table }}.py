"""Creates the kit's tables with the statements of its Alembic migration; reversed, drops them."""

from django.db import migrations

from {{ cookiecutter.project_slug }} import schema


class Migration(migrations.Migration):
    initial = True
    dependencies = ()
    operations = (migrations.RunSQL(schema.CREATE, reverse_sql=schema.DROP),)
