{%- from "replay_matrix.jinja" import py -%}
from django.apps import AppConfig


class KitConfig(AppConfig):
    name = "{{ cookiecutter.project_slug }}.django_app"
    # what `manage.py migrate {{ cookiecutter.project_slug }}` and `showmigrations` call it
    label = "{{ cookiecutter.project_slug }}"
    verbose_name = {{ py(cookiecutter.project_name) }}
