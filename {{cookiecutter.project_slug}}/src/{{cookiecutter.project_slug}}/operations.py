{%- set slug = cookiecutter.project_slug -%}
{%- set celery = cookiecutter.queue_system == "celery" -%}
{%- from "replay_matrix.jinja" import py, states with context -%}
"""Commands for producers, cron and people: send one operation, the sweeper, the status, held and failed operations.
(The try-out and the soak, which prove the kit, are `python -m {{ slug }}_proof`'s.)

    python -m {{ slug }}.operations send KEY --details '{"email": "customer@example.com"}'
    python -m {{ slug }}.operations sweep
    python -m {{ slug }}.operations status
    python -m {{ slug }}.operations held
    python -m {{ slug }}.operations resolve KEY --done --by NAME --why TEXT
    python -m {{ slug }}.operations resolve KEY --release --by NAME --why TEXT
    python -m {{ slug }}.operations resolutions [KEY]
    python -m {{ slug }}.operations retain --older-than-days N

`pip install` makes the same command available as `{{ slug|replace("_", "-") }}-operations`{{ ", and in a Django project
with the kit's app installed, `python manage.py " ~ slug ~ " ...`" if celery else "" }}.
`send` writes the operation's record as queued, then sends its message (producer.enqueue). `status` prints each
state's count and oldest age, and exits 1 when something waits for a person or is overdue: a monitor's probe.
`held` lists what waits for a person: held (a stale claim under `hold`) and failed (past the queue's retries).
`--done` records that the effect happened (the person checked); `--release` allows one more attempt: the record is
queued again and its message sent. Each resolution is kept, with the name given, the OS user and host, the
database's role, the states before and after and why, and logged in one line; `resolutions` lists them. `retain`
deletes completed records older than N days, N more than the longest time a message can still come back
(redelivery_window), or refuses.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from . import settings, telemetry
from .claims import (
    BadMessage,
    ClaimStore,
    QueueUnreachable,
    default_store,
    encode_details,
    person_needed,
    validate_details,
    validate_key,
)
from .job import DATABASE_UNREACHABLE, sweep

log = telemetry.delivery_log(__name__)
PROG = "{{ slug }}.operations"
EXAMPLE_DETAILS = '{"email": "customer@example.com"}'
EXAMPLE_KEY = {{ py(cookiecutter.example_key) }}
# every state, in the order an operation meets them; what waits for a person; how long each may last ("resend": the
# sweeper's re-send time, "lease": the lease) before the status calls it overdue
STATES = {{ states.keys()|list|tojson }}
FOR_A_PERSON = [{% for name, state in states.items() if state.person %}"{{ name }}"{{ ", " if not loop.last else "" }}{% endfor %}]
DUE = {
{%- for name, state in states.items() if state.due %}
    "{{ name }}": "{{ state.due }}",
{%- endfor %}
}


class BadInput(ValueError):
    """A command's argument that cannot be used: the message says what is wrong and what would be right."""


def parse_send(key: str, details: str) -> tuple[str, dict[str, Any]]:
    """The key and details of `send`, checked as the job will check them, or BadInput."""
    try:
        parsed = json.loads(details)
    except ValueError as error:
        raise BadInput(f"--details is not JSON ({error}): give a JSON object, e.g. {EXAMPLE_DETAILS}") from None
    if not isinstance(parsed, dict):
        raise BadInput(f"--details must be a JSON object, e.g. {EXAMPLE_DETAILS}, not a {type(parsed).__name__}")
    try:
        operation_key = validate_key(key)
    except BadMessage as error:
        raise BadInput(f"{error}: give the {settings.OPERATION_KEY_NAME}, e.g. {EXAMPLE_KEY}") from None
    try:
        details = validate_details(parsed)
        encode_details(details)  # its size, as the producer checks it
    except BadMessage as error:
        raise BadInput(f"--details: {error}") from None
    return operation_key, details


def send(key: str, details: dict[str, Any]) -> str:
    """Sends one operation as the app does, through the producer: its record queued, then its message; the id the
    queue gave the message."""
    from .producer import enqueue  # here: only the commands that send need the queue's client

    return str(enqueue(key, details))


def redelivery_window() -> tuple[int, str]:
    """How long after its first delivery a message can still come back, in seconds, and what that is made of: a
    record younger than that may still meet a duplicate, and must be kept."""
{%- if celery %}
    from .tasks import BACKOFF_MAX_SECONDS, TRANSIENT_RETRIES

    lease = settings.LEASE_SECONDS
    if settings.on_rabbitmq():
        unacknowledged, broker = settings.rabbitmq_consumer_timeout(), "RabbitMQ's consumer_timeout"
    else:
        unacknowledged, broker = settings.visibility_timeout(), "Redis's visibility timeout"
    # the first run and each retry (and a wait for the end of a lease) run up to the lease, then wait up to the
    # backoff or a lease
    runs = TRANSIENT_RETRIES + 2
    seconds = int(unacknowledged + runs * (lease + max(BACKOFF_MAX_SECONDS, lease + 1)))
    return seconds, (
        f"{runs} runs of up to the lease ({lease} s), each followed by a wait of up to the lease or the backoff, and"
        f" {broker} ({unacknowledged} s): {seconds} s, plus the length of any outage of the database"
    )
{%- else %}
    seconds = settings.SQS_MESSAGE_RETENTION_SECONDS
    return seconds, f"the queue's message retention period ({seconds // 86400} days): a message lives that long at most"
{%- endif %}


