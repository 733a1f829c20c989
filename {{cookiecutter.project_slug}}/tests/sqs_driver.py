{%- set slug = cookiecutter.project_slug -%}
"""How the replay suite drives SQS: deliver, deliver twice at once, die at a crash point, redeliver, sweep.

Both modes talk real HTTP to moto's SQS server (ThreadedMotoServer, started here on a free port), with a
visibility timeout shortened to VISIBILITY_TIMEOUT seconds, so that a dead consumer's message comes back fast.

- embedded: the kit's consumer, its poll step run in a thread of this process. Two threads meet at a barrier
  to process the same message at once. A worker death is a forked child that runs the poll step and kills
  itself with SIGKILL at the crash point; SQS delivers its message again after the visibility timeout.
- live: two real consumer processes (tests/sqs_live_worker.py, the kit's Consumer.run). At the crash point the
  consumer pauses and the suite kills it with SIGKILL; SQS hands the message to the other consumer after the
  visibility timeout: a real redelivery, with its ApproximateReceiveCount checked. The consumers reach PostgreSQL
  through the suite's proxy (db_proxy.py), which the fault tests stop.

Two entry points, chosen by REPLAY_ENTRY_POINT: `consumer` (the default, above) or `lambda`, the kit's Lambda
handler behind the Lambda service as lambda_runtime.py plays it (poll, build the event from the messages
received, invoke, delete what the response does not name as failed). Embedded, its poll step runs in the same
thread, and a forked child dies mid-invocation; live, two runner processes (tests/sqs_lambda_worker.py) take the
consumers' places, and the one at the crash point is killed with SIGKILL mid-invocation.

After every test the dead-letter queue must hold exactly the messages that were refused as bad: no healthy
message may end there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from crash_points import PauseOrders, die, with_crash_point
from driving import Delivery, Run
from lambda_runtime import Context, LambdaRuntime
from moto.server import ThreadedMotoServer

from {{ slug }} import settings
from {{ slug }}.claims import ClaimStore
from {{ slug }}.consumer import Consumer, Settled, create_queues, make_body, sqs_client
from {{ slug }}.job import Perform
from {{ slug }}.lambda_handler import BatchHandler, sweep_handler
from {{ slug }}_proof.processes import Forked

KIT_ROOT = Path(__file__).resolve().parents[1]
LIVE = bool(os.environ.get("DATABASE_URL"))
# Short in tests, so that a dead consumer's message comes back in seconds (production: twice the longest run).
VISIBILITY_TIMEOUT = 2
# Long polling, shortened so that a consumer stops within a second
WAIT_SECONDS = 1
ENTRY_POINTS = ("consumer", "lambda")
ENTRY_POINT = os.environ.get("REPLAY_ENTRY_POINT") or "consumer"
if ENTRY_POINT not in ENTRY_POINTS:
    raise pytest.UsageError(f"REPLAY_ENTRY_POINT is {ENTRY_POINT!r}: it must be consumer (the default) or lambda")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def action_of(settled: Settled) -> str:
    return Delivery(settled.message_id, settled.state, settled.value).action


class SqsDriver(ABC):
    """The parts of driving.Driver that both modes share: messages through the queue, settlements back."""

    def __init__(self, client: Any, queue_url: str, dead_letter_queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url
        self.dead_letter_queue_url = dead_letter_queue_url
        self.keys: dict[str, object] = {}
        # per key, the message that met a young claim and waits, invisible, for the end of the lease
        self.waiting: dict[object, Settled] = {}
        self.failed: set[str] = set()
        self._dead_message: str | None = None

    def send(self, body: str, key: object = None) -> str:
        message_id = str(self.client.send_message(QueueUrl=self.queue_url, MessageBody=body)["MessageId"])
        self.keys[message_id] = key
        return message_id

    @abstractmethod
    def settlements(self, message_id: str) -> list[Settled]: ...

    def settled(self, message_id: str, min_receive_count: int = 1, timeout: float = 30.0) -> Settled:
        """The consumer's settlement of the message (at its `min_receive_count`-th receive or later)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.settlements(message_id) if s.receive_count >= min_receive_count]
            if found:
                settled = found[0]
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"message {message_id} not settled within {timeout} s")
            time.sleep(0.01)
        self.track(settled)
        return settled

    def track(self, settled: Settled) -> None:
        """Notes a refused message (for the dead-letter check) and a message left waiting for the end of a lease."""
        key = self.keys.get(settled.message_id)
        if settled.state == "FAILURE":
            self.failed.add(settled.message_id)
        if settled.state == "RETRY" and settled.value == "waiting":
            self.waiting[key] = settled
        elif self.waiting.get(key) and self.waiting[key].message_id == settled.message_id:
            del self.waiting[key]

    def delivery(self, settled: Settled) -> Delivery:
        return Delivery(settled.message_id, settled.state, settled.value)

    def deliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        return self.delivery(self.settled(self.send(make_body(key, details), key)))

    def deliver_raw(self, args: list[Any], kwargs: Mapping[str, Any] | None = None) -> Delivery:
        """A message as a faulty producer might send it: the key and details as given, or missing."""
        body: dict[str, Any] = dict(zip((settings.OPERATION_KEY_NAME, "details"), args, strict=False))
        body.update(kwargs or {})
        return self.delivery(self.settled(self.send(json.dumps(body), body.get(settings.OPERATION_KEY_NAME))))

    def deliver_body(self, body: str) -> Delivery:
        """A message whose body is exactly `body` (not JSON, not an object ...)."""
        return self.delivery(self.settled(self.send(body)))

    def redeliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        """The message again after the lease. A message still waiting in the queue is the one that comes back:
        the lease has run out (aged in SQL), so its invisibility is ended too; else the message is sent anew."""
        waiting = self.waiting.pop(key, None)
        if waiting is None:
            return self.deliver(key, details)
        self.client.change_message_visibility(
            QueueUrl=self.queue_url, ReceiptHandle=waiting.receipt_handle, VisibilityTimeout=0
        )
        again = self.settled(waiting.message_id, min_receive_count=waiting.receive_count + 1)
        # the very message that waited, received once more: kept through the lease, not lost
        assert again.receive_count == waiting.receive_count + 1, again
        return self.delivery(again)

    def redeliver_after_death(self) -> Delivery:
        """The dead worker's message, delivered again by SQS after the visibility timeout: its second receive."""
        assert self._dead_message is not None, "no worker has died"
        settled = self.settled(self._dead_message, min_receive_count=2, timeout=VISIBILITY_TIMEOUT + 30)
        assert settled.receive_count == 2, f"expected SQS's second receive of the message, got {settled}"
        return self.delivery(settled)

    def check_dead_letters(self) -> dict[str, str]:
        """Drains the dead-letter queue; it must hold exactly the messages that settled as FAILURE since the
        last check. Returns the error of each, by the original message id."""
        found: dict[str, str] = {}
        while True:
            messages = self.client.receive_message(
                QueueUrl=self.dead_letter_queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                break
            for message in messages:
                attributes = message.get("MessageAttributes", {})
                original = attributes.get("original_message_id", {}).get("StringValue", message["MessageId"])
                found[original] = attributes.get("error", {}).get("StringValue", "(moved by the redrive policy)")
                self.client.delete_message(QueueUrl=self.dead_letter_queue_url, ReceiptHandle=message["ReceiptHandle"])
        failed, self.failed = self.failed, set()
        healthy = sorted(set(found) - failed)
        assert not healthy, f"healthy messages ended in the dead-letter queue: {healthy}"
        assert set(found) == failed, f"refused messages missing from the dead-letter queue: {failed - set(found)}"
        return found

    def forget_waiting(self) -> None:
        """Deletes the messages still waiting for the end of a lease: the next test starts with an empty queue."""
        for waiting in self.waiting.values():
            self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=waiting.receipt_handle)
        self.waiting.clear()


