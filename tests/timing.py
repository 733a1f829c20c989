"""The timing table printed at the end of every run, so that a slower suite shows in the log of the run that made it
slower: machine time by test file, each kit suite against its target, and the slowest tests.

Machine time is the sum of the tests' own durations (setup, call and teardown): with pytest's workers in parallel
it exceeds the wall time. CPU is what each test used, in its own process and the processes it waited for (the
kits' suites and workers, conftest measures it): on two busy cores, the run's length follows the CPU more than
any wait.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

# How long one kit's suite may take alone on a two-core machine, by mode (issue 30's targets).
SUITE_TARGETS = {"embedded": 5.0, "live": 15.0}


def seconds_by_test(reports: Iterable[Any]) -> dict[str, float]:
    """Each test's setup, call and teardown together, by node id."""
    seconds: dict[str, float] = defaultdict(float)
    for report in reports:
        if hasattr(report, "nodeid") and hasattr(report, "duration") and getattr(report, "when", None):
            seconds[report.nodeid] += report.duration
    return dict(seconds)


def cpu_by_test(reports: Iterable[Any]) -> dict[str, float]:
    """Each test's CPU seconds, from its teardown's report (conftest's cpu_seconds), by node id."""
    return {
        report.nodeid: value
        for report in reports
        if getattr(report, "when", None) == "teardown"
        for name, value in getattr(report, "user_properties", [])
        if name == "cpu_seconds"
    }


def table(reports: Iterable[Any], suites: list[dict[str, Any]]) -> str:
    reports = list(reports)
    tests, cpu = seconds_by_test(reports), cpu_by_test(reports)
    lines = ["", "timing: machine time and CPU by test file"]
    lines.append(f"  {'file':<32}{'tests':>7}{'seconds':>10}{'longest':>10}{'cpu':>8}")
    by_file: dict[str, list[str]] = defaultdict(list)
    for nodeid in tests:
        by_file[nodeid.split("::", 1)[0].removeprefix("tests/")].append(nodeid)
    for name, ids in sorted(by_file.items(), key=lambda item: -sum(tests[n] for n in item[1])):
        times = [tests[n] for n in ids]
        used = sum(cpu.get(n, 0.0) for n in ids)
        lines.append(f"  {name:<32}{len(times):>7}{sum(times):>10.0f}{max(times):>10.1f}{used:>8.0f}")
    lines.append(f"  {'all':<32}{len(tests):>7}{sum(tests.values()):>10.0f}{'':>10}{sum(cpu.values()):>8.0f}")
    if suites:
        lines += ["", "timing: kit suites (test_kits) against their targets, under this run's load"]
        lines.append(
            f"  {'suite':<34}{'runs':>6}{'median':>9}{'longest':>9}{'target':>8}{'over':>6}{'cpu':>8}{'cpu all':>9}"
        )
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for suite in suites:
            grouped[f"{suite['combo']['queue_system']} {suite['column']}"].append(suite)
        for name, runs in sorted(grouped.items()):
            times = [run["seconds"] for run in runs]
            suite_cpu = [run.get("cpu_seconds") or 0.0 for run in runs]  # a suite's, median; the group's, summed
            target = SUITE_TARGETS[name.split()[1]]
            over = sum(seconds > target for seconds in times)
            lines.append(
                f"  {name:<34}{len(times):>6}{statistics.median(times):>9.1f}{max(times):>9.1f}{target:>8.0f}{over:>6}"
                f"{statistics.median(suite_cpu):>8.1f}{sum(suite_cpu):>9.0f}"
            )
    lines += ["", "timing: the ten slowest tests"]
    for nodeid, seconds in sorted(tests.items(), key=lambda item: -item[1])[:10]:
        lines.append(f"  {seconds:8.1f} s  {nodeid}")
    if cpu:
        lines += ["", "timing: the ten tests that used the most CPU"]
        for nodeid, seconds in sorted(cpu.items(), key=lambda item: -item[1])[:10]:
            lines.append(f"  {seconds:8.1f} s  {nodeid}")
    spans = spans_by_test(reports)
    if spans:
        # the tail: what still ran while the other workers had nothing left, and when it started
        begun = min(start for start, _ in spans.values())
        lines += ["", "timing: the ten tests that ended last (seconds into the run: start, end)"]
        for nodeid, (start, stop) in sorted(spans.items(), key=lambda item: -item[1][1])[:10]:
            lines.append(f"  {start - begun:7.0f} {stop - begun:7.0f}  {nodeid}")
    return "\n".join(lines) + "\n"


def spans_by_test(reports: Iterable[Any]) -> dict[str, tuple[float, float]]:
    """When each test's setup began and its teardown ended (epoch seconds), by node id."""
    spans: dict[str, tuple[float, float]] = {}
    for report in reports:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if hasattr(report, "nodeid") and getattr(report, "when", None) and start and stop:
            first, last = spans.get(report.nodeid, (start, stop))
            spans[report.nodeid] = (min(first, start), max(last, stop))
    return spans
