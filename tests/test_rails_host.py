"""A Sidekiq kit dropped into an existing Rails app, on every Ruby stack.

The app (tests/rails_host) has its own connection to PostgreSQL, its own table, model and migration. The
kit, beside the app, is installed, migrated (the app's own `db:migrate`), run on the app's own Sidekiq and
given one operation with the commands of its README's section "In a Rails app", as written. Its replay suite
then runs inside the app (REPLAY_HOST_APP), on real sidekiq processes that boot the app. Afterwards the app's
data and connection are as they were. A same-database kit, whose claim runs in the job's transaction on the app's
own connection, runs its replay suite inside the app too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import stacks
from browser import ARTIFACTS, chromium, submit, web_server
from generate import baked, readme_commands
from selenium.webdriver.common.by import By
from services import postgres_database, psql, redis_database, smtp_sink
from test_kits import assert_report, run_name

HOST = Path(__file__).parent / "rails_host"
COMBO = {"queue_system": "sidekiq", "effect_kind": "external_no_reference", "stale_claim_policy": "hold"}


def run(stack: str, argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        stacks.command(stack, argv, cwd, env), cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, " ".join(argv) + "\n" + result.stdout[-6000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.live
@pytest.mark.parametrize("stack", stacks.RUBY_STACKS)
def test_kit_inside_an_existing_rails_app(request: pytest.FixtureRequest, tmp_path: Path, stack: str) -> None:
    stacks.require(stack)
    app = tmp_path / "host_app"
    shutil.copytree(HOST, app)
    kit = baked(tmp_path, COMBO)  # beside the app, as the kit's README has it
    install, migrate, worker, enqueue = (line.split() for line in readme_commands(kit, "In a Rails app"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "REPLAY_HOST_APP")}
    with postgres_database(run_name(request)) as database, redis_database() as redis, smtp_sink() as (smtp, mail):
        env |= {"DATABASE_URL": database, "REDIS_URL": redis, **smtp}
        name = database.rsplit("/", 1)[1]

        # The app as it was: its gems installed, its own migration, its own row.
        run(stack, ["bundle", "install", "--local"], app, env)
        run(stack, ["bin/rails", "db:migrate"], app, env)
        run(stack, ["bin/rails", "runner", 'Customer.create!(name: "Ada")'], app, env)

        installed = run(stack, install, app, env)
        # the kit's migrations in their order, each with a timestamp of the app
        migrations = sorted((app / "db/migrate").glob("*_handled_operations.rb"))
        version = run(stack, ["bin/rails", "runner", "puts ActiveRecord::Migration.current_version"], app, env)
        assert [re.sub(r"\A20\d{12}_", "", migration.name) for migration in migrations] == [
            "create_handled_operations.rb",
            "index_claimed_handled_operations.rb",
            "queued_and_failed_handled_operations.rb",
            "resolutions_handled_operations.rb",
        ]
        for migration in migrations:
            assert f"ActiveRecord::Migration[{version.strip()}]" in migration.read_text()
        assert (app / "app/sidekiq/order_confirmation/send_confirmation_job.rb").exists()
        assert "wrote lib/tasks/order_confirmation.rake" in installed

        # The app's own db:migrate applies the kit's migration beside the app's; the autoloader takes every file.
        run(stack, migrate, app, env)
        applied = psql("SELECT version FROM schema_migrations ORDER BY version", database=name).split()
        assert applied == ["20240101000000", *(migration.name[:14] for migration in migrations)]
        indexes = psql("SELECT indexname FROM pg_indexes WHERE tablename = 'handled_operations'", database=name)
        assert set(indexes.split()) == {
            "handled_operations_operation",
            "handled_operations_claimed",
            "handled_operations_queued",
        }
        assert run(stack, ["bin/rails", "zeitwerk:check"], app, env).rstrip().endswith("All is good!")
        tasks = run(stack, ["bin/rails", "-T", "order_confirmation"], app, env)
        assert {
            "order_confirmation:enqueue",
            "order_confirmation:sweep",
            "order_confirmation:held:list",
            "order_confirmation:status",
        } <= set(re.findall(r"order_confirmation:[\w:]+", tasks))

        # The app's own Sidekiq runs the job: one operation enqueued, one email at the sink, the record completed.
        app_worker = stacks.command(stack, worker, app, env)
        sidekiq = subprocess.Popen(app_worker, cwd=app, env=env, start_new_session=True)
        try:
            assert "enqueued send_confirmation ORD-1001" in run(stack, enqueue, app, env)
            done = "SELECT status FROM handled_operations WHERE operation_key = 'ORD-1001'"
            deadline = time.monotonic() + 60
            while (len(mail.received), psql(done, database=name).strip()) != (1, "completed"):
                assert time.monotonic() < deadline, "the app's sidekiq did not perform the enqueued operation"
                time.sleep(0.2)
            # the monitor's status, as the app runs it: every state, and nothing waits
            status = run(stack, ["bin/rails", "order_confirmation:status"], app, env).splitlines()
            assert status[-1] == "ok: nothing waits for a person or sits past its time", status
            assert re.fullmatch(r"completed +1  \d+s", status[3]), status
        finally:
            os.killpg(sidekiq.pid, signal.SIGTERM)
            sidekiq.wait(timeout=60)

        # The seven cases, inside the app, on its connection and real sidekiq processes.
        suite_env = env | {"REPLAY_HOST_APP": str(app)}
        result = subprocess.run(
            stacks.command(stack, ["rspec"], kit, suite_env),
            cwd=kit,
            env=suite_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
        assert_report(kit, COMBO, "live")

        # The app's connection and data are as they were; the kit's records live in the app's database.
        probe = (
            "puts ActiveRecord::Base.connection_db_config.database;"
            "puts OrderConfirmation.connection_pool.equal?(ActiveRecord::Base.connection_pool);"
            "puts Customer.pluck(:name).inspect"
        )
        assert run(stack, ["bin/rails", "runner", probe], app, env).split() == [name, "true", '["Ada"]']

        # The kit's Sidekiq Web tab, added as the README says, behind the app's sign-in; the app says who may decide.
        routes = app / "config/routes.rb"
        # the README's routes, but for who may decide: the host's own sign-in stands in for Devise
        assert "\nOrderConfirmation::Web.add_tab(resolver: " in ruby_block(kit, "In a Rails app")
        resolver = (
            'OrderConfirmation::Web.add_tab(resolver: ->(env) { env["rack.session"]["user"].presence_in(%w[ivan]) })'
        )
        routes.write_text(
            routes.read_text().replace(
                "\nRails.application.routes.draw", f"\n{resolver}\n\nRails.application.routes.draw"
            )
        )
        held = (
            "INSERT INTO handled_operations (job_type, operation_key, payload_fingerprint, payload, status,"
            " claim_token, attempt, claimed_at, note) VALUES ('send_confirmation', 'ORD-HELD-1', 'f', '{}', 'held',"
            " 't', 1, now() - interval '1 day', 'claim older than the lease: held for a person')"
        )
        psql(held, database=name)
        resolve_in_sidekiq_web(stack, app, env, tmp_path)
        audit = "SELECT resolved_by, resolved_as, status_before, status_after, why FROM handled_operations_resolutions"
        assert psql(audit, database=name).strip() == "ivan|sidekiq-web:ivan|held|completed|checked the mail log"


@pytest.mark.live
@pytest.mark.parametrize("stack", stacks.RUBY_STACKS)
def test_install_brings_an_earlier_revision_of_the_kit_up_to_date(
    request: pytest.FixtureRequest, tmp_path: Path, stack: str
) -> None:
    """An app that holds the kit at its second revision (migrations 1 and 2 applied, not 3; an earlier job; its
    own effect; the soak, which earlier revisions copied into the app): the README's install line, run again,
    writes the third migration after the app's migrations and the kit's changed files, keeps the app's effect and
    removes the soak; the app's db:migrate applies it; once more, it writes nothing."""
    stacks.require(stack)
    app = tmp_path / "host_app"
    shutil.copytree(HOST, app)
    kit = baked(tmp_path, COMBO)
    install, migrate, _, _ = (line.split() for line in readme_commands(kit, "In a Rails app"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "REPLAY_HOST_APP")}
    problem = ["bin/rails", "runner", "puts OrderConfirmation::DatabaseCheck.problem.inspect"]
    with postgres_database(run_name(request)) as database:
        env["DATABASE_URL"] = database
        name = database.rsplit("/", 1)[1]
        run(stack, ["bundle", "install", "--local"], app, env)
        run(stack, install, app, env)
        # the app as the kit's second revision left it
        later = ("queued_and_failed_handled_operations.rb", "resolutions_handled_operations.rb")
        for migration in later:
            next((app / "db/migrate").glob(f"*_{migration}")).unlink()
        job = app / "app/sidekiq/order_confirmation/send_confirmation_job.rb"
        job.write_text(job.read_text() + "# an earlier revision\n")
        effect = app / "app/sidekiq/order_confirmation/effect.rb"
        effect.write_text(effect.read_text() + "# the app's own\n")
        old_soak = app / "app/sidekiq/order_confirmation/soak.rb"
        shutil.copy(kit / "spec/soak.rb", old_soak)  # where earlier revisions of the kit copied it
        run(stack, migrate, app, env)
        assert "not migrated to revision 3" in run(stack, problem, app, env)
        applied = psql("SELECT version FROM schema_migrations ORDER BY version", database=name).split()

        upgraded = run(stack, install, app, env).splitlines()
        written = [next((app / "db/migrate").glob(f"*_{migration}")).name for migration in later]
        assert applied[-1] < written[0][:14] < written[1][:14], (written, applied)
        assert upgraded[:-1] == [
            "updated app/sidekiq/order_confirmation/send_confirmation_job.rb",
            *(f"wrote db/migrate/{migration}" for migration in written),
            "removed app/sidekiq/order_confirmation/soak.rb: the soak runs from the kit's folder",
            "kept app/sidekiq/order_confirmation/effect.rb, the app's own: compare it with the kit's"
            " lib/order_confirmation/effect.rb",
        ], upgraded
        assert "an earlier revision" not in job.read_text() and "the app's own" in effect.read_text()
        assert not old_soak.exists()

        run(stack, migrate, app, env)
        assert psql("SELECT version FROM schema_migrations ORDER BY version", database=name).split() == [
            *applied,
            *(migration[:14] for migration in written),
        ]
        assert run(stack, problem, app, env).strip() == "nil"
        files = sorted(str(path) for path in app.rglob("*") if path.is_file() and "tmp" not in path.parts)
        again = run(stack, install, app, env)
        assert "nothing to write" in again and "wrote" not in again and "updated" not in again, again
        assert sorted(str(path) for path in app.rglob("*") if path.is_file() and "tmp" not in path.parts) == files


