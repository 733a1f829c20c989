"""Bad answers stop both tools with our one line, and leave nothing on disk.

Run through each tool's command line, as a user would meet them. (Asked interactively: test_interactive.py.)
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from matrix import ROOT, answers, facts, invalid_combinations, problem

# (answer, bad value, what the message must say): each rule of replay_matrix.jinja at least once.
BAD_ANSWERS = [
    ("lease_seconds", "60", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "90", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "0", "is not a positive whole number of seconds"),
    ("lease_seconds", "9", "is shorter than 10 s; a killed worker's message must be able to come back inside the lease"),
    ("longest_run_seconds", "-5", "is not a positive whole number of seconds"),
    ("job_type", "select", "is a reserved word in SQL"),
    ("job_type", "class", "is a reserved word in Python"),
    ("job_type", "send confirmation", "is not a lower-case identifier"),
    ("job_type", "send-confirmation", "is not a lower-case identifier"),
    ("job_type", "1st_email", "is not a lower-case identifier"),
    ("job_type", "_private", "is not a lower-case identifier"),
    ("job_type", "send;drop", "is not a lower-case identifier"),
    ("operation_key_name", "Order_Reference", "is not a lower-case identifier"),
    ("operation_key_name", "elsif", "is a reserved word in Ruby"),
    ("record_table", "order", "is a reserved word in SQL"),
    ("record_table", "x" * 31, "is not a lower-case identifier"),
    ("project_slug", "my-kit", "is not a lower-case identifier"),
    ("project_slug", "module", "is a reserved word in Ruby"),
    ("project_name", "", "must be one line of text"),
    ("example_key", "", "must be one line of text"),
    ("example_key", "K" * 256, "is 256 columns wide; at most 40 fit the lines it lands on"),
    ("example_key", "ORD {{ x }}", "holds Jinja's {{, which cookiecutter would read as a template"),
    ("project_name", "Tab\there", "must be one line of text without leading or trailing spaces, control characters"),
    ("effect_description", "send \u202eliame", "control characters or direction marks"),
    ("other_example_key", "注文" * 11, "is 44 columns wide; at most 40"),
    ("other_example_key", "ORD-1001", "is the same as example_key"),
]
NOT_INTEGERS = [("lease_seconds", "ten minutes"), ("longest_run_seconds", "1.5")]


def cookiecutter_cli(tmp_path: Path, given: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "-o",
            str(out),
            str(ROOT),
            *(f"{name}={value}" for name, value in given.items()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def copier_cli(tmp_path: Path, given: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "copier",
            "copy",
            "--defaults",
            "--quiet",
            *(arg for name, value in given.items() for arg in ("-d", f"{name}={value}")),
            str(ROOT),
            str(tmp_path / "kit"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_refused(tmp_path: Path, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0, result.stdout + result.stderr
    leftovers = [p for p in (tmp_path / "out", tmp_path / "kit") if p.exists()]
    assert not leftovers, f"left on disk: {leftovers}"


def said_only(result: subprocess.CompletedProcess[str]) -> str:
    """Everything cookiecutter printed: our one line and nothing else (no traceback)."""
    return (result.stdout + result.stderr).strip()


@pytest.mark.parametrize(("name", "value", "says"), BAD_ANSWERS, ids=lambda v: str(v)[:24])
def test_cookiecutter_refuses_with_our_line(tmp_path: Path, name: str, value: str, says: str) -> None:
    message = problem(answers(**{name: value}))
    assert message.startswith(f"{name}: ") or message.startswith("lease_seconds: "), message
    assert says in message
    result = cookiecutter_cli(tmp_path, {name: value})
    assert_refused(tmp_path, result)
    # local_extensions.py refuses before cookiecutter makes the kit's folder: our line is all it prints
    assert said_only(result) == f"replay-matrix: {message}"


@pytest.mark.parametrize(("name", "value", "says"), BAD_ANSWERS, ids=lambda v: str(v)[:24])
def test_copier_refuses_with_our_line(tmp_path: Path, name: str, value: str, says: str) -> None:
    result = copier_cli(tmp_path, {name: value})
    assert_refused(tmp_path, result)
    assert problem(answers(**{name: value})) in result.stderr


@pytest.mark.parametrize("combo", invalid_combinations(), ids=lambda c: "-".join(c.values()))
def test_invalid_combinations_are_refused_by_both(tmp_path: Path, combo: dict[str, str]) -> None:
    message = problem(answers(**combo))
    assert message.startswith("stale_claim_policy: lookup needs effect_kind=external_with_reference")
    result = cookiecutter_cli(tmp_path, combo)
    assert_refused(tmp_path, result)
    assert said_only(result) == f"replay-matrix: {message}"
    result = copier_cli(tmp_path, combo)
    assert_refused(tmp_path, result)
    assert message in result.stderr


@pytest.mark.parametrize(("name", "value"), NOT_INTEGERS)
def test_durations_that_are_not_integers_are_refused(tmp_path: Path, name: str, value: str) -> None:
    # cookiecutter passes text through, so our rule names it; copier's own int() refuses it before our rule
    message = problem(answers(**{name: value}))
    assert message == f'{name}: "{value}" is not a positive whole number of seconds; give e.g. ' + (
        "600" if name == "lease_seconds" else "90"
    )
    result = cookiecutter_cli(tmp_path, {name: value})
    assert_refused(tmp_path, result)
    assert said_only(result) == f"replay-matrix: {message}"
    assert_refused(tmp_path, copier_cli(tmp_path, {name: value}))


def test_a_choice_outside_the_list_is_refused(tmp_path: Path) -> None:
    # each tool checks its own choices first; either way nothing is generated
    assert_refused(tmp_path, cookiecutter_cli(tmp_path, {"queue_system": "rq"}))
    assert_refused(tmp_path, copier_cli(tmp_path, {"queue_system": "rq"}))
    assert problem(answers(queue_system="rq")).startswith('queue_system: "rq" is not one of the choices')


def test_good_answers_pass_every_rule() -> None:
    assert problem(answers()) == ""
    assert problem(answers(job_type="notify_customer", record_table="sent_emails", lease_seconds=91)) == ""


# (misspelt name, the question the message must point to)
MISSPELT = [("queue_sytem", "queue_system"), ("lease", "lease_seconds"), ("Stale_Claim_Policy", "stale_claim_policy")]


@pytest.mark.parametrize(("name", "meant"), MISSPELT)
def test_an_answer_under_an_unknown_name_is_refused_by_both(tmp_path: Path, name: str, meant: str) -> None:
    # without the refusal both tools would silently generate the default (a Celery kit for queue_sytem=sidekiq)
    message = f"{name}: there is no such question; did you mean {meant}?"
    result = cookiecutter_cli(tmp_path, {name: "sidekiq"})
    assert_refused(tmp_path, result)
    assert said_only(result) == f"replay-matrix: {message}"
    result = copier_cli(tmp_path, {name: "sidekiq"})
    assert_refused(tmp_path, result)
    assert result.stderr.strip().splitlines()[-1].endswith(f"replay-matrix: {message}")


AWKWARD_NAMES = {
    "Order confirmation (ACME)": "order_confirmation_acme",
    "2FA reminders": "kit_2fa_reminders",
    "Café émails": "cafe_emails",
    'Say "hi"': "say_hi",
    "Class": "class_kit",
    "日本語": "kit",
}


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_the_slug_derived_from_any_name_passes_its_rule(name: str) -> None:
    slug = str(facts().slug(name))
    assert slug == AWKWARD_NAMES[name]
    assert not str(facts().answer_problem("project_slug", {"project_slug": slug})).strip()


def test_the_slug_of_random_names_passes_its_rule() -> None:
    alphabet = "aZ09 _-.()'\"/\\éÉçßøŒİ日\u0301\t!?"
    rng = random.Random(10)
    for _ in range(300):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        slug = str(facts().slug(name))
        assert not str(facts().answer_problem("project_slug", {"project_slug": slug})).strip(), (name, slug)


@pytest.mark.parametrize("name", ["Café émails", 'Say "hi"'])
def test_both_tools_generate_a_kit_from_an_awkward_name(tmp_path: Path, name: str) -> None:
    result = cookiecutter_cli(tmp_path, {"project_name": name})
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == [AWKWARD_NAMES[name]]
    result = copier_cli(tmp_path, {"project_name": name})
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = yaml.safe_load((tmp_path / "kit" / ".copier-answers.yml").read_text())
    assert (recorded["project_name"], recorded["project_slug"]) == (name, AWKWARD_NAMES[name])


def test_the_lease_default_follows_a_long_run_in_both_tools(tmp_path: Path) -> None:
    # a longest run of 900 s: the lease default (600) would break the rule, so it is derived: 4 x 900
    assert int(str(facts().lease_default(900))) == 3600
    result = cookiecutter_cli(tmp_path, {"longest_run_seconds": "900"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "**Lease: 3600 seconds.**" in (tmp_path / "out" / "order_confirmation" / "POLICY.md").read_text()
    result = copier_cli(tmp_path, {"longest_run_seconds": "900"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load((tmp_path / "kit" / ".copier-answers.yml").read_text())["lease_seconds"] == 3600
