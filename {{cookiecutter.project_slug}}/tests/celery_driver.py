{%- set slug = cookiecutter.project_slug -%}
"""How the replay suite drives Celery: deliver, deliver twice at once, die at a crash point, redeliver, sweep.

- embedded: the kit's app on an in-memory broker, with a session worker in this process
  (celery.contrib.testing). Two threads meet at a barrier for the concurrent delivery. A worker death is a
  forked child that kills itself with SIGKILL at the crash point; the redelivery is the same message again.
- live: the broker of CELERY_BROKER_URL, Redis or RabbitMQ, and two real `celery worker` processes (-P solo,
  tests/celery_live_worker.py). At the crash point the worker pauses and the suite kills it with SIGKILL; the
  broker hands the unacknowledged message to a living worker: Redis once its (shortened) visibility timeout runs
  out, RabbitMQ as soon as the dead worker's connection closes. A real redelivery either way. On RabbitMQ the
  suite prints how long after the SIGKILL the message was back in the queue (pytest -s shows it), and lets the
  workers take it only after it has seen what the death left. The workers reach PostgreSQL through the suite's
  proxy (db_proxy.py) and write down each run of a task (celery_live_worker.py), for the fault tests.
- live in a host app (REPLAY_HOST_APP=module:attribute, e.g. a Django project's `proj.celery:app`, with the
  host's folder on PYTHONPATH and its DJANGO_SETTINGS_MODULE): the same, but the messages go through the host's
  Celery app and its workers run the host's app, which finds the kit's tasks itself (autodiscover_tasks,
  include); the host's migrations made the tables.

At the end the live suite forgets the results of the tasks it sent (no result keys left in Redis) and deletes
its queue.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery.worker import state as worker_state
from crash_points import PauseOrders, die, with_crash_point
from driving import Delivery, Run

from {{ slug }}_proof.processes import Forked

KIT_ROOT = Path(__file__).resolve().parents[1]
LIVE = bool(os.environ.get("DATABASE_URL"))
HOST_APP = os.environ.get("REPLAY_HOST_APP")
TASK = "{{ slug }}.{{ cookiecutter.job_type }}"
SWEEP_TASK = "{{ slug }}.sweep_stale_claims"
# Redis: short in tests, so that a dead worker's message comes back in seconds (it is an hour or more in production).
VISIBILITY_TIMEOUT = 3
# how often Redis looks for unacknowledged messages whose visibility ran out
SHORT_VISIBILITY = {
    "visibility_timeout": VISIBILITY_TIMEOUT,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
SETTLED = ("SUCCESS", "FAILURE", "RETRY")
# One task at a time per process, and no chatter between workers: they start and stop fast. The heartbeat stays:
# its timer turns the event loop every 2 s, and a solo worker sends an acknowledgement at the loop's next turn, so
# that without it RabbitMQ (prefetch 1) held the next message back up to 10 s after a retry.
WORKER_OPTIONS = ["-P", "solo", "-c", "1", "--without-mingle", "--without-gossip", "-l", "INFO"]


def live_app() -> Celery:
    """The app that the live suite sends through and its workers run: the host's (REPLAY_HOST_APP) or the kit's.

    Either way with the visibility timeout shortened, so that a killed worker's message comes back in seconds.
    """
    if HOST_APP:
        module, _, attribute = HOST_APP.partition(":")
        app: Celery = getattr(importlib.import_module(module), attribute or "app")
    else:
        os.environ["CELERY_VISIBILITY_TIMEOUT"] = str(VISIBILITY_TIMEOUT)
        from {{ slug }}.celery_app import app
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, **SHORT_VISIBILITY}
    return app


class CeleryDriver(ABC):
    """The parts of driving.Driver that both modes share: messages through a Celery app."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.sent: list[str] = []

    def send(self, args: list[Any], kwargs: Mapping[str, Any] | None = None) -> str:
        return self.send_task(TASK, args, kwargs)

    def send_task(self, name: str, args: list[Any] | None = None, kwargs: Mapping[str, Any] | None = None) -> str:
        task_id = str(self.app.send_task(name, args=args, kwargs=dict(kwargs or {})).id)
        self.sent.append(task_id)
        return task_id

    def forget_results(self) -> None:
        """Deletes the result of every task this suite sent (in Redis, its celery-task-meta-<id> key)."""
        for task_id in self.sent:
            AsyncResult(task_id, app=self.app).forget()

    def wait(self, task_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The task's state and result once it settled, read together: RabbitMQ's rpc:// backend hands a state
        that is not final over once. Polled often, as the result backend's own wait sleeps 0.5 s."""
        deadline = time.monotonic() + timeout
        while (meta := self.app.backend.get_task_meta(task_id))["status"] not in SETTLED:
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} did not settle within {timeout} s (state {meta['status']})")
            time.sleep(0.01)
        return meta

    def settle(self, task_id: str, timeout: float = 30.0) -> Delivery:
        meta = self.wait(task_id, timeout)
        state, value = meta["status"], meta["result"]
        if isinstance(value, BaseException):
            return Delivery(task_id, state, f"{type(value).__name__}: {value}")
        return Delivery(task_id, state, str(value))

    def deliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        return self.settle(self.send([key, dict(details)]))

    def deliver_raw(self, args: list[Any], kwargs: Mapping[str, Any] | None = None) -> Delivery:
        """A message as a faulty producer might send it."""
        return self.settle(self.send(args, kwargs))

    def redeliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        """The same message again, as the queue delivers it after the lease (the waiting retry comes back)."""
        return self.deliver(key, details)

    def sweep(self) -> dict[str, int]:
        meta = self.wait(self.send_task(SWEEP_TASK))
        assert meta["status"] == "SUCCESS", meta["result"]
        return dict(meta["result"])

    @abstractmethod
    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]: ...

    @abstractmethod
    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None: ...

    @abstractmethod
    def redeliver_after_death(self) -> Delivery: ...


