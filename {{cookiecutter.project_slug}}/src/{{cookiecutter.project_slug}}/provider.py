"""The provider that receives the effect: it takes the operation key as a reference and can be asked for it.

`Provider` is what the job needs; `HttpProvider` speaks a small JSON API over HTTP. Adapt `HttpProvider` to
your provider's real API (an idempotency key, a client reference, a merchant reference ...); the replay suite
runs a fake provider that answers lookups from what it really received.
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Protocol


class Provider(Protocol):
    def send(self, reference: str, message: Mapping[str, str]) -> None: ...

    def has(self, reference: str) -> bool: ...


class HttpProvider:
    """POST {base}/messages with {"reference", "message"}; GET {base}/messages/{reference} answers 200 or 404."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def send(self, reference: str, message: Mapping[str, str]) -> None:
        body = json.dumps({"reference": reference, "message": dict(message)}).encode()
        request = urllib.request.Request(
            f"{self.base_url}/messages", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        # urlopen raises HTTPError for any answer but 2xx: the effect did not happen
        with urllib.request.urlopen(request, timeout=self.timeout):
            pass

    def has(self, reference: str) -> bool:
        url = f"{self.base_url}/messages/{urllib.parse.quote(reference, safe='')}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout):
                return True
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
