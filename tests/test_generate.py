"""Every valid combination of answers generates a whole kit, the same under cookiecutter and copier."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from generate import COPIER_ANSWERS, baked, tree, with_cookiecutter, with_copier
from kit_requirements import declared
from matrix import ROOT, answers, combinations, combo_id, expected, facts, problem

COMBINATIONS = combinations()
# One xdist worker takes this module, so the thirty kits of the `kits` fixture are baked once per run, not once
# per worker (tox runs pytest with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("generated_kits")
# Jinja left in a kit, but not a GitHub Actions expression (${{ ... }}), nor the tag that switches the report
# templates' Mustache to [[ ]] (report/*.mustache), nor a mention of cookiecutter.json
UNRENDERED = re.compile(rb"(?<!\$)\{\{(?!=\[\[ \]\]=\}\})|\{%|\{#|\bcookiecutter\.(?!json)\w")


@pytest.fixture(scope="session")
def kits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One cookiecutter kit per combination, baked once per run (generate.baked: the suites of test_kits use the
    same) for this module's tests (session scope: xdist interleaves modules on a worker, which would tear a module
    fixture down and copy the kits again)."""
    root = tmp_path_factory.mktemp("cookiecutter")
    return {combo_id(c): baked(root / combo_id(c), c) for c in COMBINATIONS}


def test_there_are_thirty_combinations() -> None:
    # 3 queue systems x (3 policies with no reference + 4 with one + 3 for same_database)
    assert len(COMBINATIONS) == 30


def folders(kit: Path) -> set[str]:
    return {str(path.relative_to(kit)) for path in kit.rglob("*") if path.is_dir()}


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combo_id)
def test_no_template_syntax_survives(kits: dict[str, Path], combo: dict[str, str]) -> None:
    kit = kits[combo_id(combo)]
    files = tree(kit)
    assert {"POLICY.md", "README.md", "schema.sql"} <= set(files)
    for name, content in files.items():
        assert not UNRENDERED.search(name.encode()), name
        assert not UNRENDERED.search(content), name
        assert content.strip(), f"{name} is empty"
    assert not [name for name in folders(kit) if not any((kit / name).iterdir())], "empty folders"


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combo_id)
def test_copier_renders_the_same_kit(kits: dict[str, Path], combo: dict[str, str], tmp_path: Path) -> None:
    by_copier = tree(with_copier(tmp_path / "kit", combo))
    recorded = yaml.safe_load(by_copier.pop(COPIER_ANSWERS))
    assert by_copier == tree(kits[combo_id(combo)])
    assert folders(tmp_path / "kit") == folders(kits[combo_id(combo)])
    # the answers file that `copier update` needs later records every answer given
    assert {name: recorded[name] for name in answers()} == answers(**combo)


def test_the_keep_list_names_template_files_and_copier_has_an_entry_for_each_path_a_kit_drops() -> None:
    """kit_files (templates/replay_matrix.jinja) is the one list of which kit keeps which file: each of its paths
    names files of the template, and copier.yml's _exclude, one path per entry, has room for every kit's."""
    template = ROOT / "{{cookiecutter.project_slug}}"
    for entry in facts().kit_files:
        for path in entry["files"]:
            # the package folder's name is an answer: the keep-list's * stands for it
            named = path.replace("src/*/", "src/{{cookiecutter.project_slug}}/")
            assert list(template.glob(named.replace("src/*_proof/", "src/{{cookiecutter.project_slug}}_proof/"))), path
    entries = yaml.safe_load((ROOT / "copier.yml").read_text())["_exclude"]
    room = sum("partials/dropped_path.jinja" in entry for entry in entries)
    dropped = {combo_id(c): str(facts().dropped(c)).split() for c in COMBINATIONS}
    assert max(len(paths) for paths in dropped.values()) <= room, dropped


