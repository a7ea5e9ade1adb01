"""Helpers for the dashboard tests: the dashboard served by Hypercorn in the test's own event
loop (trio or asyncio), a worker, an HTTP client on the ASGI app, a real Chromium driven by
Playwright on a dedicated thread, and a check that a screenshot is not blank."""

from __future__ import annotations

import os
import re
import shutil
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
from jobs_helpers import fast_options

from respire_actors.codecs import StrCodec
from respire_actors.dashboard import Dashboard, DashboardConfig, serve_dashboard
from respire_actors.jobs import QueueOptions, Worker
from respire_actors.redis.client import RedisClient

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS_ENV = "RESPIRE_DASHBOARD_SCREENSHOTS"
"""A directory to copy the screenshots to as well (docs/img when refreshing the docs)."""

R = TypeVar("R")


@asynccontextmanager
async def served(client: RedisClient, config: DashboardConfig) -> AsyncIterator[str]:
    """Serve a dashboard on a free loopback port for the block; yields its base URL."""
    async with anyio.create_task_group() as tg:
        bound = await tg.start(
            lambda **kw: serve_dashboard(Dashboard(config, client=client), port=0, **kw)
        )
        try:
            yield bound.url.rstrip("/")
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def worker_running(
    client: RedisClient, queue: str, handler: Any, *, metrics: bool = True
) -> AsyncIterator[Worker]:
    """A worker for ``queue`` (str payloads) with scheduling and, by default, metrics on."""
    worker = Worker()
    worker.register(
        queue,
        handler,
        StrCodec(),
        fast_options(consumer_count=4),
        queue_options=QueueOptions(metrics_retention_minutes=60 if metrics else 0),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


def http(
    client: RedisClient, config: DashboardConfig, *, host: str = "127.0.0.1"
) -> httpx.AsyncClient:
    """An HTTP client on the ASGI app itself, as if connecting from ``host``."""
    transport = httpx.ASGITransport(app=Dashboard(config, client=client), client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


class BrowserThread:
    """Chromium through Playwright's sync API on one dedicated thread.

    Playwright runs on asyncio only and its objects belong to the thread that made them, so the
    browser lives on its own thread whichever async library runs the test (and the server).
    """

    def __init__(self, screenshots: Path) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chromium")
        self.screenshots = screenshots
        self.page: Any = None
        self._playwright: Any = None
        self._browser: Any = None

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        future = self._pool.submit(fn, *args)
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)

    def _start(self) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        self.page = self._browser.new_page(viewport={"width": 1280, "height": 800})
        self.page.set_default_timeout(15_000)

    def _stop(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()

    def screenshot(self, name: str) -> Path:
        """Save the page as ``<name>.png`` (also under $RESPIRE_DASHBOARD_SCREENSHOTS) and
        check it is not blank."""
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert not png_is_blank(path), f"screenshot {name} is blank"
        copy_to = os.environ.get(SCREENSHOTS_ENV)
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_to) / path.name)
        return path


@asynccontextmanager
async def browser(screenshots: Path) -> AsyncIterator[BrowserThread]:
    thread = BrowserThread(screenshots)
    try:
        await thread.run(thread._start)
        yield thread
    finally:
        with anyio.CancelScope(shield=True):
            await thread.run(thread._stop)
        thread._pool.shutdown(wait=False)


def png_is_blank(path: Path) -> bool:
    """True for a PNG whose pixels are (nearly) all one colour: its filtered scanlines then
    hold almost no distinct byte values. Reads the format with the standard library only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    pixels = zlib.decompress(idat)
    return len(set(pixels)) < 16 or len(pixels) < 10_000
