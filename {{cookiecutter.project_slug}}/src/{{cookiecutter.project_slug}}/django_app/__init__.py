"""The kit as a Django app: `INSTALLED_APPS += ["{{ cookiecutter.project_slug }}.django_app"]`.

Installed, the kit's claims run on Django's own connection (store.py) instead of DATABASE_URL. Its migrations
create the kit's tables (`python manage.py migrate`), from the same statements as the Alembic migration
(schema.py); `manage.py <the kit's package>` runs the kit's commands (management/), and the admin site shows its
operations (admin.py). Its tasks module is where the project's `app.autodiscover_tasks()` finds the kit's tasks.
Nothing else of the kit imports Django: the kit on its own does not need it.
"""
