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
from matrix import combinations, facts

# What a kit's pyproject.toml declares depends on these answers alone (its template reads no other): one kit per
# set of them is enough, and every tox run (CI's, and each run test_tox_quick makes) spends seconds here, not a
# minute.
DECIDED_BY = ("queue_system", "effect_kind")


def declared(pyproject: Path) -> set[str]:
    """What a kit's pyproject.toml declares it needs: its dependencies and every extra's, but the kit itself."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = set(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        # an extra may name the kit itself (kit[test]): that is the kit, not a dependency
        found.update(item for item in extra if not item.startswith(project["name"]))
    return found


def kit_requirements() -> list[str]:
    found: set[str] = set()
    python_kits = {
        tuple(combo[name] for name in DECIDED_BY): combo
        for combo in combinations()
        if facts().queue_systems[combo["queue_system"]]["language"] == "python"
    }
    with tempfile.TemporaryDirectory() as scratch:
        for number, combo in enumerate(python_kits.values()):  # an effect kind may need what another does not
            found |= declared(with_cookiecutter(Path(scratch) / str(number), combo) / "pyproject.toml")
    return sorted(found)


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("".join(f"{line}\n" for line in kit_requirements()))
