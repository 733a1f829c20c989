"""The kit as a Django app: `INSTALLED_APPS += ["{{ cookiecutter.project_slug }}.django_app"]`.

Its migration creates the kit's tables (`python manage.py migrate`; `migrate {{ cookiecutter.project_slug }} zero` drops
them), from the same statements as the Alembic migration ({{ cookiecutter.project_slug }}/schema.py). Its tasks
module is where the project's `app.autodiscover_tasks()` finds the kit's tasks. Nothing else of the kit imports
Django: the kit on its own does not need it.
"""
