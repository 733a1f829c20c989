{%- set slug = cookiecutter.project_slug -%}
"""What the benchmarks share: the kit on the path, the raw psycopg floor, the statements the kit sends, verdicts.

The floor is the physical one, measured in the same run on the raw driver: the kit's own statements, taken from
what it really sends (psycopg's cursor sees every statement, whatever builds it), replayed with psycopg alone on
the kit's own connection (kit_connection). Nothing here changes what the kit does while it is timed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

KIT_ROOT = Path(__file__).resolve().parents[1]
# the kit and the benchmarks' own modules, here and in the worker processes they start
IMPORT_PATHS = [str(KIT_ROOT / "src"), str(KIT_ROOT / "benchmarks")]
sys.path[:0] = [path for path in IMPORT_PATHS if path not in sys.path]

import psycopg  # noqa: E402
import sqlalchemy  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from {{ slug }} import settings  # noqa: E402

TABLE = settings.RECORD_TABLE
JOB_TYPE = settings.JOB_TYPE
DETAILS = {"email": "customer@example.com"}
# where a worker process finds the floor's statements (Floor.save)
FLOOR_FILE = "BENCH_FLOOR_FILE"
Statement = tuple[Any, Any]


def postgres_url() -> str:
    """DATABASE_URL, refused unless PostgreSQL: the figures are about it."""
    url = settings.database_url()
    if not url.startswith("postgresql"):
        sys.exit("set DATABASE_URL to a PostgreSQL test database: the figures are about PostgreSQL")
    return url


def raw_connection(autocommit: bool = True) -> psycopg.Connection[Any]:
    """One psycopg connection to DATABASE_URL, with the driver's defaults (it prepares a statement after 5 runs)."""
    url = make_url(postgres_url()).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=autocommit)


def kit_session_settings() -> list[tuple[str, str]]:
    """What the kit sets on each of its connections (settings of the session, e.g. planner settings)."""
    from {{ slug }}.claims import default_store

    with default_store().engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT name, setting FROM pg_settings WHERE source = 'session' ORDER BY name")
        return [(str(name), str(setting)) for name, setting in rows]


def kit_connection() -> psycopg.Connection[Any]:
    """The psycopg connection that the kit's statements go to on this thread, its claim store's own. The floor is
    replayed on it, so that both reach the same server process: on a machine with few cores, the core that
    process gets can change the time of the same statements by a fifth (measured here, on two connections)."""
    from {{ slug }}.claims import default_store

    return default_store()._held().connection


def floor_connection() -> psycopg.Connection[Any]:
    """The floor's connection: raw psycopg, with the kit's session settings, so that the planner plans the same
    statements the same way for both."""
    conn = raw_connection()
    for name, setting in kit_session_settings():
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(setting)))
    return conn


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def migrate() -> None:
    """alembic upgrade head, as the README's install does."""
    from alembic import command
    from alembic.config import Config

    config = Config(str(KIT_ROOT / "alembic.ini"))
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")


@contextlib.contextmanager
def statements_sent() -> Iterator[list[Statement]]:
    """Every (query, parameters) this process hands to psycopg meanwhile: what the kit really sends."""
    sent: list[Statement] = []
    execute = psycopg.Cursor.execute

    def recorded(self: psycopg.Cursor[Any], query: Any, params: Any = None, **options: Any) -> Any:
        sent.append((query, params))
        return execute(self, query, params, **options)

    psycopg.Cursor.execute = recorded  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]


def log_as_the_worker(path: Path) -> None:
    """The kit's log lines at INFO go to `path`, as its worker writes them (the README starts it at INFO): every
    skip is logged, and what a duplicate costs includes its line."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    kit = logging.getLogger("{{ slug }}")
    kit.addHandler(handler)
    kit.setLevel(logging.INFO)


@contextlib.contextmanager
def logged() -> Iterator[list[logging.LogRecord]]:
    """Every line the kit logs meanwhile, as records."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    kit = logging.getLogger("{{ slug }}")
    kit.addHandler(handler)
    try:
        yield records
    finally:
        kit.removeHandler(handler)


def in_turn(variants: Mapping[str, Callable[[int], None]], number: int) -> list[tuple[str, Callable[[int], None]]]:
    """The variants, in turn going first: what comes right after the other's commit is not always the same."""
    ordered = list(variants.items())
    return ordered if number % 2 == 0 else ordered[::-1]


