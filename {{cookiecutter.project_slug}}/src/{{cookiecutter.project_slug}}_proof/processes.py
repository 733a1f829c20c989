{%- set celery = cookiecutter.queue_system == "celery" -%}
"""Worker processes for the soak and the live suite, started by fork from a server process that has already imported
the libraries a worker needs (multiprocessing's forkserver).

Both start a new worker after every kill, and a worker started as `python -m ...` spends most of a second of CPU
importing {{ "Celery" if celery else "boto3" }} and SQLAlchemy before it takes a message. A forked one starts at once, and is no less
real: a process of its own, which runs the same command line (`python -m <module> <args>`) with the environment,
working directory and output given, and dies of a real SIGKILL. It has the part of subprocess.Popen that the soak
and the suite use.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# What the server imports once, for every worker it forks (never the kit's own modules: they read their settings
# from the environment, which each worker sets first).
PRELOAD = [
{%- if celery %}
    "celery.bin.celery",
    "celery.worker",
    "kombu.transport.redis",
    "kombu.transport.pyamqp",
{%- else %}
    "boto3",
    "botocore.client",
{%- endif %}
    "sqlalchemy",
    "psycopg",
    "opentelemetry.trace",
]
_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(PRELOAD)


@atexit.register
def _stop_server() -> None:
    """The server ends with this process, which waits for it: the CPU of the workers it forked then counts among this
    process's children, as a started worker's would (resource.RUSAGE_CHILDREN)."""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)  # private: there is no public way
    if stop is not None:
        stop()


def _run_module(module: str, args: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """In the new process: what `python -m module args` runs, in `cwd`, with `env`, its output appended to `log`."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    # line by line: the log is read while it grows, for the line a worker writes once it is ready
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.path[:0] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """A worker process running `argv` (`[sys.executable, "-m", module, *args]`), forked from the server."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | str, log: Path | str) -> None:
        if list(argv[:2]) != [sys.executable, "-m"]:
            raise ValueError(f"not a `python -m` command line: {argv!r}")
        self.args = list(argv)
        module, args = argv[2], self.args[3:]
        Path(log).touch()  # there from the start, for whoever reads it while the worker starts
        self._process = _SERVER.Process(target=_run_module, args=(module, args, dict(env), str(cwd), str(log)))
        self._process.start()
        self.pid: int = self._process.pid or 0

    @property
    def returncode(self) -> int | None:
        """The exit status once it has ended, as Popen gives it: -9 for a SIGKILL."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
