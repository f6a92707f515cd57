"""Fixtures of the e2e tier.

Why: dash's ``dash_br`` starts a Chromium for every test (~2 s of CPU each on this 2-core
machine, ~35 browser tests). Here one browser serves every test of a module; each test gets
it on a blank page, at the window size it started with, with the console log drained (a
console error belongs to the test that caused it). The dashboard keeps no browser storage,
so nothing else carries over between tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def _module_browser(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[Any, dict]]:
    from dash.testing.browser import Browser

    opt = request.config.getoption
    with Browser(browser=opt("webdriver"), remote=opt("remote"), remote_url=opt("remote_url"),
                 headless=opt("headless"), options=request.config.hook.pytest_setup_options(),
                 download_path=str(tmp_path_factory.mktemp("download")),
                 percy_assets_root=opt("percy_assets"), percy_finalize=opt("nopercyfinalize"),
                 pause=opt("pause")) as browser:
        yield browser, browser.driver.get_window_size()


@pytest.fixture
def dash_br(_module_browser: tuple[Any, dict]) -> Any:
    """dash's browser fixture, shared by the module's tests (see the module docstring)."""
    browser, size = _module_browser
    browser.driver.get("about:blank")
    browser.driver.set_window_size(size["width"], size["height"])
    browser.get_logs()
    return browser
