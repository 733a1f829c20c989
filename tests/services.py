"""The live services a test run uses, safe on a machine that other runs share.

Addresses come from the environment (REPLAY_POSTGRES_URL, REPLAY_REDIS_URL, REPLAY_RABBITMQ_URL; defaults: this
machine's own). Every PostgreSQL database a run creates is named by the run's id and dropped at the end; a Redis
database is leased for one test (a lease key in Redis database 0, taken only while that database is empty),
flushed after it, and given back; a RabbitMQ vhost is named by the run's id and the test process, and deleted when
that process ends (or after a test that failed in it). Nothing this run did not create is dropped or flushed. An
SMTP sink counts the emails that arrive.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

POSTGRES = os.environ.get("REPLAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432").rstrip("/")
REDIS = os.environ.get("REPLAY_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
# the broker's address without a vhost; the vhosts are made with rabbitmqctl, on this machine's node
RABBITMQ = os.environ.get("REPLAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672").rstrip("/")
# One id per test run, shared by its xdist workers, in every name the run creates.
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)[:8]
LEASE_SECONDS = 3600  # a run killed before it gives its lease back frees the database after this


def psql(sql: str, database: str = "postgres") -> str:
    result = subprocess.run(
        ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", f"{POSTGRES}/{database}", "-c", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout


def redis(database: int, *args: str) -> str:
    result = subprocess.run(
        ["redis-cli", "-u", f"{REDIS}/{database}", *args], check=True, capture_output=True, text=True, timeout=30
    )
    return result.stdout.strip()


@contextlib.contextmanager
def postgres_database(purpose: str) -> Iterator[str]:
    """The URL of a new database named for this run and purpose, dropped afterwards."""
    name = f"rm_{RUN_ID}_{purpose}"[:63]
    psql(f"CREATE DATABASE {name}")
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def redis_database() -> Iterator[str]:
    """The URL of an empty Redis database leased to this test, flushed and given back afterwards."""
    for number in range(1, 16):
        lease = f"replay-matrix:lease:{number}"
        if redis(0, "SET", lease, RUN_ID, "NX", "EX", str(LEASE_SECONDS)) != "OK":
            continue
        if redis(number, "DBSIZE") != "0":  # someone else's data, not ours to flush
            redis(0, "DEL", lease)
            continue
        try:
            yield f"{REDIS}/{number}"
        finally:
            redis(number, "FLUSHDB")
            redis(0, "DEL", lease)
        return
    raise RuntimeError(f"no empty Redis database at {REDIS} could be leased (1 to 15 are in use)")


def rabbitmqctl(*args: str) -> str:
    result = subprocess.run(["rabbitmqctl", "--quiet", *args], check=True, capture_output=True, text=True, timeout=60)
    return result.stdout.strip()


# This process's RabbitMQ vhost while it is clean: rabbitmqctl boots an Erlang VM, some 2.5 s of CPU a call.
_vhost: str | None = None


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a RabbitMQ vhost of this run, open to the URL's user. One per test process (an xdist worker runs
    one test at a time; each test declares queues named for itself and removes them): made at the first use,
    deleted with every queue and message in it when the process ends, or at once when a test using it fails."""
    global _vhost
    if _vhost is None:
        name = f"rm_{RUN_ID}_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{uuid.uuid4().hex[:6]}"
        user = urlsplit(RABBITMQ).username or "guest"
        rabbitmqctl("add_vhost", name)
        atexit.register(rabbitmqctl, "delete_vhost", name)
        _vhost = name
        rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    try:
        yield f"{RABBITMQ}/{_vhost}"
    except BaseException:  # what the failed test left there goes with the vhost; the next test gets a new one
        atexit.unregister(rabbitmqctl)
        rabbitmqctl("delete_vhost", _vhost)
        _vhost = None
        raise


class Mailbox:
    """What an SMTP sink received: one entry per email."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        self.received.append(envelope.content)  # type: ignore[attr-defined]
        return "250 OK"


@contextlib.contextmanager
def smtp_sink() -> Iterator[tuple[dict[str, str], Mailbox]]:
    """An SMTP server on a free local port: the environment that points a kit at it, and its mailbox."""
    with socket.socket() as probe:  # aiosmtpd cannot pick a free port itself (port=0 fails)
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    mailbox = Mailbox()
    # imported here: the runs without the kits' requirements (tox -e oldest) read RUN_ID from this module too
    from aiosmtpd.controller import Controller

    server = Controller(mailbox, hostname="127.0.0.1", port=port)
    server.start()
    try:
        yield {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port)}, mailbox
    finally:
        server.stop()
