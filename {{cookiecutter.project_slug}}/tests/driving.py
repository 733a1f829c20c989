"""What the replay suite asks of a queue: the `driver` fixture that each queue's driver module provides.

The tests are written against this protocol only, so every Python kit runs the same seven rows. The live
drivers also do what the fault tests (test_faults*.py) ask: LiveWorkers; and `race` is their sweeper and redelivery
racing over a stale claim, in processes of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from crash_points import PauseOrders


@dataclass(frozen=True)
class Delivery:
    """How one message ended: SUCCESS with the outcome's action, FAILURE with the error ("BadMessage: ..."),
    or RETRY when it met a young claim and waits for the end of the lease."""

    message_id: str
    state: str
    value: str

    @property
    def action(self) -> str:
        """performed | skipped | held | abandoned | waiting, or the error for a failure."""
        return "waiting" if self.state == "RETRY" else self.value


class Driver(Protocol):
    def deliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        """One message, through the real queue and a worker; returns once it settled."""
        ...

    def deliver_raw(self, args: list[Any], kwargs: Mapping[str, Any] | None = None) -> Delivery:
        """A message as a faulty producer might send it (no key, a key that is not a string ...)."""
        ...

    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]:
        """The same message to two workers at the same moment; the actions of both runs."""
        ...

    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None:
        """A worker takes the message and dies with SIGKILL at the crash point (crash_points.py)."""
        ...

    def redeliver_after_death(self) -> Delivery:
        """The dead worker's message, delivered again by the queue, inside the lease."""
        ...

    def redeliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        """The message again, as it comes back after the lease."""
        ...

    def sweep(self) -> dict[str, int]:
        """The sweeper, run as the deployment runs it; its counts."""
        ...


# the errors a run meets when the database is unreachable (job.DATABASE_UNREACHABLE), as a run's value names them
DATABASE_ERRORS = ("OperationalError: ", "InterfaceError: ")


@dataclass(frozen=True)
class Run:
    """One run of a message by a live worker process, as the worker wrote it down: SUCCESS with the outcome's
    action, FAILURE with the error, RETRY with the error or "waiting" (it met a young claim)."""

    message_id: str
    pid: int
    state: str
    value: str

    @property
    def final(self) -> bool:
        return self.state in ("SUCCESS", "FAILURE")

    @property
    def database_unreachable(self) -> bool:
        return self.state == "RETRY" and self.value.startswith(DATABASE_ERRORS)


class LiveWorkers(Protocol):
    """What the fault tests ask of a live driver, beyond Driver."""

    # one-shot orders to the worker processes: pause (or freeze, with SIGSTOP) at a crash point
    orders: PauseOrders
    # where each worker process writes its log, <name>.log
    workdir: Path

    def send_message(self, key: str, details: Mapping[str, Any]) -> str:
        """One message to the queue, without waiting for it; its id."""
        ...

    def runs(self, message_id: str) -> list[Run]:
        """Every run of the message by a worker process so far, in order."""
        ...


RACERS = ("sweeper", "redelivery")


def race(role: str, details: Mapping[str, Any], keys: Any, barrier: Any, results: Any) -> None:
    """One of two racers for test_faults_external_effect.py, in a process of its own: for each key it is given,
    it waits at the barrier, then runs the sweeper or the key's redelivery (job.sweep, job.handle: what a worker
    runs) and reports whether it won (applied the policy to the stale claim), or what went wrong."""
    from {{ cookiecutter.project_slug }}.job import handle, sweep

    while (key := keys.get()) is not None:
        try:
            barrier.wait(timeout=60)
            if role == "sweeper":
                won = sweep()["settled"] == 1
            else:
                won = handle(key, details).action in ("held", "abandoned", "performed")
            results.put((role, "won" if won else "lost"))
        except Exception as error:  # reported in the test's process
            results.put((role, repr(error)))
