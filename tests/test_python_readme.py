"""The Celery and SQS kits' READMEs, run as written: every command of the sections "Try it out", "Install and
run", "The sweeper", "A person's command", "The status, for a monitor", "Retention", "Sending from your app: the
record first" and "The replay suite", in the order a user meets them,
in a fresh virtualenv, against PostgreSQL, Redis (Celery), moto's SQS server (SQS) and an SMTP sink that counts
what arrives.

The virtualenv sees this interpreter's packages, so `pip install -e ".[dev]"` installs the kit itself and finds
its dependencies already there. The SQS kit is given its region in AWS_REGION alone and its endpoint in AWS's
own AWS_ENDPOINT_URL_SQS, as a user following the README would.
"""

from __future__ import annotations

import os
import re
import signal
import site
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path

import pytest
from generate import baked, readme_commands, tree
from moto.server import ThreadedMotoServer
from services import Mailbox, postgres_database, psql, redis_database, smtp_sink
from test_kit_readme import ME, until
from test_kits import run_name

KEY = "ORD-1001"
LEASE = 600
TABLE = "handled_operations"


def received(mail: Mailbox, key: str) -> int:
    """Emails that arrived for the key (the last word of the subject)."""
    return sum(1 for content in mail.received if str(message_from_bytes(content)["Subject"]).split()[-1] == key)


class User:
    """A shell in the kit's folder, with the virtualenv first on PATH and the environment the README asks for."""

    def __init__(self, kit: Path, venv: Path, env: dict[str, str]) -> None:
        self.kit = kit
        self.env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
        self.env.pop("PYTHONPATH", None)
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        self.started: list[subprocess.Popen[bytes]] = []
        self.ran: set[str] = set()

    def run(self, command: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.kit,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0 or not check, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        self.ran.add(command.split("#")[0].strip())
        return result

    def run_once(self, command: str) -> None:
        """A command that two sections give (the install): typed again, it would do nothing new."""
        if command.split("#")[0].strip() not in self.ran:
            self.run(command)

    def start(self, command: str, log: str) -> Path:
        """A command that runs until stopped (a worker), in a process group of its own; its log."""
        path = self.kit.parent / log
        with path.open("wb") as out:
            self.started.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=self.kit,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return path

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def make_venv(venv: Path) -> Path:
    """A fresh virtualenv holding what this interpreter has installed, as if pip had put it there: its
    site-packages on the path (a .pth file; --system-site-packages would give the base interpreter's) and its
    commands (alembic, celery, ruff ...) in the virtualenv's bin, run by the virtualenv's python. So
    `pip install -e ".[dev]"` finds every dependency installed and installs the kit alone, with no download."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_folder = venv / "bin"
    purelib = subprocess.run(
        [str(bin_folder / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "outer-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    for command in Path(sysconfig.get_paths()["scripts"]).iterdir():
        ours = bin_folder / command.name
        if ours.exists() or not command.is_file():
            continue
        first, _, rest = command.read_bytes().partition(b"\n")
        if first.startswith(b"#!") and b"python" in first:
            ours.write_bytes(b"#!" + str(bin_folder / "python").encode() + b"\n" + rest)
            ours.chmod(0o755)
        else:
            ours.symlink_to(command)  # a binary (ruff's)
    return venv


@pytest.fixture
def sqs_endpoint() -> Iterator[str]:
    """moto's SQS server on a free local port."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.mark.live
@pytest.mark.parametrize("queue_system", ["celery", "sqs"])
def test_python_readme_commands_run_as_written(
    queue_system: str, request: pytest.FixtureRequest, tmp_path: Path, sqs_endpoint: str
) -> None:
    kit = baked(tmp_path, {"queue_system": queue_system})
    as_baked = set(tree(kit))
    venv = make_venv(tmp_path / "venv")
    base = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DATABASE_URL", "CELERY_", "SQS_", "AWS_", "SMTP_"))
    }
    with smtp_sink() as (smtp, mail):
        user = User(kit, venv, {**base, **smtp})
        try:
            try_it_out(user, mail)
            with postgres_database(run_name(request)) as database:
                if queue_system == "celery":
                    with redis_database() as redis:
                        user.env |= {"DATABASE_URL": database, "CELERY_BROKER_URL": redis}
                        install_run_and_resolve(user, queue_system, mail, database)
                else:
                    user.env |= {
                        "DATABASE_URL": database,
                        # the region in AWS_REGION alone, the endpoint in AWS's own variable
                        "AWS_REGION": "eu-west-1",
                        "AWS_ENDPOINT_URL_SQS": sqs_endpoint,
                        "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing",
                    }
                    install_run_and_resolve(user, queue_system, mail, database)
                the_replay_suite(user)
        finally:
            user.stop_all()
    # nothing that the commands left behind (databases, beat's schedule, reports, caches) is for git
    user.run("git init -q . && git add -A")
    assert set(user.run("git diff --cached --name-only").stdout.split()) == as_baked


