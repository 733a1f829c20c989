"""One kit, no servers, in a fresh folder: what `tox -e generate -- name=value ...` runs.

The kit is generated with cookiecutter into a new temporary folder under the output folder (build/), then
moved to build/<project_slug>. A kit already there is never mixed with the new one: the run stops, unless
--replace is given, when the old folder is removed first. The last line printed says where the kit is.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from cookiecutter.exceptions import CookiecutterException
from cookiecutter.main import cookiecutter
from generate import hook_files_in, settings_in
from matrix import ROOT, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tox -e generate --", description=__doc__.split("\n")[0])
    parser.add_argument("answers", nargs="*", metavar="name=value", help="answers to the template's questions")
    parser.add_argument("--output", type=Path, default=Path("build"), help="where kits go (default: build)")
    parser.add_argument("--replace", action="store_true", help="replace a kit already at build/<project_slug>")
    args = parser.parse_args(argv)
    malformed = [answer for answer in args.answers if "=" not in answer]
    if malformed:
        parser.error(f"{malformed[0]!r} is not name=value (e.g. queue_system=sidekiq)")
    given = dict(answer.split("=", 1) for answer in args.answers)
    # a misspelt choice: cookiecutter would stop with a traceback of its own before any rule of ours runs
    refused = str(facts().given_problem(given)).strip()
    if refused:
        print(f"replay-matrix: {refused}", file=sys.stderr)
        return 1

    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".generating-", dir=args.output) as scratch:
        work = Path(scratch)
        try:
            with hook_files_in(work):
                folder = cookiecutter(
                    str(ROOT), no_input=True, output_dir=scratch, extra_context=given, config_file=settings_in(work)
                )
        except CookiecutterException as error:
            print(error, file=sys.stderr)  # our one line, e.g. "replay-matrix: lease_seconds: ..."
            return 1
        made = Path(folder)
        kit = args.output / made.name
        if kit.exists() and not args.replace:
            print(
                f"{kit} already holds a kit from an earlier run; nothing was written. Remove it, or add --replace"
                " (tox -e generate -- --replace ...)",
                file=sys.stderr,
            )
            return 1
        if kit.exists():
            shutil.rmtree(kit)
            print(f"removed the earlier kit at {kit}")
        made.rename(kit)
    print(f"kit written to {kit.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
