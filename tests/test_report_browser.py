"""The sign-off report as a person sees it, in a real browser: headless Chromium (Debian's chromium and
chromium-driver) opens each report from disk with the network off and reads what is on the screen and on the
printed A4 pages.

One kit of each queue system runs its embedded suite and writes its reports; the test checks the verdict, the
seven rows and each observed figure against replay-report.json, the environment's versions, the sign-off block,
that nothing was fetched from anywhere but the file itself, that the page fits a phone's width, and that the
printed PDF is A4 with no case split across two pages. A kit whose effect is deliberately broken shows its
failure, and a run that cannot start says why. The template's run also writes a matrix page, checked the same
way. Screenshots and PDFs are kept in build/artifacts/ (REPLAY_ARTIFACTS_DIR).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matrix_report
import pytest
from browser import ARTIFACTS, chromium
from generate import baked
from pypdf import PdfReader
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.print_page_options import PrintOptions
from test_kits import LANGUAGES, REPLAY_CASES, run_suite

# A4 in PostScript points, as a PDF gives its page size (Chromium rounds to whole pixels: within 2 points)
A4 = (595.3, 841.9)
# How each kit's language runs the embedded suite here: the Ruby kit on the host's own Ruby stack
STACK = {"python": None, "ruby": "debian12"}
# The effect's one send, and the same send twice: a deliberate bug that the report must show
SEND_TWICE = {
    "python": ("smtp.send_message(message)", "smtp.send_message(message)\n        smtp.send_message(message)"),
    "ruby": (
        'smtp.send_message(mail, sender, details["to"])',
        '2.times { smtp.send_message(mail, sender, details["to"]) }',
    ),
}
EFFECT_FILES = {"python": "src/order_confirmation/effect.py", "ruby": "lib/order_confirmation/effect.rb"}


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    # Every request the page makes is logged, so that the test can see that none left the file.
    driver = chromium(**{"goog:loggingPrefs": {"performance": "ALL"}})
    # The network off: the page can reach nothing beyond the disk.
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    yield driver
    driver.quit()


def open_page(browser: webdriver.Chrome, page: Path, width: int = 1000) -> None:
    browser.set_window_size(width, 1400)
    browser.get_log("performance")  # forget the requests of earlier pages
    browser.get(page.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"


def requests_made(browser: webdriver.Chrome) -> list[str]:
    """The URL of every request the page made, from Chromium's own log."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def assert_self_contained(browser: webdriver.Chrome, page: Path) -> None:
    assert [url for url in requests_made(browser) if url != page.as_uri()] == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    # the phone: nothing wider than a 390-pixel screen
    browser.set_window_size(390, 844)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def printed(browser: webdriver.Chrome, keep_as: str) -> PdfReader:
    """The page printed on A4, as Chromium prints it; kept with a screenshot as artifacts of the run."""
    options = PrintOptions()
    options.page_width, options.page_height = 21.0, 29.7
    options.background = True
    pdf = base64.b64decode(browser.print_page(options))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{keep_as}.pdf").write_bytes(pdf)
    browser.set_window_size(1000, 1400)
    browser.save_screenshot(str(ARTIFACTS / f"{keep_as}.png"))
    reader = PdfReader(io.BytesIO(pdf))
    for page in reader.pages:
        size = (float(page.mediabox.width), float(page.mediabox.height))
        assert all(abs(got - want) < 2 for got, want in zip(size, A4, strict=True)), f"{size} is not A4"
    return reader


def assert_cases_whole_on_pages(reader: PdfReader) -> None:
    """Each case starts and ends on the same printed page: its heading and its observed row are together."""
    pages = [page.extract_text() for page in reader.pages]
    for number in range(1, 8):
        (where,) = [index for index, text in enumerate(pages) if f"Case {number}:" in text]
        rest = pages[where].split(f"Case {number}:", 1)[1]
        card = re.split(r"Case \d:", rest, maxsplit=1)[0]
        assert "Observed" in card, f"case {number} is split across pages {where + 1} and {where + 2}"


def kit_with_reports(tmp_path: Path, queue_system: str, break_effect: bool = False) -> tuple[Path, bool]:
    """A kit of the queue system, with the reports its embedded seven cases wrote (the cases alone: they write the
    reports, and the rest of the suite, which test_kits runs, adds nothing to them); whether they passed."""
    kit = baked(tmp_path, {"queue_system": queue_system})
    language = LANGUAGES[queue_system]
    if break_effect:
        effect = kit / EFFECT_FILES[language]
        once, twice = SEND_TWICE[language]
        assert once in effect.read_text()
        effect.write_text(effect.read_text().replace(once, twice))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")}
    result = run_suite(kit, language, STACK[language], env, REPLAY_CASES[language])
    return kit, result.returncode == 0


def shown(browser: webdriver.Chrome, selector: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, selector).text)


