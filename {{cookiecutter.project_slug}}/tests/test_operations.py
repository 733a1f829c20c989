{%- set celery = cookiecutter.queue_system == "celery" -%}
"""The producer and the commands (send, status, held, resolve, retain), and the migration against schema.sql: the
same under every policy (what the policy does, by the sweeper and in the try-out, is in test_sweeper.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest
{%- if celery %}
from celery import Celery
{%- endif %}
from conftest import KIT_PYTHONPATH, KIT_ROOT, TABLE, Records, database_at, store_on
from driving import Driver
from sinks import Effects
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session
from test_replay import DETAILS, KEY, OTHER_KEY

from {{ cookiecutter.project_slug }} import operations, producer, settings
from {{ cookiecutter.project_slug }}.claims import (
    RESOLUTIONS_TABLE,
    BadMessage,
    PayloadConflict,
    default_store,
    fingerprint,
)
from {{ cookiecutter.project_slug }}.operations import main, os_identity

# the kit's tables, as the migrations and schema.sql make them
KIT_TABLES = [TABLE, RESOLUTIONS_TABLE]


def test_retain_refuses_an_age_within_the_longest_redelivery(capsys: pytest.CaptureFixture[str]) -> None:
    window, _ = operations.redelivery_window()
    shortest = window // 86400 + 1
    assert shortest * 86400 > window
    assert main(["retain", "--older-than-days", str(shortest - 1)]) == 2
    refused = capsys.readouterr().err
    assert refused.count("\n") == 1 and refused.endswith(f"give {shortest} or more; nothing deleted\n"), refused


def test_retain_deletes_completed_records_older_than_the_age_and_nothing_else(
    records: Records, capsys: pytest.CaptureFixture[str]
) -> None:
    store = default_store()
    old = [f"OLD-{n}" for n in range(7)]
    recent = [f"RECENT-{n}" for n in range(3)]
    for key in [*old, *recent, "OLD-CLAIMED", "OLD-HELD"]:
        token = store.claim(key, fingerprint(key, DETAILS), DETAILS)
        assert token is not None
        if key in old or key in recent:
            assert store.complete(key, token)
    store.age("OLD-HELD", settings.LEASE_SECONDS + 1)
    assert store.settle_stale("OLD-HELD", records.row("OLD-HELD")["claim_token"], "held", "held for the test")
    days_back = {"postgresql": "make_interval(days => 400)", "mysql": "INTERVAL 400 DAY", "sqlite": "400"}[
        default_store().dialect
    ]
    with records.engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE {TABLE} SET claimed_at = claimed_at - {days_back}, completed_at = completed_at - {days_back}"
                " WHERE job_type = :job_type AND operation_key LIKE 'OLD-%'"
            ),
            {"job_type": settings.JOB_TYPE},
        )
    shortest = operations.redelivery_window()[0] // 86400 + 1
    # three keys at a time: the walk goes on past slices with nothing to delete
    assert main(["retain", "--older-than-days", str(shortest), "--batch", "3"]) == 0
    assert capsys.readouterr().out == (
        f"deleted 7 completed records of {settings.JOB_TYPE} older than {shortest} days\n"
    )
    assert [records.status(key) for key in old] == ["none"] * 7
    assert [records.status(key) for key in recent] == ["completed"] * 3
    assert (records.status("OLD-CLAIMED"), records.status("OLD-HELD")) == ("claimed", "held")


def test_a_person_lists_and_resolves_held_operations(
    driver: Driver,
    effects: Effects,
    records: Records,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = default_store()
    # the embedded worker sets the root logger's level to ERROR
    caplog.set_level(logging.WARNING, logger=operations.__name__)
    for key in (KEY, OTHER_KEY):
        assert store.settle_stale(key, records.stale_claim(key, DETAILS), "held", "held for the test")
    assert main(["held"]) == 0
    header, *rows, count = capsys.readouterr().out.splitlines()
    # a table a person can decide from: the key, the attempt, when it was claimed, why it is held, the payload
    assert header.split() == ["key", "status", "attempt", "claimed", "at", "note", "payload"]
    # each key as `resolve` takes it in a shell, then its status and attempt
    keys = [shlex.quote(KEY), shlex.quote(OTHER_KEY)]
    # the listing is oldest first to the second it shows: two claims of one second come in either order
    rows.sort(key=lambda row: not row.startswith(f"{keys[0]} "))
    assert [row.startswith(f"{key} ") for row, key in zip(rows, keys, strict=True)] == [True, True], rows
    assert [row.removeprefix(key).split()[:2] for row, key in zip(rows, keys, strict=True)] == [["held", "1"]] * 2
    assert all("UTC" in row and "held for the test" in row and json.dumps(DETAILS) in row for row in rows)
    assert count == "2 held"

    assert main(["resolve", KEY, "--done", "--by", "Ann Example", "--why", "the customer has the email"]) == 0
    done = records.row(KEY)
    assert (done["status"], done["resolved_by"]) == ("completed", "Ann Example")
    assert done["resolved_at"] is not None and "the customer has the email" in done["note"]
    assert main(["resolve", KEY, "--done", "--by", "Ann Example", "--why", "twice"]) == 1  # no longer held

    # released: queued again and its message sent; the worker performs it once
    assert main(["resolve", OTHER_KEY, "--release", "--by", "Ann Example", "--why", "never sent"]) == 0
    assert f"{OTHER_KEY}: released for one more attempt by Ann Example; sent again" in capsys.readouterr().out
    until("the worker performed it", lambda: (records.status(OTHER_KEY), effects.count(OTHER_KEY)) == ("completed", 1))
    assert records.row(OTHER_KEY)["attempt"] == 2

    # each resolution kept: the name given, who the machine and the database knew, the states, why; one log line each
    role = records.database_role() or "-"
    audit = [message.split(": resolved by ", 1)[1] for message in caplog.messages if ": resolved by " in message]
    assert audit == [
        f"Ann Example as {os_identity()} (database role {role}): held -> completed: the customer has the email",
        f"Ann Example as {os_identity()} (database role {role}): held -> queued: never sent",
    ], caplog.messages
    who = ("Ann Example", os_identity(), records.database_role())
    assert store.resolutions() == [
        (KEY, ANY, *who, "held", "completed", "the customer has the email"),
        (OTHER_KEY, ANY, *who, "held", "queued", "never sent"),
    ]
    assert main(["resolutions"]) == 0
    header, *rows, count = capsys.readouterr().out.splitlines()
    assert re.split(r"\s{2,}", header) == ["key", "resolved at", "by", "as", "database role", "status", "why"]
    assert count == "2 resolutions"
    # each key as `resolve` takes it in a shell, then when (UTC), ... and why
    assert rows[0].startswith(f"{shlex.quote(KEY)} ") and rows[0].endswith("  the customer has the email"), rows
    assert rows[1].startswith(f"{shlex.quote(OTHER_KEY)} ") and rows[1].endswith("  never sent"), rows
    between = rf" UTC +Ann Example +{re.escape(os_identity())} +{re.escape(role)} +held -> "
    assert all(re.search(between, row) for row in rows), rows
    # of one key: the second resolve, refused, left none
    assert main(["resolutions", KEY]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 resolutions"


{% if cookiecutter.effect_kind != "same_database" -%}
def test_a_failed_effect_releases_the_claim_and_the_retry_performs_it(
    driver: Driver, effects: Effects, records: Records
) -> None:
    effects.fail_next(1)
    driver.deliver(KEY, DETAILS)  # settles as RETRY: the effect failed and the claim was released
    deadline = time.monotonic() + 20
    while records.status(KEY) != "completed":
        assert time.monotonic() < deadline, f"the retry did not complete it: {records.status(KEY)}"
        time.sleep(0.05)
    # the second attempt took the released claim over; the refused email never arrived
    row = records.row(KEY)
    assert (effects.count(KEY), row["attempt"], row["note"]) == (1, 2, "released: one more attempt")


{% endif -%}
@pytest.mark.usefixtures("driver")  # the worker that performs it once released
def test_an_operation_that_failed_past_its_retries_is_listed_and_a_person_retries_it(
    effects: Effects, records: Records, capsys: pytest.CaptureFixture[str]
) -> None:
    store = default_store()
    token = store.claim(KEY, fingerprint(KEY, DETAILS), DETAILS)
    assert token is not None and store.release(KEY, token, "effect failed: the mail server said no")
    assert store.fail(KEY, DETAILS, "failed after 6 attempts: the mail server said no")
    assert main(["held"]) == 0
    _header, row, count = capsys.readouterr().out.splitlines()
    assert row.startswith(f"{shlex.quote(KEY)} ") and "the mail server said no" in row, row
    assert row.removeprefix(shlex.quote(KEY)).split()[:2] == ["failed", "1"], row
    assert count == "0 held, 1 failed"
    assert main(["status"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "attention: 1 failed"
    # one more attempt: queued again, sent, performed once
    assert main(["resolve", KEY, "--release", "--by", "Ann Example", "--why", "the mail server is back"]) == 0
    until("the worker performed it", lambda: (records.status(KEY), effects.count(KEY)) == ("completed", 1))
    row = records.row(KEY)
    assert (row["attempt"], row["resolved_by"]) == (2, "Ann Example")
    assert main(["status"]) == 0


def test_the_status_exits_non_zero_while_something_waits_for_a_person_or_is_overdue(
    records: Records, capsys: pytest.CaptureFixture[str]
) -> None:
    store = default_store()

    def status() -> tuple[int, list[str]]:
        code = main(["status"])
        return code, capsys.readouterr().out.splitlines()

    code, lines = status()
    assert code == 0 and lines[-1] == "ok: nothing waits for a person or sits past its time"
    assert [line.split()[0] for line in lines[:-1]] == operations.STATES
    # queued and claimed, young: nothing wrong yet
    assert store.enqueue(KEY, fingerprint(KEY, DETAILS), DETAILS)
    token = store.claim(OTHER_KEY, fingerprint(OTHER_KEY, DETAILS), DETAILS)
    assert token is not None
    code, lines = status()
    assert code == 0, lines
    assert lines[0].split()[:2] == ["queued", "1"] and lines[1].split()[:2] == ["claimed", "1"]
    # both past their time: the queued one past the re-send time, the claim past the lease; a young queued one
    # beside them is counted, not called overdue
    records.age(KEY)
    records.age(OTHER_KEY)
    assert store.enqueue("ORD-YOUNG", fingerprint("ORD-YOUNG", DETAILS), DETAILS)
    resend, lease = settings.resend_queued_after_seconds(), settings.LEASE_SECONDS
    code, lines = status()
    assert (code, lines[-1]) == (1, f"attention: 1 queued past {resend} s, 1 claimed past {lease} s")
    assert lines[0].split()[:2] == ["queued", "2"]
    # completed: fine again; held: waits for a person
    assert store.take_over(KEY, records.row(KEY)["claim_token"], None) is not None
    assert store.complete(KEY, records.row(KEY)["claim_token"])
    assert store.settle_stale(OTHER_KEY, token, "held", "held for the test")
    code, lines = status()
    assert (code, lines[-1]) == (1, "attention: 1 held")
    assert lines[3].split()[:2] == ["completed", "1"]


def test_the_producer_writes_the_record_first_and_the_worker_claims_it(effects: Effects, records: Records) -> None:
    producer.enqueue(KEY, DETAILS)
    until("the worker performed it", lambda: (records.status(KEY), effects.count(KEY)) == ("completed", 1))
    # claimed from queued as a new key is: first attempt, no note
    row = records.row(KEY)
    assert (row["attempt"], row["note"], json.loads(row["payload"])) == (1, None, DETAILS)
    # the same operation asked for again: no second record, no second effect; another payload: refused
    producer.enqueue(KEY, DETAILS)
    with pytest.raises(PayloadConflict, match="already known with a different payload"):
        producer.enqueue(KEY, {"email": "someone-else@example.com"})
    producer.enqueue(OTHER_KEY, DETAILS)
    until("the next one performed", lambda: records.status(OTHER_KEY) == "completed")
    assert (effects.count(KEY), records.row(KEY)["attempt"]) == (1, 1)


@pytest.mark.parametrize(
    ("key", "details", "problem"),
    [
        ("ORD\x00-1", DETAILS, "contains a NUL character"),
        ("ORD-\ud800", DETAILS, "a character that UTF-8 cannot encode"),
        (KEY, {"blob": "x" * settings.max_details_bytes()}, "(MAX_DETAILS_BYTES)"),
    ],
    ids=["NUL", "lone surrogate", "over-size"],
)
def test_the_producer_refuses_bad_data_at_the_door_and_writes_nothing(
    key: str, details: dict[str, Any], problem: str, records: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(producer, "publish", lambda *message: sent.append(message))
    with pytest.raises(BadMessage, match=re.escape(problem)):
        producer.enqueue(key, details)
    # no record (a key the database cannot hold is not even looked up), nothing sent
    assert (records.count("queued"), sent) == (0, [])


def test_a_message_the_broker_lost_is_sent_again_by_the_sweeper(
    driver: Driver, effects: Effects, records: Records
) -> None:
    store = default_store()
    # the record written, the message lost on its way (a worker killed between the broker's hand-over and its
    # filing of the message as unacknowledged): nothing comes
    assert store.enqueue(KEY, fingerprint(KEY, DETAILS), DETAILS)
    assert driver.sweep() == {"stale": 0, "settled": 0, "resent": 0}  # queued, but not for long yet
    records.age(KEY)
    assert driver.sweep() == {"stale": 0, "settled": 0, "resent": 1}
    until("the worker performed it", lambda: (records.status(KEY), effects.count(KEY)) == ("completed", 1))
    assert records.row(KEY)["attempt"] == 1


def test_in_the_apps_session_the_record_and_the_message_go_with_its_commit(
    engine: Engine, effects: Effects, records: Records
) -> None:
    with Session(engine) as session:
        producer.enqueue(KEY, DETAILS, session=session)
        session.rollback()
    with Session(engine) as session:
        producer.enqueue(OTHER_KEY, DETAILS, session=session)
        # not sent before the commit: the worker would find no record, and the app's data may still roll back
        assert records.status(OTHER_KEY) == "none"
        session.commit()
    until("the worker performed it", lambda: (records.status(OTHER_KEY), effects.count(OTHER_KEY)) == ("completed", 1))
    # rolled back: neither the record nor the message
    assert (records.status(KEY), effects.count(KEY)) == ("none", 0)


def test_the_operations_command_runs_as_a_module(engine: Engine) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.project_slug }}.operations", "held"],
        cwd=KIT_ROOT,
        env={**os.environ, "PYTHONPATH": KIT_PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "0 held\n"


def until(what: str, check: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_send_puts_one_operation_on_the_queue_for_the_worker(
    driver: Driver, effects: Effects, records: Records, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["send", KEY, "--details", json.dumps(DETAILS)]) == 0
    assert capsys.readouterr().out.startswith(f"sent {{ cookiecutter.job_type }} {KEY} to the queue ")
    until("the worker performed it", lambda: (records.status(KEY), effects.count(KEY)) == ("completed", 1))
    assert json.loads(records.row(KEY)["payload"]) == DETAILS


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ([KEY, "--details", "[1, 2]"], '--details must be a JSON object, e.g. {"email": "customer@example.com"}'),
        ([KEY, "--details", "email=a@example.com"], "--details is not JSON (Expecting value"),
        (["", "--details", "{}"], "{{ cookiecutter.operation_key_name }} is empty: give the {{ cookiecutter.operation_key_name }}"),
        (["x" * 256], "{{ cookiecutter.operation_key_name }} has 256 characters; at most 255 fit the record"),
        ([KEY, "--details", json.dumps({"blob": "x" * settings.max_details_bytes()})], "(MAX_DETAILS_BYTES)"),
    ],
)
def test_send_refuses_bad_input_with_one_line_and_sends_nothing(
    args: list[str], problem: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(operations, "send", lambda *message: sent.append(message))
    assert main(["send", *args]) == 2
    out, err = capsys.readouterr()
    assert (out, sent) == ("", [])
    assert err.count("\n") == 1 and problem in err and err.rstrip().endswith("nothing sent"), err


def test_resolve_refuses_an_empty_name_or_reason(records: Records, capsys: pytest.CaptureFixture[str]) -> None:
    store = default_store()
    assert store.settle_stale(KEY, records.stale_claim(KEY, DETAILS), "held", "held for the test")
    assert main(["resolve", KEY, "--done", "--by", " ", "--why", "checked"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert records.status(KEY) == "held"


def schema_sql_statements(name: str = "schema.sql") -> list[str]:
    without_comments = re.sub(r"--[^\n]*", "", (KIT_ROOT / name).read_text())
    return [statement.strip() for statement in without_comments.split(";") if statement.strip()]


def describe_postgresql(conn: Connection, schema: str) -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    """The kit's tables only: the database may hold an application's tables and Alembic histories beside them."""

    def rows(sql: str, table: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(row) for row in conn.execute(text(sql), {"schema": schema, "table": table}))

    return {
        table: {
            "columns": rows(
                """SELECT table_name, column_name, data_type, character_maximum_length, is_nullable, column_default
                   FROM information_schema.columns WHERE table_schema = :schema AND table_name = :table""",
                table,
            ),
            "constraints": rows(
                """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(c.oid)
                   FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
                   WHERE n.nspname = :schema AND c.conrelid = (quote_ident(:schema) || '.' || :table)::regclass""",
                table,
            ),
            "indexes": rows(
                """SELECT tablename, indexname, replace(indexdef, :schema || '.', '')
                   FROM pg_indexes WHERE schemaname = :schema AND tablename = :table""",
                table,
            ),
        }
        for table in KIT_TABLES
    }


def describe_sqlite(conn: Connection) -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    """The kit's tables only, as describe_postgresql."""
    described = {}
    for table in KIT_TABLES:
        indexes = []
        for index in conn.execute(text(f"PRAGMA index_list({table})")):
            columns = [row.name for row in conn.execute(text(f"PRAGMA index_info({index.name})"))]
            # a partial index's WHERE is in its SQL only (a constraint's index has none)
            sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :name"), {"name": index.name}).scalar()
            indexes.append((index.name, index.unique, tuple(columns), " ".join((sql or "").split())))
        described[table] = {
            "columns": [tuple(row) for row in conn.execute(text(f"PRAGMA table_info({table})"))],
            "indexes": sorted(indexes),
        }
    return described