class EmbeddedDriver(CeleryDriver):
    def __init__(self, app: Celery) -> None:
        super().__init__(app)
        self._dead_message: tuple[str, dict[str, Any]] | None = None

    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]:
        """Two threads run the job at the same moment; the database decides which one claims."""
        from {{ slug }}.job import handle

        barrier = threading.Barrier(2)
        actions: list[str] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                barrier.wait(timeout=10)
                actions.append(handle(key, dict(details)).action)
            except BaseException as error:  # reported in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        if errors:
            raise errors[0]
        return actions

    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None:
        """A forked child runs the job and kills itself with SIGKILL at the crash point."""
        from {{ slug }} import effect
        from {{ slug }}.claims import ClaimStore, connect
        from {{ slug }}.job import handle

        pid = os.fork()
        if pid == 0:  # the child: a worker that dies
            try:
                # a connection of its own: the parent's pooled connections are not the child's to use
                dying = with_crash_point(effect.perform, crash, die)
                handle(key, dict(details), store=ClaimStore(connect()), perform=dying)
            finally:
                os._exit(3)  # reached only if it did not die: the parent fails the test
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"the worker did not die at {crash} (wait status {status})"
        )
        self._dead_message = (key, dict(details))

    def redeliver_after_death(self) -> Delivery:
        """The dead worker's message again, inside the lease."""
        assert self._dead_message is not None, "no worker has died"
        return self.deliver(*self._dead_message)