class EmbeddedDriver(SqsDriver):
    """The consumer's poll step, run in a thread of this process (the pump)."""

    def __init__(self, client: Any, queue_url: str, dead_letter_queue_url: str) -> None:
        super().__init__(client, queue_url, dead_letter_queue_url)
        self._results: dict[str, list[Settled]] = {}
        self._changed = threading.Condition()
        self.consumer = self.entry_point(client, on_settled=self._record)
        self._step = threading.Lock()
        self._pause = threading.Event()
        self._stopping = threading.Event()
        self.errors: list[Exception] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def entry_point(
        self,
        client: Any,
        store: ClaimStore | None = None,
        perform: Perform | None = None,
        on_settled: Callable[[Settled], None] | None = None,
    ) -> Consumer | LambdaRuntime:
        """What receives and handles messages: poll_once(), receive() and process(message)."""
        return Consumer(
            client,
            queue_url=self.queue_url,
            dead_letter_queue_url=self.dead_letter_queue_url,
            store=store,
            perform=perform,
            on_settled=on_settled,
        )

    def _record(self, settled: Settled) -> None:
        with self._changed:
            self._results.setdefault(settled.message_id, []).append(settled)
            self._changed.notify_all()

    def _pump(self) -> None:
        while not self._stopping.is_set():
            if self._pause.is_set():
                time.sleep(0.005)
                continue
            with self._step:
                try:
                    self.consumer.poll_once(wait_seconds=WAIT_SECONDS)
                except Exception as error:  # as a consumer's loop would: note it, go on polling
                    self.errors.append(error)
                    time.sleep(0.1)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No poll step runs meanwhile: the messages sent are for the test's own workers."""
        self._pause.set()
        with self._step:
            try:
                yield
            finally:
                self._pause.clear()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=WAIT_SECONDS + 10)

    def settlements(self, message_id: str) -> list[Settled]:
        assert not self.errors, f"the consumer's poll step failed: {self.errors!r}"
        with self._changed:
            return list(self._results.get(message_id, []))

    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]:
        """The same message twice, received together; two threads process one each at the same moment."""
        with self.paused():
            for _ in range(2):
                self.send(make_body(key, details), key)
            received: list[dict[str, Any]] = []
            deadline = time.monotonic() + 10
            while len(received) < 2 and time.monotonic() < deadline:
                received += self.consumer.receive(max_messages=2 - len(received), wait_seconds=WAIT_SECONDS)
            assert len(received) == 2, f"received {len(received)} of the 2 messages"
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def run(message: dict[str, Any]) -> None:
                try:
                    barrier.wait(timeout=10)
                    self.consumer.process(message)
                except BaseException as error:  # reported in the test's thread
                    errors.append(error)

            threads = [threading.Thread(target=run, args=(message,)) for message in received]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
        if errors:
            raise errors[0]
        return [action_of(self.settled(str(message["MessageId"]))) for message in received]

    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None:
        """A forked child runs the poll step, receives the message and kills itself at the crash point."""
        from {{ slug }} import effect
        from {{ slug }}.claims import connect

        with self.paused():
            message_id = self.send(make_body(key, details), key)
            pid = os.fork()
            if pid == 0:  # the child: a consumer (or a function, mid-invocation) that dies
                try:
                    # a client and a connection of its own: the parent's are not the child's to use
                    dying = with_crash_point(effect.perform, crash, die)
                    self.entry_point(sqs_client(), store=ClaimStore(connect()), perform=dying).poll_once(wait_seconds=5)
                finally:
                    os._exit(3)  # reached only if it did not die: the parent fails the test
            _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"the consumer did not die at {crash} (wait status {status})"
        )
        self._dead_message = message_id

    def sweep(self) -> dict[str, int]:
        """The sweeper, as a consumer runs it between messages."""
        return self.consumer.sweep()