def policy_rows(policy_md: str) -> list[tuple[int, int, str]]:
    section = policy_md.split("## The seven cases", 1)[1].split("\n## ", 1)[0]
    cells = [line.strip("|").split("|") for line in section.splitlines() if re.match(r"\| \d \|", line)]
    return [(int(c[0]), int(c[2]), c[3].strip()) for c in cells]


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combo_id)
def test_policy_md_states_the_data(kits: dict[str, Path], combo: dict[str, str]) -> None:
    text = (kits[combo_id(combo)] / "POLICY.md").read_text()
    given = answers(**combo)
    rows = expected(combo["effect_kind"], combo["stale_claim_policy"])
    assert policy_rows(text) == [(row["case"], row["emails"], row["record"]) for row in rows]

    policy = facts().policies[combo["stale_claim_policy"]]
    assert f"## The policy for a stale claim: {policy['title']}" in text
    for fact in (
        f"Lease: {given['lease_seconds']} seconds",
        f"**{given['longest_run_seconds']} seconds**",
        given["example_key"],
        given["other_example_key"],
        given["record_table"],
        "UNIQUE (job_type, operation_key)",
        "## The uncertain case",
        "## Limits",
        "## Sign-off",
        "A queue does not become exactly-once",
        "Duplicates that already exist are not cleaned up",
    ):
        assert fact in text, fact
    for name, other in facts().policies.items():
        line = next(line for line in text.splitlines() if line.startswith(f"| {other['title']} (`{name}`)"))
        assert f"| {other['emails']['5']} | {other['emails']['6']} |" in line
        assert ("ruled out" in line) == (other.get("needs", combo["effect_kind"]) != combo["effect_kind"])
        assert ("**chosen**" in line) == (name == combo["stale_claim_policy"])
    assert ("leaves nothing behind" in text) == (combo["effect_kind"] == "same_database")


def described(kit: Path) -> list[str]:
    """Where a kit says what its job does: POLICY.md's row, the README's overview, both reports' first lines."""
    policy = (kit / "POLICY.md").read_text()
    readme = (kit / "README.md").read_text()
    reports = [
        (kit / "report" / name).read_text() for name in ("replay-report.md.mustache", "replay-report.html.mustache")
    ]
    row = next(line for line in policy.splitlines() if line.startswith("| What it does, once per operation key |"))
    return [row, *(re.search(r"\(([^)]*)\)", text.split("The job ", 1)[1])[1] for text in reports), readme]


def test_a_same_database_kit_says_it_writes_a_row_unless_told_otherwise(kits: dict[str, Path], tmp_path: Path) -> None:
    email = answers()["effect_description"]
    row = facts().effect_kinds["same_database"]["description"]
    kit = kits[combo_id({"queue_system": "celery", "effect_kind": "same_database", "stale_claim_policy": "hold"})]
    for place in described(kit):
        assert row.replace("'", "&#39;") in place or row in place
    assert email not in (kit / "POLICY.md").read_text()
    # the user's own words stay, whatever the kind
    given = {"effect_kind": "same_database", "effect_description": "store the invoice once"}
    own = with_cookiecutter(tmp_path, given)
    assert all("store the invoice once" in place for place in described(own))
    assert row not in (own / "POLICY.md").read_text()


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combo_id)
def test_schema_runs_on_sqlite(kits: dict[str, Path], combo: dict[str, str]) -> None:
    db = sqlite3.connect(":memory:")
    db.executescript((kits[combo_id(combo)] / "schema.sql").read_text())
    columns = {row[1] for row in db.execute("PRAGMA table_info(handled_operations)")}
    assert {"job_type", "operation_key", "status", "claimed_at", "claim_token", "payload_fingerprint"} <= columns
    insert = (
        "INSERT INTO handled_operations (job_type, operation_key, payload_fingerprint, claim_token, claimed_at)"
        " VALUES ('j', 'k', 'f', ?, julianday('now')) ON CONFLICT (job_type, operation_key) DO NOTHING"
        " RETURNING claim_token"
    )
    assert db.execute(insert, ["first"]).fetchall() == [("first",)]
    assert db.execute(insert, ["second"]).fetchall() == []  # the unique pair refuses a second claim


