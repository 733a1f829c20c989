"""Leaves out the Celery kit's Django app from the other kits: its files are named to render to nothing there, but
its folders would stay, empty. (A folder named to render to nothing stops cookiecutter, "directory already
exists"; copier.yml's _exclude leaves the same folder out under copier.)"""

import shutil
from pathlib import Path

if "{{ cookiecutter.queue_system }}" != "celery":
    code = "{{ 'lib' if cookiecutter.queue_system == 'sidekiq' else 'src' }}"
    shutil.rmtree(Path(code, "{{ cookiecutter.project_slug }}", "django_app"))
