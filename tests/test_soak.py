"""The soak (every kit's `soak` command), run as the kit's README shows it, against PostgreSQL, the broker and
real worker processes that a chaos loop kills with SIGKILL.

The short soak (300 operations, 2 workers, a kill every second) runs for one combination per queue system and
policy: hold, resend and skip with the email, lookup with the provider that takes a reference, and the
same-database effect; Celery's on Redis and on RabbitMQ in turn. It must pass (exit status 0, no violation, workers
really killed), and replay-soak.json must say what the printed table says. For each queue system's default
combination the kit's embedded suite runs first, so the soak renders the sign-off reports again, and they must
show it. The long soak (the README's command with its defaults) runs once per queue system, default policy, when
asked (`tox -- -m long`): the whole matrix keeps the short soaks, which check the same invariants on fewer keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest
from generate import baked, readme_commands
from matrix import DEFAULTS, combinations, combo_id, facts
from services import postgres_database, psql, rabbitmq_vhost, redis_database
from test_kits import REPLAY_CASES, run_name

# How each language's kit runs its soak, from the kit's root, exactly as its README's section "The soak" shows
# it: the short soak that CI runs for every policy, and the long one. {slug} is the kit's project_slug.
SOAK_COMMANDS = {
    "python": {
        "short": "python -m {slug}_proof soak --operations 300 --workers 2 --kill-every 1 --kill-after-take 0.03",
        "long": "python -m {slug}_proof soak",
    },
    "ruby": {
        "short": "bundle exec rake {slug}:soak OPERATIONS=300 WORKERS=2 KILL_EVERY=1 KILL_AFTER_TAKE=0.02",
        "long": "bundle exec rake {slug}:soak",
    },
}
# How each language's kit makes its tables: the README's section and the command's place in it.
MIGRATIONS = {"python": ("Install and run", 1), "ruby": ("On its own", 1)}
# The services each queue system's soak runs on, one run each; the first for the long soak and the reports.
SOAK_BROKERS = {"celery": ["redis", "rabbitmq"], "sidekiq": ["redis"], "sqs": ["moto"]}
# The printed table's rows, by the key of replay-soak.json that each one shows.
TABLE = {
    "keys": "operations",
    "messages sent": "messages",
    "duplicates sent": "duplicates",
    "bad messages": "bad_messages",
    "workers killed": "workers_killed",
    "killed right after a take": "killed_after_take",
    "effects": "effects",
    "completed": "completed",
    "held": "held",
    "abandoned": "abandoned",
    "lost by the queue, sent again": "lost_resent",
    "violations": "violations",
    "seconds": "seconds",
    "throughput (operations/s)": "throughput",
}


def language(queue_system: str) -> str:
    return str(facts().queue_systems[queue_system]["language"])


def soak_combinations() -> list[dict[str, str]]:
    """One combination per queue system and policy: each policy with the effect kind it is for (lookup with the
    provider that takes a reference, the others with the email), and the same-database effect."""
    policies = facts().policies
    chosen = []
    for combo in combinations():
        if combo["queue_system"] not in SOAK_BROKERS:
            continue
        policy = combo["stale_claim_policy"]
        if combo["effect_kind"] == "same_database":
            if policy == DEFAULTS["stale_claim_policy"]:
                chosen.append(combo)
        elif combo["effect_kind"] == policies[policy].get("needs", "external_no_reference"):
            chosen.append(combo)
    return chosen


def is_default(combo: dict[str, str]) -> bool:
    return all(combo[name] == DEFAULTS[name] for name in ("effect_kind", "stale_claim_policy"))


def short_soaks() -> list[pytest.param]:
    """Each soak combination once, on its queue system's brokers in turn (Celery: the default on Redis, the next on
    RabbitMQ, ...): every policy, effect kind and broker soaks, and test_kits runs every suite on every broker."""
    seen: dict[str, int] = {}
    soaks = []
    for combo in soak_combinations():
        brokers = SOAK_BROKERS[combo["queue_system"]]
        turn = seen[combo["queue_system"]] = seen.get(combo["queue_system"], -1) + 1
        broker = brokers[turn % len(brokers)]
        soaks.append(pytest.param(combo, broker, id=f"{combo_id(combo)}-{broker}", marks=pytest.mark.live))
    return soaks


LONG = [pytest.mark.live, pytest.mark.long]


def long_soaks() -> list[pytest.param]:
    return [
        pytest.param(combo, SOAK_BROKERS[combo["queue_system"]][0], id=combo_id(combo), marks=LONG)
        for combo in soak_combinations()
        if is_default(combo)
    ]


@contextlib.contextmanager
def broker_environment(broker: str) -> Iterator[dict[str, str]]:
    """The environment that points a kit at the broker, made for this test and removed after it."""
    if broker == "redis":
        with redis_database() as url:
            yield {"CELERY_BROKER_URL": url, "REDIS_URL": url}
    elif broker == "rabbitmq":
        with rabbitmq_vhost() as url:
            yield {"CELERY_BROKER_URL": url}
    else:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield {
                "SQS_ENDPOINT_URL": f"http://{host}:{port}",
                "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "soak",
                "AWS_SECRET_ACCESS_KEY": "soak",
            }
        finally:
            server.stop()


def shell_environment(kit: Path) -> dict[str, str]:
    """This environment without any service of the user's, the kit importable, and `python` this interpreter."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DATABASE_URL", "CELERY_", "REDIS_URL", "SQS_", "AWS_", "SMTP_", "PROVIDER_URL"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    env["PYTHONPATH"] = str(kit / "src")
    return env


