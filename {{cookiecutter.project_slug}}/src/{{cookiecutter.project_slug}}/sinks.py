"""Where the replay suite and the try-out count effects: where they arrive, never inside the job.
{%- if cookiecutter.effect_kind == "external_no_reference" %}

An SMTP server (aiosmtpd) on a free local port: the job really sends its emails to it.
{%- elif cookiecutter.effect_kind == "external_with_reference" %}

A fake provider: a real HTTP server in a thread of the test process. It records every reference it receives
and answers lookups from what it really received.
{%- else %}

The effect's own table, `{{ cookiecutter.job_type }}_effects`: rows the job wrote in the claim's transaction.
{%- endif %}
"""

from __future__ import annotations
{% if cookiecutter.effect_kind == "external_no_reference" %}
import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Callable
from email import message_from_bytes, policy
from typing import Any

from aiosmtpd.controller import Controller

from .effect import KEY_HEADER


def free_port() -> int:
    # aiosmtpd's Controller cannot bind port 0 itself: ask the kernel for a free port first
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SmtpSink:
    """Counts the emails that arrive, per operation key (their KEY_HEADER). `delay`: seconds it takes
    to answer each email once received (the soak's, so that a kill can land while the sender waits)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        # called with the key when an email arrives, before the sender hears back (test_faults.py's)
        self.on_arrival: Callable[[str], None] | None = None
        self._keys: list[str] = []
        self._failures_to_give = 0
        self._lock = threading.Lock()
        self.controller = Controller(self, hostname="127.0.0.1", port=free_port())

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        # the default policy decodes a header that non-ASCII text made an RFC 2047 encoded word
        key = str(message_from_bytes(envelope.content, policy=policy.default)[KEY_HEADER] or "")
        with self._lock:
            if self._failures_to_give:
                self._failures_to_give -= 1
                return "451 4.3.0 Try again later"
            self._keys.append(key)
        if self.on_arrival is not None:
            self.on_arrival(key)
        if self.delay:
            await asyncio.sleep(self.delay)
        return "250 Message accepted for delivery"

    def start(self) -> None:
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()

    def env(self) -> dict[str, str]:
        """What a worker process needs to send here."""
        return {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(self.controller.port)}

    def count(self, key: str) -> int:
        with self._lock:
            return self._keys.count(key)

    def counts(self, prefix: str = "") -> Counter[str]:
        """Emails received per key, for the keys that start with `prefix`."""
        with self._lock:
            return Counter(key for key in self._keys if key.startswith(prefix))

    def fail_next(self, count: int) -> None:
        """Refuses the next `count` emails with a temporary failure: they do not arrive."""
        with self._lock:
            self._failures_to_give = count

    def reset(self) -> None:
        with self._lock:
            self._keys.clear()
            self._failures_to_give = 0


Effects = SmtpSink
{% elif cookiecutter.effect_kind == "external_with_reference" %}
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeProvider:
    """Receives `POST /messages` with a reference and answers `GET /messages/<reference>` from what it received.
    `delay`: seconds it takes to answer each POST once received (the soak's, so that a kill can land meanwhile)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        # called with the reference when a POST arrives, before the sender hears back (test_faults.py's)
        self.on_arrival: Callable[[str], None] | None = None
        self._references: list[str] = []
        self._failures_to_give = 0
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with provider._lock:
                    if provider._failures_to_give:
                        provider._failures_to_give -= 1
                        self._answer(503)
                        return
                    provider._references.append(str(body["reference"]))
                if provider.on_arrival is not None:
                    provider.on_arrival(str(body["reference"]))
                if provider.delay:
                    time.sleep(provider.delay)
                self._answer(201)

            def do_GET(self) -> None:
                reference = urllib.parse.unquote(self.path.removeprefix("/messages/"))
                with provider._lock:
                    known = reference in provider._references
                self._answer(200 if known else 404)

            def _answer(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """What a worker process needs to call here."""
        return {"PROVIDER_URL": f"http://127.0.0.1:{self.server.server_address[1]}"}

    def count(self, key: str) -> int:
        with self._lock:
            return self._references.count(key)

    def counts(self, prefix: str = "") -> Counter[str]:
        """Requests received per reference, for the references that start with `prefix`."""
        with self._lock:
            return Counter(reference for reference in self._references if reference.startswith(prefix))

    def fail_next(self, count: int) -> None:
        """Answers the next `count` requests with 503: they are not received."""
        with self._lock:
            self._failures_to_give = count

    def reset(self) -> None:
        with self._lock:
            self._references.clear()
            self._failures_to_give = 0


Effects = FakeProvider
{% else %}
from collections import Counter

from sqlalchemy import Engine, text


class EffectsTable:
    """Counts the effect's rows in the database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def env(self) -> dict[str, str]:
        return {}

    def count(self, key: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM {{ cookiecutter.job_type }}_effects WHERE operation_key = :key"),
                    {"key": key},
                ).scalar_one()
            )

    def counts(self, prefix: str = "") -> Counter[str]:
        """The effect's rows per key, for the keys that start with `prefix`."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT operation_key, count(*) FROM {{ cookiecutter.job_type }}_effects"
                    " WHERE substr(operation_key, 1, :length) = :prefix GROUP BY operation_key"
                ),
                {"length": len(prefix), "prefix": prefix},
            )
            return Counter({str(key): int(number) for key, number in rows})

    def reset(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM {{ cookiecutter.job_type }}_effects"))


Effects = EffectsTable
{% endif -%}