class LiveDriver(CeleryDriver):
    def __init__(self, app: Celery, env: dict[str, str], workdir: Path) -> None:
        super().__init__(app)
        self.env = env
        self.workdir = workdir
        self.orders = PauseOrders(workdir)
        self.workers: dict[str, Forked] = {}
        self._started = 0
        self._dead_task_id: str | None = None
        self._held_back = False

    def start_worker(self, options: list[str] = WORKER_OPTIONS) -> str:
        """One more worker process, with the suite's options or others (a prefork pool); its name."""
        self._started += 1
        name = f"replay{self._started}"
        argv = [sys.executable, "-m", "celery", "-A", "celery_live_worker", "worker", "-n", f"{name}@%h", *options]
        self.workers[name] = Forked(argv, self.env, KIT_ROOT, self.workdir / f"{name}.log")
        return name

    def stop_worker(self, name: str) -> None:
        stop_processes([self.workers.pop(name)])

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for name, worker in self.workers.items():
            log = self.workdir / f"{name}.log"
            while b" ready." not in log.read_bytes():
                if worker.poll() is not None:
                    raise AssertionError(f"worker {name} exited: {log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"worker {name} not ready within {timeout} s")
                time.sleep(0.05)

    def stop(self) -> None:
        stop_processes(list(self.workers.values()))
        # messages still waiting (retries at the end of a lease) were put back on shutdown: drop them
        self.app.control.purge()
        self.forget_results()
        if not HOST_APP:  # the suite's own queue goes too (a host's queues are the host's)
            with self.app.connection_for_write() as connection:
                queue = self.app.amqp.queues[self.app.conf.task_default_queue](connection.default_channel)
                queue.declare()  # the channel learns the queue's bindings, which delete() then removes
                queue.delete()

    def deliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        self.wait_ready()
        return super().deliver(key, details)

    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]:
        """Two messages at once to two idle worker processes; the database decides which one claims."""
        self.wait_ready()
        task_ids = [self.send([key, dict(details)]) for _ in range(2)]
        return [self.settle(task_id).action for task_id in task_ids]

    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None:
        """The worker that takes the message pauses at the crash point; this kills it with SIGKILL."""
        self.wait_ready()
        self.orders.give(crash)
        self._dead_task_id = self.send([key, dict(details)])
        pid = self.orders.paused_pid(timeout=30)
        name, worker = next((name, w) for name, w in self.workers.items() if w.pid == pid)
        # RabbitMQ puts the message back as soon as the dead worker's connection closes: the other workers stop
        # taking messages until redeliver_after_death, so that the suite sees what the death left first. (Redis
        # keeps it back for its visibility timeout, and puts it back only while workers take messages.)
        self._held_back = self.app.connection_for_read().transport.driver_type == "amqp"
        if self._held_back:
            self.consume(False, [other for other in self.workers if other != name])
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert worker.wait(timeout=10) == -signal.SIGKILL, f"worker {name} was not killed"
        del self.workers[name]
        if self._held_back:
            while self.ready_messages() == 0:
                assert time.monotonic() < killed_at + 30, "RabbitMQ did not put the dead worker's message back"
                time.sleep(0.01)
            print(f"RabbitMQ put the dead worker's message back {time.monotonic() - killed_at:.2f} s after the SIGKILL")
        else:
            self.start_worker()  # a fresh worker takes its place, while Redis waits for the visibility timeout

    def redeliver_after_death(self) -> Delivery:
        """The broker hands the dead worker's unacknowledged message to a living worker."""
        assert self._dead_task_id is not None, "no worker has died"
        if self._held_back:  # the living workers take messages again, and a fresh one takes the dead one's place
            self.consume(True, list(self.workers))
            self.start_worker()
        return self.settle(self._dead_task_id, timeout=VISIBILITY_TIMEOUT + 30)

    def consume(self, on: bool, workers: list[str]) -> None:
        """The workers start or stop taking messages from the queue (remote control: it waits for their replies)."""
        queue = self.app.conf.task_default_queue
        names = [f"{name}@{socket.gethostname()}" for name in workers]
        command = self.app.control.add_consumer if on else self.app.control.cancel_consumer
        replies = command(queue, destination=names, reply=True, timeout=10)
        assert len(replies) == len(names), f"{command.__name__} {queue}: replies {replies} from {names}"

    def settle(self, task_id: str, timeout: float = 30.0) -> Delivery:
        """How the task's first run ended, as its worker wrote it down. Not the result backend's state, which is
        the last run's: on a busy machine a finished run's acknowledgement can come late (a solo worker sends it
        at its next timer), and Redis then hands the message to a second worker after the suite's 3 s visibility
        timeout, whose run (skipped) would overwrite the first one's result."""
        deadline = time.monotonic() + timeout
        while not (settled := [run for run in self.runs(task_id) if run.state in SETTLED]):
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} did not settle within {timeout} s")
            time.sleep(0.01)
        return Delivery(task_id, settled[0].state, settled[0].value)

    def send_message(self, key: str, details: Mapping[str, Any]) -> str:
        self.wait_ready()
        return self.send([key, dict(details)])

    def runs(self, message_id: str) -> list[Run]:
        """Every run of the task by a worker process, as the workers wrote them down (celery_live_worker.py)."""
        found = []
        for path in self.workdir.glob("runs-*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}") and f'"{message_id}"' in line:
                    run = json.loads(line)
                    found.append((run["at"], Run(run["message_id"], run["pid"], run["state"], run["value"])))
        return [run for _, run in sorted(found, key=lambda found: found[0])]

    def ready_messages(self) -> int:
        """Messages waiting in the queue for a worker (not those a worker holds unacknowledged)."""
        with self.app.connection_for_write() as connection:
            queue = self.app.amqp.queues[self.app.conf.task_default_queue](connection.default_channel)
            return int(queue.queue_declare().message_count)


