{%- from "replay_matrix.jinja" import py -%}
from django.apps import AppConfig


class KitConfig(AppConfig):
    name = "{{ cookiecutter.project_slug }}.django_app"
    # what `manage.py migrate {{ cookiecutter.project_slug }}` and `showmigrations` call it
    label = "{{ cookiecutter.project_slug }}"
    verbose_name = {{ py(cookiecutter.project_name) }}

    def ready(self) -> None:
        # from now on the kit's claims run on Django's own connection, not on DATABASE_URL
        from ..claims import use_default_store
        from .store import DjangoClaimStore

        use_default_store(DjangoClaimStore)
