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
        for number, combo in enumerate(combinations()):  # an effect kind may need what another does not
            pyproject = with_cookiecutter(Path(scratch) / str(number), combo) / "pyproject.toml"
            if pyproject.exists():
                project = tomllib.loads(pyproject.read_text())["project"]
                found.update(project.get("dependencies", []))
                for extra in project.get("optional-dependencies", {}).values():
                    # an extra may name the kit itself (kit[test]): that is the kit, not a dependency
                    found.update(item for item in extra if not item.startswith(project["name"]))
    return sorted(found)


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("".join(f"{line}\n" for line in kit_requirements()))
