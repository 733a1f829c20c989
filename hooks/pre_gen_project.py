"""Stops cookiecutter with one line when an answer breaks a rule of templates/replay_matrix.jinja."""

import sys

problem = {{ first_problem(cookiecutter) | tojson }}

if problem:
    # cookiecutter logs its own traceback after a failed hook: our line comes first and stands alone.
    print(f"replay-matrix: {problem}", file=sys.stderr, flush=True)
    sys.exit(1)
