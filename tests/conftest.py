import os
import resource
import shutil
import sys
import tempfile
import uuid
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

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


# The tests that take a minute or more, started first (in this order) by pytest's workers: last, one would run alone
# while the other workers have nothing left (the run's tail, in the timing table).
LONG_FIRST = [
    "tests/test_django_host.py::*",  # one worker runs them all, one after the other (their xdist_group)
    "tests/test_soak.py::*",
    "tests/test_kit_readme.py::*",
    "tests/test_python_readme.py::*",
    "tests/test_kits.py::*-sid]",  # the second Python's whole suites
    "tests/test_tox_quick.py::*",
    "tests/test_rails_host.py::*",
    "tests/test_regenerate.py::*",
]
COLLECTED_ORDER = pytest.StashKey[dict[str, int]]()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    config.stash[COLLECTED_ORDER] = {item.nodeid: n for n, item in enumerate(items)}

    def rank(item: Any) -> int:
        return next((n for n, pattern in enumerate(LONG_FIRST) if fnmatch(item.nodeid, pattern)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order within a rank stays


def pytest_collection_finish(session: Any) -> None:
    """The matrix report learns which kit suites this run will run (every pytest worker collects them all)."""
    order = session.config.stash.get(COLLECTED_ORDER, {})
    suites = [
        item.callspec.params
        for item in sorted(session.items, key=lambda item: order.get(item.nodeid, 0))  # as collected, not as run
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
    if hasattr(terminalreporter.config, "workerinput") or terminalreporter.config.option.collectonly:
        return
    import matrix_report
    import timing

    reports = [report for outcome in terminalreporter.stats.values() for report in outcome]
    terminalreporter.write(timing.table(reports, matrix_report.results()))


def _cpu_seconds() -> float:
    """CPU used so far by this process and by every process it has waited for (a kit's suite, its workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any) -> Any:
    item.stash[CPU_AT_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: Any) -> Any:
    """Each test's CPU seconds, on its teardown's report, for the timing table: on two cores CPU is what a run
    waits for, more than any sleep."""
    yield
    item.user_properties.append(("cpu_seconds", _cpu_seconds() - item.stash[CPU_AT_START]))
