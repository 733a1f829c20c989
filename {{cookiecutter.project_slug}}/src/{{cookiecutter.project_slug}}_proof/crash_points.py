"""Crash points for cases 5 and 6: the job's effect, wrapped so that the worker stops right before or after it.

`before_effect`: after the claim, before the effect. `after_effect`: after the effect, before the completion.
What happens at the point is the caller's: a forked child kills itself; a live worker pauses and the suite
(or the try-out) kills it from outside with SIGKILL, or (a `freeze` order) stops itself with SIGSTOP
and goes on where it stopped when the suite sends SIGCONT, as a machine paused past the lease would.

Used by the replay suite (tests/) and by the try-out (try_out.py), which must work from an installed kit: so
they live here, in the package, once. The soak's kills right after a take (die_after_some_takes) live here too.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

CRASH_POINTS = ("before_effect", "after_effect")
# an order's second word: stop with SIGSTOP at the point, and go on after SIGCONT
FREEZE = "freeze"
# The fraction of messages taken after which a soak's worker dies at once (--kill-after-take), as the soak tells
# its workers, and the line such a worker writes first.
KILL_AFTER_TAKE_VARIABLE = "REPLAY_SOAK_KILL_AFTER_TAKE"
KILLED_AFTER_TAKE = "soak: SIGKILL right after taking message"


def with_crash_point(perform: Callable[..., None], crash: str, reached: Callable[[], None]) -> Callable[..., None]:
    if crash not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {crash!r}")

    def perform_with_crash_point(*args: Any) -> None:
        if crash == "before_effect":
            reached()
        perform(*args)
        if crash == "after_effect":
            reached()

    return perform_with_crash_point


def die() -> NoReturn:
    """SIGKILL to this process: no cleanup, no rollback by Python, exactly as a machine dies."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")


def pausing(perform: Callable[..., None], orders: PauseOrders) -> Callable[..., None]:
    """`perform` as a live worker runs it: when an order is waiting, the first run to take it pauses there."""

    def perform_or_pause(*args: Any) -> None:
        order = orders.take()
        if order is None:
            perform(*args)
        else:
            crash, _, how = order.partition(" ")
            with_crash_point(perform, crash, orders.freeze_here if how == FREEZE else orders.pause_here)(*args)

    return perform_or_pause


class PauseOrders:
    """One-shot orders between the suite and live worker processes, through files in one directory.

    The suite writes an order (a crash point); the first worker that performs the effect takes it (an atomic
    rename), pauses at the point and writes its pid, so the suite knows whom to kill (or, with `freeze`, whom
    to wake up with SIGCONT).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.order = directory / "crash-order"

    def give(self, crash: str, *, freeze: bool = False) -> None:
        if crash not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {crash!r}")
        for old in self.directory.glob("paused-*"):
            old.unlink()
        self.order.write_text(f"{crash} {FREEZE}" if freeze else crash)

    def take(self) -> str | None:
        taken = self.directory / f"taken-{os.getpid()}"
        try:
            self.order.rename(taken)
        except FileNotFoundError:
            return None
        return taken.read_text()

    def pause_here(self) -> NoReturn:
        (self.directory / f"paused-{os.getpid()}").write_text("")
        while True:
            time.sleep(60)

    def freeze_here(self) -> None:
        """Stops this whole process with SIGSTOP, after saying so; it goes on from here on SIGCONT."""
        (self.directory / f"paused-{os.getpid()}").write_text("")
        os.kill(os.getpid(), signal.SIGSTOP)

    def paused_pid(self, timeout: float, running: Callable[[], bool] = lambda: True) -> int:
        """The pid of the worker that paused; AssertionError after `timeout`, or once `running()` says no."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and running():
            paused = list(self.directory.glob("paused-*"))
            if paused:
                return int(paused[0].name.removeprefix("paused-"))
            time.sleep(0.01)
        if not running():
            raise AssertionError("the worker exited before it reached the crash point")
        raise AssertionError(f"no worker reached the crash point within {timeout} s")


def die_after_some_takes() -> Callable[[str], None]:
    """What the soak's worker calls with each message it takes: for a fraction of them (KILL_AFTER_TAKE_VARIABLE),
    a line saying so, then SIGKILL to itself, before the message's claim: as the death of a machine right after
    its worker took a message, a moment a random kill seldom meets."""
    fraction = float(os.environ.get(KILL_AFTER_TAKE_VARIABLE) or 0)

    def maybe_die(message_id: str) -> None:
        if random.random() < fraction:
            print(f"{KILLED_AFTER_TAKE} {message_id}", flush=True)
            die()

    return maybe_die
