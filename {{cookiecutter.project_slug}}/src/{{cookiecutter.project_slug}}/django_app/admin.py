{%- set slug = cookiecutter.project_slug -%}
"""The admin page of the kit's operations: every operation of the job by state, with its payload and note, and the
person's two decisions on a held or failed one, as the kit's `resolve` command makes them: done (the effect
happened), or one more attempt (queued again and sent). Seeing them needs the view permission; deciding, this
permission of the kit's app:

    {{ slug }}.resolve_operation

Each decision is audited with the admin user as `django:<username>`."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest

from .. import operations, settings
from ..claims import default_store
from .models import Operation


class DecisionForm(ActionForm):
    why = forms.CharField(required=False, label="Why", help_text="recorded with the decision")


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = ("operation_key", "status", "attempt", "claimed", "note", "payload", "resolved_by")
    list_filter = ("status",)
    search_fields = ("operation_key",)
    action_form = DecisionForm
    actions = ("done", "one_more_attempt")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Operation]:
        # when it was claimed (or sent, while queued), in UTC, written by the database as the commands write it
        shown = default_store().clock.shown.format(column="claimed_at")
        operations_of_the_job = super().get_queryset(request).filter(job_type=settings.JOB_TYPE)
        return operations_of_the_job.annotate(claimed=RawSQL(shown, ())).order_by("-claimed")

    @admin.display(description="claimed at", ordering="claimed")
    def claimed(self, operation: Any) -> str:
        return str(operation.claimed)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("{{ slug }}.resolve_operation")

    @admin.action(permissions=["resolve"], description="Done: the effect happened (mark completed)")
    def done(self, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
        self.decide(request, queryset, done=True)

    @admin.action(permissions=["resolve"], description="One more attempt: queue again and send")
    def one_more_attempt(self, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
        self.decide(request, queryset, done=False)

    def decide(self, request: HttpRequest, queryset: QuerySet[Operation], *, done: bool) -> None:
        why = request.POST.get("why", "").strip()
        if not why:
            self.message_user(request, "Say why in the Why field: the decision is recorded with it.", messages.ERROR)
            return
        username = request.user.get_username()
        for key in queryset.values_list("operation_key", flat=True):
            said = operations.resolve(
                default_store(), key, done=done, by=username, why=why, resolved_as=f"django:{username}"
            )
            if said is None:
                self.message_user(request, f"{key}: not held or failed; nothing changed", messages.WARNING)
            else:
                self.message_user(request, said, messages.SUCCESS)