@pytest.mark.live
@pytest.mark.parametrize("stack", stacks.RUBY_STACKS)
def test_same_database_kit_inside_an_existing_rails_app(
    request: pytest.FixtureRequest, tmp_path: Path, stack: str
) -> None:
    """The claim, the effect's row and the completion in one transaction of the app's own connection: installed
    and migrated as the README says, then the replay suite inside the app, on real sidekiq processes."""
    stacks.require(stack)
    combo = COMBO | {"effect_kind": "same_database"}
    app = tmp_path / "host_app"
    shutil.copytree(HOST, app)
    kit = baked(tmp_path, combo)
    install, migrate, _, _ = (line.split() for line in readme_commands(kit, "In a Rails app"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "REPLAY_HOST_APP")}
    with postgres_database(run_name(request)) as database, redis_database() as redis:
        env |= {"DATABASE_URL": database, "REDIS_URL": redis}
        for step in (["bundle", "install", "--local"], ["bin/rails", "db:migrate"], install, migrate):
            run(stack, step, app, env)
        tables = psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", database=database.rsplit("/")[-1])
        assert {"customers", "handled_operations", "send_confirmation_effects"} <= set(tables.split())

        suite_env = env | {"REPLAY_HOST_APP": str(app)}
        result = subprocess.run(
            stacks.command(stack, ["rspec"], kit, suite_env),
            cwd=kit,
            env=suite_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
        # the guest's spec ran: on PostgreSQL, inside the app, the job's statements in its transaction scan nothing
        assert (
            "keeps claims, completions and duplicates on the unique index inside the job's transaction" in result.stdout
        )
        assert_report(kit, combo, "live")


def ruby_block(kit: Path, section: str) -> str:
    """The ```ruby block of the kit README's section."""
    text = (kit / "README.md").read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return text.split("```ruby\n", 1)[1].split("```", 1)[0]


def resolve_in_sidekiq_web(stack: str, app: Path, env: dict[str, str], tmp_path: Path) -> None:
    """The app's Sidekiq Web in headless Chromium: a signed-in user the app does not let decide sees the held
    operation in the kit's tab and no decision; one it does marks it done, with why, through the tab's form (Sidekiq
    Web's CSRF protection on). Screenshots go to build/artifacts/."""
    tab = "/sidekiq/order-confirmation-held"
    server = ["bin/rails", "server", "-b", "127.0.0.1", "-p"]
    log = tmp_path / "rails-server.log"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with web_server(lambda port: stacks.command(stack, [*server, str(port)], app, env), app, env, log) as base:
        driver = chromium()
        try:
            driver.set_window_size(1400, 900)
            driver.get(f"{base}/sign_in?name=olga&to={tab}")
            assert "ORD-HELD-1" in driver.find_element(By.ID, "held-operations").text, driver.page_source[-3000:]
            assert not driver.find_elements(By.NAME, "why"), "a user the app does not let decide is offered a decision"
            driver.save_screenshot(str(ARTIFACTS / f"sidekiq-web-view-only-{stack}.png"))

            driver.delete_all_cookies()
            driver.get(f"{base}/sign_in?name=ivan&to={tab}")
            row = driver.find_element(By.XPATH, "//table[@id='held-operations']//tr[td[1]='ORD-HELD-1']")
            row.find_element(By.NAME, "why").send_keys("checked the mail log")
            driver.save_screenshot(str(ARTIFACTS / f"sidekiq-web-held-{stack}.png"))
            submit(driver, row.find_element(By.CSS_SELECTOR, "button[value=done]"))
            said = driver.find_element(By.ID, "said").text
            assert said == "ORD-HELD-1: marked done by ivan", driver.page_source[-3000:]
            assert not driver.find_elements(By.XPATH, "//tr[td[1]='ORD-HELD-1']"), "still listed after it was resolved"
            driver.save_screenshot(str(ARTIFACTS / f"sidekiq-web-resolved-{stack}.png"))
        finally:
            driver.quit()