class LambdaEmbeddedDriver(EmbeddedDriver):
    """The kit's Lambda handler, invoked by lambda_runtime.py's stand-in for the Lambda service."""

    def entry_point(
        self,
        client: Any,
        store: ClaimStore | None = None,
        perform: Perform | None = None,
        on_settled: Callable[[Settled], None] | None = None,
    ) -> Consumer | LambdaRuntime:
        handler = BatchHandler(client, store=store, perform=perform, on_settled=on_settled)
        return LambdaRuntime(client, self.queue_url, handler)

    def sweep(self) -> dict[str, int]:
        """The sweeper, as a scheduled function runs it."""
        return sweep_handler({}, Context())


class LiveDriver(SqsDriver):
    """Real consumer processes; each writes its settlements to a file of its own in `workdir`."""

    # the worker's module (tests/ on PYTHONPATH), and the line it logs once it polls
    worker_module = "sqs_live_worker"
    ready_line = b"consumer ready"

    def __init__(
        self, client: Any, queue_url: str, dead_letter_queue_url: str, env: dict[str, str], workdir: Path
    ) -> None:
        super().__init__(client, queue_url, dead_letter_queue_url)
        self.env = env
        self.workdir = workdir
        self.orders = PauseOrders(workdir)
        self.workers: dict[str, Forked] = {}
        self._started = 0

    def start_worker(self) -> None:
        self._started += 1
        name = f"consumer{self._started}"
        argv = [sys.executable, "-m", self.worker_module]
        self.workers[name] = Forked(argv, self.env, KIT_ROOT, self.workdir / f"{name}.log")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for name, worker in self.workers.items():
            log = self.workdir / f"{name}.log"
            while self.ready_line not in log.read_bytes():
                if worker.poll() is not None:
                    raise AssertionError(f"consumer {name} exited: {log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"consumer {name} not ready within {timeout} s")
                time.sleep(0.02)

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.terminate()
        for worker in self.workers.values():
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def settlements(self, message_id: str) -> list[Settled]:
        return [settled for _, settled in self.settlements_by_pid(message_id)]

    def settlements_by_pid(self, message_id: str) -> list[tuple[int, Settled]]:
        """Each settlement of the message, with the pid of the process that wrote it (settled-<pid>.jsonl)."""
        found = []
        for path in self.workdir.glob("settled-*.jsonl"):
            pid = int(path.stem.removeprefix("settled-"))
            for line in path.read_text().splitlines():
                if line.endswith("}") and f'"{message_id}"' in line:
                    found.append((pid, Settled(**json.loads(line))))
        return sorted(found, key=lambda found: found[1].receive_count)

    def send_message(self, key: str, details: Mapping[str, Any]) -> str:
        self.wait_ready()
        return self.send(make_body(key, details), key)

    def runs(self, message_id: str) -> list[Run]:
        """Every receive of the message that a consumer (or function) settled, in order."""
        found = self.settlements_by_pid(message_id)
        if found:
            self.track(found[-1][1])
        return [Run(settled.message_id, pid, settled.state, settled.value) for pid, settled in found]

    def deliver(self, key: str, details: Mapping[str, Any]) -> Delivery:
        self.wait_ready()
        return super().deliver(key, details)

    def deliver_twice_at_once(self, key: str, details: Mapping[str, Any]) -> list[str]:
        """Two copies of the message at once, to two idle consumer processes; the database decides."""
        self.wait_ready()
        message_ids = [self.send(make_body(key, details), key) for _ in range(2)]
        return [action_of(self.settled(message_id)) for message_id in message_ids]

    def deliver_and_die(self, key: str, details: Mapping[str, Any], crash: str) -> None:
        """The consumer that takes the message pauses at the crash point; this kills it with SIGKILL."""
        self.wait_ready()
        self.orders.give(crash)
        self._dead_message = self.send(make_body(key, details), key)
        pid = self.orders.paused_pid(timeout=30)
        name, worker = next((name, w) for name, w in self.workers.items() if w.pid == pid)
        os.kill(pid, signal.SIGKILL)
        assert worker.wait(timeout=10) == -signal.SIGKILL, f"consumer {name} was not killed"
        del self.workers[name]
        # a fresh consumer takes its place, while the message stays invisible for the visibility timeout
        self.start_worker()

    def sweep(self) -> dict[str, int]:
        """The sweeper command, as cron runs it."""
        completed = subprocess.run(
            [sys.executable, "-m", "{{ slug }}.operations", "sweep"],
            cwd=KIT_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode == 0, completed.stderr
        found = re.search(r"stale claims: (\d+), settled: (\d+), queued sent again: (\d+)", completed.stdout)
        assert found, completed.stdout
        return {"stale": int(found[1]), "settled": int(found[2]), "resent": int(found[3])}


class LambdaLiveDriver(LiveDriver):
    """Real processes that each play the Lambda service and one execution environment of the function."""

    worker_module = "sqs_lambda_worker"
    ready_line = b"lambda runner ready"


@pytest.fixture(scope="session")
def sqs_server() -> Iterator[str]:
    """moto's SQS server on a free port, and the environment that points the kit at it."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        {
            "SQS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "SQS_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT),
            "SQS_WAIT_TIME_SECONDS": str(WAIT_SECONDS),
            # a queue of this run's own
            "SQS_QUEUE_NAME": f"{settings.JOB_TYPE}-replay-{uuid.uuid4().hex[:8]}",
        }
    )
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "SQS_QUEUE_URL", "SQS_DEAD_LETTER_QUEUE_URL"):
        os.environ.pop(name, None)
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def driver(
    engine: Any, effects: Any, database_proxy: Any, sqs_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SqsDriver]:
    client = sqs_client()
    queue_url, dead_letter_queue_url = create_queues(client)
    os.environ["SQS_QUEUE_URL"] = queue_url
    os.environ["SQS_DEAD_LETTER_QUEUE_URL"] = dead_letter_queue_url
    if not LIVE:
        embedded = (LambdaEmbeddedDriver if ENTRY_POINT == "lambda" else EmbeddedDriver)(
            client, queue_url, dead_letter_queue_url
        )
        try:
            yield embedded
        finally:
            embedded.stop()
        return
    workdir = tmp_path_factory.mktemp("consumers")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(KIT_ROOT / "src"), str(KIT_ROOT / "tests")]),
        "REPLAY_PAUSE_DIR": str(workdir),
        # the suite runs the sweeper itself, when a test asks for it
        "SQS_SWEEP_EVERY_SECONDS": "0",
        # the consumers reach PostgreSQL through the proxy, which the fault tests stop (conftest.database_proxy)
        "DATABASE_URL": database_proxy.url,
    }
    live = (LambdaLiveDriver if ENTRY_POINT == "lambda" else LiveDriver)(
        client, queue_url, dead_letter_queue_url, env, workdir
    )
    live.start_worker()
    live.start_worker()
    try:
        live.wait_ready()
        yield live
    finally:
        live.stop()


@pytest.fixture(autouse=True)
def dead_letters_are_bad_messages_only(driver: SqsDriver) -> Iterator[None]:
    """After each test: the dead-letter queue holds exactly the refused messages; no healthy one."""
    yield
    driver.forget_waiting()
    driver.check_dead_letters()