def try_it_out(user: User, mail: Mailbox) -> None:
    """The section "Try it out", with DATABASE_URL unset as it says: SQLite, no server of the user's."""
    install, migrate, try_out = readme_commands(user.kit, "Try it out")
    user.run(install)
    user.run(migrate)
    started = time.monotonic()
    out = user.run(try_out).stdout
    assert time.monotonic() - started < 60, out
    key = re.search(r"^1\. sent send_confirmation (TRY-\S+) through the queue", out, re.MULTILINE)
    assert key, out
    assert re.search(r"^2\. the worker \(pid \d+\) performed the effect \(received: 1\)", out, re.MULTILINE), out
    assert "3. killed the worker with SIGKILL; the record: claimed, attempt 1\n" in out
    assert "5. ran the sweeper: stale claims 1, settled 1\n" in out
    assert "6. policy `hold`: the record: held, attempt 1" in out
    # the held table: the key, the attempt, when, why, and the payload a person needs; then the count
    header = next(line for line in out.splitlines() if line.startswith("key "))
    assert header.split() == ["key", "status", "attempt", "claimed", "at", "note", "payload"]
    row = next(line for line in out.splitlines() if line.startswith(key[1] + " "))
    assert row.split()[1:3] == ["held", "1"] and "UTC" in row and row.endswith('{"email": "customer@example.com"}')
    assert "\n1 held\n" in out
    # the command it says to type next, typed
    resolve = next(line.strip() for line in out.splitlines() if line.startswith("    python -m "))
    assert resolve.startswith(f"python -m order_confirmation.operations resolve {key[1]} --done "), resolve
    assert f"{key[1]}: completed by you" in user.run(resolve).stdout
    assert user.run("python -m order_confirmation.operations held").stdout == "0 held\n"
    assert received(mail, key[1]) == 0  # the try-out sent to a sink of its own, never to SMTP_HOST


