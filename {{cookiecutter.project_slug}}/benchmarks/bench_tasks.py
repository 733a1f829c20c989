"""The kit's Celery app plus the benchmark's tasks: a bare one, the same effect without the claim, and the floor's.

The worker of goal 3 runs this module (`celery -A bench_tasks worker`): the kit's app, its task and its
settings as they are, and beside them the benchmark's tasks.
"""

{% if cookiecutter.effect_kind != "same_database" -%}
import functools
import os
{% endif -%}
from typing import Any

{% if cookiecutter.effect_kind != "same_database" -%}
from measure import FLOOR_FILE, Floor

{% endif -%}
from {{ cookiecutter.project_slug }} import effect
from {{ cookiecutter.project_slug }}.celery_app import app
{%- if cookiecutter.effect_kind == "same_database" %}
from {{ cookiecutter.project_slug }}.claims import default_store
{%- endif %}

BARE_TASK = "{{ cookiecutter.project_slug }}.bare_{{ cookiecutter.job_type }}"
{%- if cookiecutter.effect_kind != "same_database" %}
FLOOR_TASK = "{{ cookiecutter.project_slug }}.floor_{{ cookiecutter.job_type }}"
{%- endif %}


@app.task(name=BARE_TASK, acks_late=True, reject_on_worker_lost=True)
def bare_{{ cookiecutter.job_type }}({{ cookiecutter.operation_key_name }}: str, details: dict[str, Any]) -> str:
{%- if cookiecutter.effect_kind == "same_database" %}
    with default_store().engine.begin() as conn:
        effect.perform(conn, {{ cookiecutter.operation_key_name }}, details)
{%- else %}
    effect.perform({{ cookiecutter.operation_key_name }}, details)
{%- endif %}
    return "performed"


{%- if cookiecutter.effect_kind != "same_database" %}


@functools.cache
def floor() -> Floor:
    """The kit's statements as benchmark.py saved them, replayed raw on the kit's connection in this process."""
    return Floor.load(os.environ[FLOOR_FILE])


@app.task(name=FLOOR_TASK, acks_late=True, reject_on_worker_lost=True)
def floor_{{ cookiecutter.job_type }}({{ cookiecutter.operation_key_name }}: str, details: dict[str, Any]) -> str:
    """The physical floor: the kit's claim and completion statements, raw, around the same effect."""
    floor().run({{ cookiecutter.operation_key_name }}, lambda: effect.perform({{ cookiecutter.operation_key_name }}, details))
    return "performed"
{%- endif %}


def broker_name(celery: Any = app) -> str:
    """The broker and its version, as its server gives them."""
    with celery.connection_for_write() as connection:
        connection.connect()
        if connection.transport.driver_type == "amqp":
            return f"RabbitMQ {connection.connection.server_properties['version']}"
        return f"Redis {connection.default_channel.client.info('server')['redis_version']}"


def drop_queue(celery: Any = app) -> None:
    """Removes the benchmark's queue (the app's default queue, named by CELERY_QUEUE), what is left in it, and its
    exchange: on Redis, kombu's binding tables; on RabbitMQ, the exchange Celery declared for it."""
    queue = celery.amqp.queues[celery.conf.task_default_queue]
    with celery.connection_for_write() as connection:
        bound = queue(connection.default_channel)
        bound.declare()  # so that this channel knows the bindings it deletes (kombu's Redis keeps them otherwise)
        bound.delete()
        bound.exchange.delete()


__all__ = ["app"]
