{%- set slug = cookiecutter.project_slug -%}
"""The claim runtime's own promises, beyond the seven cases: the plans the database uses for it whatever its
statistics, a held connection replaced after a fault, threads and forked processes, the fingerprint that earlier
records were written with, and processes opening a new SQLite file at the same moment."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TABLE, Records
from sqlalchemy import Engine, TextClause, exc, text
from test_operations import schema_sql_statements
from test_replay import DETAILS, KEY

from {{ slug }} import settings
from {{ slug }}.claims import (
    CLAIMED,
    ClaimStore,
    Record,
    Statement,
    connect,
    default_store,
    encode_details,
    fingerprint,
)

JOB_TYPE = settings.JOB_TYPE
# enough rows that reaching one key by any other way than the unique index would cost something
COMPLETED_ROWS = 20_000
CLAIMED_ROWS = 2_000
UNIQUE_INDEX = {
    "postgresql": f"{TABLE}_operation",
    "mysql": f"{TABLE}_operation",
    "sqlite": f"sqlite_autoindex_{TABLE}_1",
}
# Where the tests that fork run (run_alone): a process started by a server that runs no other thread (this module
# loaded there once). A child forked from the suite's process can inherit a lock that another thread held at
# that instant (the embedded worker's thread inside SQLite's allocator, say) and wait for it forever.
FRESH = multiprocessing.get_context("forkserver")
FRESH.set_forkserver_preload([__name__])


def fill(engine: Engine, status: str, rows: int, prefix: str) -> None:
    """`rows` records of `status`, claimed and completed now, in one statement (MySQL: in one batch)."""
    now = ClaimStore(engine).clock.now
    completed_at = now if status == "completed" else "NULL"
    if engine.dialect.name in ("mysql", "mariadb"):
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"""INSERT INTO {TABLE} (job_type, operation_key, payload_fingerprint, payload, status,
                                             claim_token, attempt, claimed_at, completed_at)
                        VALUES (:job_type, :key, :fingerprint, :payload, :status, :key, 1, {now}, {completed_at})"""
                ),
                [
                    {"job_type": JOB_TYPE, "key": f"{prefix}{n}", "fingerprint": "0" * 64, "payload": "{}"}
                    | {"status": status}
                    for n in range(1, rows + 1)
                ],
            )
        return
    numbers = (
        "generate_series(1, :rows) AS n"
        if engine.dialect.name == "postgresql"
        else "(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :rows) SELECT n FROM s)"
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                f"""INSERT INTO {TABLE} (job_type, operation_key, payload_fingerprint, payload, status, claim_token,
                                         attempt, claimed_at, completed_at)
                    SELECT :job_type, :prefix || n, :fingerprint, :payload, :status, :prefix || n, 1,
                           {now}, {completed_at}
                    FROM {numbers}"""
            ),
            {
                "job_type": JOB_TYPE,
                "prefix": prefix,
                "fingerprint": "0" * 64,
                "payload": "{}",
                "status": status,
                "rows": rows,
            },
        )


def analyze(engine: Engine, vacuum: bool = False) -> None:
    """Statistics taken now, as autovacuum (PostgreSQL) or a person (SQLite's ANALYZE) would take them; `vacuum`:
    first the space of deleted rows is freed (PostgreSQL), so that an empty table has no pages, as a new one."""
    command = {"postgresql": "VACUUM ANALYZE" if vacuum else "ANALYZE", "mysql": "ANALYZE TABLE", "sqlite": "ANALYZE"}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"{command[ClaimStore(engine).dialect]} {TABLE}"))


def plan(store: ClaimStore, statement: Statement, **params: object) -> str:
    """The plan the store's own connection chooses for `statement` with these values. MySQL's reads "access <type>
    key <index>" for each table it reads: access ALL is a scan of the table."""
    explain = "EXPLAIN QUERY PLAN " if store.dialect == "sqlite" else "EXPLAIN "
    rows = store._run(Statement.build(explain + statement.clause.text, store.engine.dialect), dict(params))
    if store.dialect == "mysql":
        columns = [column[0] for column in rows.description]
        return "\n".join(
            f"access {row[columns.index('type')]} key {row[columns.index('key')]}" for row in rows.fetchall()
        )
    return "\n".join(str(row[-1]) for row in rows.fetchall())


def assert_unique_index_only(plans: dict[str, str], dialect: str) -> None:
    for name, found in plans.items():
        assert UNIQUE_INDEX[dialect] in found, f"{name}: {found}"
        assert f"{TABLE}_claimed" not in found and f"{TABLE}_queued" not in found, f"{name}: {found}"
        assert "Seq Scan" not in found and "SCAN " not in found and "access ALL" not in found, f"{name}: {found}"


def key_plans(store: ClaimStore) -> dict[str, str]:
    """The plans of every statement that reads or changes one key: duplicates and the guarded updates."""
    key, token = "PLAN-CLAIMED-7", "PLAN-CLAIMED-7"
    on_key = {"job_type": JOB_TYPE, "key": key}
    new_claim = on_key | {"fingerprint": "0" * 64, "payload": "{}", "token": "t"}
    plans = {
        "read": plan(store, store._read, **on_key),
        "complete": plan(store, store._complete, **on_key, token=token),
        "release": plan(store, store._release, **on_key, token=token, note="n"),
        "settle_stale": plan(store, store._settle_stale, **on_key, token=token, status="held", note="n"),
        "take_over": plan(store, store._take_over, **on_key, old_token=token, token="t", note="n"),
        "resolve": plan(store, store._resolve, **on_key, status="completed", done=1, by="b", why="w"),
    }
    if store.engine.dialect.name == "postgresql":
        # (SQLite plans no search for an INSERT: its conflict is found through the unique index all the same)
        plans["claim_or_read"] = plan(store, store._claim_or_read, **new_claim)
        plans["fail"] = plan(store, store._fail, **new_claim, note="n")
    return plans


def test_duplicates_and_guarded_updates_go_through_the_unique_index_whatever_the_statistics(
    engine: Engine, records: Records
) -> None:
    store = ClaimStore(connect())
    dialect = engine.dialect.name
    try:
        fill(engine, "completed", COMPLETED_ROWS, "PLAN-COMPLETED-")
        # statistics taken while nothing was claimed, the normal state of a busy table; then a backlog of claims
        analyze(engine)
        fill(engine, "claimed", CLAIMED_ROWS, "PLAN-CLAIMED-")
        assert_unique_index_only(key_plans(store), dialect)
        if dialect == "postgresql":
            # the same guard written plainly: the planner, told that nothing is claimed, walks every claimed row
            guard = CLAIMED.format(status=store.clock.status)
            plain = Statement.build(store._complete.clause.text.replace(guard, "status = 'claimed'"), engine.dialect)
            on_key = {"job_type": JOB_TYPE, "key": "PLAN-CLAIMED-7", "token": "PLAN-CLAIMED-7"}
            assert f"{TABLE}_claimed" in plan(store, plain, **on_key)
        # fresh statistics, which know the backlog
        analyze(engine)
        assert_unique_index_only(key_plans(store), dialect)
        # the sweeper's question is the one answered from the partial index; its settlement of a batch reads no
        # more than that batch
        stale = plan(store, store._stale_claims, job_type=JOB_TYPE, limit=100)
        assert f"{TABLE}_claimed" in stale, stale
        # (MySQL: the batch is read and locked first, then changed by key)
        batch = store._stale_due if store.dialect == "mysql" else store._settle_stale_batch
        settle = plan(store, batch, job_type=JOB_TYPE, status="held", note="n", limit=100)
        assert "Seq Scan" not in settle and "SCAN " not in settle and "access ALL" not in settle, settle
    finally:
        store.close()
        records.clear()
        analyze(engine)


def kept_plan(engine: Engine, records: Records, *settings_sql: str) -> str:
    """The plan a new connection of the kit keeps for a duplicate, made while the table was empty and analyzed
    (`settings_sql` run first on that connection), once the table has rows."""
    store = ClaimStore(connect())
    encoded = encode_details(DETAILS)
    try:
        records.clear()
        analyze(engine, vacuum=True)
        for sql in settings_sql:
            store._run(Statement.build(sql, engine.dialect), {})
        for _ in range(10):
            assert store.claim_or_read(KEY, fingerprint(KEY, encoded), encoded) is not None
        fill(engine, "completed", COMPLETED_ROWS, "PLAN-COMPLETED-")
        if engine.dialect.name != "postgresql":
            # SQLite plans a statement when it prepares it, from its statistics, and MySQL each time it runs one
            # (PyMySQL prepares none): the same promise, checked there
            return plan(store, store._read, job_type=JOB_TYPE, key=KEY)
        by_name = "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%new_claim%'"
        (name,) = store._run(Statement.build(by_name, engine.dialect), {}).fetchone()
        values = ", ".join(f"'{value}'" for value in (JOB_TYPE, KEY, "0" * 64, "{}", "t"))
        kept = store._run(Statement.build(f"EXPLAIN EXECUTE {name}({values})", engine.dialect), {})
        return "\n".join(row[0] for row in kept.fetchall())
    finally:
        store.close()
        records.clear()
        analyze(engine)


def test_a_duplicate_stays_an_index_lookup_after_statistics_taken_on_an_empty_table(
    engine: Engine, records: Records
) -> None:
    """psycopg prepares a statement after 5 runs, and PostgreSQL may then keep one generic plan for the
    connection's life: made while the table was empty, it must still be an index lookup at 20,000 rows."""
    # the generic plan, made at once rather than after five custom ones, while the table is empty
    generic = ["SET plan_cache_mode = force_generic_plan"] if engine.dialect.name == "postgresql" else []
    assert_unique_index_only({"claim_or_read": kept_plan(engine, records, *generic)}, engine.dialect.name)
    if engine.dialect.name == "postgresql":
        # what the kit's connections are kept from (claims.connect): that plan would scan the table
        assert "Seq Scan" in kept_plan(engine, records, *generic, "SET enable_seqscan = on")


def server_process(store: ClaimStore, connection: Any) -> tuple[int, TextClause, TextClause]:
    """The server's process behind a driver's connection (MySQL's and MariaDB's thread), the statement that ends it,
    and the one that says it is gone."""
    if store.dialect == "mysql":
        gone = "SELECT NOT EXISTS (SELECT 1 FROM information_schema.processlist WHERE id = :pid)"
        return connection.thread_id(), text("KILL :pid"), text(gone)
    gone = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = :pid)"
    return connection.info.backend_pid, text("SELECT pg_terminate_backend(:pid)"), text(gone)


