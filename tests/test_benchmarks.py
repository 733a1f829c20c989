"""The Python kits' benchmark commands (the README's section "The benchmark"), run as written with small sizes,
against PostgreSQL, Redis or RabbitMQ (Celery) and moto's SQS server (which the benchmark starts itself).

They must keep working and print every goal with its verdict. The figures are not judged: timings on a shared
machine are noise. What is not timing is checked: the plans of the statements by key go through the unique index,
the sweeper settles every stale claim, retention deletes old records, and nothing the benchmarks wrote is left, in
the database or on the broker.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from generate import baked, readme_commands
from services import postgres_database, psql, rabbitmq_vhost, rabbitmqctl, redis, redis_database
from test_kits import run_name

TABLE = "handled_operations"
# small sizes: the commands as the README gives them, with these options after them
SMALL = {
    "benchmark.py": "--operations 100 --tasks 20 --rounds 1",
    "scale.py": "--rows 20000 --backlog 2000 --stale 200 --operations 20",
}
VERDICT = r"ratio \d+\.\d\d \(goal (<=|>=) ([\d.]+)\): (PASS|MISS)"


@contextlib.contextmanager
def broker(name: str | None) -> Iterator[dict[str, str]]:
    """The environment of the broker the Celery benchmark runs its worker on; none for SQS."""
    if name == "redis":
        with redis_database() as url:
            yield {"CELERY_BROKER_URL": url}
    elif name == "rabbitmq":
        with rabbitmq_vhost() as url:
            yield {"CELERY_BROKER_URL": url}
    else:
        yield {}


def run(kit: Path, command: str, env: dict[str, str]) -> str:
    """The README's command (its comment dropped), with the small sizes after it, in the kit's folder."""
    script = command.split("#")[0].strip()
    line = f"{script} {SMALL[Path(script.split()[-1]).name]}"
    result = subprocess.run(["bash", "-c", line], cwd=kit, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result.stdout


def left_behind(database: str) -> int:
    return int(psql(f"SELECT count(*) FROM {TABLE}", database=database.rsplit("/", 1)[1]))


# kombu's own bookkeeping in a Redis that Celery workers use (when each binding table may be swept), shared by every
# worker there: not the benchmark's to remove
KOMBU_SHARED = {"_kombu.binding_deadlines"}


def left_on_the_broker(broker_name: str | None, url: str) -> list[str]:
    """What the benchmark left on the broker: its queue, exchange, binding tables or task results."""
    where = url.rsplit("/", 1)[1]
    if broker_name == "redis":
        return sorted(set(redis(int(where), "--scan").split()) - KOMBU_SHARED)
    listed = [rabbitmqctl(f"list_{kind}", "-p", where, "name").split() for kind in ("queues", "exchanges")]
    return sorted(name for names in listed for name in names if name.startswith("bench-"))


def check_benchmark(out: str, broker_name: str | None, one_transaction: bool) -> None:
    assert re.search(r"SQLAlchemy \S+, psycopg \S+", out), out
    assert "load average" in out and "at the end" in out, out
    verdicts = re.findall(rf"^   {VERDICT}$", out, re.MULTILINE)
    assert [(sign, goal) for sign, goal, _ in verdicts] == [("<=", "1.25"), ("<=", "1.5"), (">=", "0.85")], out
    assert re.search(r"^1\. claim \+ complete: .*\n   handle\(\), a new key each time +\d", out, re.MULTILINE), out
    # a same-database kit sends its transaction's BEGIN and COMMIT itself, and the floor replays them too
    sent, transaction = (4, r"BEGIN, then .*, then COMMIT \(one transaction") if one_transaction else (2, "")
    floor = rf"^   floor: the {sent} statements it sent, raw, on the kit's connection +\d.*\n     {transaction}"
    assert re.search(floor, out, re.MULTILINE), out
    sent = 3 if one_transaction else 1
    duplicate = rf"^2\. a duplicate: .*\n   handle\(\), the same completed key \({sent} statements? sent\) +\d"
    assert re.search(duplicate, out, re.MULTILINE), out
    required = (
        r"^   (the statements it sent, raw \(BEGIN, the round trip, COMMIT: .*\), )?(the round trip )?with the work"
        r" every duplicate must do in Python \(the payload's fingerprint, the skip's log line\): [\d.]+ µs, [\d.]+"
        r" times the floor; handle\(\) is [\d.]+ times that$"
    )
    found = re.search(required, out, re.MULTILINE)
    assert found and bool(found[1]) == one_transaction, out
    # the skips were logged as the worker logs them, to a file, and timed with it
    kit_log = re.search(r"the kit's log: (\S+)$", out, re.MULTILINE)
    assert kit_log and "skipped, the record is completed" in Path(kit_log[1]).read_text(), out
    Path(kit_log[1]).unlink()
    # the floor's statements, saved for the worker, are removed with it; the logs stay, for a person to read
    assert not Path(kit_log[1].replace("-kit.log", "-floor.json")).exists(), out
    where = {"redis": "on Redis ", "rabbitmq": "on RabbitMQ ", None: "on moto's SQS server"}[broker_name]
    assert re.search(rf"^3\. throughput of .*{re.escape(where)}", out, re.MULTILINE), out
    assert re.search(r"^   with the claim \(the kit's own\) +\d+\.\d tasks/s", out, re.MULTILINE), out
    if one_transaction:
        # the effect's own transaction is the claim's: the floor of goal 3 is goal 1's, added to the bare task
        floor = r"^   the floor here, a bare task plus goal 1's floor \([\d.]+ ms\): [\d.]+$"
        assert re.search(floor, out, re.MULTILINE), out
        return
    # the floor of goal 3: the kit's statements, raw, around the same effect, in the same worker
    assert re.search(r"^   floor: its statements, raw, around the effect +\d+\.\d tasks/s", out, re.MULTILINE), out
    assert re.search(r"^   the floor over bare: [\d.]+; with the claim over the floor: [\d.]+$", out, re.MULTILINE), out


def check_scale(out: str) -> None:
    # every statement by key, in each of the three states of the statistics, custom and generic plans
    judged = re.findall(r"^     (\S.*?) +custom: (.*); generic: (.*): (PASS|MISS)$", out, re.MULTILINE)
    assert len(judged) == 3 * 6, out
    assert all(verdict == "PASS" for *_, verdict in judged), out
    assert all("using handled_operations_operation" in custom for _, custom, _, _ in judged), out
    rows = re.findall(r"^     (complete|release|take_over|settle_stale)\(\) +\d+ .* (PASS|MISS)$", out, re.MULTILINE)
    assert [name for name, _ in rows] == ["complete", "release", "take_over", "settle_stale"], out
    assert re.search(r"^   200 stale claims, policy `hold`: \d+ sweep\(s\) .*, 0 left$", out, re.MULTILINE), out
    assert re.search(r"^   drained in \d+\.\d s \(goal <= 30 s for 10,000\): (PASS|MISS)$", out, re.MULTILINE), out
    before = re.search(r"^   before: +([\d,]+) rows; table [\d.]+ MiB, indexes", out, re.MULTILINE)
    after = re.search(r"^   after: +([\d,]+) rows; table [\d.]+ MiB, indexes", out, re.MULTILINE)
    assert before and after, out
    assert int(after[1].replace(",", "")) < int(before[1].replace(",", "")), out


@pytest.mark.live
@pytest.mark.parametrize(
    ("queue_system", "effect_kind", "broker_name", "with_scale"),
    [
        ("celery", "external_no_reference", "redis", True),
        ("celery", "external_no_reference", "rabbitmq", False),
        ("sqs", "external_no_reference", None, True),
        # the claim in the effect's own transaction: other statements, another floor
        ("celery", "same_database", "redis", False),
    ],
)
def test_benchmark_commands_print_every_goal(
    queue_system: str,
    effect_kind: str,
    broker_name: str | None,
    with_scale: bool,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    kit = baked(tmp_path, {"queue_system": queue_system, "effect_kind": effect_kind})
    benchmark, scale = readme_commands(kit, "The benchmark")
    assert benchmark.startswith("python benchmarks/benchmark.py") and scale.startswith("python benchmarks/scale.py")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DATABASE_URL", "CELERY_", "SQS_", "AWS_", "SMTP_", "PYTHONPATH"))
    }
    # `python` is this interpreter, which has the kits' dependencies (tests/kit_requirements.py)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    with postgres_database(run_name(request)) as database, broker(broker_name) as queue:
        env |= {"DATABASE_URL": database, **queue}
        check_benchmark(run(kit, benchmark, env), broker_name, effect_kind == "same_database")
        assert left_behind(database) == 0
        if broker_name:
            assert left_on_the_broker(broker_name, queue["CELERY_BROKER_URL"]) == []
        if with_scale:
            check_scale(run(kit, scale, env))
            assert left_behind(database) == 0