def run(kit: Path, command: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=kit, env=env, capture_output=True, text=True, timeout=timeout)


def printed_table(out: str) -> dict[str, str]:
    """The soak's table: label, then its value, right-aligned."""
    rows = dict(re.findall(r"^  (\S.*?)\s{2,}(\S+)$", out, re.MULTILINE))
    return {label: rows[label] for label in TABLE if label in rows}


def soak(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    combo: dict[str, str],
    broker: str,
    length: str,
    suite_first: bool = False,
) -> tuple[Path, dict[str, object]]:
    """Generates the kit, runs its soak as its README shows it on fresh services, and checks what it printed
    against replay-soak.json; the kit, and the soak's facts."""
    kit = baked(tmp_path, combo)
    lang = language(combo["queue_system"])
    slug = kit.name
    command = SOAK_COMMANDS[lang][length].format(slug=slug)
    assert command in readme_commands(kit, "The soak"), "the README shows another command"
    section, index = MIGRATIONS[lang]
    migrate = readme_commands(kit, section)[index]
    env = shell_environment(kit)
    if suite_first:  # the seven cases, embedded, which write replay-report.json, for the soak to render again
        suite = subprocess.run(REPLAY_CASES[lang], cwd=kit, env=env, capture_output=True, text=True, timeout=600)
        assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-3000:]
    with postgres_database(run_name(request)) as database, broker_environment(broker) as services:
        env |= {"DATABASE_URL": database, **services}
        migrated = run(kit, migrate, env)
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        result = run(kit, command, env)
        print(f"{combo_id(combo)} {broker}:\n{result.stdout}")
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
        table = psql("SELECT count(*) FROM handled_operations", database.rsplit("/", 1)[1]).strip()
        assert table == "0", "a passed soak deletes its records"
    facts_ = json.loads((kit / "replay-soak.json").read_text())
    assert {name: facts_[name] for name in combo} == combo
    assert facts_["passed"] is True and facts_["violations"] == [], facts_["violations"]
    assert facts_["workers_killed"] > 0, "the chaos loop killed no worker"
    assert facts_["killed_after_take"] > 0, "no worker died right after taking a message"
    if lang == "ruby":  # the database restarted half-way, as the workers saw it
        assert facts_["connections_ended"] > 0, "the restart ended no connection"
    assert facts_["completed"] + facts_["held"] + facts_["abandoned"] == facts_["operations"]
    shown = printed_table(result.stdout)
    assert list(shown) == list(TABLE), result.stdout
    for label, name in TABLE.items():
        value = facts_[name]
        assert shown[label] == str(len(value) if isinstance(value, list) else value), (label, shown[label], value)
    return kit, facts_


@pytest.mark.parametrize(("combo", "broker"), short_soaks())
def test_short_soak_passes(request: pytest.FixtureRequest, tmp_path: Path, combo: dict[str, str], broker: str) -> None:
    with_reports = is_default(combo) and broker == SOAK_BROKERS[combo["queue_system"]][0]
    kit, facts_ = soak(request, tmp_path, combo, broker, "short", suite_first=with_reports)
    assert (facts_["operations"], facts_["workers"], facts_["kill_every"]) == (300, 2, 1)
    assert facts_["bad_messages"] > 0 and facts_["duplicates"] > 0
    if with_reports:
        assert_reports_show_the_soak(kit, facts_)


@pytest.mark.parametrize(("combo", "broker"), long_soaks())
def test_long_soak_passes(request: pytest.FixtureRequest, tmp_path: Path, combo: dict[str, str], broker: str) -> None:
    _, facts_ = soak(request, tmp_path, combo, broker, "long")
    assert (facts_["operations"], facts_["workers"], facts_["kill_every"]) == (2000, 4, 3)


def assert_reports_show_the_soak(kit: Path, soak_facts: dict[str, object]) -> None:
    """The suite's reports, rendered again by the soak: the seven cases still, and the soak beside them."""
    words = facts().soak
    figures = f"{soak_facts['operations']} operations, {soak_facts['workers']} workers"
    html = (kit / "replay-report.html").read_text()
    assert "Passed: all seven cases behaved as POLICY.md says." in html
    assert '<section id="soak">' in html and words["title"] in html and words["passed"] in html
    assert f"{figures}, a kill every {soak_facts['kill_every']} s" in html
    assert f"<tr><th>Workers killed (SIGKILL)</th><td>{soak_facts['workers_killed']}</td></tr>" in html
    markdown = (kit / "replay-report.md").read_text()
    assert f"## {words['title']}" in markdown and f"**{words['passed']}**" in markdown
    assert f"| Workers killed (SIGKILL) | {soak_facts['workers_killed']} |" in markdown
    junit = ElementTree.parse(kit / "replay-junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert [len(cases), junit.get("tests"), junit.get("failures"), junit.get("errors")] == [8, "8", "0", "0"]
    assert cases[-1].get("name", "").startswith(f"soak: {figures}")
    assert cases[-1].find("failure") is None
