{%- from "replay_matrix.jinja" import max_key_length -%}
"""The record table as Django sees it, for the admin page (admin.py): read only, never migrated by Django (the kit's
migrations create it from schema.py). Its timestamps are left out: SQLite keeps them as day numbers, which no
Django field reads; the admin shows them through the store's SQL instead."""

from django.db import models

from .. import settings


class Operation(models.Model):
    job_type = models.CharField(max_length=100)
    # unique with job_type; the admin only ever looks within this kit's job type, where it is unique alone
    operation_key = models.CharField(max_length={{ max_key_length }}, primary_key=True)
    status = models.CharField(max_length=16)
    attempt = models.IntegerField()
    note = models.TextField(null=True)
    payload = models.TextField(null=True)
    resolved_by = models.CharField(max_length=255, null=True)

    class Meta:
        managed = False
        db_table = settings.RECORD_TABLE
        verbose_name = settings.JOB_TYPE + " operation"
        verbose_name_plural = settings.JOB_TYPE + " operations"
        # seeing them, and resolving them: a permission of its own, given to the people who decide
        default_permissions = ("view",)
        permissions = (("resolve_operation", "Can resolve held and failed operations"),)

    def __str__(self) -> str:
        return self.operation_key
