import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

# The template's tests import their helpers (matrix, generate) from this folder.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: Any) -> None:
    """One run id for the whole run, known to the main process too (pytest-xdist gives it to its workers only):
    the names of what the run creates, and its matrix report, carry it (services.RUN_ID)."""
    if not hasattr(config, "workerinput"):
        run_id = getattr(config.option, "testrunuid", None) or uuid.uuid4().hex
        if hasattr(config.option, "testrunuid"):
            config.option.testrunuid = run_id
        os.environ["PYTEST_XDIST_TESTRUNUID"] = run_id
        # A temporary folder of the run's own, for every process it starts (pytest's workers too), removed at
        # the end: cookiecutter writes each hook it runs to a temporary file and never removes it
        # (cookiecutter/cookiecutter#886). generate.with_cookiecutter cleans up after itself; cookiecutter run from
        # its command line (test_interactive) or through cruft (test_questions, test_regenerate) does not.
        os.environ["TMPDIR"] = tempfile.mkdtemp(prefix=f"replay-matrix-{run_id[:8]}-")
        tempfile.tempdir = None  # read TMPDIR again
        # Each set of answers baked once per run, then copied (generate.baked)
        os.environ["REPLAY_KIT_CACHE"] = os.path.join(os.environ["TMPDIR"], "kits")


def pytest_unconfigure(config: Any) -> None:
    """The run's temporary folder goes, with what was left in it."""
    if not hasattr(config, "workerinput"):
        folder = os.environ.get("TMPDIR", "")
        if Path(folder).name.startswith("replay-matrix-"):
            shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_finish(session: Any) -> None:
    """The matrix report learns which kit suites this run will run (every pytest worker collects them all)."""
    suites = [
        item.callspec.params
        for item in session.items
        if getattr(item, "originalname", "") == "test_kit_suite_proves_the_policy"
    ]
    if suites:
        import matrix_report

        matrix_report.plan((params["combo"], params["mode"], params["variant"], params["stack"]) for params in suites)


def pytest_sessionfinish(session: Any) -> None:
    """The run's matrix report, final: written once, by the process that is not a worker."""
    import matrix_report

    if not hasattr(session.config, "workerinput") and matrix_report.results_file().exists():
        page = matrix_report.render(finished=True)
        print(f"\nthe matrix report: {page}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The timing table (tests/timing.py), by the process that is not a worker."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    import matrix_report
    import timing

    reports = [report for outcome in terminalreporter.stats.values() for report in outcome]
    terminalreporter.write(timing.table(reports, matrix_report.results()))
