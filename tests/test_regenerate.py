"""Regenerating a kit after the client changes the policy or the lease keeps the user's edits.

For each queue system with a kit, the four policies changed in a ring (hold -> resend -> skip -> lookup ->
hold: each policy once before a change and once after it; the update works the same for every pair), plus one
change of the lease, under copier (`copier update`); and each change under cookiecutter (cruft's update) on one
queue system, the queue systems in turn (regenerations): generate, commit, edit the effect file as a user would,
regenerate with the new answer, then check that POLICY.md and the suite's table state the new expectations, the
edit is still there, and the kit is the one the new answers generate. After
the lease change (a lease no combination of test_kits has) the kit's embedded suite runs too, on copier's kit.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import cookiecutter.main
import copier
import cruft
import pytest
import yaml
from generate import with_cookiecutter
from matrix import ROOT, answers, expected, facts
from test_kits import LANGUAGES, SUITES

EFFECT_KIND = "external_with_reference"  # the one kind every policy allows
POLICIES = list(facts().policies)
POLICY_CHANGES = [
    ({"stale_claim_policy": before}, {"stale_claim_policy": after})
    for before, after in zip(POLICIES, POLICIES[1:] + POLICIES[:1], strict=True)
]
LEASE_CHANGE = ({"lease_seconds": 600}, {"lease_seconds": 900})
CHANGES = [*POLICY_CHANGES, LEASE_CHANGE]
# Where the user edits the effect, and the suite's seven-row table, per language.
EFFECT_FILE = {"python": "src/{slug}/effect.py", "ruby": "lib/{slug}/effect.rb"}
SUITE_TABLE = {"python": "tests/test_replay.py", "ruby": "spec/replay_spec.rb"}
USER_EDIT = "# Edited by the client's team: the provider wants a sender name. Keep this line.\n"
# The template's last commit before its files got plain names (ee84f2d) and the proof tools left the kits'
# runtime: a kit made by it must update to the template as it stands, as any kit does.
BEFORE_PLAIN_NAMES = "b58ddd3"


def change_id(change: tuple[dict[str, Any], dict[str, Any]]) -> str:
    before, after = change
    return "-".join(f"{name}={before[name]}..{after[name]}" for name in after)


def git(kit: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=kit, capture_output=True, text=True, check=True, timeout=60)
    return result.stdout


def commit_all(kit: Path, message: str) -> None:
    git(kit, "add", "-A")
    git(kit, "-c", "user.name=client", "-c", "user.email=client@example.com", "commit", "-qm", message)


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template as it stands, committed in a repository of its own.

    Both tools record the template's commit and regenerate the old kit from it, so a working tree with
    changes not yet committed (a developer's) must become a real commit first.
    """
    snapshot = tmp_path_factory.mktemp("template")
    listed = git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, snapshot / name
        if source.exists() or source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    git(snapshot, "init", "-q")
    commit_all(snapshot, "template snapshot")
    return snapshot