@pytest.mark.parametrize("queue_system", sorted(LANGUAGES))
def test_a_person_reads_the_report_offline(browser: webdriver.Chrome, tmp_path: Path, queue_system: str) -> None:
    kit, passed = kit_with_reports(tmp_path, queue_system)
    assert passed
    report: dict[str, Any] = json.loads((kit / "replay-report.json").read_text())
    page = kit / "replay-report.html"
    open_page(browser, page)

    assert shown(browser, "#verdict") == "Passed: all seven cases behaved as POLICY.md says."
    assert len(browser.find_elements(By.CSS_SELECTOR, "article.case")) == 7
    for row in report["rows"]:
        case = shown(browser, f"#case-{row['case']}")
        assert "PASSED" in case
        observed = f"Observed {row['observed']['emails']} {row['observed']['record']}"
        assert observed in case.replace("\n", " "), case
    environment = shown(browser, "#environment")
    for fact in report["environment"]:
        assert f"{fact['name']} {fact['value']}" in environment.replace("\n", " ")
    assert re.search(r"\d+\.\d+", environment)  # versions, not names alone
    signoff = browser.find_element(By.CSS_SELECTOR, "#signoff")
    assert signoff.is_displayed() and {"Client", "Engineer", "Signature", "Date"} <= set(signoff.text.split())

    assert_self_contained(browser, page)
    assert_cases_whole_on_pages(printed(browser, f"replay-report-{queue_system}"))
    print(f"{queue_system}: replay-report.html is {page.stat().st_size} bytes")


@pytest.mark.parametrize("queue_system", sorted(LANGUAGES))
def test_a_failed_case_shows_plainly(browser: webdriver.Chrome, tmp_path: Path, queue_system: str) -> None:
    kit, passed = kit_with_reports(tmp_path, queue_system, break_effect=True)
    assert not passed
    report = json.loads((kit / "replay-report.json").read_text())
    failed = [row for row in report["rows"] if not row["passed"]]
    assert failed
    open_page(browser, kit / "replay-report.html")
    verdict = shown(browser, "#verdict")
    assert verdict.startswith("Not passed:")
    for row in failed:
        assert f"case {row['case']} failed" in verdict
        case = shown(browser, f"#case-{row['case']}")
        assert "FAILED" in case and f"Observed {row['observed']['emails']} " in case.replace("\n", " ")
    junit = (kit / "replay-junit.xml").read_text()
    assert junit.count("<testcase ") == 7 and junit.count("<failure ") == len(failed)
    printed(browser, f"replay-report-{queue_system}-failed")


# A live run given only a database, one that does not answer, and what each kit's report says about it.
CANNOT_START = {
    "celery": "Connection refused",
    "sidekiq": "live mode needs both DATABASE_URL (PostgreSQL) and REDIS_URL",
}


@pytest.mark.parametrize("queue_system", sorted(CANNOT_START))
def test_a_run_that_cannot_start_says_why(browser: webdriver.Chrome, tmp_path: Path, queue_system: str) -> None:
    kit = baked(tmp_path, {"queue_system": queue_system})
    reason = CANNOT_START[queue_system]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")}
    env["DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
    language = LANGUAGES[queue_system]
    assert run_suite(kit, language, STACK[language], env).returncode != 0
    open_page(browser, kit / "replay-report.html")
    verdict = shown(browser, "#verdict")
    assert verdict.startswith("Not passed: the run could not start:") and reason in verdict, verdict
    assert "not run" in shown(browser, "#case-1")


def test_the_matrix_page(browser: webdriver.Chrome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's matrix page: one cell per suite, linked to that kit's report, with its time."""
    monkeypatch.setattr(matrix_report, "MATRIX", tmp_path / "matrix")
    hold = {"effect_kind": "external_no_reference", "stale_claim_policy": "hold"}
    combos = [{"queue_system": queue_system, **hold} for queue_system in LANGUAGES]
    matrix_report.plan([(combo, mode, None, "debian12") for combo in combos for mode in ("embedded", "live")])
    for combo in combos:
        kit, passed = kit_with_reports(tmp_path / combo["queue_system"], combo["queue_system"])
        matrix_report.record(combo, "embedded", None, "debian12", 12.5, passed, kit)
    page = matrix_report.render()

    open_page(browser, page)
    assert f"{len(combos)} of {2 * len(combos)}" in shown(browser, "#progress")
    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td a")
    assert len(cells) == len(combos) and all(cell.text == "passed, 12 s" for cell in cells)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#matrix td.pending")) == len(combos)
    assert_self_contained(browser, page)
    printed(browser, "matrix")
    # a cell opens its kit's report
    open_page(browser, page)
    browser.find_element(By.CSS_SELECTOR, "#matrix td a").click()
    assert shown(browser, "#verdict").startswith("Passed")
