"""Removes what this kit leaves out: the template holds every kit's files under their own names, and
`kit_files` in templates/replay_matrix.jinja says which ones a kit keeps (copier.yml's _exclude reads the same
list)."""

import json
import shutil
from pathlib import Path

# Rendered by cookiecutter before it runs: the paths, relative to the kit's folder, that this kit leaves out.
dropped = json.loads(r"""{{ dropped(cookiecutter).split() | tojson }}""")  # fmt: skip

for pattern in dropped:
    for path in Path().glob(pattern):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
