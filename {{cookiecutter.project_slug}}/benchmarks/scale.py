{%- set slug = cookiecutter.project_slug -%}
{%- set p = cookiecutter.stale_claim_policy -%}
"""The claim at scale, on PostgreSQL: a table of a million completed records, a backlog of claims, the sweeper and
retention. Figures printed, not a test; a few minutes.

    DATABASE_URL=postgresql://... python benchmarks/scale.py

1. plans of the statements by key after ANALYZE of the empty table;
2. the table filled with completed records (generate_series), statistics taken while no record is claimed;
3. the guarded updates (complete, release, take_over, settle_stale) and handle() with no backlog, then with a
   backlog of claimed records: under those statistics, and again with fresh ones. Goal: at most 1.2 times the
   time with no backlog. Plans: every statement by key an index lookup through the unique index;
4. the sweeper draining stale claims as the kit runs it (job.sweep at its cadence). Goal: 10,000 in 30 s;
5. the retention command, `python -m {{ slug }}.operations retain`, and the sizes of the table and
   its indexes.

Point DATABASE_URL at a throwaway database: it refuses a record table that holds rows, turns autovacuum off on
it while it runs (so that the statistics stay as they were taken) and deletes what it wrote at the end.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from measure import (
    DETAILS,
    IMPORT_PATHS,
    JOB_TYPE,
    KIT_ROOT,
    TABLE,
    Statement,
    floor_connection,
    header,
    load,
    migrate,
    raw_connection,
    statements_sent,
)
from psycopg import sql

from {{ slug }} import settings
from {{ slug }}.claims import ClaimStore, default_store, encode_details, fingerprint
from {{ slug }}.job import handle, sweep

RUN = uuid.uuid4().hex[:8]
PREFIX = f"scale-{RUN}-"
PAYLOAD = encode_details(DETAILS)
LEASE = settings.LEASE_SECONDS
GOAL_BACKLOG = 1.2
GOAL_DRAIN_SECONDS = 30
# the note the benchmark's own changes leave on a record
NOTE = "scale benchmark"
{%- if cookiecutter.queue_system == "celery" %}
# beat runs the sweeper task (job.sweep) every SWEEP_EVERY_SECONDS
SWEEP_EVERY_SECONDS = settings.SWEEP_EVERY_SECONDS
SWEEPER = f"beat's sweeper task, every {SWEEP_EVERY_SECONDS} s"
{%- else %}
# each consumer runs the sweeper (job.sweep) this often between messages
SWEEP_EVERY_SECONDS = settings.sweep_every_seconds()
SWEEPER = f"the consumer's sweep, every {SWEEP_EVERY_SECONDS} s"
{%- endif %}


def no_effect(*_: Any) -> None:
    """The effect while the claim is timed: nothing."""


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def sizes(raw: Any) -> str:
    """Rows, the table's and each index's size."""
    row = raw.execute(
        f"SELECT count(*), pg_relation_size('{TABLE}'), pg_indexes_size('{TABLE}') FROM {TABLE} WHERE job_type = %s",
        (JOB_TYPE,),
    ).fetchone()
    indexes = raw.execute(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index WHERE indrelid = %s::regclass"
        " ORDER BY 1",
        (TABLE,),
    ).fetchall()
    each = ", ".join(f"{name} {mib(size)}" for name, size in indexes)
    return f"{row[0]:,} rows; table {mib(row[1])}, indexes {mib(row[2])} ({each})"


@contextmanager
def timed(what: str) -> Iterator[None]:
    began = time.perf_counter()
    yield
    print(f"   {what} in {time.perf_counter() - began:.1f} s")


# --- plans --------------------------------------------------------------------------------------------------------


def unique_index(raw: Any) -> str:
    row = raw.execute(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass AND indisunique", (TABLE,)
    ).fetchone()
    assert row is not None, f"{TABLE} has no unique index"
    return str(row[0])


def numbered(statement: Statement) -> tuple[str, list[Any]]:
    """The statement with $1, $2 ... for PREPARE, and its values in that order (psycopg's %(name)s placeholders)."""
    query, params = statement
    names: list[str] = []
    text = str(query)
    for name in params:
        placeholder = f"%({name})s"
        if placeholder in text:
            names.append(name)
            text = text.replace(placeholder, f"${len(names)}")
    return text.replace("%%", "%"), [params[name] for name in names]


def scans(plan: dict[str, Any]) -> Iterator[str]:
    """How each node of the plan reaches the record table: `Seq Scan`, or `<node> using <index>`."""
    if plan.get("Relation Name") == TABLE and plan["Node Type"] == "Seq Scan":
        yield "Seq Scan"
    if "Index Name" in plan:
        yield f"{plan['Node Type']} using {plan['Index Name']}"
    for child in plan.get("Plans", []):
        yield from scans(child)


def plans(store: ClaimStore, statements: dict[str, Statement], index: str, title: str) -> None:
    """The plans the kit's own connection gets (its session settings included), custom and generic (what a
    prepared statement ends up with); PASS when every scan of the table goes through the unique index."""
    print(f"   plans, {title}:")
    pooled = store.engine.raw_connection()
    conn = pooled.driver_connection
    conn.rollback()
    conn.autocommit = True
    try:
        for name, statement in statements.items():
            text, values = numbered(statement)
            conn.execute(sql.SQL("PREPARE scale_plan AS ") + sql.SQL(text))  # type: ignore[operator]
            found: list[str] = []
            for mode in ("force_custom_plan", "force_generic_plan"):
                conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.SQL(mode)))
                explain = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE scale_plan ({})").format(
                    sql.SQL(", ").join(sql.Literal(value) for value in values)
                )
                plan = conn.execute(explain).fetchone()[0][0]["Plan"]
                found.append(", ".join(scans(plan)) or "no scan")
            conn.execute("DEALLOCATE scale_plan")
            conn.execute("RESET plan_cache_mode")
            if name == "stale_claims()":
                # the sweeper's question is meant to use the index of claimed rows: shown, not judged
                print(f"     {name:<22} custom: {found[0]}; generic: {found[1]}")
                continue
            lookups = all(scan.endswith(f" using {index}") for shown in found for scan in shown.split(", "))
            print(f"     {name:<22} custom: {found[0]}; generic: {found[1]}: {'PASS' if lookups else 'MISS'}")
    finally:
        conn.autocommit = False
        pooled.close()


