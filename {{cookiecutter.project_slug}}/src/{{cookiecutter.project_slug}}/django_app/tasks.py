{#- the names in the order ruff sorts them, whatever the job type is called -#}
{%- set names = [cookiecutter.job_type, "sweep_stale_claims"]|sort -%}
"""Where a Django project's `app.autodiscover_tasks()` looks: the kit's tasks, registered on the project's app."""

from {{ cookiecutter.project_slug }}.tasks import {{ names|join(", ") }}

__all__ = ["{{ names|join('", "') }}"]
