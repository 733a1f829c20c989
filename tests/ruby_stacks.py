"""The Ruby stacks the Sidekiq kits are proven on, and how to run a command on each.

debian12: the machine's own Ruby 3.1 with Debian 12's ActiveRecord 6.1, Sidekiq 6.4 and Rails 6.1;
debian13: Ruby 3.3 with ActiveRecord 7.2, Sidekiq 7.3 and Rails 7.2, in a Debian 13 root; sid: Ruby 3.3 with
ActiveRecord 7.2, Sidekiq 8.1 and Rails 7.2, in a Debian sid root. `.ci/ruby-stacks` builds the roots
(`python3 tests/ruby_stacks.py` prints the suite and folder of each). A command runs in a
root through chroot, in a mount namespace of its own (so that its mounts of /proc, /dev and /tmp vanish with it,
whatever other runs do): the host's PostgreSQL and Redis answer on 127.0.0.1 as before, and a kit under /tmp has
the same path inside.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# Where `.ci/ruby-stacks` builds the roots, one folder per Debian suite.
ROOTS = Path(os.environ.get("REPLAY_RUBY_ROOTS", "/var/cache/replay-matrix"))
# Each stack by name: the Debian suite of its root, or None for this machine's own Ruby.
SUITES: dict[str, str | None] = {"debian12": None, "debian13": "trixie", "sid": "sid"}
STACKS: dict[str, Path | None] = {name: ROOTS / suite if suite else None for name, suite in SUITES.items()}
# What a command inside the root may see of this environment; everything else stays outside.
PASSED = ("CI", "DATABASE_URL", "REDIS_URL", "REPLAY_HOST_APP", "KEEP_REPLAY_WORK_DIR", "SMTP_HOST", "SMTP_PORT")


def missing(stack: str) -> str | None:
    """Why the stack cannot run here, or None."""
    root = STACKS[stack]
    if root is not None and not (root / ".replay-matrix-stack").exists():
        return f"the {stack} Ruby stack is not built at {root}: run .ci/ruby-stacks"
    return None


def command(stack: str, argv: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """argv, run in cwd on the stack, with env (the host's own stack takes it whole)."""
    root = STACKS[stack]
    if root is None:
        return argv
    if not str(cwd).startswith("/tmp/"):
        raise ValueError(f"{cwd}: a command on {stack} runs in a folder under /tmp, which the root shares")
    inner = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    inner |= {name: env[name] for name in PASSED if name in env}
    mounts = f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && mount --rbind /tmp {root}/tmp"
    variables = [f"{name}={value}" for name, value in inner.items()]
    in_cwd = f"cd {shlex.quote(str(cwd))} && exec {shlex.join(argv)}"
    run = shlex.join(["chroot", str(root), "/usr/bin/env", "-i", *variables, "sh", "-c", in_cwd])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts} && exec {run}"]


if __name__ == "__main__":  # for .ci/ruby-stacks: the Debian suite and the root of each stack built there
    for name, suite in SUITES.items():
        if suite:
            print(suite, STACKS[name])