def captured(store: ClaimStore) -> dict[str, Statement]:
    """The statements by key that the kit sends, each taken from a call of its public API."""
    statements: dict[str, Statement] = {}

    def last(name: str, call: Callable[[], object]) -> object:
        with statements_sent() as sent:
            result = call()
        statements[name] = sent[-1]
        return result

    done = f"{PREFIX}plan-done"
    handle(done, DETAILS, perform=no_effect)
    last("duplicate: handle()", lambda: handle(done, DETAILS, perform=no_effect))
    last("read()", lambda: store.read(done))
    key = f"{PREFIX}plan-key"
    token = store.claim(key, fingerprint(key, PAYLOAD), PAYLOAD)
    assert token is not None
    last("release()", lambda: store.release(key, token, NOTE))
    token = last("take_over()", lambda: store.take_over(key, token, NOTE))  # type: ignore[assignment]
    last("complete()", lambda: store.complete(key, token))
    stale = f"{PREFIX}plan-stale"
    token = store.claim(stale, fingerprint(stale, PAYLOAD), PAYLOAD)
    assert token is not None and store.age(stale, LEASE + 1)
    last("settle_stale()", lambda: store.settle_stale(stale, token, "held", NOTE))
    last("stale_claims()", lambda: store.stale_claims(100))
    return statements


# --- timings ------------------------------------------------------------------------------------------------------

GUARDED = ("complete()", "release()", "take_over()", "settle_stale()")


class Phase(dict[str, tuple[float, float]]):
    """For each operation: its median seconds, and the median of its time over the floor's, a raw durable UPDATE
    by key run right after it (a machine slower for a while is slower for both)."""


