{%- from "replay_matrix.jinja" import doc, py -%}
{%- set slug = cookiecutter.project_slug -%}
"""The kit's own Celery app, for running it on its own; in an app of yours, see tasks.py and the README.

    celery -A {{ slug }}.celery_app worker --loglevel=INFO
    celery -A {{ slug }}.celery_app beat --loglevel=INFO     # schedules the sweeper

Send one operation with

    {{ cookiecutter.job_type }}.delay({{ doc(py(cookiecutter.example_key)) }}, {"email": "customer@example.com"})
"""

from __future__ import annotations

from celery import Celery

from . import settings
{#- the names in the order ruff sorts them, whatever the job type is called #}
from .tasks import SWEEP_TASK_NAME, {{ [cookiecutter.job_type, "sweep_stale_claims"]|sort|join(", ") }}

QUEUE = settings.queue_name()

# no fix-ups: the kit's own app stays itself where DJANGO_SETTINGS_MODULE is set (a Django project's shell), which
# Celery would otherwise take as a sign to set Django up
app = Celery("{{ slug }}", fixups=[])
visibility_timeout = settings.visibility_timeout()
app.conf.update(
    broker_url=settings.broker_url(),
    result_backend=settings.result_backend(),
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    # the settings the guarantee needs beyond the task's own options (tasks.guarantee_problem checks them)
    worker_prefetch_multiplier=1,
    broker_transport_options={
        # Redis: an unacknowledged message goes back to the queue after this; look for such messages often
        # enough that a dead worker's message comes back soon after its visibility runs out.
        "visibility_timeout": visibility_timeout,
        "unacked_restore_interval": max(1, min(10, visibility_timeout // 2)),
        "unacked_restore_throttle": 1,
    },
    beat_schedule={
        "sweep-stale-claims": {"task": SWEEP_TASK_NAME, "schedule": settings.SWEEP_EVERY_SECONDS},
    },
)

__all__ = ["{{ ["app", cookiecutter.job_type, "sweep_stale_claims"]|sort|join('", "') }}"]
