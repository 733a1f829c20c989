"""`manage.py {{ cookiecutter.project_slug }}`: the kit's commands, named after its package."""
