"""Writes the dependencies of every generated Python kit (runtime and test extras) to a requirements file.

The harness runs each kit's suite with the interpreter of the template's tests, so that interpreter needs
what the kits declare, but not the kits themselves: a kit installed as a package would shadow the
combination under test.
"""

from __future__ import annotations

import sys
import tempfile
import tomllib
from pathlib import Path

from generate import with_cookiecutter
from matrix import combinations


def kit_requirements() -> list[str]:
    found: set[str] = set()
    with tempfile.TemporaryDirectory() as scratch:
        for queue in sorted({combo["queue_system"] for combo in combinations()}):
            pyproject = with_cookiecutter(Path(scratch) / queue, {"queue_system": queue}) / "pyproject.toml"
            if pyproject.exists():
                project = tomllib.loads(pyproject.read_text())["project"]
                found.update(project.get("dependencies", []))
                for extra in project.get("optional-dependencies", {}).values():
                    found.update(extra)
    return sorted(found)


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("".join(f"{line}\n" for line in kit_requirements()))
