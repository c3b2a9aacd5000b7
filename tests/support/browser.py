"""Headless chromium for the console's page tests: the driver and how tests read a rendered page.

Debian's ``chromium`` is driven through its ``chromedriver`` (selenium), kept off the network: every
host but 127.0.0.1 resolves to nothing, and nothing updates, syncs or reports. The console marks
each number it shows with ``data-field`` and carries it raw in ``data-value``; ``field`` and
``values`` read those, never the formatted text.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from tests.support import wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: Flags that keep the browser off the network and quiet (no updates, sync, metrics or first-run pages).
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--disable-default-apps", "--metrics-recording-only",
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1280,1800")


def start_browser() -> Any:
    """A headless chromium (selenium WebDriver); AssertionError naming the fix when it is not installed."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    assert not missing, (f"{' and '.join(missing)} missing: `make test` installs Debian's chromium and "
                         "chromium-driver (as root: apt-get install chromium chromium-driver)")
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium never looks for a driver online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    return driver


def load(driver: Any, url: str, page: str) -> None:
    """Open ``url`` and wait until the console has rendered ``page`` from its API answers."""
    driver.get(url)
    try:
        wait_for(lambda: driver.execute_script("return document.body.dataset.loaded") == page, f"the {page} page", 60)
    except AssertionError as e:
        shown = driver.execute_script("return document.body.dataset.loaded + ': ' + document.body.innerText")
        raise AssertionError(f"{e}; the page shows {shown[:2000]!r}; browser log: {driver.get_log('browser')}") from e


def values(driver: Any, selector: str, attribute: str = "data-value") -> list[str]:
    """``attribute`` of every element ``selector`` finds, in page order."""
    return [e.get_attribute(attribute) for e in driver.find_elements("css selector", selector)]


def raw(value: Any) -> str:
    """How the page carries an API value in ``data-value``: as is, '' for null."""
    return "" if value is None else str(value)


def field(driver: Any, name: str, within: str = "") -> str:
    """The one number named ``name`` (``data-field``) inside ``within``."""
    (value,) = values(driver, f"{within} [data-field='{name}']".strip())
    return value