def end_idle_connection(store: ClaimStore) -> None:
    """The calling thread's connection of `store` ends while idle: its server process is ended, and gone
    (PostgreSQL, MySQL, MariaDB), or it is closed under the store (SQLite has no server)."""
    held = store._held()
    if store.dialect == "sqlite":
        held.connection.close()
        return
    pid, end, gone = server_process(store, held.connection)
    with store.engine.connect() as conn:
        conn.execute(end, {"pid": pid})
        # the ended process says its last word, then exits: gone, it has said it
        deadline = time.monotonic() + 30
        while not conn.execute(gone, {"pid": pid}).scalar_one():
            assert time.monotonic() < deadline, "the ended server process is still there after 30 s"
            conn.rollback()  # pg_stat_activity is read once per transaction
            time.sleep(0.01)


@contextlib.contextmanager
def connection_lost_during_the_claim(store: ClaimStore, key: str, encoded: str) -> Iterator[None]:
    """The store's next claim of `key` loses its connection midway. PostgreSQL, MySQL and MariaDB: another
    transaction claims `key` first and holds it, the store's claim waits for it, and its server process (thread)
    is ended while it waits. SQLite has no server: the connection is closed under the store."""
    if store.dialect == "sqlite":
        store._held().connection.close()
        yield
        return
    # how often the waiting is looked for: InnoDB refreshes what information_schema.innodb_trx shows only once it has
    # not been read for 0.1 s
    poll = 0.01
    pid, end, _ = server_process(store, store._held().connection)
    if store.dialect == "mysql":
        poll = 0.15
        waiting = text(
            "SELECT count(*) FROM information_schema.innodb_trx"
            " WHERE trx_mysql_thread_id = :pid AND trx_state = 'LOCK WAIT'"
        )
    else:
        waiting = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid AND wait_event_type = 'Lock'")
    # another store on this thread holds the claim in its transaction, which the store's error rolls back
    holder = ClaimStore(store.engine)
    try:
        with holder.transaction(), store.engine.connect() as killer:
            assert holder.claim(key, fingerprint(key, encoded), encoded) is not None

            def terminate_once_waiting() -> None:
                while not killer.execute(waiting, {"pid": pid}).scalar_one():
                    killer.rollback()  # pg_stat_activity is read once per transaction
                    time.sleep(poll)
                killer.execute(end, {"pid": pid})

            terminator = threading.Thread(target=terminate_once_waiting, daemon=True)
            terminator.start()
            try:
                yield
            finally:
                terminator.join(timeout=30)
    finally:
        holder.close()


