"""The try-out and the soak, from the command line (the package's docstring says what they are)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import PROG


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description="what proves the kit's job")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("try-out", help="one operation, a worker killed mid-effect, the sweeper and the policy")
    soak = commands.add_parser("soak", help="many operations, duplicated, while workers are killed; the invariants")
    soak.add_argument("--operations", type=int, default=2000, help="how many keys (default 2000)")
    soak.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    soak.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills, jittered (default 3)")
    soak.add_argument("--duplicates", type=float, default=0.3, help="fraction of keys sent 2 or 3 times (0.3)")
    soak.add_argument(
        "--kill-after-take", type=float, default=0.005, help="fraction of messages taken whose worker then dies (0.005)"
    )
    soak.add_argument("--seed", type=int, default=None, help="the random choices' seed (default: a new one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # imported here: each needs the test extra, and neither the other's imports
    try:
        if args.command == "try-out":
            from .try_out import try_out

            return try_out()
        from .soak import soak as run_soak

        return run_soak(
            args.operations, args.workers, args.kill_every, args.duplicates, args.seed, args.kill_after_take
        )
    except ModuleNotFoundError as error:
        needs = f"{PROG} {args.command} needs {error.name}, from the test extra: pip install -e '.[test]'"
        print(needs, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
