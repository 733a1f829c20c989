"""Bad answers stop both tools with our one line, and leave nothing on disk.

Run through each tool's command line, as a user would meet them. (Asked interactively: test_interactive.py.)
"""

from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import stacks
import yaml
from generate import with_cookiecutter
from matrix import ROOT, answers, facts, invalid_combinations, problem

# (answer, bad value, what the message must say): each rule of replay_matrix.jinja at least once.
BAD_ANSWERS = [
    ("lease_seconds", "60", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "90", "is not greater than longest_run_seconds (90)"),
    ("lease_seconds", "0", "is not a positive whole number of seconds"),
    ("lease_seconds", "9", "is shorter than 10 s; a killed worker's message must come back inside the lease"),
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
    ("project_slug", "kit_", "is not a lower-case identifier"),
    ("project_slug", "email", "is taken: it is a module of Python's standard library or of a kit's dependency"),
    ("project_slug", "celery", "is taken: it is a module of Python's standard library or of a kit's dependency"),
    ("project_slug", "active_record", "is taken: it is a constant of Ruby's core or of a kit's gem"),
    ("job_type", "max", "is taken: it is a Python builtin"),
    ("operation_key_name", "payload", "is taken: it is a variable the kit's code keeps beside the key"),
    ("operation_key_name", "l", "is taken: it is a name ruff refuses as ambiguous"),
    ("record_table", "sqlite_master", "starts with a prefix the database keeps for its own tables"),
    ("record_table", "name", "is taken: it is a column of SQLite's catalog"),
    ("project_slug", "module", "is a reserved word in Ruby"),
    ("project_name", "", "must be one line of text"),
    ("example_key", "", "must be one line of text"),
    ("example_key", "K" * 256, "is 256 columns wide as the kit writes it"),
    ("example_key", "ORD {{ x }}", "holds Jinja's {{, which cookiecutter would read as a template"),
    ("project_name", "Tab\there", "must be one line of text without leading or trailing spaces, control characters"),
    ("effect_description", "send \u202eliame", "control characters or direction marks"),
    ("other_example_key", "注文" * 11, "is 44 columns wide as the kit writes it (a wide character counts two"),
    ("other_example_key", "ORD-1001", "is the same as example_key"),
    (
        "example_key",
        "\\" * 10 + "abc",
        "is 43 columns wide as the kit writes it (a wide character counts two, a backslash four",
    ),
    ("example_key", "-1001", "starts with -, which the kit's commands would read as an option"),
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
        env={**os.environ, "HOME": str(tmp_path)},  # cookiecutter's replay file goes there, not to the user's home
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
    # cookiecutter.json's __rules refuses before cookiecutter makes the kit's folder: our line is all it prints
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


def test_an_sqs_job_runs_for_less_than_the_longest_visibility_timeout(tmp_path: Path) -> None:
    given = {"queue_system": "sqs", "longest_run_seconds": "43200", "lease_seconds": "86400"}
    message = problem(answers(**given))
    assert message.startswith("longest_run_seconds: 43200 is not shorter than the longest visibility timeout SQS")
    assert problem(answers(**{**given, "longest_run_seconds": "43199"})) == ""
    assert problem(answers(**{**given, "queue_system": "celery"})) == ""  # Celery and Sidekiq have no such bound
    result = cookiecutter_cli(tmp_path, given)
    assert_refused(tmp_path, result)
    assert said_only(result) == f"replay-matrix: {message}"


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


# What a Sidekiq kit loads beside its own module, whose constants its module must not reopen.
RUBY_LIBRARIES = (
    "sidekiq active_record rails redis connection_pool mustache rake net/smtp net/http json yaml pg sqlite3"
)


# Every module of a Python's standard library and every builtin, as one line each.
# Each Python stack; one in a Debian root runs in its kit environment, which tox's own commands_pre installs
# (tests/stacks.py): tox -e oldest, which runs beside tox in CI and installs none, leaves those out.
PYTHON_STACKS = [
    pytest.param(stack, marks=[pytest.mark.stack_environment] if stacks.STACKS[stack] else [])
    for stack in stacks.PYTHON_STACKS
]
PYTHON_NAMES = "import builtins, sys; print(*sorted(sys.stdlib_module_names)); print(*dir(builtins))"


@pytest.mark.parametrize("stack", PYTHON_STACKS)
def test_the_taken_names_cover_each_python(stack: str, tmp_path: Path) -> None:
    """The lists in replay_matrix.jinja hold every module of each Python's standard library and every builtin."""
    stacks.require(stack, "python")
    argv = stacks.command(stack, [stacks.python(stack), "-c", PYTHON_NAMES], tmp_path, {})
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    stdlib, builtin_names = (
        {name for name in line.split() if not name.startswith("_") and name.islower()} for line in lines
    )
    modules, builtins_ = set(facts().python_modules.split()), set(facts().python_builtins.split())
    assert not stdlib - modules, f"add to python_modules in replay_matrix.jinja: {' '.join(sorted(stdlib - modules))}"
    assert not builtin_names - builtins_, (
        f"add to python_builtins in replay_matrix.jinja: {' '.join(sorted(builtin_names - builtins_))}"
    )


# Django's own commands, of its core and of its contrib apps, as `manage.py help` lists them in a project with all
DJANGO_COMMANDS = """
import pkgutil
from pathlib import Path
import django
root = Path(django.__file__).parent
folders = [root / "core/management/commands", *root.glob("contrib/*/management/commands")]
print(*sorted(module.name for module in pkgutil.iter_modules(map(str, folders)) if not module.name.startswith("_")))
"""


@pytest.mark.parametrize("stack", PYTHON_STACKS)
def test_the_taken_names_cover_djangos_commands(stack: str, tmp_path: Path) -> None:
    """project_slug names a Celery kit's command in a Django project: it may not be one of Django's (each Python's
    Django, as pip resolved it there)."""
    stacks.require(stack, "python")
    argv = stacks.command(stack, [stacks.python(stack), "-c", DJANGO_COMMANDS], tmp_path, {})
    commands = set(subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split())
    assert "migrate" in commands
    missing = commands - set(facts().django_commands.split())
    assert not missing, f"add to django_commands in replay_matrix.jinja: {' '.join(sorted(missing))}"


@pytest.mark.parametrize("effect_kind", list(facts().effect_kinds))
def test_the_taken_names_cover_what_the_celery_task_keeps_beside_it(effect_kind: str, tmp_path: Path) -> None:
    """Every name at the top of a module that defines or imports the task (job_type) is one job_type may not take."""
    kit = with_cookiecutter(tmp_path, {"queue_system": "celery", "effect_kind": effect_kind, "job_type": "the_task"})
    taken = {word for words in facts().taken_names["job_type"].values() for word in words.split()}
    for path in kit.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        names |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        names |= {
            (alias.asname or alias.name).split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        if "the_task" in names:
            beside = {
                name for name in names - {"the_task", "annotations"} if name.islower() and not name.startswith("_")
            }
            assert beside <= taken, f"{path.name}: add to job_type's taken names: {sorted(beside - taken)}"


KEY_NAME = "the_key"  # an operation_key_name no kit uses for anything else
# The local variables of every Ruby method (or block) of a kit that has one named KEY_NAME.
RUBY_LOCALS_BESIDE_THE_KEY = f"""
def walk(iseq, &block) = (block.call(iseq); iseq.each_child {{ |child| walk(child, &block) }})
ARGV.each do |path|
  walk(RubyVM::InstructionSequence.compile_file(path)) do |iseq|
    locals = iseq.to_a[10].map(&:to_s)
    puts locals.grep(/\\A[a-z_][a-z0-9_]*\\z/).join(" ") if locals.include?("{KEY_NAME}")
  end
end
"""


def python_locals_beside_the_key(kit: Path) -> set[str]:
    """The arguments and local variables of every Python function of the kit that takes KEY_NAME."""
    found: set[str] = set()
    for path in kit.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                args = {arg.arg for arg in [*node.args.args, *node.args.kwonlyargs]}
                stored = {
                    name.id for name in ast.walk(node) if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
                }
                found |= args | stored if KEY_NAME in args | stored else set()
    return found


@pytest.mark.parametrize("queue_system", ["celery", "sidekiq"])
@pytest.mark.parametrize("effect_kind", list(facts().effect_kinds))
def test_the_taken_names_cover_the_variables_beside_the_operation_key(
    queue_system: str, effect_kind: str, tmp_path: Path
) -> None:
    """operation_key_name is a variable wherever the kit handles the key: no other variable there may share it (a
    key named `why` made Ruby's `resolve(why, ..., why:)`)."""
    given = {"queue_system": queue_system, "effect_kind": effect_kind, "operation_key_name": KEY_NAME}
    kit = with_cookiecutter(tmp_path, given)
    if queue_system == "sidekiq":
        files = [str(path) for path in [*kit.rglob("*.rb"), *kit.rglob("*.rake")]]
        listed = subprocess.run(["ruby", "-e", RUBY_LOCALS_BESIDE_THE_KEY, *files], capture_output=True, text=True)
        assert listed.returncode == 0, listed.stderr
        beside = set(listed.stdout.split())
    else:
        beside = python_locals_beside_the_key(kit)
    assert KEY_NAME in beside  # the walk found where the kit handles the key
    taken = {word for words in facts().taken_names["operation_key_name"].values() for word in words.split()}
    missing = beside - taken - {KEY_NAME}
    assert not missing, f"add to operation_key_name's taken names: {' '.join(sorted(missing))}"


# Every constant a Sidekiq kit's Ruby has loaded, as a slug would name it (IOError: i_o_error).
RUBY_CONSTANTS = (
    "ARGV.each { |lib| require lib }; "
    + r'puts Object.constants.map(&:to_s).grep(/\A(?:[A-Z][a-z0-9]*)+\z/).map { |c| c.gsub(/(?<=.)(?=[A-Z])/, "_") }'
)


@pytest.mark.parametrize("stack", list(stacks.RUBY_STACKS))
def test_the_taken_names_cover_each_ruby_stack(stack: str, tmp_path: Path) -> None:
    stacks.require(stack)
    argv = stacks.command(stack, ["ruby", "-e", RUBY_CONSTANTS, *RUBY_LIBRARIES.split()], tmp_path, {})
    listed = {name.lower() for name in subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()}
    assert {"sidekiq", "active_record", "i_o_error"} <= listed
    missing = listed - set(facts().ruby_constants.split())
    assert not missing, f"add to ruby_constants in replay_matrix.jinja: {' '.join(sorted(missing))}"


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
