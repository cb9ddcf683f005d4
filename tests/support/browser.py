"""Test support: Debian's headless Chromium driven by Selenium through Debian's chromedriver.

No browser or driver download: the driver's path goes to ``Service`` explicitly, so Selenium
Manager never runs. Console messages come from ``goog:loggingPrefs``."""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
T = TypeVar("T")


def available() -> str | None:
    """None when the browser can run here, else why not (for a skip message)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} missing: `make services` installs Debian's chromium and chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return "selenium missing: pip install -e '.[test]'"
    return None


def chromium(width: int = 1400, height: int = 1000) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--metrics-recording-only", "--disable-default-apps", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver") or CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(20)
    return driver


def screenshot(driver: Any, path: Path, width: int = 1400, max_height: int = 2400) -> Path:
    """The whole page (up to ``max_height`` CSS pixels tall) as a PNG at ``path``; the window is
    put back to ``width`` x 1000 afterwards."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(width, max(900, min(max_height, height)))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    driver.set_window_size(width, 1000)
    return path


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """Console entries at SEVERE (errors, uncaught exceptions, CSP violations, failed loads)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def poll(condition: Callable[[], T], timeout_s: float = 15.0, what: str = "", interval_s: float = 0.05) -> T:
    """``condition()`` once it is truthy (exceptions count as not yet)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - an element not there yet, a stale one
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}" + (f": {last!r}" if last else ""))
        time.sleep(interval_s)
