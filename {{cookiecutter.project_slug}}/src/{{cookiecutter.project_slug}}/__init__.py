{%- from "replay_matrix.jinja" import doc -%}
"""The job `{{ cookiecutter.job_type }}`, made safe against duplicates and worker deaths, for
{{ doc(cookiecutter.project_name) }}.
"""
