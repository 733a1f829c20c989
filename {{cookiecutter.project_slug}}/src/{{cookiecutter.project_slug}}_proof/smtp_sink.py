"""Where the emails arrive: an SMTP server (aiosmtpd) on a free local port, to which the job really sends them;
it counts them per operation key."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Callable
from email import message_from_bytes, policy
from typing import Any

from aiosmtpd.controller import Controller

from {{ cookiecutter.project_slug }}.effect import KEY_HEADER


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
        # called with the key when an email arrives, before the sender hears back (test_faults_external_effect.py's)
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
