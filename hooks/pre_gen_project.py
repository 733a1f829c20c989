"""Stops cookiecutter with one line when an answer breaks a rule of templates/replay_matrix.jinja.

local_extensions.py normally refuses such answers first, before the kit's folder is made and without the
traceback cookiecutter prints after a failed hook; this hook is the guard for a caller it does not recognise.
"""

import json
import sys

# Rendered by cookiecutter before it runs; tojson escapes every quote (single quotes too, which
# the raw string needs: an empty message renders as ""), so the message arrives intact.
problem = json.loads(r'''{{ first_problem(cookiecutter) | tojson }}''')  # fmt: skip

if problem:
    # cookiecutter logs its own traceback after a failed hook: our line comes first and stands alone.
    print(f"replay-matrix: {problem}", file=sys.stderr, flush=True)
    sys.exit(1)