def phase(store: ClaimStore, floor: Any, name: str, operations: int) -> Phase:
    """The guarded updates, and handle() for a new key and for a duplicate, each followed by the floor."""
    spent: dict[str, list[tuple[float, float]]] = {
        what: [] for what in (*GUARDED, "handle(), new key", "handle(), duplicate")
    }
    done = f"{PREFIX}{name}-done"
    handle(done, DETAILS, perform=no_effect)
    floor_sql = f"UPDATE {TABLE} SET note = %s WHERE job_type = %s AND operation_key = %s"

    def clocked(what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        result = call(*args, **kwargs)
        took = time.perf_counter() - began
        began = time.perf_counter()
        floor.execute(floor_sql, (NOTE, JOB_TYPE, done))
        spent[what].append((took, time.perf_counter() - began))
        return result

    for i in range(operations):
        key = f"{PREFIX}{name}-{i}"
        token = store.claim(key, fingerprint(key, PAYLOAD), PAYLOAD)
        assert token is not None
        assert clocked("release()", store.release, key, token, NOTE)
        token = clocked("take_over()", store.take_over, key, token, NOTE)
        assert token is not None and clocked("complete()", store.complete, key, token)
        stale = f"{PREFIX}{name}-stale-{i}"
        token = store.claim(stale, fingerprint(stale, PAYLOAD), PAYLOAD)
        assert token is not None and store.age(stale, LEASE + 1)
        assert clocked("settle_stale()", store.settle_stale, stale, token, "held", NOTE)
        clocked("handle(), new key", handle, f"{PREFIX}{name}-new-{i}", DETAILS, perform=no_effect)
        clocked("handle(), duplicate", handle, done, DETAILS, perform=no_effect)
    return Phase(
        {
            what: (statistics.median(kit for kit, _ in pairs), statistics.median(kit / floor for kit, floor in pairs))
            for what, pairs in spent.items()
        }
    )


def print_phases(phases: dict[str, Phase]) -> None:
    (base_name, base), *others = phases.items()
    print(
        f"   median µs, and the ratio to {base_name}: of each time over the floor's, a raw durable UPDATE by key run"
        f" right after it (so that the machine's ups and downs cancel out; goal for the guarded updates <="
        f" {GOAL_BACKLOG}):"
    )
    print(f"     {'':<22}{base_name:>12}" + "".join(f"{name:>36}" for name, _ in others))
    for what, (base_time, base_over_floor) in base.items():
        cells = []
        for _, figures in others:
            took, over_floor = figures[what]
            ratio = over_floor / base_over_floor
            judged = f" {'PASS' if ratio <= GOAL_BACKLOG else 'MISS'}" if what in GUARDED else "     "
            cells.append(f"{took * 1e6:>16.0f}  ratio {ratio:5.2f}{judged}")
        print(f"     {what:<22}{base_time * 1e6:>12.0f}" + "".join(f"{cell:>36}" for cell in cells))


# --- the table ----------------------------------------------------------------------------------------------------


def fill(raw: Any, rows: int, days: int, name: str = "done") -> None:
    """`rows` completed records, completed evenly over the last `days` days, the oldest first in the table."""
    raw.execute(
        f"""
        INSERT INTO {TABLE} (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt,
                             claimed_at, completed_at)
        SELECT %(job_type)s, %(prefix)s || lpad(n::text, 9, '0'), md5(n::text) || md5(n::text), %(payload)s,
               'completed', gen_random_uuid()::text, 1, at, at + interval '1 second'
        FROM generate_series(1, %(rows)s) AS n,
             LATERAL (SELECT now() - make_interval(secs => (%(rows)s - n) * %(days)s * 86400.0 / %(rows)s)) AS t(at)
        """,
        {"job_type": JOB_TYPE, "prefix": f"{PREFIX}{name}-", "payload": PAYLOAD, "rows": rows, "days": days},
    )


def claims(raw: Any, count: int, name: str, age_seconds: float) -> None:
    """`count` claims `age_seconds` old (older than the lease: stale, as a dead worker leaves them)."""
    raw.execute(
        f"""
        INSERT INTO {TABLE} (job_type, operation_key, payload_fingerprint, payload, status, claim_token, attempt,
                             claimed_at)
        SELECT %(job_type)s, %(prefix)s || n, md5(n::text) || md5(n::text), %(payload)s, 'claimed',
               gen_random_uuid()::text, 1, clock_timestamp() - make_interval(secs => %(age)s + n / 1000000.0)
        FROM generate_series(1, %(count)s) AS n
        """,
        {"job_type": JOB_TYPE, "prefix": f"{PREFIX}{name}-", "payload": PAYLOAD, "count": count, "age": age_seconds},
    )


def still_stale(raw: Any, name: str) -> int:
    row = raw.execute(
        f"SELECT count(*) FROM {TABLE} WHERE job_type = %s AND operation_key LIKE %s AND status = 'claimed'",
        (JOB_TYPE, f"{PREFIX}{name}-%"),
    ).fetchone()
    return int(row[0])


# --- the sweeper --------------------------------------------------------------------------------------------------


class Worker(threading.Thread):
    """A worker handling new keys while the sweeper runs: how long a delivery waits meanwhile."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.latencies: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            began = time.perf_counter()
            handle(f"{PREFIX}meanwhile-{i}", DETAILS, perform=no_effect)
            self.latencies.append(time.perf_counter() - began)
            i += 1
            time.sleep(0.01)

    def summary(self) -> str:
        if not self.latencies:
            return "no delivery"
        return (
            f"{len(self.latencies)} deliveries, median {statistics.median(self.latencies) * 1e3:.1f} ms,"
            f" slowest {max(self.latencies) * 1e3:.1f} ms"
        )


def drain(raw: Any, store: ClaimStore, stale: int) -> None:
    """Stale claims settled by the kit's sweeper, called as the kit calls it: once per period, each call going on
    while it finds work, within its budget. The waits between calls are counted, not slept."""
    from {{ slug }}_proof.sinks import Effects
{% if cookiecutter.effect_kind == "same_database" %}
    sink = Effects(store.engine)
{%- else %}
    sink = Effects()
{%- endif %}
    sink.start()
    os.environ.update(sink.env())  # the sweeper performs the effect itself under resend and lookup
    claims(raw, stale, "stale", LEASE + 60)
    before = Worker()
    before.start()
    time.sleep(2)
    before.stopping.set()
    before.join()
    meanwhile = Worker()
    meanwhile.start()
    calls, work, drained_at, started = 0, 0.0, 0.0, 0.0
    try:
        while still_stale(raw, "stale") and calls < 1000:
            began = time.perf_counter()
            sweep(store)
            took = time.perf_counter() - began
            # the next sweep starts a period after this one started, or when it ends if it ran longer
            started = 0.0 if calls == 0 else max(started + SWEEP_EVERY_SECONDS, drained_at)
            drained_at = started + took
            calls += 1
            work += took
    finally:
        meanwhile.stopping.set()
        meanwhile.join()
        sink.stop()
    left = still_stale(raw, "stale")
    print(
        f"   {stale:,} stale claims, policy `{{ p }}`: {calls} sweep(s) ({SWEEPER}; job.sweep batch"
        f" {settings.SWEEP_BATCH}, budget {settings.SWEEP_BUDGET_SECONDS} s), {work:.1f} s of work,"
        f" {left:,} left"
    )
    print(f"   a worker's handle() before: {before.summary()}; while the sweeper ran: {meanwhile.summary()}")
{%- if p in ("hold", "skip") %}
    met = left == 0 and drained_at <= GOAL_DRAIN_SECONDS
    print(f"   drained in {drained_at:.1f} s (goal <= {GOAL_DRAIN_SECONDS} s for 10,000): {'PASS' if met else 'MISS'}")
{%- else %}
    print(
        f"   drained in {drained_at:.1f} s; under `{{ p }}` each stale claim performs the effect again, so the goal"
        f" (10,000 in {GOAL_DRAIN_SECONDS} s) is for hold and skip"
    )
{%- endif %}


# --- retention ----------------------------------------------------------------------------------------------------


def retention(raw: Any, days: int, rows: int) -> None:
    print(f"   before:  {sizes(raw)}")
    arguments = ["retain", "--older-than-days", str(days)]
    command = [sys.executable, "-m", "{{ slug }}.operations", *arguments]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(IMPORT_PATHS)}
    began = time.perf_counter()
    result = subprocess.run(command, cwd=KIT_ROOT, env=env, capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - began
    said = (result.stdout.strip() or result.stderr.strip()).splitlines()[-1:] or ["(nothing)"]
    print(f"   python -m {{ slug }}.operations {' '.join(arguments)}: {said[0]} ({took:.1f} s)")
    print(f"   after:   {sizes(raw)}")
    fill(raw, rows, 0, "new")
    print(f"   then {rows:,} new records (the space freed is used again): {sizes(raw)}")


# --- the run ------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="completed records to fill (1,000,000)")
    parser.add_argument("--backlog", type=int, default=100_000, help="claimed records of the backlog (100,000)")
    parser.add_argument("--stale", type=int, default=10_000, help="stale claims for the sweeper (10,000)")
    parser.add_argument("--operations", type=int, default=300, help="timed operations of each kind per phase")
    parser.add_argument("--days", type=int, default=90, help="the fill's records completed over this many days")
    parser.add_argument("--older-than-days", type=int, default=30, help="the retention command's age (30)")
    args = parser.parse_args()
    log = Path(tempfile.gettempdir()) / f"{PREFIX}kit.log"
    # the kit's warnings (two per stale claim the sweeper settles) go to a file, as a worker's would
    logging.basicConfig(filename=log, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raw = raw_connection()
    header("{{ slug }} ({{ cookiecutter.queue_system }}, policy {{ p }}): the claim at scale", raw)
    migrate()
    if raw.execute(f"SELECT EXISTS (SELECT 1 FROM {TABLE})").fetchone()[0]:
        sys.exit(f"{TABLE} holds rows: point DATABASE_URL at a throwaway database, this fills and empties the table")
    store = default_store()
    raw.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = off)")
    try:
        index = unique_index(raw)
        raw.execute(f"ANALYZE {TABLE}")
        statements = captured(store)
        print("1. the empty table, analyzed")
        plans(store, statements, index, "statistics of the empty table")
        print(f"\n2. {args.rows:,} completed records")
        with timed("filled (generate_series)"):
            fill(raw, args.rows, args.days)
        with timed("VACUUM ANALYZE: the statistics taken while no record is claimed"):
            raw.execute(f"VACUUM ANALYZE {TABLE}")
        print(f"   {sizes(raw)}")
        print(f"\n3. the guarded updates, with no backlog and with {args.backlog:,} claimed records")
        floor = floor_connection()
        phase(store, floor, "warm-up", 20)  # connections opened, statements prepared
        phases = {"no backlog": phase(store, floor, "calm", args.operations)}
        claims(raw, args.backlog, "backlog", 0)
        phases["backlog, statistics from before"] = phase(store, floor, "stale-stats", args.operations)
        plans(store, statements, index, "the backlog, statistics from before it")
        raw.execute(f"ANALYZE {TABLE}")
        phases["backlog, fresh statistics"] = phase(store, floor, "fresh-stats", args.operations)
        plans(store, statements, index, "the backlog, fresh statistics")
        print_phases(phases)
        print(f"\n4. the sweeper, {args.stale:,} stale claims beside the backlog")
        drain(raw, store, args.stale)
        print(f"\n5. retention: completed records older than {args.older_than_days} days")
        retention(raw, args.older_than_days, max(args.rows // 10, 1))
    finally:
        raw.execute(f"DELETE FROM {TABLE} WHERE job_type = %s AND operation_key LIKE %s", (JOB_TYPE, f"{PREFIX}%"))
{%- if cookiecutter.effect_kind == "same_database" %}
        raw.execute("DELETE FROM {{ cookiecutter.job_type }}_effects WHERE operation_key LIKE %s", (f"{PREFIX}%",))
{%- endif %}
        raw.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")
        raw.execute(f"VACUUM ANALYZE {TABLE}")
        raw.close()
    print(f"\n{load()} at the end; the kit's log: {log}")


if __name__ == "__main__":
    main()
