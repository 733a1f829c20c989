"""Bad answers stop both tools with our one line, and leave nothing on disk.

Run through each tool's command line, as a user would meet them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matrix import ROOT, answers, invalid_combinations, problem

# (answer, bad value, what the message must say): each rule of replay_matrix.jinja at least once.
BAD_ANSWERS = [
    ("lease_seconds", "60", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "90", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "0", "is not a positive whole number of seconds"),
    ("longest_run_seconds", "-5", "is not a positive whole number of seconds"),
    ("job_type", "select", "is a reserved word in SQL"),
    ("job_type", "class", "is a reserved word in Python"),
    ("job_type", "send confirmation", "is not a lower-case identifier"),
    ("job_type", "send-confirmation", "is not a lower-case identifier"),
    ("job_type", "1st_email", "is not a lower-case identifier"),
    ("job_type", "send;drop", "is not a lower-case identifier"),
    ("operation_key_name", "Order_Reference", "is not a lower-case identifier"),
    ("operation_key_name", "elsif", "is a reserved word in Ruby"),
    ("record_table", "order", "is a reserved word in SQL"),
    ("record_table", "x" * 64, "is not a lower-case identifier"),
    ("project_slug", "my-kit", "is not a lower-case identifier"),
    ("project_slug", "module", "is a reserved word in Ruby"),
    ("project_name", "", "must be one line of text"),
    ("example_key", "", "must be one line of text"),
    ("example_key", "K" * 256, "is longer than the 255 the record table holds"),
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
    leftovers = [p for p in (tmp_path / "out", tmp_path / "kit") if p.exists() and any(p.iterdir())]
    assert not leftovers, f"half-generated: {leftovers}"


@pytest.mark.parametrize(("name", "value", "says"), BAD_ANSWERS, ids=lambda v: str(v)[:24])
def test_cookiecutter_refuses_with_our_line(tmp_path: Path, name: str, value: str, says: str) -> None:
    message = problem(answers(**{name: value}))
    assert message.startswith(f"{name}: ") or message.startswith("lease_seconds: "), message
    assert says in message
    result = cookiecutter_cli(tmp_path, {name: value})
    assert_refused(tmp_path, result)
    # cookiecutter logs its own traceback after a failed hook: our line comes first, alone on its line
    assert result.stderr.splitlines()[0] == f"replay-matrix: {message}"


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
    assert result.stderr.splitlines()[0] == f"replay-matrix: {message}"
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
    assert result.stderr.splitlines()[0] == f"replay-matrix: {message}"
    assert_refused(tmp_path, copier_cli(tmp_path, {name: value}))


def test_a_choice_outside_the_list_is_refused(tmp_path: Path) -> None:
    # each tool checks its own choices first; either way nothing is generated
    assert_refused(tmp_path, cookiecutter_cli(tmp_path, {"queue_system": "rq"}))
    assert_refused(tmp_path, copier_cli(tmp_path, {"queue_system": "rq"}))
    assert problem(answers(queue_system="rq")).startswith('queue_system: "rq" is not one of the choices')


def test_good_answers_pass_every_rule() -> None:
    assert problem(answers()) == ""
    assert problem(answers(job_type="notify_customer", record_table="sent_emails", lease_seconds=91)) == ""
