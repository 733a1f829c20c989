"""The claim runtime: the record of handled operations in `{{ cookiecutter.record_table }}`, and every change to it.

The rules it keeps (see README.md):
- The database is the only clock. Timestamps are written in SQL (PostgreSQL clock_timestamp(), MySQL and MariaDB
  UTC_TIMESTAMP(6), SQLite julianday('now')) and "older than the lease" is decided in SQL, never by a worker's
  clock.
- A claim commits in its own short transaction before the effect starts (for a row in the same database, the
  claim, the effect and the completion share one transaction instead).
- Every change after the claim is guarded by the claim's token: only the run holding the claim completes it,
  and a takeover of a stale claim is a compare-and-swap that one run alone can win.

SQLAlchemy Core with the SQL in text(), for PostgreSQL, MySQL, MariaDB and SQLite; DATABASE_URL chooses. MySQL has
no RETURNING and no ON CONFLICT: there a claim is a plain INSERT that a duplicate key refuses, and the statements
that return rows lock them first and read them (the `mysql` parts of ClaimStore). What a delivery
runs costs what the database does and little more: each thread holds one connection of its own in autocommit
(one statement, one transaction: no BEGIN or COMMIT round trips, no pool checkout per statement), every
statement is built once and compiled once for the driver, and the message's details are encoded to JSON once.
A held connection that fails is closed, replaced at the next call, and the error goes to the queue's retry. A
same-database effect shares one transaction with its claim on that same connection (ClaimStore.transaction).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import select
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect, Engine, TextClause, create_engine, event, exc, text

from . import settings

JOB_TYPE = settings.JOB_TYPE
TABLE = settings.RECORD_TABLE
# every resolution by a person (revision 0004)
RESOLUTIONS_TABLE = f"{TABLE}_resolutions"
LEASE = settings.LEASE_SECONDS
# how long a SQLite connection waits for another's write (and for another process's switch to WAL)
SQLITE_BUSY_SECONDS = 10


class BadMessage(ValueError):
    """The message can never succeed as it is: retrying it would not help, so it is refused at once."""


class PayloadConflict(BadMessage):
    """The key is known with another payload: a different operation reusing the key, not a duplicate."""


class QueueUnreachable(ConnectionError):
    """The queue did not take a message: its broker or endpoint cannot be reached, or the settings name none. A
    record already written stays queued, and the sweeper sends it again after the re-send time."""


class ClaimRace(RuntimeError):
    """The record changed between two steps (another run got there first): the queue's retry decides again."""


def validate_key(key: object) -> str:
    """The operation key, or BadMessage saying what is wrong with it."""
    name = settings.OPERATION_KEY_NAME
    if key is None:
        raise BadMessage(f"{name} is missing")
    if not isinstance(key, str):
        raise BadMessage(f"{name} must be a string, not {type(key).__name__}")
    if not key.strip():
        raise BadMessage(f"{name} is empty")
    if len(key) > settings.MAX_KEY_LENGTH:
        raise BadMessage(f"{name} has {len(key)} characters; at most {settings.MAX_KEY_LENGTH} fit the record")
    if "\x00" in key:
        raise BadMessage(f"{name} contains a NUL character, which no database text column can hold")
    try:
        key.encode()
    except UnicodeEncodeError as error:
        raise BadMessage(f"{name} contains a character that UTF-8 cannot encode ({error.reason})") from None
    return key


def validate_details(details: object) -> dict[str, Any]:
    """The rest of the message: a mapping (or nothing), or BadMessage. Whether it is plain JSON is known when it
    is encoded (encode_details), once."""
    if details is None:
        return {}
    if not isinstance(details, Mapping):
        raise BadMessage(f"details must be a mapping, not {type(details).__name__}")
    return dict(details)


