"""A Celery kit added to an existing Django project, for a covering set of the Celery combinations and brokers
(every policy, effect kind and broker at least once: test_kits runs every combination on every broker alone).

The project (tests/django_host) is laid out as `django-admin startproject` and Celery's Django guide make one: its
own Celery app (`proj/celery.py`: Django's settings with the CELERY_ namespace, autodiscover_tasks()), the admin,
its own app `customers` with a model and a migration, and PostgreSQL from its own setting, PROJ_DATABASE_URL (the
kit has no DATABASE_URL: it uses Django's connection). The kit is installed with the commands of its README's
section "Add to a Django project", as written, in a virtual environment of its own; the section's settings are
added to the project's settings; `manage.py migrate` creates the kit's tables beside the project's (reversibly),
and the kit's replay suite then runs inside the project (REPLAY_HOST_APP): real `celery worker` processes of the
project's app, with crash points, SIGKILLed mid-run. A same-database effect written through the ORM commits and
rolls back with its claim. For the default answers the section runs to the end: the project's worker refuses to
start before the settings are in and before the tables are, then runs the operation the README sends; two claims
left behind are held by `manage.py <kit> sweep`, one resolved in the admin page in headless Chromium (a staff user
without the permission sees no decision), the other released by `manage.py <kit> resolve` and performed by the
project's worker. On each further Python (stacks.PYTHON_STACKS: sid's 3.14, where pip resolves Django 6), the
walkthrough's cell runs too, every command inside that stack. A second project, made at test time by
`django-admin startproject` with Celery's Django guide, takes the README's section as written with its SQLite
database as it comes, and no DATABASE_URL anywhere.
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
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import stacks
from browser import ARTIFACTS, chromium, submit, web_server
from generate import baked, readme_commands
from matrix import DEFAULTS, combinations, combo_id, covering
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
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
# A same-database effect as a Django user writes it: the project's model, through the ORM.
ORM_EFFECT = """
from customers.models import Customer


def perform(conn, key, details):
    Customer.objects.create(name=key)
    if details.get("fail"):
        raise RuntimeError("the effect failed after writing its row")