def describe_mysql(conn: Connection, database: str) -> dict[str, str]:
    """The kit's tables only, as MySQL and MariaDB show them (SHOW CREATE TABLE: columns, keys, constraints)."""
    return {table: conn.execute(text(f"SHOW CREATE TABLE `{database}`.`{table}`")).one()[1] for table in KIT_TABLES}


def test_the_migration_matches_schema_sql(engine: Engine) -> None:
    """The suite's tables come from the Alembic migration; schema.sql (schema-mysql.sql on MySQL and MariaDB),
    run on its own, must give the same."""
    if default_store().dialect == "mysql":
        with engine.connect() as conn:
            database = conn.execute(text("SELECT DATABASE()")).scalar_one()
            migrated = describe_mysql(conn, database)
            # DDL is not transactional there: a scratch database of its own, dropped after
            scratch = f"{database[:40]}_schema_sql_check"
            conn.execute(text(f"CREATE DATABASE `{scratch}`"))
            try:
                conn.execute(text(f"USE `{scratch}`"))
                for statement in schema_sql_statements("schema-mysql.sql"):
                    conn.execute(text(statement))
                from_schema_sql = describe_mysql(conn, scratch)
            finally:
                conn.execute(text(f"DROP DATABASE `{scratch}`"))
                conn.execute(text(f"USE `{database}`"))
    elif engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            migrated = describe_postgresql(conn, "public")
            # DDL is transactional in PostgreSQL: the scratch schema vanishes with the rollback
            conn.execute(text("CREATE SCHEMA schema_sql_check"))
            conn.execute(text("SET LOCAL search_path TO schema_sql_check"))
            for statement in schema_sql_statements():
                conn.execute(text(statement))
            from_schema_sql = describe_postgresql(conn, "schema_sql_check")
            conn.rollback()
    else:
        with engine.connect() as conn:
            migrated = describe_sqlite(conn)
        scratch = create_engine("sqlite://")
        with scratch.begin() as conn:
            for statement in schema_sql_statements():
                conn.execute(text(statement))
            from_schema_sql = describe_sqlite(conn)
    assert migrated == from_schema_sql