@pytest.fixture(scope="session")
def template_history(template: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A repository of two commits: the template at BEFORE_PLAIN_NAMES (from this clone's history), then the
    template as it stands; the repository, and its first commit."""
    history = tmp_path_factory.mktemp("history")
    archive = subprocess.run(["git", "archive", BEFORE_PLAIN_NAMES], cwd=ROOT, capture_output=True, timeout=60)
    assert archive.returncode == 0, f"this clone lacks the commit {BEFORE_PLAIN_NAMES}: {archive.stderr.decode()}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(history, filter="tar")
    git(history, "init", "-q")
    commit_all(history, "the template before plain names")
    before = git(history, "rev-parse", "HEAD").strip()
    git(history, "rm", "-rq", ".")
    shutil.copytree(template, history, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True, symlinks=True)
    commit_all(history, "the template as it stands")
    return history, before


def generate(tool: str, template: Path, where: Path, given: dict[str, Any]) -> Path:
    if tool == "copier":
        copier.run_copy(str(template), where, data=given, defaults=True, quiet=True)
        return where
    return cruft.create(str(template), output_dir=where, extra_context=given, no_input=True)


def generate_at(tool: str, template: Path, ref: str, where: Path, given: dict[str, str]) -> Path:
    """A kit of the template at `ref`, by each tool's command line: in a process of its own, since cookiecutter
    imports the template's local_extensions.py once per process and the older revision's must not stay."""
    if tool == "copier":
        data = [arg for name, value in given.items() for arg in ("-d", f"{name}={value}")]
        command = ["copier", "copy", "--defaults", "--quiet", f"--vcs-ref={ref}", *data, str(template), str(where)]
    else:
        command = ["cruft", "create", "-y", "--checkout", ref, "--extra-context", json.dumps(given)]
        command += ["--output-dir", str(where), str(template)]
    result = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return where if tool == "copier" else next(where.iterdir())


def regenerate(tool: str, kit: Path, new: dict[str, Any], ref: str = ":current:") -> None:
    """The command each kit's README gives, with the changed answer and nothing else (or, given another `ref`,
    the update to that revision of the template)."""
    if tool == "copier":
        command = [
            sys.executable,
            "-m",
            "copier",
            "update",
            "--defaults",
            "--quiet",
            f"--vcs-ref={ref}",
            *(arg for name, value in new.items() for arg in ("-d", f"{name}={value}")),
        ]
    else:
        command = [sys.executable, "-m", "cruft", "update", "-y", "--variables-to-update", json.dumps(new)]
        command += [] if ref == ":current:" else ["--checkout", ref]
    result = subprocess.run(command, cwd=kit, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def kit_files(kit: Path) -> dict[str, bytes]:
    """The kit's files by path, without git's folder and the tools' own records of the answers."""
    records = {".git", ".copier-answers.yml", ".cruft.json"}
    return {
        str(path.relative_to(kit)): path.read_bytes()
        for path in sorted(kit.rglob("*"))
        if path.is_file() and not records & set(path.relative_to(kit).parts)
    }


@pytest.mark.parametrize("tool", ["copier", "cruft"])
@pytest.mark.parametrize("queue_system", sorted(LANGUAGES))
def test_a_kit_of_the_template_before_plain_names_updates_to_it_cleanly(
    template_history: tuple[Path, str], tmp_path: Path, tool: str, queue_system: str
) -> None:
    """Files renamed, split and moved between the two revisions: the update brings the kit to what a fresh copy
    of the new template gives, with no conflict."""
    history, before = template_history
    given = {"queue_system": queue_system}
    kit = generate_at(tool, history, before, tmp_path / "kit", given)
    git(kit, "init", "-q")
    commit_all(kit, "kit as the older template made it")

    regenerate(tool, kit, {}, ref=git(history, "rev-parse", "HEAD").strip())

    fresh = generate(tool, history, tmp_path / "fresh", given)
    assert not list(kit.rglob("*.rej")), "the update left rejected hunks"
    assert kit_files(kit) == kit_files(fresh)


def table_line(table: str, attempt: str) -> str:
    return next(line for line in table.splitlines() if f'"{attempt}"' in line)


def regenerations() -> list[pytest.param]:
    """copier on every change in each language's kit: each policy change on the Python kits in turn (the files it
    touches are the same template's for Celery and SQS), the lease change on every queue system (its kit's suite
    runs); cruft on each change once, on the queue systems in turn. cruft updates every kit the same way
    (cookiecutter's kit before and after, and git's three-way apply of the difference): a queue system changes
    which files the difference touches, not how cruft applies it."""
    queue_systems = sorted(LANGUAGES)
    python = [queue for queue in queue_systems if LANGUAGES[queue] == "python"]
    runs = [(python[n % len(python)], change, "copier") for n, change in enumerate(POLICY_CHANGES)]
    runs += [(queue, change, "copier") for queue in queue_systems if queue not in python for change in POLICY_CHANGES]
    runs += [(queue, LEASE_CHANGE, "copier") for queue in queue_systems]
    runs += [(queue_systems[n % len(queue_systems)], change, "cruft") for n, change in enumerate(CHANGES)]
    return [pytest.param(*run, id=f"{run[0]}-{change_id(run[1])}-{run[2]}") for run in runs]


@pytest.mark.parametrize(("queue_system", "change", "tool"), regenerations())
def test_regenerate_after_a_change_keeps_the_users_edit(
    template: Path, tmp_path: Path, queue_system: str, change: tuple[dict[str, Any], dict[str, Any]], tool: str
) -> None:
    before, after = change
    language = LANGUAGES[queue_system]
    first = answers(queue_system=queue_system, effect_kind=EFFECT_KIND, **before)
    kit = generate(tool, template, tmp_path / "kit", first)
    git(kit, "init", "-q")
    commit_all(kit, "kit as generated")
    effect = kit / EFFECT_FILE[language].format(slug=first["project_slug"])
    effect.write_text(USER_EDIT + effect.read_text())
    commit_all(kit, "the client's edit")

    regenerate(tool, kit, after)

    now = {**first, **after}
    assert effect.read_text().startswith(USER_EDIT), "the user's edit was lost"
    assert not list(kit.rglob("*.rej")), "a conflict where none was expected"
    policy_md = (kit / "POLICY.md").read_text()
    chosen = facts().policies[now["stale_claim_policy"]]
    assert f"## The policy for a stale claim: {chosen['title']} (`{now['stale_claim_policy']}`)" in policy_md
    assert f"**Lease: {now['lease_seconds']} seconds.**" in policy_md
    table = (kit / SUITE_TABLE[language]).read_text()
    for row in expected(EFFECT_KIND, now["stale_claim_policy"]):
        line = table_line(table, row["attempt"])
        assert f'"{row["record"]}"' in line and str(row["emails"]) in line, line

    # The regenerated kit is, file for file, the kit these answers generate, with the user's edit: so the suite
    # test_kits.py runs on that combination holds for it too. A new lease is in no combination: run the suite,
    # once per queue system (the other tool's kit is, file for file, this same kit).
    fresh = with_cookiecutter(tmp_path / "fresh", now)  # both tools write the same kit (test_generate.py)
    fresh_effect = fresh / EFFECT_FILE[language].format(slug=first["project_slug"])
    fresh_effect.write_text(USER_EDIT + fresh_effect.read_text())
    assert kit_files(kit) == kit_files(fresh)
    if change != LEASE_CHANGE or tool != "copier":
        return
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")}
    result = subprocess.run(SUITES[language], cwd=kit, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    report = json.loads((kit / "replay-report.json").read_text())
    assert report["stale_claim_policy"] == now["stale_claim_policy"]
    assert all(row["passed"] for row in report["rows"])


@pytest.mark.parametrize("tool", ["copier", "cruft"])
def test_a_conflict_is_shown_not_resolved_against_the_user(template: Path, tmp_path: Path, tool: str) -> None:
    """The user rewrote the line the new policy changes: the tool must show the conflict its usual way."""
    first = answers(effect_kind=EFFECT_KIND, stale_claim_policy="hold")
    kit = generate(tool, template, tmp_path / "kit", first)
    git(kit, "init", "-q")
    commit_all(kit, "kit as generated")
    policy_md = kit / "POLICY.md"
    heading = "## The policy for a stale claim: Hold for a person (`hold`)"
    policy_md.write_text(policy_md.read_text().replace(heading, "## Our policy: we hold, then call the client"))
    commit_all(kit, "the client's wording")

    regenerate(tool, kit, {"stale_claim_policy": "resend"})

    # both tools merge with git here and leave inline markers, with both sides kept
    text = policy_md.read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text
    assert "## Our policy: we hold, then call the client" in text
    assert "Accept a rare duplicate (`resend`)" in text


def test_a_plain_cookiecutter_kit_linked_as_the_readme_says_updates_cleanly(template: Path, tmp_path: Path) -> None:
    """`cruft link` with the kit's own answers (the README's command), then `cruft update`: no .rej files."""
    readme = (ROOT / "README.md").read_text()
    link = next(line.strip() for line in readme.splitlines() if line.strip().startswith("cruft link <template> "))
    given = json.loads(link.split("--extra-context", 1)[1].strip().strip("'"))
    assert given == {"queue_system": "sqs", "stale_claim_policy": "skip"}  # not the defaults: celery, hold
    kit = Path(
        cookiecutter.main.cookiecutter(str(template), no_input=True, output_dir=str(tmp_path), extra_context=given)
    )
    git(kit, "init", "-q")
    commit_all(kit, "kit made by plain cookiecutter")

    command = shlex.split(link.replace("<template>", str(template)))
    result = subprocess.run([sys.executable, "-m", "cruft", *command[1:]], cwd=kit, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = json.loads((kit / ".cruft.json").read_text())["context"]["cookiecutter"]
    assert {name: recorded[name] for name in given} == given
    commit_all(kit, "linked")

    regenerate("cruft", kit, {"stale_claim_policy": "resend"})

    assert not list(kit.rglob("*.rej")), "cruft update met a kit other than the one it recorded"
    assert not git(kit, "status", "--porcelain", "--untracked-files=all").count(".rej")
    assert "Accept a rare duplicate (`resend`)" in (kit / "POLICY.md").read_text()
    assert (kit / "src" / "order_confirmation" / "consumer.py").exists()  # still the SQS kit


def report_template_line(kit: Path, language: str) -> str:
    """The sign-off report's "Template" line, as the kit's own report code writes it."""
    if language == "ruby":
        command = ["ruby", "-e", 'require "./spec/replay_report"; puts TemplateOrigin.describe(ReplayReport::KIT_ROOT)']
    else:
        command = [sys.executable, "-c", "from replay_reports import template_version; print(template_version())"]
    env = {**os.environ, "PYTHONPATH": f"{kit / 'src'}{os.pathsep}{kit / 'tests'}"}
    result = subprocess.run(command, cwd=kit, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("queue_system", list(LANGUAGES))
def test_the_report_names_a_commit_that_exists_or_says_why_not(
    template: Path, tmp_path: Path, queue_system: str
) -> None:
    # a clone set up as the README says (a virtualenv inside it): still clean, so the commit recorded is its own
    clone = tmp_path / "replay-matrix"
    subprocess.run(["git", "clone", "-q", str(template), str(clone)], check=True, timeout=60)
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "python").write_text("")
    language = LANGUAGES[queue_system]
    clean = generate("copier", clone, tmp_path / "clean", {"queue_system": queue_system})
    recorded = copier_answers(clean)["_commit"]
    assert git(clone, "rev-parse", f"{recorded}^{{commit}}").strip() == git(clone, "rev-parse", "HEAD").strip()
    assert report_template_line(clean, language) == f"{clone} at {recorded}"
    # copier quotes a short commit of digits only, which YAML would read as a number
    answers_file = clean / ".copier-answers.yml"
    answers_file.write_text(answers_file.read_text().replace(f"_commit: {recorded}\n", f"_commit: '{recorded}'\n"))
    assert f"_commit: '{recorded}'" in answers_file.read_text()
    assert report_template_line(clean, language) == f"{clone} at {recorded}"

    # a change not committed: copier commits it in a clone of its own, and records a commit found nowhere else
    (clone / "NOTES.md").write_text("a change not yet committed\n")
    dirty = generate("copier", clone, tmp_path / "dirty", {"queue_system": queue_system})
    line = report_template_line(dirty, language)
    assert line.startswith(f"{clone}, at a commit it does not hold: the template had uncommitted changes"), line
    assert copier_answers(dirty)["_commit"] not in line

    # the template moved away: said in words, not a commit
    shutil.rmtree(clone)
    assert report_template_line(clean, language) == (
        f"{clone}, at a commit that cannot be checked: no template is at that path from this kit's folder"
    )


def copier_answers(kit: Path) -> dict[str, str]:
    return {key: str(value) for key, value in yaml.safe_load((kit / ".copier-answers.yml").read_text()).items()}