def test_a_connection_lost_is_replaced_and_a_claim_is_never_silently_run_again(records: Records) -> None:
    store = ClaimStore(connect())
    encoded = encode_details(DETAILS)
    try:
        assert store.read(KEY) is None
        # lost during the claim: whether it committed is unknown, so it fails, for the queue's retry to decide,
        # and is not run again
        with pytest.raises(exc.DBAPIError) as failed, connection_lost_during_the_claim(store, KEY, encoded):
            store.claim(KEY, fingerprint(KEY, encoded), encoded)
        assert failed.value.connection_invalidated
        assert records.status(KEY) == "none"
        # the next call has a new connection
        token = store.claim(KEY, fingerprint(KEY, encoded), encoded)
        assert token is not None and store.complete(KEY, token)
        # a read changes nothing: after a fault it goes again, once, on a new connection
        end_idle_connection(store)
        record = store.read(KEY)
        assert record is not None and record.status == "completed"
        if store.dialect != "sqlite":
            # A connection the server ended while idle (a restart, an outage that has passed) is found before
            # anything is sent on it: the first write after it (the sweeper's, after an outage) goes through.
            end_idle_connection(store)
            assert store.complete(KEY, token) is False  # a guarded write: sent, and refused (completed already)
            end_idle_connection(store)
            assert store.claim("LOST-WHILE-IDLE", fingerprint("LOST-WHILE-IDLE", encoded), encoded) is not None
    finally:
        store.close()


