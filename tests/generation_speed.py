"""How long the template takes to generate a kit, under each tool, against a template of one file (the tool's own
cost on this machine): `tox -e speed`. Each figure is the median of three runs; a kit's time over the one-file
template's is the ratio that stays comparable across machines."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import copier
from cookiecutter.main import cookiecutter
from generate import with_cookiecutter, with_copier

RUNS = 3
QUEUE_SYSTEMS = ("celery", "sidekiq", "sqs")


def median_seconds(make: Callable[[Path], object], repeat: int = 1) -> float:
    """The median over RUNS of one generation's time (of `repeat` generations, averaged, for fast ones)."""
    times = []
    for _ in range(RUNS):
        with tempfile.TemporaryDirectory() as scratch:
            started = time.perf_counter()
            for n in range(repeat):
                make(Path(scratch, str(n)))
            times.append((time.perf_counter() - started) / repeat)
    return statistics.median(times)


def one_file_templates(folder: Path) -> tuple[Path, Path]:
    """A cookiecutter template and a copier template, each of one file holding one answer."""
    baked = folder / "cookiecutter"
    (baked / "{{cookiecutter.name}}").mkdir(parents=True)
    (baked / "cookiecutter.json").write_text(json.dumps({"name": "kit"}))
    (baked / "{{cookiecutter.name}}" / "README.md").write_text("# {{ cookiecutter.name }}\n")
    copied = folder / "copier"
    copied.mkdir()
    (copied / "copier.yml").write_text("name:\n  type: str\n  default: kit\n")
    (copied / "README.md.jinja").write_text("# {{ name }}\n")
    return baked, copied


def main() -> None:
    warnings.simplefilter("ignore")  # copier warns that a dirty checkout is used as it is
    with tempfile.TemporaryDirectory() as scratch:
        baked, copied = one_file_templates(Path(scratch))
        floor = {
            "cookiecutter": median_seconds(
                lambda out: cookiecutter(str(baked), no_input=True, output_dir=str(out)), repeat=10
            ),
            "copier": median_seconds(
                lambda out: copier.run_copy(str(copied), out, defaults=True, quiet=True), repeat=10
            ),
        }
        print(f"a one-file template: cookiecutter {floor['cookiecutter'] * 1000:.1f} ms,", end=" ")
        print(f"copier {floor['copier'] * 1000:.1f} ms (median of {RUNS} runs)")
        tools = {"cookiecutter": with_cookiecutter, "copier": with_copier}
        for tool, generate in tools.items():
            for queue_system in QUEUE_SYSTEMS:
                kit = median_seconds(lambda out: generate(out, {"queue_system": queue_system}))  # noqa: B023
                ratio = kit / floor[tool]
                print(f"{tool:<13} {queue_system:<8} {kit:6.2f} s a kit, {ratio:5.0f} times the one-file template")


if __name__ == "__main__":
    main()
