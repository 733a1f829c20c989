"""The stacks the kits are proven on, and how to run a command on each.

debian12: this machine's own Ruby 3.1 (Debian 12's ActiveRecord 6.1, Sidekiq 6.4, Rails 6.1) and Python 3.11;
debian13: Ruby 3.3 with ActiveRecord 7.2, Sidekiq 7.3 and Rails 7.2, in a Debian 13 root; sid: Ruby 3.3 with
ActiveRecord 7.2, Sidekiq 8.1 and Rails 7.2, and Python 3.14, in a Debian sid root. The Sidekiq kits run on
every stack, the Python kits on this machine's Python and on sid's, the newest that Debian offers.

`.ci/stacks` builds the roots (`python3 tests/stacks.py` prints the suite, folder and packages of each); the
Python kits' dependencies go into a virtual environment inside a root (PYTHON) when tox prepares its own
(`python tests/stacks.py --python-requirements FILE`). A command runs in a root through chroot, in a mount
namespace of its own (so that its mounts of /proc, /dev and /tmp vanish with it, whatever other runs do): the
host's services answer on 127.0.0.1 as before, and a kit under /tmp has the same path inside.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# Where `.ci/stacks` builds the roots, one folder per Debian suite.
ROOTS = Path(os.environ.get("REPLAY_STACK_ROOTS", "/var/cache/replay-matrix"))
# Each stack by name: the Debian suite of its root, or None for this machine's own.
SUITES: dict[str, str | None] = {"debian12": None, "debian13": "trixie", "sid": "sid"}
STACKS: dict[str, Path | None] = {name: ROOTS / suite if suite else None for name, suite in SUITES.items()}
# What each language's kits run on.
RUBY_STACKS = ["debian12", "debian13", "sid"]
PYTHON_STACKS = ["debian12", "sid"]
# The Debian packages a root needs for each language: Ruby and every gem of the Sidekiq kit's Gemfile, so that its
# `bundle install --local` resolves (RubyGems is not reachable); Python and venv (the kits' dependencies come from
# PyPI).
PACKAGES = {
    "ruby": "ruby ruby-sidekiq ruby-activerecord ruby-railties ruby-pg ruby-sqlite3 ruby-rspec ruby-redis "
    "ruby-mustache rubocop bundler ca-certificates",
    "python": "python3 python3-venv ca-certificates",
}
# In a root: the virtual environment with the Python kits' dependencies, and its interpreter.
VENV = "/opt/replay-python"
PYTHON = f"{VENV}/bin/python"
# What a command inside the root may see of this environment; everything else stays outside.
PASSED = (
    "CI",
    "DATABASE_URL",
    "PROJ_DATABASE_URL",  # the Django host's own name for its database (tests/django_host)
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "REPLAY_ENTRY_POINT",
    "REPLAY_HOST_APP",
    "KEEP_REPLAY_WORK_DIR",
    "SMTP_HOST",
    "SMTP_PORT",
    "VIRTUAL_ENV",  # inside a root: a virtual environment there, whose bin comes first on the PATH
    "DJANGO_SETTINGS_MODULE",
    "PYTHONPATH",
)


def missing(stack: str, language: str = "ruby") -> str | None:
    """Why the stack cannot run a kit of this language here, or None."""
    root = STACKS[stack]
    if root is None:
        return None
    if not (root / ".replay-matrix-stack").exists():
        return f"the {stack} stack is not built at {root}: run .ci/stacks"
    if language == "python" and not (root / "usr/bin/python3").exists():
        return f"the {stack} stack at {root} was built without Python: run .ci/stacks"
    if language == "python" and not (root / VENV.lstrip("/") / "requirements.txt").exists():
        return f"the {stack} stack has no Python kit dependencies in {root}{VENV}: run tox (it installs them)"
    return None


def require(stack: str, language: str = "ruby") -> None:
    """A stack that cannot run here skips its test, and fails it in CI (CI=true), where nothing may skip."""
    why = missing(stack, language)
    if why:
        import pytest  # only the tests ask; .ci/stacks runs this module without it

        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(why)


def command(stack: str, argv: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """argv, run in cwd on the stack, with env (the host's own stack takes it whole)."""
    root = STACKS[stack]
    if root is None:
        return argv
    if not str(cwd).startswith("/tmp/"):
        raise ValueError(f"{cwd}: a command on {stack} runs in a folder under /tmp, which the root shares")
    inner = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    inner |= {name: env[name] for name in PASSED if name in env}
    if "VIRTUAL_ENV" in inner:
        inner["PATH"] = f"{inner['VIRTUAL_ENV']}/bin:{inner['PATH']}"
    mounts = f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && mount --rbind /tmp {root}/tmp"
    variables = [f"{name}={value}" for name, value in inner.items()]
    in_cwd = f"cd {shlex.quote(str(cwd))} && exec {shlex.join(argv)}"
    run = shlex.join(["chroot", str(root), "/usr/bin/env", "-i", *variables, "sh", "-c", in_cwd])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts} && exec {run}"]


def python(stack: str) -> str:
    """The interpreter that runs a Python kit on the stack."""
    return sys.executable if STACKS[stack] is None else PYTHON


def install_python_requirements(requirements: Path) -> None:
    """The Python kits' dependencies, in a virtual environment inside each built root of PYTHON_STACKS; kept while
    the requirements read the same (a copy of them in the environment says which)."""
    wanted = requirements.read_text()
    for stack in PYTHON_STACKS:
        root = STACKS[stack]
        if root is None or not (root / "usr/bin/python3").exists():
            continue  # not built, or built before it had Python: missing() says so, and .ci/stacks builds it
        # pip inside trusts what this machine trusts (a proxy's certificate may be among them)
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/replay-host.crt")
        (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/replay-host.crt\n")
        venv = root / VENV.lstrip("/")
        if (venv / "requirements.txt").exists() and (venv / "requirements.txt").read_text() == wanted:
            continue
        scratch = Path(f"/tmp/replay-stack-{hashlib.sha1(wanted.encode()).hexdigest()[:8]}-{os.getpid()}")
        scratch.mkdir()
        try:
            (scratch / "requirements.txt").write_text(wanted)
            shutil.rmtree(venv, ignore_errors=True)
            pip = [PYTHON, "-m", "pip", "install", "-q", "-r", str(scratch / "requirements.txt")]
            steps = [["python3", "-m", "venv", VENV], pip]
            for argv in steps:
                subprocess.run(command(stack, argv, scratch, {}), check=True, timeout=900)
            (venv / "requirements.txt").write_text(wanted)  # last: an environment half installed is made again
        finally:
            shutil.rmtree(scratch)
        print(f"{stack}: the Python kits' dependencies installed in {venv}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--python-requirements"]:  # for tox, after this interpreter's own
        install_python_requirements(Path(sys.argv[2]))
    else:  # for .ci/stacks: the Debian suite, the root and the packages of each stack built there
        for name, suite in SUITES.items():
            if suite:
                languages = [("ruby", RUBY_STACKS), ("python", PYTHON_STACKS)]
                needed = {package for language, on in languages if name in on for package in PACKAGES[language].split()}
                print(suite, STACKS[name], ",".join(sorted(needed)))
