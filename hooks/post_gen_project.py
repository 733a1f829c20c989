"""Removes what this kit leaves out: the template holds every kit's files under their own names, and `kit_files`
in templates/replay_matrix.jinja says which ones a kit keeps (copier.yml's _exclude reads the same list).

The kit's .replay-matrix-dropped names them, rendered from that list by the template's own files: a hook of its
own cannot import the list, and the rule macros cookiecutter's extension gives it may be an older template's
(cruft update renders the old template, then the new one, in one process, where the first extension imported
stays).
"""

import shutil
from pathlib import Path

listing = Path(".replay-matrix-dropped")
for pattern in listing.read_text().split():
    for path in Path().glob(pattern):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
listing.unlink()