def test_a_claim_lost_in_a_transaction_reads_the_winners_record_not_the_transactions_snapshot(
    records: Records,
) -> None:
    """A same-database effect claims inside a transaction, which may have read the table before (an app's request
    does): under REPEATABLE READ, MySQL's and MariaDB's default, a plain SELECT there reads the snapshot of that
    first read. A claim lost to a run that committed since must read that run's record (a locking read), not find
    none. SQLite cannot write in a transaction whose snapshot is older than the last write: the claim fails, and
    the queue's retry decides."""
    store, rival = ClaimStore(connect()), ClaimStore(connect())
    encoded = encode_details(DETAILS)
    try:
        with store.transaction() as conn:
            # the transaction's first read: its snapshot, on MySQL and MariaDB
            assert conn.execute(text(f"SELECT count(*) FROM {TABLE}")).scalar_one() == 0
            token = rival.claim(KEY, fingerprint(KEY, encoded), encoded)
            assert token is not None
            if store.dialect == "sqlite":
                with pytest.raises(exc.OperationalError, match="locked"):
                    store.claim_or_read(KEY, fingerprint(KEY, encoded), encoded)
                raise RuntimeError("the effect's transaction ends")
            found = store.claim_or_read(KEY, fingerprint(KEY, encoded), encoded)
            assert isinstance(found, Record), f"the claim was lost, and then found no record: {found!r}"
            assert (found.claim_token, found.status) == (token, "claimed")
    except RuntimeError as error:
        assert store.dialect == "sqlite" and str(error) == "the effect's transaction ends"
    finally:
        store.close()
        rival.close()
    assert records.status(KEY) == "claimed"


def test_a_transaction_stays_on_the_threads_connection_and_ends_with_it(records: Records) -> None:
    """What a same-database effect shares with its claim (ClaimStore.transaction): the store's statements and the
    yielded Connection's run in one transaction, which commits at the end and rolls back on an error; and a
    connection lost inside it fails it: no later statement of it, not even a read, runs on a new connection."""
    store = ClaimStore(connect())
    encoded = encode_details(DETAILS)
    status = text(f"SELECT status FROM {TABLE} WHERE job_type = :job_type AND operation_key = :key")
    try:
        with pytest.raises(RuntimeError, match="the effect failed"), store.transaction() as conn:
            assert store.claim(KEY, fingerprint(KEY, encoded), encoded) is not None
            assert conn.execute(status, {"job_type": JOB_TYPE, "key": KEY}).scalar_one() == "claimed"
            raise RuntimeError("the effect failed")
        assert records.status(KEY) == "none"
        with store.transaction():
            token = store.claim(KEY, fingerprint(KEY, encoded), encoded)
            assert token is not None and store.complete(KEY, token)
        assert records.status(KEY) == "completed"
        lost = "LOST-IN-A-TRANSACTION"
        with pytest.raises(exc.DBAPIError) as failed, store.transaction():
            assert store.claim(lost, fingerprint(lost, encoded), encoded) is not None
            end_idle_connection(store)
            store.read(lost)
        assert failed.value.connection_invalidated
        assert records.status(lost) == "none"
        # the next transaction has a new connection
        with store.transaction():
            assert store.claim(lost, fingerprint(lost, encoded), encoded) is not None
        assert records.status(lost) == "claimed"
    finally:
        store.close()