@pytest.mark.parametrize("effect_kind", ["external_no_reference", "same_database"])
def test_schema_runs_on_postgresql(kits: dict[str, Path], effect_kind: str) -> None:
    kit = kits[combo_id({"queue_system": "celery", "effect_kind": effect_kind, "stale_claim_policy": "hold"})]
    claim = (
        "INSERT INTO handled_operations (job_type, operation_key, payload_fingerprint, claim_token, claimed_at)"
        " VALUES ('j', 'k', 'f', 't', clock_timestamp()) ON CONFLICT (job_type, operation_key) DO NOTHING"
        " RETURNING claim_token;"
    )
    psql = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"]
    # all in one transaction that rolls back: the shared server keeps nothing
    result = subprocess.run(
        [*psql, "-c", "BEGIN", "-f", str(kit / "schema.sql"), "-c", claim, "-c", claim, "-c", "ROLLBACK"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(1 row)") == 1 and result.stdout.count("(0 rows)") == 1, result.stdout


def test_default_answers_name_the_kit(kits: dict[str, Path]) -> None:
    defaults = answers()
    kit = kits[combo_id({k: defaults[k] for k in ("queue_system", "effect_kind", "stale_claim_policy")})]
    assert kit.name == "order_confirmation"


README_GENERATE = (ROOT / "README.md").read_text().split("## Generate a kit", 1)[1].split("\n## ", 1)[0]


def readme_generate_commands() -> list[str]:
    """The README's `tox -e generate` commands, as written in its section on generating a kit."""
    return [command.strip() for command in re.findall(r"([^`\n]*tox -e generate[^`\n]*)", README_GENERATE)]


def run_generate(readme_command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs what tox runs for a README command: [testenv:generate]'s commands with the README's arguments."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    (command,) = tox["testenv:generate"]["commands"].strip().splitlines()
    posargs = shlex.split(readme_command.split("tox -e generate", 1)[1])
    posargs = posargs[1:] if posargs[:1] == ["--"] else posargs
    argv = shlex.split(command.replace("{posargs}", shlex.join(posargs)))
    assert argv[:2] == ["python", "tests/generate_kit.py"], argv
    # tox runs it from the template's root; here from an empty folder, so build/ is this test's own
    argv = [sys.executable, str(ROOT / argv[1]), *argv[2:]]
    # a temporary folder and a home of its own, which the run must leave as it found them (cookiecutter writes a
    # replay file to ~/.cookiecutter_replay unless told otherwise)
    temporary, home = cwd / "tmp", cwd / "home"
    temporary.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(temporary), "HOME": str(home)}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert not any(temporary.iterdir()), f"left in the temporary folder: {sorted(temporary.iterdir())}"
    assert not any(home.iterdir()), f"left in the home folder: {sorted(home.iterdir())}"
    return result


def test_the_readme_generate_commands_write_a_fresh_kit_and_say_where(tmp_path: Path) -> None:
    commands = readme_generate_commands()
    plain, with_answers = commands
    assert plain == ".venv/bin/tox -e generate" and "queue_system=sidekiq" in with_answers
    # the install line works where the system Python is externally managed (no bare `pip install`)
    assert "\n    python3 -m venv .venv && .venv/bin/pip install tox" in README_GENERATE

    first = run_generate(plain, tmp_path)
    kit = tmp_path / "build" / "order_confirmation"
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == f"kit written to {kit}"
    assert (kit / "src" / "order_confirmation" / "celery_app.py").exists()

    # different answers into the same folder: refused, the first kit untouched, nothing mixed in
    before = tree(kit)
    second = run_generate(with_answers, tmp_path)
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"{kit.relative_to(tmp_path)} already holds a kit from an earlier run; nothing was written."
        " Remove it, or add --replace (tox -e generate -- --replace ...)"
    )
    assert tree(kit) == before
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == ["order_confirmation"]

    replaced = run_generate(with_answers.replace("-- ", "-- --replace "), tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stdout.strip().splitlines()[-1] == f"kit written to {kit}"
    assert not (kit / "src").exists() and (kit / "lib" / "order_confirmation.rb").exists()  # a Sidekiq kit only
    assert "Accept a rare duplicate (`resend`)" in (kit / "POLICY.md").read_text()


def test_generate_refuses_a_bad_answer_with_our_line(tmp_path: Path) -> None:
    result = run_generate("tox -e generate -- lease_seconds=5", tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == f"replay-matrix: {problem(answers(lease_seconds=5))}"
    assert not any((tmp_path / "build").iterdir())


def test_generate_refuses_a_misspelt_choice_with_our_line(tmp_path: Path) -> None:
    # cookiecutter itself would stop with a ValueError's traceback before any rule of ours ran
    result = run_generate("tox -e generate -- queue_system=sidekik", tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'replay-matrix: queue_system: "sidekik" is not one of the choices; use one of celery, sidekiq, sqs'
    )
    assert not (tmp_path / "build").exists() or not any((tmp_path / "build").iterdir())


def test_kit_requirements_lists_what_every_kit_needs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    # tox runs it before pytest, so before the run's own temporary folder: it must clean up after cookiecutter
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    listing = tmp_path / "kit-requirements.txt"
    env = {**os.environ, "TMPDIR": str(temporary)}
    command = [sys.executable, str(ROOT / "tests" / "kit_requirements.py"), str(listing)]
    subprocess.run(command, env=env, check=True, timeout=300)
    assert not any(temporary.iterdir()), f"left in the temporary folder: {sorted(temporary.iterdir())}"
    requirements = listing.read_text().splitlines()
    assert any(line.startswith("celery") for line in requirements)
    assert not any(line.startswith("order_confirmation") for line in requirements)  # the kit itself is not one
    # it reads one kit per queue system and effect kind: every combination's kit must declare nothing more
    for combo in combinations():
        pyproject = baked(tmp_path / combo_id(combo), combo) / "pyproject.toml"
        if pyproject.exists():
            missing = declared(pyproject) - set(requirements)
            assert not missing, (combo_id(combo), sorted(missing))
