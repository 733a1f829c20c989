"""The matrix report of a test run: every kit's suite by combination and mode, each cell linked to that kit's
replay-report.html and showing how long the suite took.

    build/matrix/index.html          the page: rewritten after every suite, so that it fills in as the run goes
                                     (it reloads itself until the run has finished)
    build/matrix/<suite>/            each suite's reports, copied from its kit

A test run's pytest workers share the folder: each suite appends one line to results-<run id>.jsonl (an
append of one short line is atomic) and renders the page from all the lines so far.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matrix import ROOT, combo_id
from services import RUN_ID

MATRIX = Path(os.environ.get("REPLAY_MATRIX_DIR", ROOT / "build" / "matrix"))
REPORTS = ("replay-report.html", "replay-report.md", "replay-junit.xml", "replay-report.json")


def results_file() -> Path:
    return MATRIX / f"results-{RUN_ID}.jsonl"


def plan(suites: Iterable[tuple[dict[str, str], str, str | None, str]]) -> None:
    """Records the suites this run will run, so that the page shows what is still to come."""
    MATRIX.mkdir(parents=True, exist_ok=True)
    planned = [{"combo": combo, "column": column(mode, variant, stack)} for combo, mode, variant, stack in suites]
    # every pytest worker writes the same plan, at the same time: each whole, by a rename, so that none reads half
    written = MATRIX / f"planned-{RUN_ID}.json.{os.getpid()}"
    written.write_text(json.dumps(planned))
    written.replace(MATRIX / f"planned-{RUN_ID}.json")
    render()


def column(mode: str, variant: str | None, stack: str) -> str:
    """The mode, the broker or entry point, and the stack: "live redis debian12"."""
    return " ".join(filter(None, [mode, variant, stack]))


def record(
    combo: dict[str, str],
    mode: str,
    variant: str | None,
    stack: str,
    seconds: float,
    passed: bool,
    kit: Path,
    cpu_seconds: float | None = None,
) -> None:
    """One suite's outcome: its reports copied here, a line in the results, the page rendered again."""
    name = f"{combo_id(combo)}-{column(mode, variant, stack).replace(' ', '-')}"
    folder = MATRIX / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for report in REPORTS:
        if (kit / report).exists():
            shutil.copy2(kit / report, folder / report)
    line = {
        "combo": combo,
        "column": column(mode, variant, stack),
        "seconds": round(seconds, 1),
        "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 1),
        "passed": passed,
        "report": f"{name}/replay-report.html" if (folder / "replay-report.html").exists() else None,
    }
    with results_file().open("a") as results:
        results.write(json.dumps(line) + "\n")
    render()


def results() -> list[dict[str, Any]]:
    """The suites recorded so far in this run, one dict each (combo, column, seconds, cpu_seconds, passed, report)."""
    return [json.loads(line) for line in results_file().read_text().splitlines()] if results_file().exists() else []


def render(finished: bool = False) -> Path:
    """Writes index.html from what this run has planned and done so far."""
    planned_file = MATRIX / f"planned-{RUN_ID}.json"
    planned = json.loads(planned_file.read_text()) if planned_file.exists() else []
    done = results()
    page = MATRIX / "index.html"
    written = MATRIX / f"index.html.{os.getpid()}"  # whole, by a rename, as plan() writes
    written.write_text(matrix_page(planned, done, finished))
    written.replace(page)
    return page


def matrix_page(planned: list[dict[str, Any]], done: list[dict[str, Any]], finished: bool) -> str:
    columns = list(dict.fromkeys(entry["column"] for entry in planned + done))
    combos = list({combo_id(entry["combo"]): entry["combo"] for entry in planned + done}.values())
    cells = {(combo_id(entry["combo"]), entry["column"]): entry for entry in done}
    wanted = {(combo_id(entry["combo"]), entry["column"]) for entry in planned}
    passed = sum(entry["passed"] for entry in done)
    failed = len(done) - passed
    total = max(len(planned), len(done))
    state = "finished" if finished else "running"
    head = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    rows = []
    for combo in combos:
        key = combo_id(combo)
        tds = []
        for name in columns:
            entry = cells.get((key, name))
            if entry is None:
                text, css = ("to come", "pending") if (key, name) in wanted and not finished else ("", "none")
                tds.append(f'<td class="{css}">{text}</td>')
                continue
            label = f"{'passed' if entry['passed'] else 'FAILED'}, {entry['seconds']:.0f} s"
            if entry["report"]:
                label = f'<a href="{html.escape(entry["report"])}">{label}</a>'
            tds.append(f'<td class="{"passed" if entry["passed"] else "failed"}">{label}</td>')
        names = " ".join(f"<code>{html.escape(value)}</code>" for value in combo.values())
        rows.append(f"<tr><th>{names}</th>{''.join(tds)}</tr>")
    refresh = "" if finished else '<meta http-equiv="refresh" content="10">'
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
{refresh}
<title>replay-matrix: the matrix of run {RUN_ID}</title>
<style>
  body {{ font: 14px/1.4 system-ui, "DejaVu Sans", sans-serif; margin: 1rem; color: #1a1a1a; }}
  table {{ border-collapse: collapse; }}
  th, td {{ border: 1px solid #d0d0d0; padding: 0.25rem 0.5rem; text-align: left; white-space: nowrap; }}
  td.passed {{ background: #eaf6ef; }} td.failed {{ background: #fbeaea; font-weight: 700; }}
  td.pending {{ color: #777; }}
  progress {{ width: 20rem; max-width: 100%; }}
  .scroll {{ overflow-x: auto; }}
</style>
</head>
<body>
<h1>The replay matrix: every combination, by mode</h1>
<p id="progress">Run {RUN_ID}, {state} ({time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}):
<strong>{len(done)} of {total}</strong> suites done, {passed} passed, {failed} failed.
<progress max="{total}" value="{len(done)}"></progress></p>
<p>Each cell links to that kit's replay report and gives how long its suite took.</p>
<div class="scroll">
<table id="matrix">
<tr><th>queue system, effect kind, policy</th>{head}</tr>
{chr(10).join(rows)}
</table>
</div>
</body>
</html>
"""
