"""Headless Chromium for the browser tests: Debian's `/usr/bin/chromium` (installed by
`scripts/install-chromium.sh`, which `make test` runs) driven by Playwright. A missing browser is
an error, never a skip: CI installs it, so its absence is a broken set-up."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, Page, sync_playwright

# Chromium on a machine with no network but loopback: no background fetches, no GPU, no sandbox
# (CI runs as root).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError(
            "chromium is not installed: run `bash scripts/install-chromium.sh` (make test does)"
        )
    return path


@contextmanager
def browser() -> Iterator[Browser]:
    """One headless Chromium, closed when the block ends (Playwright gives each launch a fresh
    temporary profile of its own and removes it)."""
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), args=FLAGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def page() -> Iterator[Page]:
    """A page in a fresh browser; every wait on it is bounded (30 s)."""
    with browser() as b:
        p = b.new_page(viewport={"width": 1400, "height": 900})
        p.set_default_timeout(30_000)
        yield p
