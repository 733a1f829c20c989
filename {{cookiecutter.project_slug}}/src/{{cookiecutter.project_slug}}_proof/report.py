{%- set celery = cookiecutter.queue_system == "celery" -%}
"""The sign-off reports, rendered from the facts: replay-report.json (the replay suite's) and replay-soak.json
(the soak's), in the kit's root.

    replay-report.html   for the client: the verdict, the policy, the seven cases, the soak, where it ran
    replay-report.md     the same, for a pull request or an email
    replay-junit.xml     one test case per row, and one for the soak, for any CI

Both the replay suite (tests/replay_reports.py) and the soak render them here, so the reports show the
last run of each, whichever ran last. The templates in report/ are Mustache, shared with the Ruby kit: their
words come from the template that wrote POLICY.md; `view` adds only what Mustache cannot compute.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pystache

from {{ cookiecutter.project_slug }} import settings

REPORTS = ("replay-report.html", "replay-report.md", "replay-junit.xml")
FACTS = "replay-report.json"
SOAK = "replay-soak.json"
CASES = range(1, 8)


def view(facts: dict[str, Any], soak: dict[str, Any] | None = None) -> dict[str, Any]:
    """The facts, plus each case by its number (`case5`) with its status, the verdict's parts, and the soak."""
    rows = {row["case"]: row for row in facts["rows"]}
    cases: dict[str, dict[str, Any]] = {}
    for number in CASES:
        row = rows.get(number)
        status = "not run" if row is None else "passed" if row["passed"] else "failed"
        cases[f"case{number}"] = {
            **(row or {"case": number}),
            "status": status,
            "status_class": status.replace(" ", "-"),
            "failed": status == "failed",
            "not_run": status == "not run",
            "has_timeline": bool(row and row["timeline"]),
        }
    unpassed = [case for case in cases.values() if case["status"] != "passed"]
    soak_failed = soak is not None and not soak["passed"]
    return {
        **facts,
        **cases,
        "failed_cases": unpassed,
        "signed_off": not unpassed and not facts.get("error") and not soak_failed,
        "failure_count": sum(case["failed"] for case in cases.values()) + int(soak_failed),
        "error_count": sum(case["not_run"] for case in cases.values()),
        # absent when no soak of this kit's policy ran: the templates leave the section out
        "soak": soak,
    }


def this_kits_soak(root: Path) -> dict[str, Any] | None:
    """replay-soak.json, when it is there and was made with this kit's answers (not before a policy change)."""
    path = root / SOAK
    if not path.exists():
        return None
    soak: dict[str, Any] = json.loads(path.read_text())
    answers = ("{{ cookiecutter.queue_system }}", settings.STALE_CLAIM_POLICY, settings.EFFECT_KIND)
    return soak if (soak["queue_system"], soak["stale_claim_policy"], soak["effect_kind"]) == answers else None


def render(root: Path, facts: dict[str, Any]) -> None:
    """Writes the three reports into `root` from the replay suite's facts and the soak's, if one ran."""
    filled = view(facts, this_kits_soak(root))
    for name in REPORTS:
        template = (root / "report" / f"{name}.mustache").read_text()
        (root / name).write_text(pystache.render(template, filled))


def rerender(root: Path) -> bool:
    """The reports again from replay-report.json, when the suite has written one; False when it has not."""
    facts = root / FACTS
    if not facts.exists() or not (root / "report").is_dir():
        return False
    render(root, json.loads(facts.read_text()))
    return True


def answer(ask: Callable[[], object]) -> str:
    """A service's answer, or why there was none."""
    try:
        return str(ask())
    except Exception as error:
        return f"unknown ({type(error).__name__}: {error})"
{%- if celery %}


def broker() -> str:
    """The broker of CELERY_BROKER_URL and its server's version, as the reports name it."""
    import kombu

    url = settings.broker_url()
    if url.startswith("redis"):
        import redis

        return f"Redis {answer(lambda: redis.Redis.from_url(url).info('server')['redis_version'])}"
    if settings.on_rabbitmq():

        def rabbitmq_version() -> str:
            with kombu.Connection(url, connect_timeout=10) as connection:
                connection.connect()
                return str(connection.connection.server_properties["version"])

        return f"RabbitMQ {answer(rabbitmq_version)}"
    return f"none: kombu's in-memory transport ({url}, embedded mode)"
{%- endif %}
