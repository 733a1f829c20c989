{%- set slug = cookiecutter.project_slug -%}
"""What proves the job `{{ cookiecutter.job_type }}`, kept apart from the package that runs it,
`{{ slug }}`: the try-out, the soak, the crash points, the sinks where effects are
counted, and the replay reports. A deployment needs only the package that runs the job;
these need the test extra (`pip install -e '.[test]'`) and import that package, never
the other way round.

    python -m {{ slug }}_proof try-out
    python -m {{ slug }}_proof soak [--operations N] [--workers N] ...     (see --help)
"""

PROG = "{{ slug }}_proof"


class BadInput(ValueError):
    """What keeps a proof command from starting: the message says what is wrong and what would be right."""