def held_table(store: ClaimStore) -> str:
    """The operations that wait for a person (held, failed) as a table, with what a person needs to decide, and
    their count on the last line: "2 held" or "2 held, 1 failed". A key is written as `resolve` takes it in a
    shell: quoted when it holds a space or a character the shell would read."""
    held = store.held()
    rows = [
        (shlex.quote(op.operation_key), op.status, str(op.attempt), op.claimed_at, op.note or "", op.payload)
        for op in held
    ]
    failed = sum(op.status == "failed" for op in held)
    count = f"{len(held) - failed} held" + (f", {failed} failed" if failed else "")
    header = ("key", "status", "attempt", "claimed at", "note", "payload")
    return "\n".join([*(table(header, rows) if held else []), count])


def resolutions_table(store: ClaimStore, key: str | None) -> str:
    """Every resolution by a person (of one key, or of all), oldest first, and their count on the last line."""
    rows = [
        (shlex.quote(found_key), at, by, resolved_as, role or "-", f"{before} -> {after}", why)
        for found_key, at, by, resolved_as, role, before, after, why in store.resolutions(key)
    ]
    header = ("key", "resolved at", "by", "as", "database role", "status", "why")
    return "\n".join([*(table(header, rows) if rows else []), f"{len(rows)} resolutions"])


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Lines of aligned columns; the last column, free text, as it is."""
    everything = [header, *rows]
    widths = [max(len(row[column]) for row in everything) for column in range(len(header) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in everything
    ]


def status_report(store: ClaimStore) -> tuple[str, bool]:
    """Each state's count and oldest age, one line each, then what needs attention; and whether anything does:
    something waiting for a person, or queued or claimed past its time."""
    times = {"resend": settings.resend_queued_after_seconds(), "lease": settings.LEASE_SECONDS}
    due = {state: times[time] for state, time in DUE.items()}
    found = store.states(due)
    lines, attention = [], []
    for state in STATES:
        count, age, overdue = found.get(state, (0, 0.0, 0))
        lines.append(f"{state:<10} {count:>7}  {f'{age:.0f}s' if count else '-'}")
        if count and state in FOR_A_PERSON:
            attention.append(f"{count} {state}")
        elif overdue:
            attention.append(f"{overdue} {state} past {due[state]} s")
    if attention:
        lines.append("attention: " + ", ".join(attention))
    else:
        lines.append("ok: nothing waits for a person or sits past its time")
    return "\n".join(lines), bool(attention)


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The commands and their options; `prog` is how they are run (`manage.py <the kit's package>` in Django)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    send_command = commands.add_parser("send", help="send one operation through the queue")
    send_command.add_argument("key", help="the operation's {{ cookiecutter.operation_key_name }}")
    send_command.add_argument("--details", default="{}", help=f"the rest of the message: {EXAMPLE_DETAILS}")
    commands.add_parser("sweep", help="apply the stale-claim policy to claims older than the lease")
    commands.add_parser("status", help="each state's count and oldest age; exit 1 when something needs attention")
    commands.add_parser("held", help="list the operations that wait for a person: held and failed")
    resolve = commands.add_parser("resolve", help="resolve one held or failed operation")
    resolve.add_argument("key", help="the held or failed operation's {{ cookiecutter.operation_key_name }}")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--done", action="store_true", help="the effect happened: mark it completed")
    decision.add_argument("--release", action="store_true", help="one more attempt: queued again and sent")
    resolve.add_argument("--by", required=True, help="who decides")
    resolve.add_argument("--why", required=True, help="why: recorded with the operation")
    resolutions = commands.add_parser("resolutions", help="every resolution by a person, oldest first")
    resolutions.add_argument("key", nargs="?", help="of this {{ cookiecutter.operation_key_name }} only")
    retain = commands.add_parser("retain", help="delete completed records older than the longest redelivery")
    retain.add_argument(
        "--older-than-days", type=int, required=True, help="their age: more than the longest redelivery window"
    )
    retain.add_argument("--batch", type=int, default=10_000, help="records looked at per statement (default 10000)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    args.prog = prog
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
{%- if not celery %}
    logging.getLogger("botocore").setLevel(logging.WARNING)  # not its INFO on where it found the credentials
{%- endif %}
{%- if celery %}
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        # In a Django project, as its management commands do: its settings load its Celery app, which the
        # commands then send through (producer.celery_app), to the queue its workers consume.
        import django

        django.setup()
{%- endif %}
    try:
        return run(args)
    except DATABASE_UNREACHABLE as error:
        # a table not migrated, a login refused, the server down: one line saying what to do, not a traceback
        problem = person_needed(error) or unreachable(error)
        if problem is None:
            raise
        print(f"{args.prog} {args.command}: {problem}", file=sys.stderr)
        return 2
    except QueueUnreachable as error:
        # the sweep's re-sends (send and a release say more): a record it could not send waits for its next run
        print(f"{args.prog} {args.command}: {error}; `status` shows what is queued", file=sys.stderr)
        return 2


def unreachable(error: Exception) -> str | None:
    """For a database that cannot be reached now (down, restarting, the network), one line; None for other errors.
    A command changes the record in one transaction, so it changed all or nothing; `held` shows which."""
    if not isinstance(error, OperationalError | InterfaceError):
        return None
    cause = " ".join(str(getattr(error, "orig", None) or error).split())[:300]
    return f"the database cannot be reached ({cause}); run it again when it answers (`held` shows what is recorded)"


def run(args: argparse.Namespace) -> int:
    """The command the arguments name; its exit status."""
    if args.command == "send":
        try:
            key, details = parse_send(args.key, args.details)
        except BadInput as error:
            print(f"{args.prog} send: {error}; nothing sent", file=sys.stderr)
            return 2
        from .producer import check_queue, queue

        try:
            check_queue()
        except QueueUnreachable as error:
            print(f"{args.prog} send: {error}; nothing sent, nothing recorded", file=sys.stderr)
            return 2
        try:
            message = send(key, details)
        except QueueUnreachable as error:
            # lost between the check and the send: the record, written first, stays queued for the sweeper
            print(f"{args.prog} send: {error}; {resent_later()}", file=sys.stderr)
            return 2
        print(f"sent {settings.JOB_TYPE} {key} to the queue {queue()}: message {message}")
        return 0
    if args.command == "retain":
        window, made_of = redelivery_window()
        # a whole number of days strictly longer than the window
        shortest = window // 86400 + 1
        if args.older_than_days < shortest:
            print(
                f"{args.prog} retain: --older-than-days {args.older_than_days} is not longer than the longest"
                f" redelivery window, {made_of}: give {shortest} or more; nothing deleted",
                file=sys.stderr,
            )
            return 2
        if args.batch < 1:
            print(f"{args.prog} retain: --batch {args.batch} must be 1 or more; nothing deleted", file=sys.stderr)
            return 2
        deleted = default_store().retain(args.older_than_days, args.batch)
        print(f"deleted {deleted} completed records of {settings.JOB_TYPE} older than {args.older_than_days} days")
        return 0
    store = default_store()
    if args.command == "sweep":
        counts = sweep(store)
        print(f"stale claims: {counts['stale']}, settled: {counts['settled']}, queued sent again: {counts['resent']}")
        return 0
    if args.command == "status":
        report, attention = status_report(store)
        print(report)
        return 1 if attention else 0
    if args.command == "held":
        print(held_table(store))
        return 0
    if args.command == "resolutions":
        print(resolutions_table(store, args.key))
        return 0
    if not args.by.strip() or not args.why.strip():
        print(f"{args.prog} resolve: --by and --why must not be empty: the record keeps who and why", file=sys.stderr)
        return 2
    said = resolve(store, args.key, done=args.done, by=args.by, why=args.why, resolved_as=os_identity())
    if said is None:
        print(f"{args.key}: no held or failed operation with this key; `held` lists them", file=sys.stderr)
        return 1
    print(said)
    return 0


def resolve(store: ClaimStore, key: str, *, done: bool, by: str, why: str, resolved_as: str) -> str | None:
    """A person's decision on a held or failed operation (the command's, the Django admin's): recorded with its
    audit row and logged in one line; released, its message is sent again (the queue unreachable: by the sweeper,
    later). What happened, in one line; None when no such operation waits for a person."""
    resolution = store.resolve(key, done=done, by=by, why=why, resolved_as=resolved_as)
    if resolution is None:
        return None
    log.line(
        logging.WARNING,
        "resolved",
        key,
        None,
        "resolved by %s as %s (database role %s): %s -> %s: %s",
        by,
        resolved_as,
        resolution.database_role or "-",
        resolution.status_before,
        resolution.status_after,
        why,
    )
    if done:
        return f"{key}: completed by {by} (was {resolution.status_before})"
    # queued again: its message goes now (if sending fails, the sweeper sends it after the re-send time)
    from .producer import publish

    try:
        message = publish(key, resolution.details)
    except QueueUnreachable as error:
        return f"{key}: released for one more attempt by {by}; not sent now, {error}; {resent_later()}"
    return f"{key}: released for one more attempt by {by}; sent again: message {message}"


def resent_later() -> str:
    seconds = settings.resend_queued_after_seconds()
    return f"its record is queued: the sweeper sends it again after {seconds} s (`status` shows it)"


def os_identity() -> str:
    """Who runs this command, as the machine knows them: the OS user at the host (the name given with --by is
    theirs to choose)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a container's bare uid)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


if __name__ == "__main__":
    sys.exit(main())
