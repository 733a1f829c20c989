"""The app as the live replay suite runs it: `celery -A celery_live_worker worker`.

The kit's own app, or with REPLAY_HOST_APP the host's app (a Django project's, say), which finds the kit's tasks
itself (celery_driver.live_app). What differs from running that app as it is: the visibility timeout and the
retries' backoff are shortened, the effect has a crash point, and each run of a task is written down. When the
suite has given an order (REPLAY_PAUSE_DIR), the first run to reach the effect pauses before or after it, and the
suite kills this worker process with SIGKILL (or, ordered to freeze, it stops itself with SIGSTOP until the suite
sends SIGCONT). Each run's end goes to runs-<pid>.jsonl there (celery_driver.LiveDriver.runs reads it).
"""

import json
import os
import time
from pathlib import Path
from typing import Any

from celery.exceptions import Retry
from celery.signals import task_postrun
from celery_driver import live_app
from crash_points import PauseOrders, pausing

from {{ cookiecutter.project_slug }} import effect, tasks

workdir = Path(os.environ["REPLAY_PAUSE_DIR"])
# job.handle looks the effect up when it runs, so the task meets the crash point (whichever kind of effect it is)
effect.perform = pausing(effect.perform, PauseOrders(workdir))  # type: ignore[assignment]
app = live_app()
# The visibility timeout is below the lease, against the guarantee: a choice of this suite alone, said where it
# is made, so that the worker's check at start (tasks.py) lets it pass. Every other setting is checked.
tasks.VISIBILITY_BELOW_LEASE_ALLOWED = True
# Retries come back within a fifth of a second instead of up to the longest run, so that the fault tests see a
# database outage outlast more retries than a passing failure gets, in a second or two.
tasks.BACKOFF_MAX_SECONDS = 0.2


@task_postrun.connect
def write_down(task_id: str = "", state: str = "", retval: Any = None, **_: Any) -> None:
    """One line per run of a task: its id, this process, and how it ended (driving.Run)."""
    if isinstance(retval, Retry):
        value = "waiting" if retval.exc is None else f"{type(retval.exc).__name__}: {retval.exc}"
    elif isinstance(retval, BaseException):
        value = f"{type(retval).__name__}: {retval}"
    else:
        value = str(retval)
    line = json.dumps({"message_id": task_id, "pid": os.getpid(), "state": state, "value": value, "at": time.time()})
    # one short line per append: the suite reads whole lines only
    with (workdir / f"runs-{os.getpid()}.jsonl").open("a") as out:
        out.write(line + "\n")


__all__ = ["app"]
