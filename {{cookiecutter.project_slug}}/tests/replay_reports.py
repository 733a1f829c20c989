{%- set c = cookiecutter -%}
{%- set q = c.queue_system -%}
"""The sign-off reports, written after every run of the replay suite (a pytest plugin: conftest.py loads it).

    replay-report.json   the facts: per case what was expected and observed, where it ran, when
    replay-report.html   for the client: the verdict, the policy, the seven cases, where it ran, the sign-off
    replay-report.md     the same, for a pull request or an email
    replay-junit.xml     one test case per row, for any CI

The last three are rendered from the Mustache templates in report/ by the kit's report.py, which `operations
soak` uses too: the reports show the last soak beside the seven cases. A run that cannot start (its setup fails
before any case) writes them too, saying why.
"""

from __future__ import annotations

import json
{%- if q == "celery" %}
import os
{%- endif %}
import platform
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text

from {{ c.project_slug }} import settings
from {{ c.project_slug }}_proof.report import FACTS, answer, render

KIT_ROOT = Path(__file__).resolve().parents[1]
# The distributions whose versions the report names, as they are installed.
LIBRARIES = (
{%- if q == "celery" %}
    "redis",
    "amqp",
{%- else %}
    "botocore",
    "moto",
{%- endif %}
    "SQLAlchemy",
    "psycopg",
    "alembic",
    "aiosmtpd",
    "pytest",
    "pystache",
)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Report:
    """What the replay suite observed, case by case, and the reason when the run could not start."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.error: str | None = None
        self.started_at = now()

    def add(
        self,
        case: int,
        attempt: str,
        expected: dict[str, Any],
        observed: dict[str, Any],
        timeline: tuple[str, ...] = (),
    ) -> None:
        self.rows[case] = {
            "case": case,
            "attempt": attempt,
            "expected": expected,
            "observed": observed,
            "passed": observed == expected,
            "timeline": list(timeline),
        }

    def facts(self) -> dict[str, Any]:
        """replay-report.json's content."""
        database = make_url(settings.database_url()).get_backend_name()
        facts = {
            "queue_system": "{{ q }}",
            "effect_kind": settings.EFFECT_KIND,
            "stale_claim_policy": settings.STALE_CLAIM_POLICY,
            "mode": "embedded" if database == "sqlite" else "live",
{%- if q == "sqs" %}
            "entry_point": entry_point(),
{%- endif %}
            "database": database,
            "rows": [self.rows[case] for case in sorted(self.rows)],
            "environment": [{"name": name, "value": value} for name, value in environment()],
            "machine": platform.node(),
            "started_at": self.started_at,
            "finished_at": now(),
        }
        if self.error:
            facts["error"] = self.error
        return facts

    def write(self) -> None:
        facts = self.facts()
        (KIT_ROOT / FACTS).write_text(json.dumps(facts, indent=2) + "\n")
        render(KIT_ROOT, facts)
{%- if q == "sqs" %}


def entry_point() -> str:
    # imported here, not above: pytest_plugins loads sqs_driver itself, with its asserts rewritten
    from sqs_driver import ENTRY_POINT

    return str(ENTRY_POINT)
{%- endif %}


def environment() -> list[tuple[str, str]]:
    """Where the suite ran, as this process sees it: a service that cannot be reached says so."""
{%- if q == "celery" %}
    import celery
    import kombu

    from {{ c.project_slug }}_proof.report import broker as named_broker

    queue = f"Celery {celery.__version__}, kombu {kombu.__version__}"
    broker = named_broker()
{%- else %}
    import boto3

    queue = f"an SQS consumer, entry point {entry_point()}, boto3 {boto3.__version__}"
    broker = f"SQS as moto {metadata.version('moto')} serves it over HTTP (ThreadedMotoServer)"
{%- endif %}
    libraries = []
    for name in LIBRARIES:
        try:
            libraries.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return [
        ("Queue system", queue),
        ("Broker", broker),
        ("Database", database_server()),
        ("Language", f"Python {platform.python_version()} ({platform.platform()})"),
        ("Broker settings", broker_settings()),
        ("Libraries", ", ".join(libraries)),
{%- if q == "celery" %}
        ("Host application", os.environ.get("REPLAY_HOST_APP") or "none: the kit's own Celery app"),
{%- endif %}
        ("Template", template_version()),
    ]


