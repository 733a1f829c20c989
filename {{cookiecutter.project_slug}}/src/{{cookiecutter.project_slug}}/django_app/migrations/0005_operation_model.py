{%- from "replay_matrix.jinja" import max_key_length -%}
"""The admin's view of the record table (models.Operation): Django's state only, nothing changes in the database."""

from django.db import migrations, models

from {{ cookiecutter.project_slug }} import settings


class Migration(migrations.Migration):
    dependencies = (("{{ cookiecutter.project_slug }}", "0004_resolutions_{{ cookiecutter.record_table }}"),)
    operations = (
        migrations.CreateModel(
            name="Operation",
            fields=[
                ("job_type", models.CharField(max_length=100)),
                ("operation_key", models.CharField(max_length={{ max_key_length }}, primary_key=True, serialize=False)),
                ("status", models.CharField(max_length=16)),
                ("attempt", models.IntegerField()),
                ("note", models.TextField(null=True)),
                ("payload", models.TextField(null=True)),
                ("resolved_by", models.CharField(max_length=255, null=True)),
            ],
            options={
                "verbose_name": settings.JOB_TYPE + " operation",
                "verbose_name_plural": settings.JOB_TYPE + " operations",
                "db_table": settings.RECORD_TABLE,
                "managed": False,
                "default_permissions": ("view",),
                "permissions": (("resolve_operation", "Can resolve held and failed operations"),),
            },
        ),
    )