def encode_details(details: Mapping[str, Any]) -> str:
    """The details as canonical JSON (keys sorted, no spaces), what the record keeps and the fingerprint hashes;
    BadMessage when they are not plain JSON."""
    try:
        encoded = json.dumps(details, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise BadMessage(f"details are not plain JSON: {error}") from None
    # (ASCII JSON: any character, NUL and lone surrogates too, is written as an escape the record can hold)
    limit = settings.max_details_bytes()
    if len(encoded) > limit:
        raise BadMessage(f"details are {len(encoded)} bytes as JSON; at most {limit} (MAX_DETAILS_BYTES)")
    return encoded


def fingerprint(key: str, details: Mapping[str, Any] | str) -> str:
    """sha256 of the payload, written canonically, so equal payloads always match. `details` may be given
    encoded already (encode_details)."""
    encoded = details if isinstance(details, str) else encode_details(details)
    # the canonical JSON of {"key": key, "details": details}: sorted, "details" comes first
    canonical = '{"details":' + encoded + ',"key":' + json.dumps(key) + "}"
    return hashlib.sha256(canonical.encode()).hexdigest()


MIGRATE = "run the kit's migration (alembic upgrade head; in a Django project, manage.py migrate)"
# What a database error says when it will not pass by itself, and what a person must do about it (person_needed).
_NEEDS_A_PERSON = {
    "does not exist": MIGRATE,
    "doesn't exist": MIGRATE,
    "no such table": MIGRATE,
    "permission denied": "grant DATABASE_URL's role the rights on the table",
    "command denied": "grant DATABASE_URL's user the rights on the table",
    "authentication failed": "check the user and password in DATABASE_URL",
    "Access denied for user": "check the user and password in DATABASE_URL",
    "violates check constraint": "migrate the table to revision 0003 (alembic upgrade head)",
    "CHECK constraint failed": "migrate the table to revision 0003 (alembic upgrade head)",
    # MariaDB's and MySQL's words for a failed CHECK
    "_status` failed for": "migrate the table to revision 0003 (alembic upgrade head)",
    "_status' is violated": "migrate the table to revision 0003 (alembic upgrade head)",
}


def person_needed(error: BaseException) -> str | None:
    """For a database error that will not pass by itself (a missing table, a failed login, a missing permission, a
    table not migrated), one line: its cause and what a person must do; None for one that may pass (the server
    restarting, the network)."""
    cause = str(getattr(error, "orig", None) or error).strip().splitlines()[0][:300]
    for sign, remedy in _NEEDS_A_PERSON.items():
        if sign in cause:
            return f"{cause}: {remedy}"
    return None


@dataclass(frozen=True)
class Clock:
    """The SQL that differs per database: its clock, and the few expressions each writes its own way."""

    now: str
    # True when the claim is older than the lease
    stale: str
    # seconds of the lease left; negative once the claim is stale
    seconds_left: str
    # a moment as a person reads it, in UTC: the SQL of a {column}
    shown: str
    # claimed_at moved back by :seconds, as if they had passed (the try-out and the suite let a lease run out)
    moved_back: str
    # the moment :days days ago
    days_ago: str
    # the moment :seconds seconds ago
    seconds_ago: str
    # seconds since the oldest moment of a group of rows: its completion, else its claim (or send, while queued)
    oldest_age: str
    # the role the database sees the statement run as: the audit's, which no caller can give
    role: str
    # what locks the rows a SELECT reads until the transaction ends
    for_update: str
    # the status as the guards of the statements on one key read it (see CLAIMED)
    status: str = "status || ''"
    # the record's note with ' | ' and :why appended
    note_and_why: str = "COALESCE(note || ' | ', '') || :why"


CLOCKS = {
    "postgresql": Clock(
        # clock_timestamp(), not now(): now() is the start of the transaction
        now="clock_timestamp()",
        stale=f"claimed_at < clock_timestamp() - interval '{LEASE} seconds'",
        seconds_left=f"extract(epoch from claimed_at + interval '{LEASE} seconds' - clock_timestamp())",
        shown="to_char({column} at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'",
        moved_back="claimed_at - make_interval(secs => :seconds)",
        days_ago="clock_timestamp() - make_interval(days => :days)",
        seconds_ago="clock_timestamp() - make_interval(secs => :seconds)",
        oldest_age="extract(epoch from clock_timestamp() - min(coalesce(completed_at, claimed_at)))::float8",
        role="current_user",
        for_update=" FOR UPDATE",
    ),
    # MySQL 8 and MariaDB 10.5+ (SQLAlchemy's mysql and mariadb dialects): DATETIME(6) columns, in UTC
    "mysql": Clock(
        now="UTC_TIMESTAMP(6)",
        stale=f"claimed_at < UTC_TIMESTAMP(6) - INTERVAL {LEASE} SECOND",
        seconds_left=f"TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), claimed_at) / 1000000.0 + {LEASE}",
        shown="CONCAT(DATE_FORMAT({column}, '%Y-%m-%d %H:%i:%s'), ' UTC')",
        moved_back="claimed_at - INTERVAL :seconds SECOND",
        days_ago="UTC_TIMESTAMP(6) - INTERVAL :days DAY",
        seconds_ago="UTC_TIMESTAMP(6) - INTERVAL :seconds SECOND",
        oldest_age="TIMESTAMPDIFF(MICROSECOND, min(coalesce(completed_at, claimed_at)), UTC_TIMESTAMP(6)) / 1000000.0",
        role="CURRENT_USER()",
        for_update=" FOR UPDATE",
        # no partial index that a plain guard could lead the planner to (`||` is OR there)
        status="status",
        note_and_why="CONCAT(COALESCE(CONCAT(note, ' | '), ''), :why)",
    ),
    "sqlite": Clock(
        # julianday('now') is in days, with milliseconds
        now="julianday('now')",
        stale=f"claimed_at < julianday('now') - {LEASE} / 86400.0",
        seconds_left=f"(claimed_at - julianday('now')) * 86400.0 + {LEASE}",
        shown="datetime({column}) || ' UTC'",
        moved_back="claimed_at - :seconds / 86400.0",
        days_ago="julianday('now') - :days",
        seconds_ago="julianday('now') - :seconds / 86400.0",
        oldest_age="(julianday('now') - min(coalesce(completed_at, claimed_at))) * 86400.0",
        role="NULL",
        # a write transaction locks the whole database
        for_update="",
    ),
}

# The guards on a record's status, in every statement that changes one key, with `{status}` the dialect's
# Clock.status. On PostgreSQL and SQLite `status || ''` is the status, but no index matches it: the planner finds the
# row through the unique (job_type, operation_key) index alone and never walks the partial index of claimed rows
# (schema.sql) instead, whatever its statistics say about how many rows are claimed (taken while none were, they say
# "none", and that index would look like the cheapest way).
CLAIMED = "{status} = 'claimed'"
RELEASED = "{status} = 'released'"
QUEUED = "{status} = 'queued'"
# what a person resolves (held, failed) and what the queue's last failure ends (released, queued)
FOR_A_PERSON = "{status} IN ('held', 'failed')"
FAILING = "{status} IN ('released', 'queued')"
# where a statement on a list of keys (MySQL's, ClaimStore._by_keys) takes one placeholder a key
KEYS = "(keys)"


@dataclass(frozen=True)
class Record:
    """The record of one operation, as another run finds it."""

    status: str
    claim_token: str
    payload_fingerprint: str
    attempt: int
    stale: bool
    seconds_left: float


# what a record is read as, in this order (read, and claim_or_read after its first column)
RECORD_COLUMNS = "status, claim_token, payload_fingerprint, attempt"


def _record(row: Any) -> Record:
    status, claim_token, payload_fingerprint, attempt, stale, seconds_left = row
    return Record(status, claim_token, payload_fingerprint, attempt, bool(stale), float(seconds_left))


@dataclass(frozen=True)
class HeldOperation:
    """An operation that waits for a person: held (a stale claim under `hold`) or failed (past the retries)."""

    operation_key: str
    status: str
    attempt: int
    claimed_at: str
    note: str | None
    # the message's details (JSON), what a person needs to check whether the effect happened
    payload: str


@dataclass(frozen=True)
class Resolution:
    """A person's decision on a held or failed operation, as the record and its audit keep it."""

    status_before: str
    status_after: str
    # who the database saw deciding (PostgreSQL's current_user; None on SQLite)
    database_role: str | None
    # the message's details, for the one more attempt's message
    details: dict[str, Any]


@dataclass(frozen=True)
class Statement:
    """One statement, built once: its text() for a SQLAlchemy connection, and the same compiled for the driver."""

    clause: TextClause
    sql: str
    # the parameters' names in order, for a driver that takes them by position (SQLite); None: by name
    order: tuple[str, ...] | None

    @classmethod
    def build(cls, sql: str, dialect: Dialect) -> Statement:
        clause = text(sql)
        compiled = clause.compile(dialect=dialect)
        return cls(clause, compiled.string, tuple(compiled.positiontup or ()) if compiled.positional else None)

    def parameters(self, params: dict[str, Any]) -> Any:
        return params if self.order is None else tuple(params[name] for name in self.order)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # First the busy timeout: a second writer waits for the first instead of failing at once.
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
    # WAL lets readers work beside the one writer, and it stays in the file: switched once (the migration does it),
    # only read at later opens. Processes switching a new file at the same moment are refused at once, without the
    # busy timeout (SQLite will not wait on that lock): the loser looks again, and finds WAL or switches.
    deadline = time.monotonic() + SQLITE_BUSY_SECONDS
    while cursor.execute("PRAGMA journal_mode").fetchone()[0] not in ("wal", "memory"):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    cursor.close()


def _postgresql_settings(dbapi_connection: Any, _record: Any) -> None:
    # Reads and changes by key must stay index lookups whatever the statistics say: psycopg prepares a statement
    # after 5 runs, and a plan made while the table was small (or its statistics said empty) would otherwise scan
    # the table for the connection's life. Set on the kit's own connections only, outside any transaction (so that
    # no rollback undoes it).
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    dbapi_connection.execute("SET enable_seqscan = off")
    dbapi_connection.autocommit = autocommit


# The engines of this process. A forked child (a Celery prefork worker's process) must not use a connection its
# parent left in a pool (the worker's start-up checks the table): two processes on one socket read each other's
# results, and a delivery hangs or fails. The child starts with empty pools; the parent's connections stay open.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_the_parents_connections() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_the_parents_connections)


def connect(url: str | None = None, creator: Callable[[], Any] | None = None) -> Engine:
    """An engine on `url` (DATABASE_URL), with the kit's settings for each new connection; `creator` makes the
    connections when another owner knows how (a Django project's backend: django_app/store.py)."""
    engine = create_engine(url or settings.database_url(), **({"creator": creator} if creator else {}))
    _ENGINES.add(engine)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    elif engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgresql_settings)
    return engine


