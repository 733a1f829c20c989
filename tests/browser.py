"""Headless Chromium (Debian's chromium and chromium-driver), as the browser tests drive it."""

from __future__ import annotations

import shutil

from selenium import webdriver


def chromium(**capabilities: object) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    for name, value in capabilities.items():
        options.set_capability(name, value)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)
