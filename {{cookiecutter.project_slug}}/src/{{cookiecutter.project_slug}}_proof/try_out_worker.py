{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
"""The try-out's worker: the kit's own {{ "task" if celery else "consumer" }}, with a crash point on the effect.
{%- if celery %}

    celery -A {{ slug }}_proof.try_out_worker worker --pool=solo     (the try-out starts it)

Two things differ from `{{ slug }}.celery_app`: the broker is the try-out's folder, and
the first run to reach the effect pauses where the try-out's order says, for the try-out to kill this process.
{%- else %}

    python -m {{ slug }}_proof.try_out_worker     (the try-out starts it)

One thing differs from `python -m {{ slug }}.consumer`: the first run to reach the effect pauses
where the try-out's order says, for the try-out to kill this process.
{%- endif %}
"""

import os
from pathlib import Path

from {{ cookiecutter.project_slug }} import effect
{%- if celery %}
from {{ cookiecutter.project_slug }}.celery_app import app
{%- endif %}

from .crash_points import PauseOrders, pausing
from .try_out import FOLDER_VARIABLE{{ ", use_folder_broker" if celery else "" }}

folder = Path(os.environ[FOLDER_VARIABLE])
{%- if celery %}
use_folder_broker(app, folder)
# job.handle looks the effect up when it runs, so the task meets the crash point
effect.perform = pausing(effect.perform, PauseOrders(folder))  # type: ignore[assignment]

__all__ = ["app"]
{%- else %}

if __name__ == "__main__":
    import logging

    from {{ cookiecutter.project_slug }}.consumer import Consumer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Consumer(perform=pausing(effect.perform, PauseOrders(folder))).run()
{%- endif %}