def insert_record(status: str, attempt: int, now: str, *, returning: bool = True) -> str:
    """The statement that writes a new record, with `status` and `attempt`, and nothing when the key has one: the
    claim (claimed, 1) and the producer's record (queued, 0). `now` is the dialect's clock (Clock.now).
    `returning=False` (MySQL, MariaDB): a plain INSERT, which a known key refuses (is_duplicate_key)."""
    on_conflict = "ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING claim_token" if returning else ""
    return f"""
        INSERT INTO {TABLE}
            (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt, claimed_at)
        VALUES (:job_type, :key, :fingerprint, :payload, '{status}', :token, {attempt}, {now})
        {on_conflict}
    """


# MySQL's and MariaDB's error for a key that a unique index holds already (ER_DUP_ENTRY)
DUPLICATE_KEY = 1062


def is_duplicate_key(error: BaseException) -> bool:
    """Whether a database error (SQLAlchemy's or the driver's) is MySQL's duplicate key: a record exists."""
    orig = getattr(error, "orig", None) or error
    return bool(getattr(orig, "args", None)) and orig.args[0] == DUPLICATE_KEY


def new_record(key: str, payload_fingerprint: str, details: Mapping[str, Any] | str) -> dict[str, Any]:
    """The parameters of a new claim, with its new token."""
    payload = details if isinstance(details, str) else encode_details(details)
    token = str(uuid.uuid4())
    return {"job_type": JOB_TYPE, "key": key, "fingerprint": payload_fingerprint, "payload": payload, "token": token}


class HeldConnection:
    """One thread's connection for the store, in autocommit, with its cursor."""

    __slots__ = ("connection", "cursor", "ended", "pid", "pooled")

    def __init__(self, pooled: Any) -> None:
        # SQLAlchemy's wrapper of the connection, out of the pool: a Connection for a same-database effect wraps it
        self.pooled = pooled
        connection = self.connection = pooled.dbapi_connection
        self.cursor = connection.cursor()
        self.pid = os.getpid()
        # What the server says while the connection sits idle comes as a notice; FATAL is its last word. (A
        # list the handler appends to, not this object: no cycle keeps a thread's connection open past it.)
        ended: list[str] = []
        self.ended = ended

        def last_word(notice: Any) -> None:
            if notice.severity_nonlocalized == "FATAL":
                ended.append(notice.message_primary)

        if hasattr(connection, "add_notice_handler"):  # psycopg's; SQLite has no server to lose
            connection.add_notice_handler(last_word)

    def alive(self) -> bool:
        """Whether the connection is still there, without a round trip: reads what came while it sat idle. A
        server that ends it (a restart, pg_terminate_backend) says so first; a cut network closes the socket."""
        pgconn = getattr(self.connection, "pgconn", None)
        if pgconn is None:
            # MySQL and MariaDB (PyMySQL's socket): nothing is due on an idle connection, so anything to read (the
            # server's last error packet, or the end of the stream) means it has ended. SQLite has no server.
            sock = getattr(self.connection, "_sock", None)
            return sock is None or not select.select([sock], [], [], 0)[0]
        try:
            pgconn.consume_input()
            pgconn.is_busy()  # parses what came, so that a notice reaches the handler
        except Exception:
            return False
        return not self.ended and pgconn.status == 0  # CONNECTION_OK

    def close(self) -> None:
        # In a forked child, the parent's connection is left alone: closing it would end the parent's session.
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self.connection.close()

    # the thread that held it ended
    __del__ = close


