"""A Celery kit added to an existing Django project, for a covering set of the Celery combinations and brokers
(every policy, effect kind and broker at least once: test_kits runs every combination on every broker alone).

The project (tests/django_host) has its own Celery app (`proj/celery.py`: Django's settings with the CELERY_
namespace, autodiscover_tasks()), its own app `customers` with a model and a migration, and PostgreSQL from
DATABASE_URL. The kit is installed with the commands of its README's section "Add to a Django project", as
written, in a virtual environment of its own; the section's settings are added to the project's settings;
`manage.py migrate` creates the kit's table beside the project's (reversibly), and the kit's replay suite then
runs inside the project (REPLAY_HOST_APP): real `celery worker` processes of the project's app, with crash
points, SIGKILLed mid-run. For the default answers the section runs to the end: the project's worker refuses to
start before the settings are in, then runs the operation the README sends. On each further Python
(stacks.PYTHON_STACKS: sid's 3.14, where pip resolves Django 6), the walkthrough's cell runs too, every command
inside that stack.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
import stacks
from generate import baked, readme_commands
from matrix import DEFAULTS, combinations, combo_id, covering
from services import postgres_database, psql, rabbitmq_vhost, redis, redis_database, smtp_sink
from test_kits import assert_report, run_name

HOST = Path(__file__).parent / "django_host"
SECTION = "Add to a Django project"
CELERY = [combo for combo in combinations() if combo["queue_system"] == "celery"]
CELLS = covering(
    [combo | {"broker": broker} for combo in CELERY for broker in ("redis", "rabbitmq")],
    ["effect_kind", "stale_claim_policy", "broker"],
)
# the combination whose README section runs to the end, worker and operation included (the first cell, on Redis)
WALKTHROUGH = {name: DEFAULTS[name] for name in CELERY[0]}
TABLE = DEFAULTS["record_table"]
# Each cell on the first Python; the walkthrough's on every other.
RUNS = [
    pytest.param(cell, stack, id=f"{combo_id(cell)}-{stack}")
    for cell, stack in [
        *[(cell, stacks.PYTHON_STACKS[0]) for cell in CELLS],
        *[(CELLS[0], stack) for stack in stacks.PYTHON_STACKS[1:]],
    ]
]


def settings_block(kit: Path) -> str:
    """The ```python block of the README's section: what a user adds to the project's settings."""
    text = (kit / "README.md").read_text()
    section = text.split(f"## {SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def virtualenv(folder: Path, stack: str) -> Path:
    """A virtual environment that sees the packages of the stack's Python (on this machine: this interpreter's), so
    that pip installs the kit alone."""
    python = stacks.python(stack)
    subprocess.run(
        stacks.command(stack, [python, "-m", "venv", "--without-pip", str(folder)], folder.parent, {}), check=True
    )
    root = stacks.STACKS[stack]
    packages = (
        sysconfig.get_paths()["purelib"]
        if root is None
        else "/" + str(next(root.glob(f"{stacks.VENV.lstrip('/')}/lib/python3*/site-packages")).relative_to(root))
    )
    (next(folder.glob("lib/python3*/site-packages")) / "test-interpreter.pth").write_text(packages + "\n")
    return folder / "bin"


@pytest.mark.live
@pytest.mark.xdist_group("django_host")
@pytest.mark.parametrize(("cell", "stack"), RUNS)
def test_kit_inside_a_django_project(
    request: pytest.FixtureRequest, tmp_path: Path, cell: dict[str, str], stack: str
) -> None:
    stacks.require(stack, "python")
    combo = {name: value for name, value in cell.items() if name != "broker"}
    on_redis = cell["broker"] == "redis"
    kit = baked(tmp_path, combo)
    slug = kit.name
    project = tmp_path / "django_host"  # beside the kit, as the README has it
    shutil.copytree(HOST, project)
    install, migrate, worker, send = readme_commands(kit, SECTION)
    walkthrough = combo == WALKTHROUGH
    bin_dir = virtualenv(tmp_path / "venv", stack)
    removed = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REPLAY_HOST_APP", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in (*removed, "DJANGO_SETTINGS_MODULE")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(bin_dir.parent)}
    broker_service = redis_database() if on_redis else rabbitmq_vhost()
    with postgres_database(run_name(request)) as database, broker_service as broker, smtp_sink() as (smtp, mail):
        env |= {"DATABASE_URL": database, "CELERY_BROKER_URL": broker, **smtp}
        name = database.rsplit("/", 1)[1]

        def on_stack(argv: list[str]) -> list[str]:
            return stacks.command(stack, argv, project, env)

        def run(command: str) -> str:
            result = subprocess.run(
                on_stack(["sh", "-c", command]), cwd=project, env=env, capture_output=True, text=True, timeout=300
            )
            assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            return result.stdout

        def tables() -> set[str]:
            return set(psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", database=name).split())

        run(install)
        settings = project / "proj" / "settings.py"
        installed, *guarantee = settings_block(kit).splitlines(keepends=True)
        assert installed.startswith("INSTALLED_APPS +=")
        settings.write_text(settings.read_text() + "\n" + installed)
        if walkthrough:
            # the kit is in, the guarantee's settings not yet: Celery's default prefetch (4) contradicts it
            refused = subprocess.run(
                on_stack(shlex.split(worker)), cwd=project, env=env, capture_output=True, text=True, timeout=120
            )
            assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
            assert "Traceback" not in refused.stderr, refused.stderr
            assert refused.stderr.splitlines()[-1].startswith(
                f"{slug}: refusing to start the worker: worker_prefetch_multiplier is 4; it must be 1"
            )
        settings.write_text(settings.read_text() + "".join(guarantee))

        run(migrate)
        assert {TABLE, "customers_customer"} <= tables()
        applied = psql(f"SELECT name FROM django_migrations WHERE app = '{slug}'", database=name).split()
        migrations = [
            f"0001_create_{TABLE}",
            f"0002_index_claimed_{TABLE}",
            f"0003_queued_and_failed_{TABLE}",
            f"0004_resolutions_{TABLE}",
        ]
        assert sorted(applied) == migrations
        if walkthrough:
            run(f"python manage.py migrate {slug} zero")
            assert {TABLE, f"{TABLE}_resolutions"}.isdisjoint(tables()) and "customers_customer" in tables()
            run(migrate)
            assert TABLE in tables()

        # the seven cases, in the project's own Celery app and workers
        suite_env = env | {
            "REPLAY_HOST_APP": "proj.celery:app",
            "DJANGO_SETTINGS_MODULE": "proj.settings",
            "PYTHONPATH": str(project),
        }
        started = time.monotonic()
        result = subprocess.run(
            stacks.command(
                stack, [str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], kit, suite_env
            ),
            cwd=kit,
            env=suite_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
        print(f"{combo_id(combo)} in Django on {stack}: suite passed in {time.monotonic() - started:.1f} s")
        assert_report(kit, combo, "live")
        facts = {
            fact["name"]: fact["value"] for fact in json.loads((kit / "replay-report.json").read_text())["environment"]
        }
        assert facts["Host application"] == "proj.celery:app"
        if on_redis:
            redis_db = int(broker.rsplit("/", 1)[1])
            assert redis(redis_db, "KEYS", "celery-task-meta-*") == "", "the suite left results in Redis"

        if walkthrough:
            key = DEFAULTS["example_key"]
            status = f"SELECT status FROM {TABLE} WHERE operation_key = '{key}'"
            log = (tmp_path / "worker.log").open("wb")
            process = subprocess.Popen(
                on_stack(shlex.split(worker)),
                cwd=project,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                run(send)
                deadline = time.monotonic() + 60
                while (len(mail.received), psql(status, database=name).strip()) != (1, "completed"):
                    assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                    time.sleep(0.2)
                # the producer in the project's transaction: rolled back, neither record nor message; committed, both
                for key, end in (("ORD-ROLLED-BACK", "transaction.set_rollback(True)"), ("ORD-COMMITTED", "pass")):
                    code = (
                        f"from django.db import transaction\nfrom {slug}.django_app.producer import enqueue\n"
                        f"with transaction.atomic():\n    enqueue('{key}', {{'email': 'customer@example.com'}})\n"
                        f"    {end}\n"
                    )
                    run(f"python manage.py shell -c {shlex.quote(code)}")
                committed = f"SELECT status FROM {TABLE} WHERE operation_key = 'ORD-COMMITTED'"
                deadline = time.monotonic() + 60
                while (len(mail.received), psql(committed, database=name).strip()) != (2, "completed"):
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                    time.sleep(0.2)
                rolled_back = f"SELECT count(*) FROM {TABLE} WHERE operation_key = 'ORD-ROLLED-BACK'"
                assert psql(rolled_back, database=name).strip() == "0"
            finally:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=60)