def broker_settings() -> str:
    """The settings the guarantee rests on, as the suite's workers ran with them."""
    resend = f"queued records sent again after {settings.resend_queued_after_seconds()} s"
{%- if q == "celery" %}
    from {{ c.project_slug }}.tasks import {{ c.job_type }} as task

    # the task's own options; the prefetch multiplier every worker checks at its start (tasks.guarantee_problem)
    options = (
        f"acks_late={task.acks_late}, reject_on_worker_lost={task.reject_on_worker_lost}, hard time limit"
        f" {task.time_limit} s, prefetch multiplier 1"
    )
    if settings.broker_url().startswith("memory://"):  # embedded
        return f"{options}; kombu's in-memory transport; {resend}"
    if settings.on_rabbitmq():
        return f"{options}; RabbitMQ consumer_timeout {settings.rabbitmq_consumer_timeout()} s; {resend}"
    # the live suite shortens it (celery_driver.live_app), so that a killed worker's message comes back in seconds
    return f"{options}; Redis visibility_timeout {settings.visibility_timeout()} s, shortened for the suite; {resend}"
{%- else %}
    return (
        f"visibility timeout {settings.visibility_timeout()} s, long polling {settings.wait_time_seconds()} s,"
        f" redrive to the dead-letter queue after {settings.max_receive_count()} receives; {resend}"
    )
{%- endif %}


def database_server() -> str:
    """The server and its version, as it names them: PostgreSQL 15.8, MariaDB 10.11.19, MySQL 8.4.3, SQLite 3.40.1."""
    url = settings.database_url()
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return f"SQLite {sqlite3.sqlite_version}"

    def version() -> str:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                if backend == "postgresql":
                    return "PostgreSQL " + str(conn.execute(text("SHOW server_version")).scalar_one())
                # MariaDB's VERSION() is 10.11.19-MariaDB-0+deb12u1, MySQL's 8.4.3
                number, _, rest = str(conn.execute(text("SELECT VERSION()")).scalar_one()).partition("-")
                return f"{'MariaDB' if 'MariaDB' in rest else 'MySQL'} {number}"
        finally:
            engine.dispose()

    return answer(version)


def template_version() -> str:
    """Where the template that made this kit came from: the commit copier or cruft recorded, when either did, and
    in words when that commit cannot be found in a template on this machine."""
    copier = KIT_ROOT / ".copier-answers.yml"
    cruft = KIT_ROOT / ".cruft.json"
    if copier.exists():
        # YAML scalars, quoted when they would read as another type (a short commit of digits only: '3274751')
        recorded = {
            name: value.strip().strip("'\"")
            for name, value in (line.split(": ", 1) for line in copier.read_text().splitlines() if ": " in line)
        }
        source, commit = recorded.get("_src_path", "?"), recorded.get("_commit", "?")
    elif cruft.exists():
        recorded = json.loads(cruft.read_text())
        source, commit = str(recorded.get("template")), str(recorded.get("commit"))
    else:
        return "not recorded (generated by cookiecutter; copier and cruft record it)"
    missing = commit_missing(source, commit)
    return f"{source}, {missing}" if missing else f"{source} at {commit}"


def commit_missing(source: str, commit: str) -> str:
    """Why the recorded commit cannot be shown, in words; empty when it can. A template in a folder here (the path as
    recorded, from the kit's folder) is asked for the commit; a template elsewhere (a URL) cannot be asked."""
    if "://" in source or source.startswith(("gh:", "gl:", "git@")):
        return ""
    folder = KIT_ROOT / source
    if not folder.is_dir():
        return "at a commit that cannot be checked: no template is at that path from this kit's folder"
    asked = subprocess.run(["git", "-C", str(folder), "cat-file", "-e", f"{commit}^0"], capture_output=True)
    if asked.returncode:
        return (
            "at a commit it does not hold: the template had uncommitted changes when this kit was made (copier then"
            " records a commit of its own making), or the commit is gone"
        )
    return ""


RUN = Report()


@pytest.fixture(scope="session")
def report() -> Report:
    return RUN


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A setup that fails before any case was observed: the run could not start, and the report says why."""
    outcome = yield
    result = outcome.get_result()  # type: ignore[attr-defined]
    if result.when == "setup" and result.failed and not RUN.rows and RUN.error is None and call.excinfo:
        message = str(call.excinfo.value).strip()
        RUN.error = message.splitlines()[0] if message else call.excinfo.typename


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The reports, once the replay suite has run (a run of other tests alone leaves the last ones as they were)."""
    if any(getattr(item, "module", None) and item.module.__name__ == "test_replay" for item in session.items):
        RUN.write()
