"""An existing Celery app that runs the kit's tasks, as the README's "Add to an existing Celery app" has it:
`include=["{{ cookiecutter.project_slug }}.tasks"]`. HOST_CELERY_CONF (JSON) is its configuration, so that a test can
give it what a host might have, one contradiction of the guarantee at a time."""

import json
import os

from celery import Celery

app = Celery("host", include=["{{ cookiecutter.project_slug }}.tasks"])
app.conf.update(json.loads(os.environ.get("HOST_CELERY_CONF", "{}")))
