{%- from "replay_matrix.jinja" import expected, kind, policy, py with context -%}
{%- set c = cookiecutter -%}
"""The replay suite: the seven cases of POLICY.md for `{{ c.job_type }}`, one test each.

Policy `{{ c.stale_claim_policy }}` ({{ policy.title }}); effect: {{ kind.title }}.
Effects are {{ kind.counted }}, counted where they arrive; the record is read from the database.
Every run writes replay-report.json and the sign-off reports made from it (replay_reports.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conftest import Records
from driving import Driver
from replay_reports import Report
from sinks import Effects

KEY = {{ py(c.example_key) }}
OTHER_KEY = {{ py(c.other_example_key) }}
DETAILS = {"email": "customer@example.com"}
# a different effect for a reused key is not a duplicate: the message is refused
OTHER_DETAILS = {"email": "someone.else@example.com"}
ONE_TRANSACTION = {{ "True" if kind.one_transaction else "False" }}
LEASE_SECONDS = {{ c.lease_seconds }}


@dataclass(frozen=True)
class Case:
    attempt: str
    emails: int
    record: str

    def expected(self) -> dict[str, Any]:
        return {"emails": self.emails, "record": self.record}


# What each case must show afterwards: emails (effects) and the record.
CASES = {
{%- for r in expected %}
    {{ r.case }}: Case({{ r.attempt|tojson }}, emails={{ r.emails }}, record={{ r.record|tojson }}),
{%- endfor %}
}
CRASH_POINTS = {
{%- for r in expected if r.get("crash") %}
    {{ r.case }}: {{ r.crash|tojson }},
{%- endfor %}
}
# Where a worker is killed, in the words of the report's timeline.
CRASHES = {
    "before_effect": "after the claim, before the effect",
    "after_effect": "after the effect, before it was marked completed",
}


@dataclass(frozen=True)
class Seen:
    emails: int
    record: str

    def after(self, step: str) -> str:
        """One step of a case's timeline: what was done, then the record and the effects so far."""
        return f"{step}: record {self.record}, {self.emails} effect(s)"


def seen(effects: Effects, records: Records, key: str = KEY) -> Seen:
    return Seen(effects.count(key), records.status(key))


def check(report: Report, number: int, observed: dict[str, Any], timeline: tuple[str, ...] = ()) -> None:
    case = CASES[number]
    report.add(number, case.attempt, case.expected(), observed, timeline)
    assert observed == case.expected(), f"case {number}, {case.attempt}"


def test_case_1_first_delivery(driver: Driver, effects: Effects, records: Records, report: Report) -> None:
    driver.deliver(KEY, DETAILS)
    now = seen(effects, records)
    check(report, 1, {"emails": now.emails, "record": now.record})


def test_case_2_same_message_again_after_success(
    driver: Driver, effects: Effects, records: Records, report: Report
) -> None:
    driver.deliver(KEY, DETAILS)
    again = driver.deliver(KEY, DETAILS)
    now = seen(effects, records)
    record = now.record if again.action == "skipped" else f"{now.record} (second delivery: {again.action})"
    check(report, 2, {"emails": now.emails, "record": record})


def test_case_3_same_message_to_two_workers_at_once(
    driver: Driver, effects: Effects, records: Records, report: Report
) -> None:
    actions = driver.deliver_twice_at_once(KEY, DETAILS)
    now = seen(effects, records)
    # one claims and performs; the other meets its claim (young, or already completed) and skips
    one_claims = sorted(actions) in (["performed", "skipped"], ["performed", "waiting"])
    record = now.record if one_claims else f"{now.record} (runs: {', '.join(actions)})"
    check(report, 3, {"emails": now.emails, "record": record})


def test_case_4_a_different_key(driver: Driver, effects: Effects, records: Records, report: Report) -> None:
    driver.deliver(KEY, DETAILS)
    driver.deliver(OTHER_KEY, DETAILS)
    first, other = seen(effects, records, KEY), seen(effects, records, OTHER_KEY)
    check(report, 4, {"emails": first.emails + other.emails, "record": f"{first.record}, {other.record}"})


@dataclass(frozen=True)
class Death:
    crash: str
    after_death: Seen
    after_redelivery: Seen
    redelivery_action: str

    def timeline(self) -> tuple[str, ...]:
        return (
            self.after_death.after(f"a worker claimed it and was killed with SIGKILL {CRASHES[self.crash]}"),
            self.after_redelivery.after(f"the queue delivered it again, inside the lease ({self.redelivery_action})"),
        )


deaths: dict[int, Death] = {}


def die_and_redeliver(number: int, driver: Driver, effects: Effects, records: Records) -> Death:
    """A worker dies at case `number`'s crash point; then the queue delivers the message again, inside the lease."""
    driver.deliver_and_die(KEY, DETAILS, CRASH_POINTS[number])
    after_death = seen(effects, records)
    redelivery = driver.redeliver_after_death()
    deaths[number] = Death(CRASH_POINTS[number], after_death, seen(effects, records), redelivery.action)
    return deaths[number]


def worker_death_case(number: int, driver: Driver, effects: Effects, records: Records, report: Report) -> None:
    death = die_and_redeliver(number, driver, effects, records)
    first = death.after_death.record
    if not ONE_TRANSACTION and (death.after_redelivery, death.redelivery_action) != (death.after_death, "waiting"):
        # inside the lease a redelivery must change nothing and take nothing over: show it if it did
        first += f" (redelivered inside the lease: {death.redelivery_action}, {death.after_redelivery})"
    # the lease runs out, by the database's clock; the message comes back and the policy applies
    records.age(KEY)
    aged = f"the claim was aged past the lease ({LEASE_SECONDS + 1} s) in SQL"
    redelivery = driver.redeliver(KEY, DETAILS)
    final = seen(effects, records)
    timeline = (*death.timeline(), aged, final.after(f"the message came back after the lease ({redelivery.action})"))
    check(report, number, {"emails": final.emails, "record": f"{first}, then {final.record}"}, timeline)


def test_case_5_worker_dies_after_the_claim_before_the_effect(
    driver: Driver, effects: Effects, records: Records, report: Report
) -> None:
    worker_death_case(5, driver, effects, records, report)


def test_case_6_worker_dies_after_the_effect_before_completed(
    driver: Driver, effects: Effects, records: Records, report: Report
) -> None:
    worker_death_case(6, driver, effects, records, report)


def test_case_7_redelivery_inside_the_lease(driver: Driver, effects: Effects, records: Records, report: Report) -> None:
    # case 5's death and redelivery, as case 5 saw them right after the redelivery (or anew when run alone)
    death = deaths.get(5) or die_and_redeliver(5, driver, effects, records)
    record = death.after_redelivery.record
    expected_action = "performed" if ONE_TRANSACTION else "waiting"
    if death.redelivery_action != expected_action:
        record += f" (redelivery: {death.redelivery_action})"
    check(report, 7, {"emails": death.after_redelivery.emails, "record": record}, death.timeline())
