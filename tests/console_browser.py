"""The operator console in a real headless Chromium, driven by Selenium.

Selenium's calls block, and the gateway under test runs on the test's own event
loop, so every step runs in a worker thread (`asyncio.to_thread`): the page
waits on the gateway while the loop keeps serving it. The browser is Debian's
`chromium` through `chromium-driver` (never a downloaded one); without them a
test is skipped locally and fails in CI (`CI=true`), where `.ci/run` installs them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 60
"""How long a step waits for the page to show what it expects: only a broken page takes this
long, but on a loaded machine the console's answers and re-renders can take seconds."""

T = TypeVar("T")


def chromium_or_skip() -> None:
    """Skip (or fail, in CI) when Debian's chromium and chromium-driver are missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"the console tests need a real browser in CI: {reason}")
    pytest.skip(reason)


def start_chromium() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


class ConsolePage:
    """The console as an operator uses it: sign in, pick a state, open, settle.

    Each public method is a coroutine that runs its Selenium steps off the loop.
    Screenshots go to `shots`, numbered in the order taken.
    """

    def __init__(self, driver: webdriver.Chrome, admin_url: str, shots: Path) -> None:
        self.driver = driver
        self.admin_url = admin_url
        self.shots = shots
        self._shot = 0

    async def _run(self, step: Callable[[], T]) -> T:
        return await asyncio.to_thread(step)

    def _wait(self) -> WebDriverWait[webdriver.Chrome]:
        # The page re-renders a list or a detail in place when an answer arrives: an
        # element read a moment before is then stale, and the wait reads it again.
        return WebDriverWait(
            self.driver, WAIT_SECONDS, ignored_exceptions=(StaleElementReferenceException,)
        )

    def _visible(self, element_id: str) -> WebElement:
        element: WebElement = self._wait().until(
            ec.visibility_of_element_located((By.ID, element_id))
        )
        return element

    # --- steps -------------------------------------------------------------------

    async def open(self, fragment: str = "") -> None:
        def step() -> None:
            self.driver.get(f"{self.admin_url}/admin/{fragment}")
            self._wait().until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )

        await self._run(step)

    async def login_visible(self) -> bool:
        return await self._run(lambda: self._visible("login").is_displayed())

    async def sign_in(self, token: str, *, actor: str = "") -> None:
        """Type the token (and the operator's name, recorded with their actions) and sign in."""

        def step() -> None:
            field = self._visible("token")
            field.clear()
            field.send_keys(token)
            name = self.driver.find_element(By.ID, "actor")
            name.clear()
            name.send_keys(actor)
            self.driver.find_element(By.CSS_SELECTOR, "#login-form button").click()

        await self._run(step)

    async def login_error(self) -> str:
        def step() -> str:
            return str(self._visible("login-error").text)

        return await self._run(step)

    async def wait_for_list(self) -> None:
        await self._run(lambda: self._visible("list"))

    async def state_counts(self) -> dict[str, int]:
        def step() -> dict[str, int]:
            self._visible("states")
            links = self.driver.find_elements(By.CSS_SELECTOR, "#states a")
            return {
                str(link.get_attribute("data-state")): int(
                    link.find_element(By.CLASS_NAME, "count").text
                )
                for link in links
            }

        return await self._run(step)

    async def current_state_tab(self) -> str:
        def step() -> str:
            link = self._wait().until(
                ec.presence_of_element_located((By.CSS_SELECTOR, '#states a[aria-current="page"]'))
            )
            return str(link.get_attribute("data-state"))

        return await self._run(step)

    async def choose_state(self, state: str, *, wait: bool = True) -> None:
        def step() -> None:
            # The tabs are drawn when the counts arrive: wait for them, never assume they are.
            tab = self._wait().until(
                ec.element_to_be_clickable((By.CSS_SELECTOR, f'#states a[data-state="{state}"]'))
            )
            tab.click()
            if not wait:
                return
            self._wait().until(
                ec.presence_of_element_located(
                    (By.CSS_SELECTOR, f'#states a[data-state="{state}"][aria-current="page"]')
                )
            )

        await self._run(step)

    async def filter(self, *, route: str = "", older_than: str = "") -> None:
        def step() -> None:
            Select(self._visible("route")).select_by_value(route)
            age = self.driver.find_element(By.ID, "older-than")
            age.clear()
            age.send_keys(older_than)
            self.driver.find_element(By.CSS_SELECTOR, "#filters button").click()

        await self._run(step)

    async def rows(self, *, expect: int | None = None) -> list[dict[str, str]]:
        """The listed operations (key, state, route, request), once `expect` are shown."""

        def step() -> list[dict[str, str]]:
            # Wrapped in a tuple: WebDriverWait retries a falsy result, and [] is an answer.
            def read(driver: webdriver.Chrome) -> tuple[list[dict[str, str]]] | None:
                rows = [
                    {
                        "id": str(row.get_attribute("data-id")),
                        "key": cells[0].text,
                        "state": cells[1].text,
                        "route": cells[2].text,
                        "request": cells[3].text,
                    }
                    for row in driver.find_elements(By.CSS_SELECTOR, "#operations tbody tr")
                    if (cells := row.find_elements(By.TAG_NAME, "td"))
                ]
                return (rows,) if expect is None or len(rows) == expect else None

            found: tuple[list[dict[str, str]]] = self._wait().until(read)
            return found[0]

        return await self._run(step)

    async def open_operation(self, operation_id: str) -> None:
        def step() -> None:
            row = self._wait().until(
                ec.element_to_be_clickable(
                    (By.CSS_SELECTOR, f'#operations tr[data-id="{operation_id}"] a')
                )
            )
            row.click()
            self._wait().until(
                lambda d: (
                    d.find_element(By.ID, "detail").is_displayed()
                    and d.find_elements(By.CSS_SELECTOR, "#summary dd")
                )
            )

        await self._run(step)

    async def detail_text(self, element_id: str) -> str:
        return await self._run(lambda: str(self._visible(element_id).text))

    async def search(self, text: str, *, one: bool = False) -> None:
        """Search by key, id or forwarded key; returns once the results' caption names `text`,
        or (`one`: a single match) once that operation is open."""

        def step() -> None:
            field = self._visible("q")
            field.clear()
            field.send_keys(text)
            self.driver.find_element(By.CSS_SELECTOR, "#search button").click()
            if one:
                self._wait().until(lambda d: d.find_element(By.ID, "detail").is_displayed())
                return
            self._wait().until(
                lambda d: (
                    text in d.find_element(By.ID, "list-caption").text
                    and d.find_element(By.ID, "list").is_displayed()
                )
            )

        await self._run(step)

    async def history(
        self, *, until: Callable[[list[dict[str, str]]], bool] | None = None
    ) -> list[dict[str, str]]:
        """The history as shown (type and text of each event), once `until` holds for it."""

        def step() -> list[dict[str, str]]:
            def read(driver: webdriver.Chrome) -> tuple[list[dict[str, str]]] | None:
                if not driver.find_element(By.ID, "detail").is_displayed():
                    return None
                events = [
                    {"type": str(item.get_attribute("data-type")), "text": str(item.text)}
                    for item in driver.find_elements(By.CSS_SELECTOR, "#history li")
                ]
                return (events,) if events and (until is None or until(events)) else None

            found: tuple[list[dict[str, str]]] = self._wait().until(read)
            return found[0]

        return await self._run(step)

    async def wait_text(self, element_id: str, contains: str) -> str:
        """The element's text once it is shown and contains `contains`."""

        def step() -> str:
            def read(driver: webdriver.Chrome) -> str | None:
                element = driver.find_element(By.ID, element_id)
                text = str(element.text)
                return text if element.is_displayed() and contains in text else None

            found: str = self._wait().until(read)
            return found

        return await self._run(step)

    async def click(self, element_id: str) -> None:
        def step() -> None:
            self._wait().until(ec.element_to_be_clickable((By.ID, element_id))).click()

        await self._run(step)

    async def receipt_body(self) -> str:
        """The receipt body exactly as the page holds it (textContent, not rendered HTML)."""

        def step() -> str:
            body = self._wait().until(
                ec.presence_of_element_located((By.CSS_SELECTOR, "#receipt pre.body"))
            )
            return str(self.driver.execute_script("return arguments[0].textContent", body))

        return await self._run(step)

    async def settle(
        self,
        outcome: str,
        *,
        note: str,
        status: int | None = None,
        body: str | None = None,
        empty_body: bool = False,
        wait: bool = True,
        submit: bool = True,
    ) -> None:
        """Fill the settle form and (unless not `submit`) press Settle."""

        def step() -> None:
            form = self._visible("resolve-form")
            form.find_element(By.CSS_SELECTOR, f'input[name="outcome"][value="{outcome}"]').click()

        await self._run(step)
        await self.fill_receipt(
            note=note, status=status, body=body, empty_body=empty_body, wait=wait, submit=submit
        )

    async def fill_receipt(
        self,
        *,
        note: str,
        status: int | None = None,
        body: str | None = None,
        empty_body: bool = False,
        wait: bool = True,
        submit: bool = True,
    ) -> None:
        """Fill the form's receipt and note (settling `applied`, or attaching a missing
        receipt) and (unless not `submit`) press its button."""

        def step() -> None:
            form = self._visible("resolve-form")
            if status is not None:
                field = self.driver.find_element(By.ID, "receipt-status")
                field.clear()
                field.send_keys(str(status))
            if body is not None:
                self.driver.find_element(By.ID, "receipt-body").send_keys(body)
            if empty_body:
                self.driver.find_element(By.ID, "receipt-empty").click()
            note_field = self.driver.find_element(By.ID, "resolve-note")
            note_field.clear()
            note_field.send_keys(note)
            if not submit:
                return
            form.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()
            if wait:
                self._visible("action-result")

        await self._run(step)

    async def ask_redact(self, *, reason: str) -> None:
        """Type the reason and press Redact: the page asks to confirm (nothing is sent yet)."""

        def step() -> None:
            form = self._visible("redact-form")
            field = self.driver.find_element(By.ID, "redact-reason")
            field.clear()
            field.send_keys(reason)
            form.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()

        await self._run(step)

    async def text_content(self, css: str) -> str:
        """An element's text exactly as the page holds it (textContent, not rendered HTML)."""

        def step() -> str:
            node = self._wait().until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))
            return str(self.driver.execute_script("return arguments[0].textContent", node))

        return await self._run(step)

    async def window(self, width: int, height: int) -> int:
        """Resize the window; answers the page's width (`innerWidth`) once it has changed."""

        def step() -> int:
            self.driver.set_window_size(width, height)
            self._wait().until(lambda d: d.execute_script("return window.innerWidth") == width)
            return int(self.driver.execute_script("return window.innerWidth"))

        return await self._run(step)

    async def displayed(self, element_id: str) -> bool:
        def step() -> bool:
            return bool(self.driver.find_element(By.ID, element_id).is_displayed())

        return await self._run(step)

    async def script(self, source: str) -> Any:
        return await self._run(lambda: self.driver.execute_script(source))

    async def async_script(self, source: str, *args: Any) -> Any:
        """Run `source` in the page; it answers by calling its last argument (a callback)."""
        return await self._run(lambda: self.driver.execute_async_script(source, *args))

    async def count(self, css: str) -> int:
        return await self._run(lambda: len(self.driver.find_elements(By.CSS_SELECTOR, css)))

    async def console_errors(self) -> list[str]:
        """Browser log lines at SEVERE: script errors and Content-Security-Policy reports."""

        def step() -> list[str]:
            return [
                str(entry["message"])
                for entry in self.driver.get_log("browser")
                if entry.get("level") == "SEVERE"
            ]

        return await self._run(step)

    async def screenshots(self, name: str) -> list[Path]:
        """The page at 1280 px and at a phone's 390 px (`name-1280`, `name-390`), checking
        the phone needs no sideways scrolling; the window is 1280 px wide again after."""
        shots = []
        try:
            for width, height in ((1280, 1000), (390, 844)):
                assert await self.window(width, height) == width
                scroll = await self.script("return document.documentElement.scrollWidth")
                assert scroll <= width, f"{name}: the page is {scroll} px wide at {width}"
                shots.append(await self.screenshot(f"{name}-{width}"))
        finally:
            await self.window(1280, 1000)
        return shots

    async def screenshot(self, name: str) -> Path:
        """The whole page (not only the window's part of it) as a PNG under `shots`."""
        self._shot += 1
        path = self.shots / f"{self._shot:02d}-{name}.png"

        def step() -> None:
            self.shots.mkdir(parents=True, exist_ok=True)
            size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            shot = self.driver.execute_cdp_cmd(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip},
            )
            path.write_bytes(base64.b64decode(shot["data"]))

        await self._run(step)
        return path
