"""A headless chromium for the tests that open `components.html` (Debian's `chromium` and
`chromium-driver`, driven by selenium); `.ci/run` installs both when it runs as root."""

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no chromium and chromedriver on PATH (apt-get install chromium chromium-driver; "
    ".ci/run installs them when it runs as root)",
)


@contextmanager
def opened(page: Path) -> Iterator[webdriver.Chrome]:
    """`page` loaded from `file://` in a headless chromium that keeps the console's messages."""
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(DRIVER)))
    try:
        driver.get(page.resolve().as_uri())
        yield driver
    finally:
        driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The console's error messages so far."""
    get_log: Callable[[str], list[dict[str, str]]] = driver.get_log  # unannotated upstream
    return [e["message"] for e in get_log("browser") if e["level"] == "SEVERE"]