"""
# the walkthrough's operations left for a person: in the admin page one marked done and one given one more
# attempt; one more attempt for the last by the command
HELD = ("ORD-HELD-1", "ORD-HELD-2", "ORD-HELD-3")
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
    install, migrate, worker, send, status = readme_commands(kit, SECTION)
    walkthrough = combo == WALKTHROUGH
    bin_dir = virtualenv(tmp_path / "venv", stack)
    removed = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REPLAY_HOST_APP", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in (*removed, "DJANGO_SETTINGS_MODULE")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(bin_dir.parent)}
    broker_service = redis_database() if on_redis else rabbitmq_vhost()
    with postgres_database(run_name(request)) as database, broker_service as broker, smtp_sink() as (smtp, mail):
        # the project's database by the project's own setting: the kit has no DATABASE_URL, it uses Django's
        env |= {"PROJ_DATABASE_URL": database, "CELERY_BROKER_URL": broker, **smtp}
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
        if walkthrough:
            # the settings are in, the table not yet: the worker looks for it through Django's connection
            refused = subprocess.run(
                on_stack(shlex.split(worker)), cwd=project, env=env, capture_output=True, text=True, timeout=120
            )
            assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
            assert refused.stderr.splitlines()[-1] == (
                f"{slug}: refusing to start the worker: the table {TABLE} does not exist: run the kit's migration"
                " (alembic upgrade head; in a Django project, manage.py migrate) first"
            ), refused.stderr[-3000:]

        run(migrate)
        # the kit's models are Django's state as its migrations leave it: the project's makemigrations adds nothing
        run("python manage.py makemigrations --check --dry-run")
        assert {TABLE, "customers_customer"} <= tables()
        applied = psql(f"SELECT name FROM django_migrations WHERE app = '{slug}'", database=name).split()
        migrations = [
            f"0001_create_{TABLE}",
            f"0002_index_claimed_{TABLE}",
            f"0003_queued_and_failed_{TABLE}",
            f"0004_resolutions_{TABLE}",
            "0005_operation_model",
        ]
        assert sorted(applied) == migrations
        if walkthrough:
            run(f"python manage.py migrate {slug} zero")
            assert {TABLE, f"{TABLE}_resolutions"}.isdisjoint(tables()) and "customers_customer" in tables()
            run(migrate)
            assert TABLE in tables()

        # the seven cases, in the project's own Celery app and workers
        suite_env = {k: v for k, v in env.items() if k != "PROJ_DATABASE_URL"} | {
            # the suite's own harness, and its workers through the project's settings, on DATABASE_URL (its proxy
            # for the fault cases)
            "DATABASE_URL": database,
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

        if combo["effect_kind"] == "same_database":
            # The user's effect through the project's ORM, in the claim's transaction: when it raises after its row,
            # neither the row nor the record stays; when it returns, both commit.
            (kit / "src" / slug / "effect.py").write_text(ORM_EFFECT)
            code = (
                f"from {slug}.job import handle\n"
                "try:\n    handle('ORD-ORM-1', {'fail': True})\nexcept RuntimeError:\n    pass\n"
                "print(handle('ORD-ORM-2', {}).action)\n"
            )
            assert run(f"python manage.py shell -c {shlex.quote(code)}").split()[-1] == "performed"
            assert psql("SELECT name FROM customers_customer", database=name).split() == ["ORD-ORM-2"]
            records = f"SELECT operation_key, status FROM {TABLE} WHERE operation_key LIKE 'ORD-ORM-%'"
            assert psql(records, database=name).split() == ["ORD-ORM-2|completed"]

        if walkthrough:
            key = DEFAULTS["example_key"]
            state = f"SELECT status FROM {TABLE} WHERE operation_key = '{key}'"
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
                # sent through the project's app, to the queue its worker consumes (not one named after the task)
                assert "to the queue celery: message" in run(send)
                deadline = time.monotonic() + 60
                while (len(mail.received), psql(state, database=name).strip()) != (1, "completed"):
                    assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                    time.sleep(0.2)
                shown = run(status)  # exits 0: nothing waits for a person
                assert "completed        1" in shown and shown.splitlines()[-1].startswith("ok:"), shown
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

                # Claims left past their lease (workers that died), held by the sweeper of `manage.py`
                for key in HELD:
                    run(f"python manage.py shell -c {shlex.quote(claim_left_behind(slug, key))}")
                assert "stale claims: 3, settled: 3" in run(f"python manage.py {slug} sweep")
                assert all(f"{key}  held" in run(f"python manage.py {slug} held") for key in HELD)
                # two resolved in the admin page by a person with the permission: done, and one more attempt
                resolve_in_the_admin(project, on_stack, env, slug, HELD[:2], tmp_path)
                audit = (
                    f"SELECT operation_key, resolved_as, status_before, status_after, why FROM {TABLE}_resolutions"
                    " ORDER BY resolved_at"
                )
                assert psql(audit, database=name).splitlines() == [
                    f"{HELD[0]}|django:ivan|held|completed|checked the mail log",
                    f"{HELD[1]}|django:ivan|held|queued|not in the mail log",
                ]
                # the last by the command, for one more attempt; both attempts sent through the project's app, to
                # its worker, and performed
                run(f"python manage.py {slug} resolve {HELD[2]} --release --by olga --why 'not received'")
                again = f"SELECT count(*) FROM {TABLE} WHERE operation_key IN {HELD[1:]} AND status = 'completed'"
                deadline = time.monotonic() + 60
                while (len(mail.received), psql(again, database=name).strip()) != (4, "2"):
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                    time.sleep(0.2)
                assert "3 resolutions" in run(f"python manage.py {slug} resolutions")
            finally:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=60)


# Celery's "First steps with Django": the project's Celery app and its import, as the guide writes them.
CELERY_GUIDE = {
    "celery.py": (
        "import os\n\nfrom celery import Celery\n\n"
        'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")\n\n'
        'app = Celery("proj")\n'
        'app.config_from_object("django.conf:settings", namespace="CELERY")\n'
        "app.autodiscover_tasks()\n"
    ),
    "__init__.py": 'from .celery import app as celery_app\n\n__all__ = ("celery_app",)\n',
}


@pytest.mark.live
@pytest.mark.xdist_group("django_host")
def test_kit_in_a_project_made_by_startproject(tmp_path: Path) -> None:
    """A project made as a new user makes one: `django-admin startproject proj`, its SQLite database as it comes,
    Celery as Celery's Django guide says; the kit added with its README's section, every command as written, and
    no DATABASE_URL anywhere: the worker runs the operation the README sends, on Django's own connection, and
    `manage.py <kit> status` reads it there."""
    stack = stacks.PYTHON_STACKS[0]
    kit = baked(tmp_path, WALKTHROUGH)
    slug = kit.name
    install, migrate, worker, send, status = readme_commands(kit, SECTION)
    bin_dir = virtualenv(tmp_path / "venv", stack)
    removed = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REPLAY_HOST_APP", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in (*removed, "DJANGO_SETTINGS_MODULE")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(bin_dir.parent)}
    # django-admin, as `python -m django` runs it in the virtual environment
    subprocess.run([bin_dir / "python", "-m", "django", "startproject", "proj"], cwd=tmp_path, env=env, check=True)
    project = tmp_path / "proj"
    for name, text in CELERY_GUIDE.items():
        (project / "proj" / name).write_text(text)
    with redis_database() as broker, smtp_sink() as (smtp, mail):
        env |= smtp

        def run(command: str) -> str:
            result = subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True, text=True)
            assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            return result.stdout

        run(install)
        settings = project / "proj" / "settings.py"
        settings.write_text(f"{settings.read_text()}\n{settings_block(kit)}CELERY_BROKER_URL = {broker!r}\n")
        run(migrate)
        log = (tmp_path / "worker.log").open("wb")
        process = subprocess.Popen(
            shlex.split(worker), cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            assert "to the queue celery: message" in run(send)
            deadline = time.monotonic() + 60
            while len(mail.received) < 1 or "completed        1" not in run(status):
                assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(0.5)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
        assert len(mail.received) == 1
        # the records are in the project's own database; the kit made no database of its own
        assert (project / "db.sqlite3").exists() and not list(project.glob(f"{slug}*.sqlite3"))


def claim_left_behind(slug: str, key: str) -> str:
    """Python for `manage.py shell`: a claim of `key` as a worker that died leaves it, past its lease."""
    return (
        f"from {slug} import settings\nfrom {slug}.claims import default_store, fingerprint\n"
        f"details = {{'email': 'customer@example.com'}}\nstore = default_store()\n"
        f"store.claim({key!r}, fingerprint({key!r}, details), details)\n"
        f"store.age({key!r}, settings.LEASE_SECONDS + 1)\n"
    )


def resolve_in_the_admin(
    project: Path,
    on_stack: Callable[[list[str]], list[str]],
    env: dict[str, str],
    slug: str,
    keys: tuple[str, ...],
    tmp_path: Path,
) -> None:
    """The project's admin in headless Chromium: a staff user who may only view sees the held operations and no
    decision; one with the kit's permission marks the first done and gives the second one more attempt, each with
    why. Screenshots go to build/artifacts/."""
    users = (
        "from django.contrib.auth.models import Permission, User\n"
        "view, resolve = (Permission.objects.get(codename=name) for name in ('view_operation', 'resolve_operation'))\n"
        "User.objects.create_user('olga', password='olga-pw-1', is_staff=True).user_permissions.add(view)\n"
        "User.objects.create_user('ivan', password='ivan-pw-1', is_staff=True).user_permissions.add(view, resolve)\n"
    )
    subprocess.run(on_stack(["python", "manage.py", "shell", "-c", users]), cwd=project, env=env, check=True)
    page = f"/admin/{slug}/operation/?status__exact=held"
    server = ["python", "manage.py", "runserver", "--noreload", "--insecure"]
    log = tmp_path / "runserver.log"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with web_server(lambda port: on_stack([*server, f"127.0.0.1:{port}"]), project, env, log) as base:
        driver = chromium()
        try:
            driver.set_window_size(1400, 900)

            def log_in(user: str, password: str) -> None:
                driver.delete_all_cookies()
                driver.get(f"{base}/admin/login/?next={quote(page)}")
                driver.find_element(By.NAME, "username").send_keys(user)
                driver.find_element(By.NAME, "password").send_keys(password)
                submit(driver, driver.find_element(By.CSS_SELECTOR, "input[type=submit]"))

            done, again = keys
            log_in("olga", "olga-pw-1")
            assert done in driver.find_element(By.ID, "result_list").text
            assert not driver.find_elements(By.NAME, "action"), "a person without the permission is offered a decision"
            driver.save_screenshot(str(ARTIFACTS / "django-admin-view-only.png"))

            log_in("ivan", "ivan-pw-1")

            def decide(key: str, action: str, why: str) -> str:
                driver.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value={key!r}]").click()
                Select(driver.find_element(By.NAME, "action")).select_by_value(action)
                driver.find_element(By.NAME, "why").send_keys(why)
                driver.save_screenshot(str(ARTIFACTS / f"django-admin-{action}.png"))
                submit(driver, driver.find_element(By.CSS_SELECTOR, "button[name=index]"))
                return str(driver.find_element(By.CSS_SELECTOR, ".messagelist").text)

            assert f"{done}: completed by ivan (was held)" in decide(done, "done", "checked the mail log")
            said = decide(again, "one_more_attempt", "not in the mail log")
            assert f"{again}: released for one more attempt by ivan; sent again: message " in said
            driver.save_screenshot(str(ARTIFACTS / "django-admin-resolved.png"))
        finally:
            driver.quit()
