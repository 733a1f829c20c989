"""A fake provider: a real HTTP server in a thread of the process that uses it. It records every reference it
receives and answers lookups from what it really received."""

from __future__ import annotations

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
        # called with the reference when a POST arrives, before the sender hears back (test_faults_external_effect.py's)
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