class ClaimStore:
    """Claims, completes, reads, takes over, holds, abandons and resolves records of `{{ cookiecutter.job_type }}`.

    Each method is one SQL statement on the calling thread's connection, committed on its own, or with the rest of
    the transaction when one is open on that thread (`transaction`: a same-database effect shares it with its claim).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # MySQL and MariaDB share their SQL (SQLAlchemy names a MariaDB dialect apart)
        self.dialect = "mysql" if engine.dialect.name in ("mysql", "mariadb") else engine.dialect.name
        self.clock = CLOCKS[self.dialect]
        self._dbapi = engine.dialect.loaded_dbapi
        self._local = threading.local()
        statement = functools.partial(Statement.build, dialect=engine.dialect)
        clock = self.clock
        claimed, released, queued, for_a_person = (
            guard.format(status=clock.status) for guard in (CLAIMED, RELEASED, QUEUED, FOR_A_PERSON)
        )
        failing_known = FAILING.format(status="known." + clock.status)
        self._begin, self._commit = statement("BEGIN"), statement("COMMIT")
        insert = insert_record("claimed", 1, clock.now, returning=self.dialect != "mysql")
        self._claim = statement(insert)
        # The producer's record, written before the message is sent: queued, attempt 0, claimed_at the time it was
        # sent. A run claims it as a new key (take_over on its token); a known key gets no second record.
        self._enqueue = statement(insert_record("queued", 0, clock.now, returning=self.dialect != "mysql"))
        # On PostgreSQL one statement claims or, when the key is known, reads the record: a duplicate costs one
        # round trip. (SQLite claims, then reads.)
        self._claim_or_read = statement(
            f"""
            WITH new_claim AS ({insert})
            SELECT true AS claimed, NULL AS status, claim_token, NULL AS payload_fingerprint,
                   NULL::integer AS attempt, NULL::integer AS stale, NULL::float8 AS seconds_left
            FROM new_claim
            UNION ALL
            SELECT false, {RECORD_COLUMNS}, CASE WHEN {clock.stale} THEN 1 ELSE 0 END, ({clock.seconds_left})::float8
            FROM {TABLE}
            WHERE job_type = :job_type AND operation_key = :key AND NOT EXISTS (SELECT 1 FROM new_claim)
            """
        )
        self._read = statement(
            f"""
            SELECT {RECORD_COLUMNS}, CASE WHEN {clock.stale} THEN 1 ELSE 0 END, {clock.seconds_left}
            FROM {TABLE}
            WHERE job_type = :job_type AND operation_key = :key
            """
        )
        self._complete = statement(
            f"""
            UPDATE {TABLE} SET status = 'completed', completed_at = {clock.now}
            WHERE job_type = :job_type AND operation_key = :key AND claim_token = :token AND {claimed}
            """
        )
        self._take_over = statement(
            f"""
            UPDATE {TABLE}
            SET claim_token = :token, attempt = attempt + 1, status = 'claimed', claimed_at = {clock.now},
                note = COALESCE(:note, note)
            WHERE job_type = :job_type AND operation_key = :key AND claim_token = :old_token
              AND ({queued} OR {released} OR ({claimed} AND {clock.stale}))
            """
        )
        self._settle_stale = statement(
            f"""
            UPDATE {TABLE} SET status = :status, note = :note
            WHERE job_type = :job_type AND operation_key = :key AND claim_token = :token
              AND {claimed} AND {clock.stale}
            """
        )
        self._age = statement(
            f"""
            UPDATE {TABLE} SET claimed_at = {clock.moved_back}
            WHERE job_type = :job_type AND operation_key = :key
            """
        )
        self._release = statement(
            f"""
            UPDATE {TABLE} SET status = 'released', note = :note
            WHERE job_type = :job_type AND operation_key = :key AND claim_token = :token AND {claimed}
            """
        )
        # The queue gave up on the operation (its retries spent): failed, for a person, with the last error. From
        # released (the effect raised) or queued (a same-database effect's claim rolled back with it); a delivery
        # that found no record writes one, so that the failure is seen.
        self._fail = statement(
            f"""
            INSERT INTO {TABLE} AS known
                (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt, claimed_at, note)
            VALUES (:job_type, :key, :fingerprint, :payload, 'failed', :token, 0, {clock.now}, :note)
            ON CONFLICT (job_type, operation_key) DO UPDATE SET status = 'failed', note = excluded.note
            WHERE {failing_known}
            """
        )
        # The sweeper's re-send: records still queued after :seconds (the broker may have lost their message), the
        # oldest first, up to :limit; each is sent again with its clock reset, so the next sweep waits as long again.
        self._resend_queued = statement(
            f"""
            UPDATE {TABLE} SET claimed_at = {clock.now}
            WHERE job_type = :job_type AND {queued} AND claimed_at < {clock.seconds_ago} AND operation_key IN (
                SELECT operation_key FROM {TABLE}
                WHERE job_type = :job_type AND status = 'queued' AND claimed_at < {clock.seconds_ago}
                ORDER BY claimed_at
                LIMIT :limit
            )
            RETURNING operation_key, payload
            """
        )
        # the sweeper's question, answered from the partial index of claimed rows, oldest first
        self._stale_claims = statement(
            f"""
            SELECT operation_key, payload, {RECORD_COLUMNS}, 1, {clock.seconds_left} FROM {TABLE}
            WHERE job_type = :job_type AND status = 'claimed' AND {clock.stale}
            ORDER BY claimed_at
            LIMIT :limit
            """
        )
        # The sweeper's settlement under a policy that performs nothing (hold, skip): the oldest stale claims, up to
        # :limit, in one statement; each row is checked again as it is changed (still claimed, still older than the
        # lease), so a claim that a redelivery took over or settled meanwhile stays as the redelivery left it.
        self._settle_stale_batch = statement(
            f"""
            UPDATE {TABLE} SET status = :status, note = :note
            WHERE job_type = :job_type AND {claimed} AND {clock.stale} AND operation_key IN (
                SELECT operation_key FROM {TABLE}
                WHERE job_type = :job_type AND status = 'claimed' AND {clock.stale}
                ORDER BY claimed_at
                LIMIT :limit
            )
            RETURNING operation_key
            """
        )
        self._held_operations = statement(
            f"""
            SELECT operation_key, status, attempt, {clock.shown.format(column="claimed_at")} AS claimed_at, note,
                   payload
            FROM {TABLE}
            WHERE job_type = :job_type AND status IN ('held', 'failed')
            ORDER BY {TABLE}.claimed_at
            """
        )
        # A person's resolve, in one transaction: the audit row, copied from the record while it waits for a person
        # (and locking it: a second person's resolve then finds it resolved), then the record's change.
        self._audit = statement(
            f"""
            INSERT INTO {RESOLUTIONS_TABLE}
                (job_type, operation_key, resolved_at, resolved_by, resolved_as, database_role,
                 status_before, status_after, why)
            SELECT job_type, operation_key, {clock.now}, :by, :resolved_as, {clock.role}, status, :status, :why
            FROM {TABLE}
            WHERE job_type = :job_type AND operation_key = :key AND {for_a_person}{clock.for_update}
            RETURNING status_before, database_role
            """
        )
        self._resolve = statement(
            f"""
            UPDATE {TABLE}
            SET status = :status,
                completed_at = CASE WHEN :done = 1 THEN {clock.now} ELSE completed_at END,
                claimed_at = CASE WHEN :done = 1 THEN claimed_at ELSE {clock.now} END,
                resolved_by = :by, resolved_at = {clock.now},
                note = {clock.note_and_why}
            WHERE job_type = :job_type AND operation_key = :key AND {for_a_person}
            {"" if self.dialect == "mysql" else "RETURNING payload"}
            """
        )
        self._resolutions = statement(
            f"""
            SELECT operation_key, {clock.shown.format(column="resolved_at")} AS resolved_at, resolved_by,
                   resolved_as, database_role, status_before, status_after, why
            FROM {RESOLUTIONS_TABLE}
            WHERE job_type = :job_type AND (operation_key = :key OR :key IS NULL)
            ORDER BY {RESOLUTIONS_TABLE}.resolved_at
            """
        )
        # Retention walks the unique index in slices of :batch keys: each slice is a short statement of its own,
        # and the whole walk reads each entry once, whatever the share of old completed rows.
        self._slice_end = statement(
            f"""
            SELECT max(operation_key) FROM (
                SELECT operation_key FROM {TABLE}
                WHERE job_type = :job_type AND operation_key > :after
                ORDER BY operation_key
                LIMIT :batch
            ) AS slice
            """
        )
        self._vacuum = statement(f"VACUUM {TABLE}")
        self._delete_completed = statement(
            f"""
            DELETE FROM {TABLE}
            WHERE job_type = :job_type AND operation_key > :after AND operation_key <= :upto
              AND status = 'completed' AND completed_at < {clock.days_ago}
            """
        )

        if self.dialect == "mysql":
            self._mysql_statements(statement, claimed, queued, for_a_person)

    def _mysql_statements(
        self, statement: Callable[[str], Statement], claimed: str, queued: str, for_a_person: str
    ) -> None:
        """MySQL's and MariaDB's forms of the statements that return rows or resolve a conflict in one statement
        elsewhere: no RETURNING (MariaDB's INSERT ... RETURNING is not MySQL's), no ON CONFLICT, no subquery on the
        table an UPDATE changes. What a statement would return is read first, from rows locked until the
        transaction ends, then changed by key."""
        clock = self.clock
        # The record another run wrote, as committed now: inside a transaction a plain SELECT reads the snapshot
        # that REPEATABLE READ (MySQL's default) took at the transaction's first read, which may predate it.
        self._read_latest = statement(self._read.clause.text + " LOCK IN SHARE MODE")
        self._fail = statement(
            f"""
            INSERT INTO {TABLE}
                (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt, claimed_at, note)
            VALUES (:job_type, :key, :fingerprint, :payload, 'failed', :token, 0, {clock.now}, :note)
            """
        )
        self._fail_known = statement(
            f"""
            UPDATE {TABLE} SET status = 'failed', note = :note
            WHERE job_type = :job_type AND operation_key = :key AND {FAILING.format(status=clock.status)}
            """
        )
        self._queued_due = statement(
            f"""
            SELECT operation_key, payload FROM {TABLE}
            WHERE job_type = :job_type AND status = 'queued' AND claimed_at < {clock.seconds_ago}
            ORDER BY claimed_at, operation_key
            LIMIT :limit{clock.for_update}
            """
        )
        self._resend_keys = f"""
            UPDATE {TABLE} SET claimed_at = {clock.now}
            WHERE job_type = :job_type AND {queued} AND operation_key IN {KEYS}
        """
        self._stale_due = statement(
            f"""
            SELECT operation_key FROM {TABLE}
            WHERE job_type = :job_type AND status = 'claimed' AND {clock.stale}
            ORDER BY claimed_at, operation_key
            LIMIT :limit{clock.for_update}
            """
        )
        self._settle_keys = f"""
            UPDATE {TABLE} SET status = :status, note = :note
            WHERE job_type = :job_type AND {claimed} AND {clock.stale} AND operation_key IN {KEYS}
        """
        self._waiting = statement(
            f"""
            SELECT status, {clock.role}, payload FROM {TABLE}
            WHERE job_type = :job_type AND operation_key = :key AND {for_a_person}{clock.for_update}
            """
        )
        self._audit = statement(
            f"""
            INSERT INTO {RESOLUTIONS_TABLE}
                (job_type, operation_key, resolved_at, resolved_by, resolved_as, database_role,
                 status_before, status_after, why)
            VALUES (:job_type, :key, {clock.now}, :by, :resolved_as, :role, :status_before, :status, :why)
            """
        )

    def _by_keys(self, sql: str, keys: list[str], params: dict[str, Any]) -> Any:
        """Runs `sql` (MySQL's) on the rows of `keys`, which the transaction has locked: one placeholder a key."""
        names = [f"key_{number}" for number in range(len(keys))]
        built = Statement.build(sql.replace(KEYS, f"({', '.join(f':{name}' for name in names)})"), self.engine.dialect)
        return self._run(built, params | dict(zip(names, keys, strict=True)))

    def _in_transaction(self) -> bool:
        return getattr(self._local, "transaction", None) is not None

    def _insert(self, statement: Statement, params: dict[str, Any], conn: Connection | None = None) -> bool:
        """Runs an INSERT of a new record: whether it was written (False: the key has a record already)."""
        if self.dialect != "mysql":
            return self._run(statement, params, conn).fetchone() is not None
        try:
            self._run(statement, params, conn)
        except exc.IntegrityError as error:
            if is_duplicate_key(error):
                return False
            raise
        return True

    def _held(self) -> HeldConnection:
        held: HeldConnection | None = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid() or not held.alive():
            # A write that met a lost connection is never sent again (_run); one lost while idle is found here,
            # before anything is sent on it.
            self.close()
            held = self._local.held = self._open()
        return held

    def _open(self) -> HeldConnection:
        pooled = None
        try:
            pooled = self.engine.raw_connection()
            # Out of the pool for good: this thread keeps it, and closing it closes it.
            pooled.detach()
            if self.dialect == "sqlite":
                pooled.dbapi_connection.isolation_level = None
            elif self.dialect == "mysql":
                pooled.dbapi_connection.autocommit(True)  # PyMySQL's is a method, and a round trip
            else:
                pooled.dbapi_connection.autocommit = True
        except self._dbapi.Error as error:
            if pooled is not None:
                with contextlib.suppress(Exception):
                    pooled.close()
            raise exc.DBAPIError.instance(None, None, error, self._dbapi.Error, dialect=self.engine.dialect) from error
        return HeldConnection(pooled)

    def close(self) -> None:
        """Closes the calling thread's connection (the next call opens another)."""
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None:
            held.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction on the calling thread's connection: the store's statements run in it meanwhile, and a
        same-database effect's through the SQLAlchemy Connection it yields, over that same connection. It commits
        at the end, or rolls back when anything raised. No pool checkout, no second connection: BEGIN and COMMIT
        are the only statements it adds."""
        self._run(self._begin, {})
        held = self._local.transaction = self._local.held
        try:
            yield Connection(self.engine, held.pooled)
            self._run(self._commit, {})
        except BaseException:
            # a connection lost on the way was closed where it was found: its transaction went with it
            if held is self._local.held:
                try:
                    held.cursor.execute("ROLLBACK")
                except self._dbapi.Error:
                    self.close()
            raise
        finally:
            self._local.transaction = None

    def _run(
        self, statement: Statement, params: dict[str, Any], conn: Connection | None = None, *, read: bool = False
    ) -> Any:
        """Runs one statement in `conn`, or on the calling thread's connection; what it returned, to fetch from.

        A statement that changes something is never run again after a failure: whether it committed is unknown,
        and the queue's retry decides. A read is, once, when its connection had been lost (closed by the server
        while idle, cut by a proxy): it changes nothing. Not inside a transaction, which the lost connection ended.
        """
        if conn is not None:
            return conn.execute(statement.clause, params)
        try:
            return self._execute(statement, params)
        except exc.DBAPIError as error:
            if not (read and error.connection_invalidated) or getattr(self._local, "transaction", None):
                raise
        return self._execute(statement, params)

    def _execute(self, statement: Statement, params: dict[str, Any]) -> Any:
        # in a transaction, its connection and no other: a replacement would run the statement outside it
        held = getattr(self._local, "transaction", None) or self._held()
        try:
            held.cursor.execute(statement.sql, statement.parameters(params))
        except self._dbapi.Error as error:
            # The server or the network failed: this connection is done, and the next call opens another. The
            # error goes up as SQLAlchemy's, as the queue's retry expects it.
            lost = isinstance(error, (self._dbapi.OperationalError, self._dbapi.InterfaceError))
            lost = lost or self.engine.dialect.is_disconnect(error, held.connection, held.cursor)
            if lost:
                self.close()
            raise exc.DBAPIError.instance(
                statement.sql,
                params,
                error,
                self._dbapi.Error,
                connection_invalidated=lost,
                dialect=self.engine.dialect,
            ) from error
        return held.cursor

    def claim(self, key: str, payload_fingerprint: str, details: Mapping[str, Any] | str) -> str | None:
        """The new claim's token when this run owns the work; None when a record exists already. `details` may be
        given encoded (encode_details)."""
        params = new_record(key, payload_fingerprint, details)
        return params["token"] if self._insert(self._claim, params) else None

    def enqueue(
        self, key: str, payload_fingerprint: str, details: Mapping[str, Any] | str, conn: Connection | None = None
    ) -> bool:
        """Writes the record of an operation the app asks for, as `queued`, before its message is sent; in `conn`
        (the app's transaction) when given. False when the key has a record already (nothing written)."""
        params = new_record(key, payload_fingerprint, details)
        return self._insert(self._enqueue, params, conn)

    def claim_or_read(
        self, key: str, payload_fingerprint: str, details: Mapping[str, Any] | str
    ) -> str | Record | None:
        """The new claim's token when this run owns the work; else the record another run left.

        On PostgreSQL one statement does both, so a duplicate costs one round trip; on MySQL and MariaDB, outside a
        transaction, the read comes first (each statement reads what is committed then), and a duplicate costs one
        round trip too. None when the record vanished between the two steps (its claim rolled back).
        """
        if self.dialect == "mysql" and not self._in_transaction():
            record = self.read(key)
            if record is not None:
                return record
        if self.dialect != "postgresql":
            token = self.claim(key, payload_fingerprint, details)
            return token if token is not None else self.read(key)
        params = new_record(key, payload_fingerprint, details)
        row = self._run(self._claim_or_read, params).fetchone()
        if row is None:
            # the other run's row committed after this statement's snapshot: read it now
            return self.read(key)
        if row[0]:
            return params["token"]
        return _record(row[1:])

    def read(self, key: str) -> Record | None:
        latest = self.dialect == "mysql" and self._in_transaction()
        row = self._run(self._read_latest if latest else self._read, {"job_type": JOB_TYPE, "key": key}, read=True)
        row = row.fetchone()
        return _record(row) if row is not None else None

    def complete(self, key: str, token: str) -> bool:
        """Marks the claim completed; False when this run no longer holds it (it was taken over or held)."""
        params = {"job_type": JOB_TYPE, "key": key, "token": token}
        return bool(self._run(self._complete, params).rowcount == 1)

    def take_over(self, key: str, old_token: str, note: str | None) -> str | None:
        """A new token when this run wins the compare-and-swap on a queued record, or a stale or released claim;
        else None. `note` replaces the record's note (None keeps it)."""
        token = str(uuid.uuid4())
        params = {"job_type": JOB_TYPE, "key": key, "old_token": old_token, "token": token, "note": note}
        return token if self._run(self._take_over, params).rowcount == 1 else None

    def settle_stale(self, key: str, token: str, status: str, note: str) -> bool:
        """Moves a stale claim to `held` or `abandoned`, if it is still that claim and still stale."""
        if status not in ("held", "abandoned"):
            raise ValueError(f"a stale claim is held or abandoned, not {status}")
        params = {"job_type": JOB_TYPE, "key": key, "token": token, "status": status, "note": note}
        return bool(self._run(self._settle_stale, params).rowcount == 1)

    def settle_stale_batch(self, status: str, note: str, limit: int = 100) -> list[str]:
        """Moves up to `limit` of the oldest stale claims to `held` or `abandoned`, in one statement; their keys."""
        if status not in ("held", "abandoned"):
            raise ValueError(f"a stale claim is held or abandoned, not {status}")
        params = {"job_type": JOB_TYPE, "status": status, "note": note, "limit": limit}
        if self.dialect != "mysql":
            return [key for (key,) in self._run(self._settle_stale_batch, params).fetchall()]
        with self.transaction():
            keys = [key for (key,) in self._run(self._stale_due, params).fetchall()]
            if keys:  # locked since they were read: each is still claimed and stale
                self._by_keys(self._settle_keys, keys, params)
        return keys

    def age(self, key: str, seconds: float) -> bool:
        """Moves the claim back by `seconds`, on the database's clock: never the job's; the try-out and the replay
        suite let a lease run out this way."""
        params = {"job_type": JOB_TYPE, "key": key, "seconds": seconds}
        return bool(self._run(self._age, params).rowcount == 1)

    def release(self, key: str, token: str, note: str) -> bool:
        """Gives up this run's claim after its effect failed, so that the queue's retry may claim it again."""
        params = {"job_type": JOB_TYPE, "key": key, "token": token, "note": note}
        return bool(self._run(self._release, params).rowcount == 1)

    def fail(self, key: str, details: Mapping[str, Any] | str, note: str) -> bool:
        """The queue gave up on this operation after its last retry: `failed`, for a person, with `note` (the last
        error). From released or queued, or a new record when there was none; False when another run holds it."""
        params = new_record(key, fingerprint(key, details), details) | {"note": note}
        if self.dialect != "mysql":
            return bool(self._run(self._fail, params).rowcount == 1)
        return self._insert(self._fail, params) or self._run(self._fail_known, params).rowcount == 1

    def resend_queued(self, older_than_seconds: float, limit: int = 100) -> list[tuple[str, dict[str, Any]]]:
        """(key, details) of up to `limit` records queued longer than `older_than_seconds`, oldest first, their
        clock reset: the caller sends each message again."""
        params = {"job_type": JOB_TYPE, "seconds": older_than_seconds, "limit": limit}
        if self.dialect == "mysql":
            with self.transaction():
                rows = self._run(self._queued_due, params).fetchall()
                if rows:
                    self._by_keys(self._resend_keys, [key for key, _ in rows], {"job_type": JOB_TYPE})
        else:
            rows = self._run(self._resend_queued, params).fetchall()
        return [(key, json.loads(payload or "{}")) for key, payload in rows]

    def states(self, due: Mapping[str, float]) -> dict[str, tuple[int, float, int]]:
        """For each status that has records: how many, the oldest one's age in seconds (since its completion, else
        its claim, or its send while queued), and how many are older than `due` gives that status (none when it
        gives none)."""
        params: dict[str, Any] = {"job_type": JOB_TYPE}
        cases = ""
        for number, (status, seconds) in enumerate(due.items()):
            params |= {f"status_{number}": status, f"seconds_{number}": seconds}
            cases += f" WHEN :status_{number} THEN {self.clock.seconds_ago.replace(':seconds', f':seconds_{number}')}"
        overdue = f"sum(CASE WHEN claimed_at < (CASE status{cases} END) THEN 1 ELSE 0 END)" if cases else "0"
        sql = f"SELECT status, count(*), {self.clock.oldest_age}, {overdue} FROM {TABLE} WHERE job_type = :job_type"
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                # a question about the whole table: reading it through is the best plan
                conn.execute(text("SET LOCAL enable_seqscan = on"))
            rows = conn.execute(text(sql + " GROUP BY status"), params).fetchall()
        return {status: (int(count), float(age), int(late or 0)) for status, count, age, late in rows}

    def schema_problem(self) -> str | None:
        """What keeps the kit from using DATABASE_URL, as one line saying what to do: the record table missing or
        not at the latest revision (0004), a failed login. None when it can be used, or when the database cannot be
        reached now (that passes: the queue retries)."""
        try:
            with self.engine.connect() as conn:
                if self.engine.dialect.name == "postgresql":
                    check, resolutions = conn.execute(
                        text(
                            "SELECT coalesce(pg_get_constraintdef(c.oid), ''), to_regclass(:resolutions) IS NOT NULL"
                            " FROM (SELECT to_regclass(:table) AS t) r"
                            " LEFT JOIN pg_constraint c ON c.conrelid = r.t AND c.conname = :name WHERE r.t IS NOT NULL"
                        ),
                        {"table": TABLE, "name": f"{TABLE}_status", "resolutions": RESOLUTIONS_TABLE},
                    ).one_or_none() or (None, False)
                elif self.dialect == "mysql":
                    check, resolutions = conn.execute(
                        text(
                            "SELECT coalesce((SELECT check_clause FROM information_schema.check_constraints"
                            "  WHERE constraint_schema = DATABASE() AND constraint_name = :name), ''),"
                            " EXISTS (SELECT 1 FROM information_schema.tables"
                            "  WHERE table_schema = DATABASE() AND table_name = :resolutions)"
                            " FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = :table"
                        ),
                        {"table": TABLE, "name": f"{TABLE}_status", "resolutions": RESOLUTIONS_TABLE},
                    ).one_or_none() or (None, False)
                else:
                    tables = dict(
                        conn.execute(
                            text("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (:t, :r)"),
                            {"t": TABLE, "r": RESOLUTIONS_TABLE},
                        ).all()
                    )
                    check, resolutions = tables.get(TABLE), RESOLUTIONS_TABLE in tables
        except exc.DBAPIError as error:
            return person_needed(error)
        if check is None:
            return f"the table {TABLE} does not exist: {MIGRATE} first"
        if "queued" not in check:
            return f"the table {TABLE} is not at revision 0003 (no queued or failed records): {MIGRATE} first"
        if not resolutions:
            return f"the table {TABLE} is not at revision 0004 (no {RESOLUTIONS_TABLE}): {MIGRATE} first"
        return None

    def stale_claims(self, limit: int = 100) -> list[tuple[str, dict[str, Any]]]:
        """(key, the message's details) of claims older than the lease, oldest first."""
        return [(key, details) for key, details, _ in self.stale_records(limit)]

    def stale_records(self, limit: int = 100) -> list[tuple[str, dict[str, Any], Record]]:
        """(key, the message's details, the record) of claims older than the lease, oldest first: what the sweeper
        needs to apply the policy, whose guarded statement finds out whether a redelivery got there since."""
        rows = self._run(self._stale_claims, {"job_type": JOB_TYPE, "limit": limit}, read=True).fetchall()
        return [(row[0], json.loads(row[1] or "{}"), _record(row[2:])) for row in rows]

    def held(self) -> list[HeldOperation]:
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                # the one question about the whole table: for it, reading the table through is the best plan
                conn.execute(text("SET LOCAL enable_seqscan = on"))
            rows = self._run(self._held_operations, {"job_type": JOB_TYPE}, conn).fetchall()
        # the details as a person reads them, whichever way they were encoded
        return [
            HeldOperation(key, status, attempt, claimed_at, note, json.dumps(json.loads(payload or "{}")))
            for key, status, attempt, claimed_at, note, payload in rows
        ]

    def resolve(self, key: str, *, done: bool, by: str, why: str, resolved_as: str) -> Resolution | None:
        """A person's decision on a held or failed operation: done (completed), or one more attempt (queued again,
        for the caller to send its message with the details returned). `by` is the name the person gave,
        `resolved_as` who the system knows them as (the OS user of a command, the app's user of a page); the
        database adds its own role. The record and the audit row change together. None when no such operation
        waits."""
        status = "completed" if done else "queued"
        params = {"job_type": JOB_TYPE, "key": key, "status": status, "done": 1 if done else 0, "by": by, "why": why}
        with self.transaction():
            if self.dialect == "mysql":
                waiting = self._run(self._waiting, params).fetchone()
                if waiting is None:
                    return None
                before, role, payload = waiting
                audit = {**params, "resolved_as": resolved_as, "role": role, "status_before": before}
                self._run(self._audit, audit)
                self._run(self._resolve, params)
            else:
                audited = self._run(self._audit, {**params, "resolved_as": resolved_as}).fetchone()
                if audited is None:
                    return None
                (payload,) = self._run(self._resolve, params).fetchone()
                before, role = audited
        return Resolution(before, status, role, json.loads(payload or "{}"))

    def resolutions(self, key: str | None = None) -> list[tuple[Any, ...]]:
        """Every resolution of `key` (None: of every key), oldest first: key, when, by, as, database role, status
        before and after, why."""
        return [tuple(row) for row in self._run(self._resolutions, {"job_type": JOB_TYPE, "key": key}, read=True)]

    def retain(self, older_than_days: int, batch: int = 10_000) -> int:
        """Deletes the completed records completed more than `older_than_days` days ago (the database's clock), in
        batches of up to `batch` keys, each a statement of its own; how many it deleted. The caller checks that
        the age outlasts every redelivery (operations.py retain)."""
        deleted, after = 0, ""
        while True:
            params: dict[str, Any] = {"job_type": JOB_TYPE, "after": after, "batch": batch}
            upto = self._run(self._slice_end, params, read=True).fetchone()[0]
            if upto is None:
                break
            params = {"job_type": JOB_TYPE, "after": after, "upto": upto, "days": older_than_days}
            deleted += self._run(self._delete_completed, params).rowcount
            after = upto
        if deleted and self.engine.dialect.name == "postgresql":
            # the freed space is reused by new rows from now on, rather than after autovacuum comes by
            self._run(self._vacuum, {})
        return deleted


def _store_on_database_url() -> ClaimStore:
    return ClaimStore(connect())


# What default_store makes: a store on DATABASE_URL, or in a Django project the kit's Django app's store, on
# Django's own connection (django_app/apps.py says so through use_default_store).
_make_default_store: Callable[[], ClaimStore] = _store_on_database_url


@functools.cache
def default_store() -> ClaimStore:
    """The store of this process, made once: on DATABASE_URL, or on Django's connection (use_default_store)."""
    return _make_default_store()


def use_default_store(make: Callable[[], ClaimStore]) -> None:
    """From now on default_store() is `make`'s store (the kit's Django app calls it when Django is ready)."""
    global _make_default_store
    _make_default_store = make
    default_store.cache_clear()
