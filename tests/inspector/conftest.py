"""What the inspector's browser tests share: Debian's Chromium, one browser per test module, and
a context of it that reaches the inspector alone."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from tests.helpers import CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":  # CI installs it (.ci/run): its absence there is a failure
            pytest.fail("Chromium is not installed (apt-get install --no-install-recommends chromium)")
        pytest.skip("Chromium is not installed (apt-get install --no-install-recommends chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def local_only(browser: Browser, inspected) -> Iterator[tuple[BrowserContext, list[str]]]:
    """A browser context in which every request not to the inspector is aborted, and recorded
    (``inspected``, each module's own fixture, gives the inspector's base URL first)."""
    base = inspected[0]
    blocked: list[str] = []
    context = browser.new_context()

    def route(route) -> None:
        if route.request.url.startswith(base + "/") or route.request.url == base:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    yield context, blocked
    context.close()