def command_on(
    url: str, command: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> str:
    """A person's command on the database at `url`, refused (refused_in_one_line)."""
    with store_on(url):
        return refused_in_one_line(command, capsys, caplog)


def refused_in_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> str:
    """A person's command, run here as `python -m ... operations` runs it (main): it exits 2, prints nothing, and
    logs nothing; the one line it wrote to standard error."""
    capsys.readouterr()
    caplog.set_level(logging.INFO)  # what `python -m ... operations` would print (main's logging.basicConfig)
    assert main(command) == 2
    out, err = capsys.readouterr()
    logged = [record for record in caplog.records if record.thread == threading.get_ident()]  # not a server's
    assert (out, logged) == ("", []), out + caplog.text
    (line,) = err.splitlines()
    return line


@pytest.mark.embedded_only
@pytest.mark.parametrize("command", [["send", KEY], ["held"], ["status"], ["sweep"]], ids=lambda argv: argv[0])
def test_a_command_on_a_database_not_migrated_says_so_in_one_line(
    command: list[str], tmp_path: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Run before the migration, a person's command names what to do, and sends nothing (its record comes first)."""
    line = command_on(database_at(tmp_path, None), command, capsys, caplog)
    assert line.startswith(f"{operations.PROG} {command[0]}: ")
    assert "run the kit's migration" in line


def refusing_port() -> socket.socket:
    """A port bound and never listened on: it refuses every connection, and no other process can take it meanwhile."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    return closed


def unreachable_url(closed: socket.socket) -> str:
    return f"postgresql://nobody@127.0.0.1:{closed.getsockname()[1]}/down"


@pytest.mark.embedded_only
@pytest.mark.parametrize(
    "command",
    [["send", KEY], ["held"], ["status"], ["sweep"], ["resolve", KEY, "--done", "--by", "alice", "--why", "checked"]],
    ids=lambda argv: argv[0],
)
def test_a_command_while_the_database_cannot_be_reached_says_so_in_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The server down (nothing listens on its port): one line that names it and what to do, no traceback."""
    with refusing_port() as closed:
        line = command_on(unreachable_url(closed), command, capsys, caplog)
    assert line.startswith(f"{operations.PROG} {command[0]}: the database cannot be reached (")
    assert "run it again when it answers" in line and "Connection refused" in line


@pytest.mark.embedded_only
def test_a_command_run_as_a_module_while_the_database_cannot_be_reached_prints_one_line() -> None:
    """The same, in a process of its own: exit status 2 and one line, nothing else from the interpreter or logging."""
    with refusing_port() as closed:
        env = {**os.environ, "DATABASE_URL": unreachable_url(closed), "PYTHONPATH": KIT_PYTHONPATH}
        argv = [sys.executable, "-m", operations.__name__, "status"]
        ran = subprocess.run(argv, cwd=KIT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (2, ""), ran.stdout + ran.stderr
    (line,) = ran.stderr.splitlines()
    assert line.startswith(f"{operations.PROG} status: the database cannot be reached (")


@pytest.fixture
def queue_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing listens where the producer sends: the {{ "broker" if celery else "SQS endpoint" }} is down."""
    with refusing_port() as closed:
{%- if celery %}
        down = Celery("down", set_as_current=False)
        # where the producer sends (CELERY_BROKER_URL, which the suite sets, would win over a broker_url)
        down.conf.broker_write_url = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        monkeypatch.setattr(producer, "celery_app", lambda: down)
{%- else %}
        monkeypatch.setenv("SQS_ENDPOINT_URL", f"http://127.0.0.1:{closed.getsockname()[1]}")
{%- endif %}
        yield


def the_queue_unreachable(line: str, command: str) -> str:
    """What the line says after naming the queue that cannot be reached and what to check."""
    assert line.startswith(f"{operations.PROG} {command}: the queue {producer.queue()} cannot be reached ("), line
    assert "{{ "CELERY_BROKER_URL" if celery else "AWS_REGION" }}" in line, line
    return line


@pytest.mark.embedded_only
@pytest.mark.usefixtures("queue_down")
def test_send_while_the_queue_cannot_be_reached_records_nothing_and_says_so_in_one_line(
    records: Records, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    line = refused_in_one_line(["send", KEY, "--details", json.dumps(DETAILS)], capsys, caplog)
    assert the_queue_unreachable(line, "send").endswith("; nothing sent, nothing recorded"), line
    assert records.status(KEY) == "none"
{%- if not celery %}


@pytest.mark.embedded_only
def test_send_with_no_aws_region_records_nothing_and_says_so_in_one_line(
    records: Records,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first try on a machine with no AWS configuration: the region is the first thing boto3 asks for."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))  # no region from ~/.aws/config either
    line = refused_in_one_line(["send", KEY, "--details", json.dumps(DETAILS)], capsys, caplog)
    assert "(You must specify a region.)" in the_queue_unreachable(line, "send"), line
    assert records.status(KEY) == "none"
{%- endif %}


@pytest.mark.embedded_only
def test_a_message_the_queue_refuses_after_its_record_stays_queued_for_the_sweeper(
    queue_down: None,
    records: Records,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue answered `send`'s check and went down before the message: the record, written first, stays."""
    monkeypatch.setattr(producer, "check_queue", lambda: None)
    line = refused_in_one_line(["send", KEY, "--details", json.dumps(DETAILS)], capsys, caplog)
    resend = settings.resend_queued_after_seconds()
    assert the_queue_unreachable(line, "send").endswith(
        f"; its record is queued: the sweeper sends it again after {resend} s (`status` shows it)"
    ), line
    assert records.status(KEY) == "queued"


@pytest.mark.embedded_only
def test_a_release_while_the_queue_cannot_be_reached_is_recorded_and_left_to_the_sweeper(
    queue_down: None, records: Records, capsys: pytest.CaptureFixture[str]
) -> None:
    store = default_store()
    assert store.settle_stale(KEY, records.stale_claim(KEY, DETAILS), "held", "held for the test")
    assert main(["resolve", KEY, "--release", "--by", "Ann Example", "--why", "one more try"]) == 0
    (said,) = capsys.readouterr().out.splitlines()
    assert said.startswith(f"{KEY}: released for one more attempt by Ann Example; not sent now, the queue "), said
    assert said.endswith(
        f"the sweeper sends it again after {settings.resend_queued_after_seconds()} s (`status` shows it)"
    ), said
    assert (records.status(KEY), records.row(KEY)["resolved_by"]) == ("queued", "Ann Example")


@pytest.mark.embedded_only
def test_a_sweep_while_the_queue_cannot_be_reached_says_so_and_its_next_run_sends(
    queue_down: None,
    driver: Driver,
    effects: Effects,
    records: Records,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = default_store()
    assert store.enqueue(KEY, fingerprint(KEY, DETAILS), DETAILS)
    records.age(KEY)
    assert main(["sweep"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert the_queue_unreachable(line, "sweep").endswith("; `status` shows what is queued"), line
    assert records.status(KEY) == "queued"
    # the queue back: the next sweep after the re-send time sends it, and it is performed once
    monkeypatch.undo()
    records.age(KEY)
    assert driver.sweep() == {"stale": 0, "settled": 0, "resent": 1}
    until("the worker performed it", lambda: (records.status(KEY), effects.count(KEY)) == ("completed", 1))