def in_the_driver(
    variants: Mapping[str, Callable[[int], None]], operations: int, block: int = 10
) -> dict[str, tuple[float, float]]:
    """Where each variant's time goes, in a pass of its own: (seconds per operation inside psycopg's execute, which
    holds the round trip, and seconds around it), medians over blocks taken in turns as in `alternating`."""
    inside = 0.0
    execute = psycopg.Cursor.execute

    def timed(self: psycopg.Cursor[Any], query: Any, params: Any = None, **options: Any) -> Any:
        nonlocal inside
        began = time.perf_counter()
        try:
            return execute(self, query, params, **options)
        finally:
            inside += time.perf_counter() - began

    blocks: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    psycopg.Cursor.execute = timed  # type: ignore[method-assign]
    try:
        for start in range(0, operations, block):
            for name, run in in_turn(variants, start // block):
                inside = 0.0
                began = time.perf_counter()
                for i in range(start, start + block):
                    run(i)
                spent = time.perf_counter() - began
                blocks[name].append((inside / block, (spent - inside) / block))
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    return {
        name: (statistics.median(b[0] for b in values), statistics.median(b[1] for b in values))
        for name, values in blocks.items()
    }


def replaced(params: Any, values: Mapping[str, str]) -> Any:
    """The parameters with each value found in `values` replaced: a statement replayed for another key or token."""
    if isinstance(params, Mapping):
        return {name: values.get(value, value) if isinstance(value, str) else value for name, value in params.items()}
    if isinstance(params, Sequence) and not isinstance(params, str):
        return [values.get(value, value) if isinstance(value, str) else value for value in params]
    return params


def first_line(query: Any) -> str:
    """The statement's first words, to name it in the output."""
    words = " ".join(str(query).split())
    return words if len(words) <= 60 else words[:57] + "..."


def claim_token(raw: psycopg.Connection[Any], key: str) -> str:
    row = raw.execute(
        f"SELECT claim_token FROM {TABLE} WHERE job_type = %s AND operation_key = %s", (JOB_TYPE, key)
    ).fetchone()
    assert row is not None, f"no record for {key}"
    return str(row[0])


def the_claim(sent: Sequence[Statement], key: str) -> int:
    """Where the claim is among the statements sent: the first with `key` among its parameters (a same-database kit
    sends its BEGIN before it)."""
    for number, (_, params) in enumerate(sent):
        if key in (params.values() if isinstance(params, Mapping) else params or ()):
            return number
    raise AssertionError(f"no statement sent for {key}")


class Floor:
    """The statements handle() sent for a new key (the claim, then the completion, and a same-database kit's BEGIN
    and COMMIT around them), replayed as they were sent, on the kit's connection, for another key and token: the
    physical floor of claim + complete. Saved to a file, it serves the floor variant of a worker process too
    (FLOOR_FILE), on that process's kit connection."""

    def __init__(self, key: str, token: str, statements: Sequence[Statement]) -> None:
        self.key, self.token, self.statements = key, token, [(str(query), params) for query, params in statements]
        self.claim_ends = the_claim(self.statements, key) + 1
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = kit_connection()
        return self._conn

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"key": self.key, "token": self.token, "statements": self.statements}))

    @classmethod
    def load(cls, path: str | Path) -> Floor:
        data = json.loads(Path(path).read_text())
        return cls(data["key"], data["token"], [tuple(statement) for statement in data["statements"]])

    def run(self, key: str, between: Callable[[], object] | None = None) -> None:
        """The statements up to the claim of `key`, then `between` (the effect), then the completion and the rest."""
        values = {self.key: key, self.token: str(uuid.uuid4())}
        for query, params in self.statements[: self.claim_ends]:
            self.conn.execute(query, replaced(params, values))
        if between is not None:
            between()
        (complete, params), *rest = self.statements[self.claim_ends :]
        # the completion found the claim the statements before it made
        assert self.conn.execute(complete, replaced(params, values)).rowcount == 1
        for query, params in rest:
            self.conn.execute(query, replaced(params, values))


class Blocks(dict[str, list[float]]):
    """Seconds per operation of each variant, one figure per block of operations, the variants taking turns."""

    def median(self, name: str) -> float:
        return statistics.median(self[name])

    def ratio(self, name: str, base: str) -> float:
        """The median of the ratios of neighbouring blocks: a machine that slows down for a while slows both."""
        return statistics.median(a / b for a, b in zip(self[name], self[base], strict=True))


def alternating(variants: Mapping[str, Callable[[int], None]], operations: int, block: int = 10) -> Blocks:
    """Runs each variant `operations` times, in blocks of `block` operations, the variants taking turns block by
    block (and at going first) so that each sees the same machine."""
    blocks = Blocks({name: [] for name in variants})
    for start in range(0, operations, block):
        for name, run in in_turn(variants, start // block):
            began = time.perf_counter()
            for i in range(start, start + block):
                run(i)
            blocks[name].append((time.perf_counter() - began) / block)
    return blocks


def verdict(ratio: float, goal: float, at_most: bool = True) -> str:
    met = ratio <= goal if at_most else ratio >= goal
    return f"ratio {ratio:.2f} (goal {'<=' if at_most else '>='} {goal}): {'PASS' if met else 'MISS'}"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def header(title: str, raw: psycopg.Connection[Any]) -> None:
    """What the figures were taken on: versions, the server's durability settings, and the machine's load."""
    server = raw.execute("SHOW server_version").fetchone()
    synchronous_commit = raw.execute("SHOW synchronous_commit").fetchone()
    fsync = raw.execute("SHOW fsync").fetchone()
    assert server and synchronous_commit and fsync
    print(title)
    print(
        f"PostgreSQL {server[0]} (synchronous_commit={synchronous_commit[0]}, fsync={fsync[0]}) at"
        f" {raw.info.host}:{raw.info.port}/{raw.info.dbname}; Python {platform.python_version()},"
        f" SQLAlchemy {sqlalchemy.__version__}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
    )
    kit = ", ".join(f"{name}={setting}" for name, setting in kit_session_settings()) or "none"
    print(f"the kit's connections, whose session settings the floor's share: {kit}")
    print(
        f"{load()} at the start: timings on a shared or loaded machine are noisy; compare the ratios, each taken"
        " within one run, and run it more than once\n"
    )