def stop_processes(workers: list[Forked]) -> None:
    """A warm shutdown, or SIGKILL for a worker still running after 15 s (a run that hangs)."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.fixture(scope="session")
def driver(
    engine: Any, effects: Any, database_proxy: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryDriver]:
    if HOST_APP and not LIVE:
        pytest.fail("REPLAY_HOST_APP runs the live mode only: set DATABASE_URL and CELERY_BROKER_URL too")
    if not LIVE:
        # the kit's own app on an in-memory broker, and one worker thread for the whole session
        os.environ["CELERY_BROKER_URL"] = "memory://"
        os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"
        from {{ slug }}.celery_app import app

        # the in-memory transport polls for messages: every 10 ms rather than every second
        app.conf.broker_transport_options = {**app.conf.broker_transport_options, "polling_interval": 0.01}
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield EmbeddedDriver(app)
            # The worker thread looks for the stop signal only between waits of 2 s for a message: give
            # the signal, then a message, so that it stops at once.
            worker_state.should_terminate = 0
            app.send_task(SWEEP_TASK)
        return
    if not os.environ.get("CELERY_BROKER_URL"):
        pytest.fail("live mode (DATABASE_URL is set) needs CELERY_BROKER_URL, a Redis or RabbitMQ URL")
    # a queue of this run's own: another run on the same Redis database takes none of its messages
    os.environ["CELERY_QUEUE"] = f"{{ cookiecutter.job_type }}-replay-{uuid.uuid4().hex[:8]}"
    app = live_app()
    if HOST_APP:
        # the host's workers listen to the host's queues: the kit's own commands (operations send) send there too
        # (give the suite a Redis database of its own)
        os.environ["CELERY_QUEUE"] = app.conf.task_default_queue

    workdir = tmp_path_factory.mktemp("workers")
    env = {
        **os.environ,
        # the kit and this folder first; then what the caller gave (a host app's folder)
        "PYTHONPATH": os.pathsep.join(
            [str(KIT_ROOT / "src"), str(KIT_ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
        "REPLAY_PAUSE_DIR": str(workdir),
        # the workers reach PostgreSQL through the proxy, which the fault tests stop (conftest.database_proxy)
        "DATABASE_URL": database_proxy.url,
    }
    live = LiveDriver(app, env, workdir)
    live.start_worker()
    live.start_worker()
    try:
        live.wait_ready()
        yield live
    finally:
        live.stop()