def install_run_and_resolve(user: User, queue_system: str, mail: Mailbox, database: str) -> None:
    """The sections "Install and run", "The sweeper", "A person's command", "The status, for a monitor",
    "Retention" and "Sending from your app", against the live services."""
    install, migrate, *workers, send = readme_commands(user.kit, "Install and run")
    (sweep,) = readme_commands(user.kit, "The sweeper")
    held, resolve_done, resolve_release, resolutions = readme_commands(user.kit, "A person's command")
    status_command, cron_line = readme_commands(user.kit, "The status, for a monitor")
    (retain,) = readme_commands(user.kit, "Retention")
    from_the_app = readme_commands(user.kit, "Sending from your app: the record first")
    # the cron line's command, without its schedule (five fields)
    probe = cron_line.split(maxsplit=5)[5]
    name = database.rsplit("/", 1)[1]

    def status() -> str:
        return psql(f"SELECT status FROM {TABLE} WHERE operation_key = '{KEY}'", database=name).strip()

    def held_after_the_lease() -> None:
        """As a worker killed mid-run leaves it, once the lease has passed, swept by the README's command."""
        psql(
            f"UPDATE {TABLE} SET status = 'claimed', claimed_at = claimed_at - interval '{LEASE + 1} seconds'",
            database=name,
        )
        assert user.run(sweep).stdout == "stale claims: 1, settled: 1, queued sent again: 0\n"
        assert status() == "held"

    user.run_once(install)
    user.run(migrate)
    if queue_system == "celery":
        worker, beat = workers
        worker_log = user.start(worker, "worker.log")
        beat_log = user.start(beat, "beat.log")
        until("beat started", lambda: b"beat: Starting" in beat_log.read_bytes())
    else:
        create_queues, consumer = workers
        urls = user.run(create_queues).stdout
        assert re.fullmatch(r"SQS_QUEUE_URL=\S+/send_confirmation\nSQS_DEAD_LETTER_QUEUE_URL=\S+\n", urls), urls
        worker_log = user.start(consumer, "consumer.log")
        until("the consumer is ready", lambda: b"consumer ready" in worker_log.read_bytes())

    bad = user.run(send.split(" --details ")[0] + " --details '[1]'", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad
    assert "--details must be a JSON object" in bad.stderr and bad.stderr.endswith("nothing sent\n"), bad
    assert f"sent send_confirmation {KEY} to the queue send_confirmation" in user.run(send).stdout
    until("the email arrived and was completed", lambda: (received(mail, KEY), status()) == (1, "completed"))

    assert user.run(status_command).stdout.splitlines()[-1] == "ok: nothing waits for a person or sits past its time"
    assert user.run(probe).stdout == ""

    held_after_the_lease()
    # the monitor's status fails, and the cron line prints (cron mails it)
    waiting = user.run(status_command, check=False)
    assert (waiting.returncode, waiting.stdout.splitlines()[-1]) == (1, "attention: 1 held"), waiting
    assert user.run(probe).stdout == "send_confirmation needs attention: operations status\n"
    listed = user.run(held).stdout.splitlines()
    assert listed[0].split() == ["key", "status", "attempt", "claimed", "at", "note", "payload"], listed
    assert listed[1].startswith(f"{KEY} ") and listed[1].endswith('{"email": "customer@example.com"}'), listed
    assert listed[2:] == ["1 held"], listed
    done = user.run(resolve_done)
    assert "completed by alice" in done.stdout
    # the one log line, with who the machine knew: the name given is free text
    assert f"resolved by alice as {ME} (database role postgres): held -> completed: the customer has it" in done.stderr
    assert (status(), received(mail, KEY)) == ("completed", 1)

    held_after_the_lease()
    # one more attempt: queued again and sent by the command itself
    assert "released for one more attempt by alice; sent again: message " in user.run(resolve_release).stdout
    until("it was sent again and completed", lambda: (received(mail, KEY), status()) == (2, "completed"))
    assert user.run(status_command).returncode == 0
    assert b"Traceback" not in worker_log.read_bytes()

    # the record is minutes old: kept; completed 31 days ago, it goes
    days = retain.split("--older-than-days ")[1].split()[0]
    assert user.run(retain).stdout == f"deleted 0 completed records of send_confirmation older than {days} days\n"
    psql(f"UPDATE {TABLE} SET completed_at = completed_at - interval '{int(days) + 1} days'", database=name)
    assert user.run(retain).stdout == f"deleted 1 completed records of send_confirmation older than {days} days\n"
    assert status() == ""
    # both resolutions outlive the record: by alice, as this machine's user, seen by the database as postgres
    kept = [re.split(r"\s{2,}", line) for line in user.run(resolutions).stdout.splitlines()]
    assert [row[2:] for row in kept[1:-1]] == [
        ["alice", ME, "postgres", "held -> completed", "the customer has it"],
        ["alice", ME, "postgres", "held -> queued", "never arrived"],
    ], kept
    assert kept[-1] == ["2 resolutions"], kept

    # the producer, from the app's code as the README shows it: the record, then the message; the same operation
    # asked for again in the app's Session goes after its commit, and its claim skips it: as completed, or, when
    # it comes while the first copy still runs, as a younger claim (retried after the lease, skipped then)
    app_code = [
        "from sqlalchemy.orm import Session",
        "from order_confirmation.claims import default_store",
        "session = Session(default_store().engine)",
        *from_the_app,
        "session.commit()",
    ]
    skipped = b": skipped, "
    skips = worker_log.read_bytes().count(skipped)
    user.run("python - <<'EOF'\n" + "\n".join(app_code) + "\nEOF")
    until("the app's operation was performed once", lambda: (received(mail, KEY), status()) == (3, "completed"))
    try:  # on a timeout, the worker's log says what it did meanwhile
        until("the copy sent after the commit was skipped", lambda: worker_log.read_bytes().count(skipped) > skips)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; the worker's log ends:\n{worker_log.read_text()[-4000:]}") from None
    assert received(mail, KEY) == 3


def the_replay_suite(user: User) -> None:
    """The section "The replay suite", typed in one shell: the unset must make the next run embedded, although
    the environment still points at the PostgreSQL database that now holds rows (a live run would refuse it)."""
    commands = readme_commands(user.kit, "The replay suite")
    assert commands[0].startswith("unset DATABASE_URL")
    result = user.run("set -e\n" + "\n".join(commands))
    assert re.search(r"\d+ passed", result.stdout), result.stdout[-2000:]
    assert '"mode": "embedded"' in (user.kit / "replay-report.json").read_text()