def test_threads_each_hold_a_connection_and_a_forked_child_leaves_its_parents_alone(records: Records) -> None:
    store = default_store()
    encoded = encode_details(DETAILS)
    won: list[str] = []

    def claim_all() -> None:
        for n in range(20):
            key = f"THREADS-{n}"
            if store.claim(key, fingerprint(key, encoded), encoded) is not None:
                won.append(key)

    threads = [threading.Thread(target=claim_all) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == sorted(f"THREADS-{n}" for n in range(20))
    assert records.count("claimed") == 20

    # a child forked while its parent holds a connection opens its own, and leaves the parent's session alone
    run_alone(fork_while_holding, store.engine.url.render_as_string(False))


def run_alone(target: Callable[..., None], *args: object, timeout: float = 300) -> None:
    """Runs `target` in a process of its own, where no other thread runs (FRESH), and fails if it fails there."""
    process = FRESH.Process(target=target, args=args)
    process.start()
    process.join(timeout=timeout)
    if process.exitcode is None:
        process.kill()  # not left for multiprocessing to wait for at exit
    assert process.exitcode == 0, (
        f"{target.__name__}: exit code {process.exitcode} (None: still running after {timeout} s); see its stderr"
    )


def fork_while_holding(url: str) -> None:
    """Holds a connection, forks a child that reads on a connection of its own, then reads on its own still."""
    store = ClaimStore(connect(url))
    assert store.read("THREADS-0") is not None
    child = multiprocessing.get_context("fork").Process(target=store.read, args=("THREADS-1",), daemon=True)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0, f"the forked child ended with {child.exitcode}"
    record = store.read("THREADS-2")
    assert record is not None and record.status == "claimed"


def test_the_fingerprint_is_the_one_earlier_records_were_written_with() -> None:
    details = {"email": "customer@example.com", "lines": [{"sku": "A-1", "qty": 2}], "note": "caf\u00e9", "n": 1.5}
    earlier = json.dumps({"key": KEY, "details": details}, sort_keys=True, separators=(",", ":"))
    assert fingerprint(KEY, details) == hashlib.sha256(earlier.encode()).hexdigest()
    assert fingerprint(KEY, encode_details(details)) == fingerprint(KEY, details)


def open_and_claim(url: str, key: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait(timeout=30)
    store = ClaimStore(connect(url))
    assert store.claim(key, fingerprint(key, "{}"), "{}") is not None


@pytest.mark.embedded_only
def test_processes_opening_a_new_sqlite_file_at_once_all_start(tmp_path: Path) -> None:
    """The switch to WAL happens once per file; processes that meet a file not yet switched all go on."""
    run_alone(open_new_files_at_once, str(tmp_path))


def open_new_files_at_once(folder: str) -> None:
    """Six processes open each of eight new files at the same moment, each claims a key, and all go on."""
    fork = multiprocessing.get_context("fork")
    for trial in range(8):
        path = Path(folder) / f"new-{trial}.sqlite3"
        with sqlite3.connect(path) as db:  # the tables made outside the kit: the file is still in rollback mode
            for statement in schema_sql_statements():
                db.execute(statement)
        barrier = fork.Barrier(6)
        url = f"sqlite:///{path}"
        children = [fork.Process(target=open_and_claim, args=(url, f"K{n}", barrier), daemon=True) for n in range(6)]
        for child in children:
            child.start()
        for child in children:
            child.join(timeout=60)
        assert [child.exitcode for child in children] == [0] * 6
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0] == 6
