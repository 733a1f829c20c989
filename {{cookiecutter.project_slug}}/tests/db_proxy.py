"""A TCP proxy in front of PostgreSQL, so that the live suite can take the database away from its workers for real.

The live driver points the worker processes' DATABASE_URL here (the suite itself keeps the direct URL). `stop`
closes the listening socket, so new connections are refused, and cuts every open connection both ways: the
workers' drivers meet a refused port and dead sockets, and PostgreSQL sees its clients go and rolls back what
they had open. `start` listens again on the same port. Nothing is mocked. The fault tests (test_faults*.py) use it.

The relay runs in a process of its own (`python db_proxy.py HOST PORT`, driven through its stdin and stdout), so
that the workers' every statement does not wait on the test process's threads (moto's server, the sink).
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit, urlunsplit

# how often the acceptor looks whether it was stopped
ACCEPT_POLL_SECONDS = 0.05


class DbProxy:
    """The suite's handle on the relay process: start, stop, and the database URL through it."""

    def __init__(self, database_url: str) -> None:
        upstream = urlsplit(database_url)
        if not upstream.hostname:
            raise ValueError(f"DbProxy: the database URL names no host ({upstream.scheme}:...): give host and port")
        self.database_url = database_url
        default_port = 3306 if upstream.scheme.split("+")[0] in ("mysql", "mariadb") else 5432
        self.upstream = (upstream.hostname, upstream.port or default_port)
        self.port = 0
        self.running = False
        self._process: subprocess.Popen[str] | None = None
        # the sink's thread stops it too (test_faults_external_effect.py)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The database URL through the proxy."""
        parts = urlsplit(self.database_url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def start(self) -> DbProxy:
        with self._lock:
            if self._process is None:
                host, port = self.upstream
                self._process = subprocess.Popen(
                    [sys.executable, __file__, host, str(port)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                self.port = int(self._answer("started"))
            elif not self.running:
                self._command("start", "started")
            self.running = True
        return self

    def stop(self) -> int:
        """Refuses new connections and cuts the open ones, and returns once it has; how many it cut."""
        with self._lock:
            if not self.running:
                return 0
            self.running = False
            return int(self._command("stop", "stopped"))

    def close(self) -> None:
        """Ends the relay process (it stops first)."""
        with self._lock:
            process, self._process = self._process, None
            self.running = False
        if process is not None and process.stdin is not None:
            process.stdin.close()
            process.wait(timeout=30)

    def _command(self, command: str, answer: str) -> str:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._answer(answer)

    def _answer(self, expected: str) -> str:
        assert self._process is not None and self._process.stdout is not None
        word, _, value = self._process.stdout.readline().partition(" ")
        if word != expected:
            raise RuntimeError(f"the database proxy answered {word!r}, not {expected!r}")
        return value.strip()


class Relay:
    """The proxy itself, in the relay process: a listening socket, and two threads per connection pumping bytes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._lock = threading.Lock()
        self._open: set[tuple[socket.socket, socket.socket]] = set()
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._acceptor: threading.Thread | None = None

    def start(self) -> None:
        listener = self._listen()
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._stopping = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, args=(listener, self._stopping), daemon=True)
        self._acceptor.start()

    def stop(self) -> int:
        listener, self._listener = self._listener, None
        if listener is None:
            return 0
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join()
        listener.close()
        with self._lock:
            cut, self._open = self._open, set()
        for pair in cut:
            for end in pair:
                _close(end)
        return len(cut)

    def _listen(self) -> socket.socket:
        """The first start takes a port below the range the kernel hands out to outgoing connections, so that no
        client socket can take it while the proxy is stopped; later starts take the same port again."""
        if self.port:
            return _listener_on(self.port)
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
                first = int(ports.read().split()[0])
        except OSError:
            first = 32768  # not Linux: below the usual ranges all the same
        for _ in range(20):
            with contextlib.suppress(OSError):
                return _listener_on(random.randrange(10_000, max(first, 20_000)))
        return _listener_on(0)

    def _accept(self, listener: socket.socket, stopping: threading.Event) -> None:
        listener.settimeout(ACCEPT_POLL_SECONDS)
        while not stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if stopping.is_set():
                _close(client)
                return
            self._relay(client)

    def _relay(self, client: socket.socket) -> None:
        client.settimeout(None)
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _close(client)  # PostgreSQL itself refused: so does the proxy
            return
        pair = (client, upstream)
        for end in pair:
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.add(pair)
        threading.Thread(target=self._pump, args=(client, upstream, pair), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        """Copies one direction until either side closes, then closes both."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with self._lock:
            self._open.discard(pair)
        for end in pair:
            _close(end)


def _listener_on(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    return listener


def _close(end: socket.socket) -> None:
    """Shuts the socket down (waking a thread blocked reading it), then closes it."""
    with contextlib.suppress(OSError):  # not connected, or closed already
        end.shutdown(socket.SHUT_RDWR)
    end.close()


def main(host: str, port: str) -> None:
    """The relay process: `stop` and `start` on stdin, each answered on stdout once done; ends with its stdin."""
    relay = Relay((host, int(port)))
    relay.start()
    print(f"started {relay.port}", flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            print(f"stopped {relay.stop()}", flush=True)
        elif line.strip() == "start":
            relay.start()
            print(f"started {relay.port}", flush=True)
    relay.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
