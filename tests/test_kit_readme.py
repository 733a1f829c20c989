"""The Sidekiq kit's README, run as written: every command of its sections "On its own", "A person's task",
"The status, for a monitor", "Retention", "Sending from your app: the record first", "The replay suite", "The
benchmark" (with small sizes) and "The soak" (the short one), in the order a user meets them (the app's send after
retention, which counts the records), against PostgreSQL, Redis, a real sidekiq process and an SMTP sink that
counts what arrives, on every Ruby stack (tests/stacks.py): every command inside the stack's root.

(The section "In a Rails app" runs in tests/test_rails_host.py. `bundle install` finds the gems already on the
machine: the test first runs `bundle install --local`, which the README gives for offline use, since RubyGems
is not reachable here.)
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import stacks
from generate import baked, readme_commands
from services import postgres_database, psql, redis_database, smtp_sink
from test_kits import run_name

COMBO = {"queue_system": "sidekiq", "effect_kind": "external_no_reference", "stale_claim_policy": "hold"}
KEY = "ORD-1001"
# who the kit's commands record as the person at the keyboard: the OS user at this host (a stack's root shares both)
ME = f"{getpass.getuser()}@{socket.gethostname()}"


# goal 3's floor: the kit's statements, raw, around the same effect, in the same sidekiq process
THROUGHPUT_FLOOR = re.compile(
    r"^   floor: its statements, raw, around the effect +\d+\.\d jobs/s.*\n(.*\n)*"
    r"   the floor over bare: [\d.]+; with the claim over the floor: [\d.]+$",
    re.MULTILINE,
)


def until(what: str, check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


@pytest.mark.live
@pytest.mark.parametrize("stack", stacks.RUBY_STACKS)
def test_sidekiq_readme_commands_run_as_written(request: pytest.FixtureRequest, tmp_path: Path, stack: str) -> None:
    stacks.require(stack)
    kit = baked(tmp_path, COMBO)
    install, migrate, worker, enqueue = readme_commands(kit, "On its own")
    held_list, resolve_done, resolve_again, resolutions = readme_commands(kit, "A person's task")
    status_command, cron_line = readme_commands(kit, "The status, for a monitor")
    probe = cron_line.split(maxsplit=5)[5]  # the cron line's command, without its schedule (five fields)
    (from_the_app,) = readme_commands(kit, "Sending from your app: the record first")
    (retain,) = readme_commands(kit, "Retention")
    (suite,) = readme_commands(kit, "The replay suite")
    short_soak, _ = readme_commands(kit, "The soak")  # the long one runs in tests/test_soak.py
    # the benchmarks as written, with small sizes: they print figures, checked for their shape only
    benchmark, scale = (shlex.join(shlex.split(line, comments=True)) for line in readme_commands(kit, "The benchmark"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    with postgres_database(run_name(request)) as database, redis_database() as redis, smtp_sink() as (smtp, mail):
        env |= {"DATABASE_URL": database, "REDIS_URL": redis, **smtp}
        table = database.rsplit("/", 1)[1]

        def run(command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            argv = stacks.command(stack, ["sh", "-c", command], kit, env)
            result = subprocess.run(argv, cwd=kit, env=env, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0 or not check, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            return result

        def status() -> str:
            return psql(f"SELECT status FROM handled_operations WHERE operation_key = '{KEY}'", database=table).strip()

        def held_after_the_lease() -> None:
            """As a worker killed mid-job leaves it, once the lease has passed and the sweeper has run."""
            psql(
                "UPDATE handled_operations SET status = 'claimed', claimed_at = claimed_at - interval '601 seconds'",
                database=table,
            )
            assert "1 stale claim(s)" in run("bundle exec rake order_confirmation:sweep").stdout
            assert status() == "held"

        run("bundle install --local")
        # RubyGems is not reachable here: on this machine the gems are all installed and `bundle install` finds them;
        # in a root, Ruby 3.3's default gems (benchmark) send Bundler to RubyGems' index, so it runs the README's
        # offline form alone
        assert install == "bundle install"
        if stacks.STACKS[stack] is None:
            run(install)
        run(migrate)
        # Split, not through a shell: the process waited for is sidekiq itself (bundle exec execs it), so that it
        # has written its last stats to Redis before the database is flushed.
        sidekiq = subprocess.Popen(
            stacks.command(stack, shlex.split(worker), kit, env), cwd=kit, env=env, start_new_session=True
        )
        try:
            assert f"enqueued send_confirmation {KEY}" in run(enqueue).stdout
            until("the email arrived and was completed", lambda: (len(mail.received), status()) == (1, "completed"))
            # the same key again: known, nothing written or sent
            again = run(enqueue).stdout.splitlines()
            assert again[-1] == f"send_confirmation {KEY}: known, not sent again" and "INFO" in again[0], again
            ok = run(status_command).stdout.splitlines()
            assert ok[-1] == "ok: nothing waits for a person or sits past its time", ok
            assert re.fullmatch(r"completed +1  \d+s", ok[3]), ok
            assert run(probe).stdout == ""

            held_after_the_lease()
            listed = run(held_list).stdout.splitlines()
            assert KEY in listed[0] and "\theld\t" in listed[0] and listed[-1] == "1 held", listed
            # the monitor's status fails, and the cron line prints (cron mails it)
            waiting = run(status_command, check=False)
            assert waiting.returncode == 1 and waiting.stdout.splitlines()[-1] == "attention: 1 held", waiting.stdout
            assert run(probe).stdout == "send_confirmation needs attention: rake order_confirmation:status\n"
            missing = run("bundle exec rake order_confirmation:held:resolve DONE=yes", check=False)
            assert missing.returncode != 0 and "KEY is missing: pass the order_reference" in missing.stderr
            done = run(resolve_done).stdout
            # the one log line, with who the machine knew: the name given is free text
            audit = "resolved by alice as {} (database role postgres): held -> completed: the customer has the email"
            assert audit.format(ME) in done, done
            assert (status(), len(mail.received)) == ("completed", 1)

            held_after_the_lease()
            run(resolve_again)
            until("it was released and sent again", lambda: (len(mail.received), status()) == (2, "completed"))

            # Retention: a DAYS inside the job's redelivery window is refused in one line; the record stays.
            refused = run("bundle exec rake order_confirmation:retain DAYS=0", check=False)
            assert refused.returncode != 0 and len(refused.stderr.splitlines()) == 1, refused.stderr
            assert "is refused" in refused.stderr and "the minimum is DAYS=" in refused.stderr
            psql(
                "UPDATE handled_operations SET completed_at = completed_at - interval '40 days'",
                database=table,
            )
            deleted = run(retain).stdout
            assert "1 completed record(s) of send_confirmation older than 30 days deleted" in deleted
            assert status() == ""
            # both resolutions outlive the record
            *kept, count = run(resolutions).stdout.splitlines()
            assert [line.split("\t")[2:] for line in kept] == [
                ["alice", ME, "postgres", "held -> completed", "the customer has the email"],
                ["alice", ME, "postgres", "held -> queued", "never arrived: send it"],
            ], kept
            assert count == "2 resolutions"

            # the app's send, in its transaction, as the README shows it: the record, then the message after the commit,
            # from a Ruby process standing for the app (its ActiveRecord connected, as an app's is)
            app = f'ActiveRecord::Base.establish_connection(ENV.fetch("DATABASE_URL")); {from_the_app}'
            run(f"bundle exec ruby -r ./lib/order_confirmation.rb -e {shlex.quote(app)}")
            until("the app's operation was performed once", lambda: (len(mail.received), status()) == (3, "completed"))
            assert run(status_command).returncode == 0
            # the benchmark checks that it leaves no record of KEY behind: none before it
            psql(f"DELETE FROM handled_operations WHERE operation_key = '{KEY}'", database=table)
        finally:
            os.killpg(sidekiq.pid, signal.SIGTERM)
            sidekiq.wait(timeout=30)

        if stacks.STACKS[stack] is not None:
            # The benchmarks and the short soak run on this machine's own stack, as test_soak.py's soaks do: they
            # print figures about the database and the machine. On the other stacks the kit's runtime, its workers
            # killed mid-job, is proven by each stack's suites (test_kits.py).
            return
        verdicts = r"ratio \d+\.\d\d \(goal [<>]= [\d.]+\): (PASS|MISS)"
        figures = run(f"{benchmark} --operations 100 --jobs 20 --rounds 1").stdout
        assert len(re.findall(verdicts, figures)) == 3, figures
        # a duplicate's floor, and the work any duplicate must do besides: the kit's own skip line among it
        required = r"the skip's log line\): [\d.]+ µs, [\d.]+ times the floor; the job's perform is [\d.]+ times that"
        assert re.search(required, figures), figures
        benchmark_log = re.search(r"the log: (\S+)$", figures, re.MULTILINE)
        assert benchmark_log and "skipped: already completed" in Path(benchmark_log[1]).read_text(), figures
        assert THROUGHPUT_FLOOR.search(figures), figures
        assert status() == "", "the benchmark left records behind"
        figures = run(f"{scale} --rows 20000 --backlog 2000 --stale 500 --samples 20").stdout
        assert len(re.findall(verdicts, figures)) == 8, figures
        assert re.search(r"500 handled in one sweep, 500 held, .*\n.*\(goal <= 30 s\): (PASS|MISS)", figures), figures
        assert "retention: `rake order_confirmation:retain DAYS=30` deleted" in figures

        soaked = run(short_soak).stdout
        assert re.search(r"\n  violations +0\n", soaked), soaked
        assert json.loads((kit / "replay-soak.json").read_text())["operations"] == 300

    embedded = {k: v for k, v in env.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    argv = stacks.command(stack, ["sh", "-c", suite], kit, embedded)
    result = subprocess.run(argv, cwd=kit, env=embedded, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    # the reports show the last soak beside the seven cases
    assert "The soak of 300 operations found no violation." in (kit / "replay-report.md").read_text()


@pytest.mark.live
def test_sidekiq_same_database_benchmark_runs_as_written(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The same-database kit's benchmark, whose claim runs inside the job's ActiveRecord transaction (Claims::Guest):
    every goal printed, the floors inside such a transaction too, the throughput floor, and nothing left."""
    kit = baked(tmp_path, COMBO | {"effect_kind": "same_database"})
    benchmark = shlex.join(shlex.split(readme_commands(kit, "The benchmark")[0], comments=True))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    with postgres_database(run_name(request)) as database, redis_database() as redis:
        env |= {"DATABASE_URL": database, "REDIS_URL": redis}
        for command in ("bundle install --local", f"{benchmark} --operations 100 --jobs 20 --rounds 1"):
            result = subprocess.run(command, shell=True, cwd=kit, env=env, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        figures = result.stdout
        assert len(re.findall(r"ratio \d+\.\d\d \(goal [<>]= [\d.]+\): (PASS|MISS)", figures)) == 3, figures
        assert "floor: the 2 statements, raw, in one commit" in figures, figures
        assert "perform, the same completed key (3 statements)" in figures, figures
        # the floors inside a transaction of ActiveRecord's, which the job cannot do without, shown beside the raw ones
        in_app = r"^   the floor in a transaction of the app's ActiveRecord, .*: [\d.]+ µs, [\d.]+ times the floor; the"
        assert re.search(in_app, figures, re.MULTILINE), figures
        duplicate = r"^   the round trip in a transaction of the app's ActiveRecord \(BEGIN, COMMIT: .*\): [\d.]+ µs"
        assert re.search(duplicate, figures, re.MULTILINE), figures
        assert THROUGHPUT_FLOOR.search(figures), figures
        table = database.rsplit("/", 1)[1]
        for rows in ("handled_operations", "send_confirmation_effects"):
            assert psql(f"SELECT count(*) FROM {rows}", database=table).strip() == "0", f"{rows} left behind"
