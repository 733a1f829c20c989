"""Headless Chromium (Debian's chromium and chromium-driver), and a host app's web server for it to visit, as the
browser tests drive them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

from matrix import ROOT
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

# Where the browser tests keep their screenshots and printed pages: build/artifacts/ (REPLAY_ARTIFACTS_DIR)
ARTIFACTS = Path(os.environ.get("REPLAY_ARTIFACTS_DIR", ROOT / "build" / "artifacts"))


def chromium(**capabilities: object) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    for name, value in capabilities.items():
        options.set_capability(name, value)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


def submit(driver: webdriver.Chrome, button: WebElement, timeout: float = 60) -> None:
    """Clicks a button that sends a form, and returns once the page it was on has gone and the answer has loaded: an
    element looked up right after the click would otherwise be the old page's (stale under load)."""
    page = driver.find_element(By.TAG_NAME, "html")
    button.click()
    WebDriverWait(driver, timeout).until(expected_conditions.staleness_of(page))
    WebDriverWait(driver, timeout).until(lambda _: driver.execute_script("return document.readyState") == "complete")


@contextmanager
def web_server(command: Callable[[int], list[str]], cwd: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """The app's server, `command(port)` on a free port, from when it answers (an error page counts) until the block
    ends; its base URL. Its output goes to `log`, shown when it stops before it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        command(port), cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urlopen(f"{base}/", timeout=5).close()
                break
            except HTTPError:
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
