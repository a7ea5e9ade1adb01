"""The dashboard in a real browser: headless Chromium (the system package) driven by
Playwright, against the dashboard served by Hypercorn on the test's own backend (trio and
asyncio) with a real worker, on both servers.

Each page renders and its screenshot is not blank; live counts and events move while the
worker runs (no reload); a dead letter retried from its page is completed by the worker with
its original id and payload; group and queue pause from the pages; token auth refuses a
missing or wrong token; CSRF refuses forged posts; read-only mode hides every action.
Screenshots go to the test's temp dir (and to $RESPIRE_DASHBOARD_SCREENSHOTS if set).
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from dashboard_helpers import CHROMIUM, browser, served, worker_running
from jobs_helpers import wait_until, wait_until_async
from playwright.sync_api import expect

from respire_actors.admin import QueueAdmin, register_queue
from respire_actors.codecs import StrCodec
from respire_actors.dashboard import DashboardConfig, TokenAuth
from respire_actors.jobs import DeadLetter, FlowNode, Job, JobEnqueueOptions, JobQueue, Outcome
from respire_actors.redis.client import RedisClient

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.xdist_group("browser"),  # one Chromium at a time under xdist
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="no system Chromium"),
]

TOKEN = "browser-token-0123456789"
LIVE = 0.2


async def test_pages_live_counts_and_dead_letter_retry(
    prefixed: RedisClient, unique_name: str, tmp_path: Path
) -> None:
    client, name = prefixed, unique_name
    queue = JobQueue(client, name, StrCodec())
    admin = QueueAdmin(client, name)
    release = anyio.Event()
    runs: list[tuple[str, str, int]] = []

    async def handler(job: Job[str]) -> Outcome | None:
        runs.append((job.id, job.payload, job.attempt))
        if job.flow_id is not None:
            return job.complete(f"{job.id}: 42 rows".encode())
        if job.id.startswith("hopeless-"):
            return DeadLetter(detail="always fails")
        if job.id == "poison" and sum(r[0] == "poison" for r in runs) == 1:
            return DeadLetter(detail="could not parse the address")
        if job.id.startswith("slow-"):
            await job.report_progress(50)
            await job.log(f"{job.id}: waiting for the test")
            await release.wait()
        return None

    await register_queue(client, name)
    await queue.enqueue_scheduled("later", "l", JobEnqueueOptions(delay=timedelta(hours=1)))
    await queue.enqueue_scheduled(
        "tenant-job", "t", JobEnqueueOptions(delay=timedelta(hours=1), group="tenant-a")
    )
    config = DashboardConfig(live_interval=LIVE)
    async with (
        worker_running(client, name, handler) as _,
        served(client, config) as url,
        browser(tmp_path) as b,
    ):
        await queue.enqueue("poison", '{"to": "nobody@"}')
        report = FlowNode(
            "combine", "build", [FlowNode("region-a", "fetch"), FlowNode("region-b", "fetch")]
        )
        await queue.enqueue_flow("report-1", report)
        nightly = await queue.create_batch(batch_id="nightly")
        await queue.add_to_batch(nightly, "nightly-1", "n")
        await queue.seal_batch(nightly)
        for i in range(3):
            await queue.enqueue(f"done-{i}", f"body-{i}")
        await wait_until_async(lambda: _dead_letters(admin, 1))
        await wait_until(lambda: sum(r[0].startswith("done-") for r in runs) == 3)
        await wait_until(lambda: any(r[0] == "combine" for r in runs))

        def overview(page: Any) -> None:
            response = page.goto(url + "/")
            assert response.status == 200
            row = page.locator(f'tr[data-queue="{name}"]')
            assert row.count() == 1
            assert row.locator('[data-field="dead"]').inner_text() == "1"
            assert row.locator("svg.chart rect.completed").count() >= 1  # metrics chart
            page.wait_for_selector('html[data-live-connected="yes"]')
            b.screenshot("overview")

        await b.run(overview, b.page)
        await queue.pause()

        def overview_follows_pause(page: Any) -> None:
            # the overview's cells follow the queue without a reload
            expect(page.locator(f'tr[data-queue="{name}"] [data-field="paused"]')).to_have_text(
                "paused"
            )

        await b.run(overview_follows_pause, b.page)
        await queue.resume()

        def open_queue(page: Any) -> None:
            page.goto(url + f"/queue?queue={name}")
            page.wait_for_selector('html[data-live-connected="yes"]')
            assert page.locator('#counts [data-field="pending"]').inner_text() == "0"
            assert page.locator("#scheduled").inner_text().count("later") == 1

        await b.run(open_queue, b.page)
        for i in range(3):
            await queue.enqueue(f"slow-{i}", f"slow body {i}")

        def sees_pending_live(page: Any) -> None:
            expect(page.locator('#counts [data-field="pending"]')).to_have_text("3")
            page.wait_for_selector("#events tbody tr:has-text('progress')")
            b.screenshot("queue-live")  # counts and events as they arrived, no reload
            page.reload()  # the pending table is rendered by the server
            b.screenshot("queue")
            page.locator("#pending a").first.click()
            page.wait_for_selector("#envelope")
            text = page.locator("main").inner_text()
            assert "slow-" in text and "waiting for the test" in text
            assert "hidden (11 bytes)" in text  # payloads are not shown by default
            b.screenshot("job")
            page.go_back()
            page.wait_for_selector('html[data-live-connected="yes"]')

        try:
            await b.run(sees_pending_live, b.page)
        finally:
            release.set()

        def sees_completion_live(page: Any) -> None:
            expect(page.locator('#counts [data-field="pending"]')).to_have_text("0")
            page.wait_for_selector("#events tbody tr:has-text('completed')")

        await b.run(sees_completion_live, b.page)

        def retry_dead_letter(page: Any) -> None:
            page.goto(url + f"/dead?queue={name}")
            row = page.locator("#dead tbody tr")
            assert row.count() == 1
            assert "could not parse the address" in row.inner_text()
            b.screenshot("dead-letters")
            row.locator("button.retry-one").click()
            page.wait_for_selector(".notice")
            assert page.locator(".notice").inner_text() == "retried 1 of 1"

        await b.run(retry_dead_letter, b.page)
        await wait_until(lambda: sum(r[0] == "poison" for r in runs) == 2)
        second = [r for r in runs if r[0] == "poison"][1]
        assert second[1] == '{"to": "nobody@"}'  # the original payload, as a new delivery
        await wait_until_async(lambda: _dead_letters(admin, 0))
        for i in range(3):
            await queue.enqueue(f"hopeless-{i}", "h")
        await wait_until_async(lambda: _dead_letters(admin, 3))

        def select_and_act(page: Any) -> None:
            page.goto(url + f"/dead?queue={name}")
            rows = page.locator("#dead tbody tr")
            assert rows.count() == 3
            rows.nth(0).locator("input[type=checkbox]").check()
            rows.nth(1).locator("input[type=checkbox]").check()
            page.click("#delete-selected")
            assert page.locator(".notice").inner_text() == "deleted 2 of 2"
            rows = page.locator("#dead tbody tr")
            assert rows.count() == 1
            rows.nth(0).locator("input[type=checkbox]").check()
            page.click("#retry-selected")
            assert page.locator(".notice").inner_text() == "retried 1 of 1"

        await b.run(select_and_act, b.page)
        # the retried one fails again (a new dead letter): retried, not just deleted
        await wait_until(lambda: sum(r[0].startswith("hopeless-") for r in runs) == 4)
        await wait_until_async(lambda: _dead_letters(admin, 1))

        def groups_and_pause(page: Any) -> None:
            page.goto(url + f"/groups?queue={name}")
            group = page.locator('tr[data-group="tenant-a"]')
            assert group.count() == 1
            b.screenshot("groups")
            group.locator("button").click()
            page.wait_for_selector('tr[data-group="tenant-a"] td.paused')
            page.goto(url + f"/batches?queue={name}&kind=flow&id=report-1")
            tree = page.locator("#status-tree")
            assert tree.locator("li").count() == 3
            assert tree.locator('li[data-node="combine"] li[data-node="region-a"]').count() == 1
            assert tree.locator(".status.completed").count() == 3
            assert "42 rows" not in tree.inner_text()  # results are hidden like payloads
            b.screenshot("flows")
            page.goto(url + f"/batches?queue={name}&kind=batch&id=nightly")
            assert "succeeded" in page.locator("#status-tree").inner_text()
            b.screenshot("batches")
            page.goto(url + f"/queue?queue={name}")
            page.locator("button.pause").click()
            page.wait_for_selector("button.resume")

        await b.run(groups_and_pause, b.page)
        assert (await queue.get_group("tenant-a")).paused
        assert (await queue.get_state()).paused
        await queue.resume()


async def _dead_letters(admin: QueueAdmin, n: int) -> bool:
    return (await admin.summary()).dead_letters == n


async def test_token_auth_csrf_and_read_only(
    client: RedisClient, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    queue = JobQueue(client, name, StrCodec())
    config = DashboardConfig(auth=TokenAuth(TOKEN), queues=(name,), live_interval=LIVE)
    async with served(client, config) as url, browser(tmp_path) as b:

        def log_in(page: Any) -> None:
            response = page.goto(url + f"/queue?queue={name}")
            assert response.status == 401
            assert page.locator('input[name="token"]').count() == 1
            b.screenshot("login")
            page.fill('input[name="token"]', "not-the-token-at-all")
            page.click("form.login button")
            page.wait_for_selector("#login-failed")
            page.fill('input[name="token"]', TOKEN)
            page.click("form.login button")
            page.wait_for_selector("#counts")  # back on the page first asked for
            assert f"/queue?queue={name}" in page.url

        await b.run(log_in, b.page)

        def forged_posts(page: Any) -> list[int]:
            statuses = []
            # the browser's own cookies (session and CSRF nonce), but no or a wrong token
            for form in ({"queue": name}, {"queue": name, "csrf": "0" * 64}):
                statuses.append(page.request.post(url + "/queue/pause", form=form).status)
            # a form on another site (localhost is not 127.0.0.1) that posts to the dashboard
            page.goto(url.replace("127.0.0.1", "localhost") + "/static/dashboard.css")
            page.set_content(
                f'<form method="post" action="{url}/queue/pause">'
                f'<input name="queue" value="{name}"><button>go</button></form>'
            )
            with page.expect_response(lambda r: "/queue/pause" in r.url) as info:
                page.click("button")
            statuses.append(info.value.status)
            return statuses

        statuses = await b.run(forged_posts, b.page)

        def blank_is_detected(page: Any) -> None:
            page.set_content("<html><body style='background:#fff'></body></html>")
            with pytest.raises(AssertionError, match="blank"):
                b.screenshot("blank")

        await b.run(blank_is_detected, b.page)
        # no token: 403; cross-site: the SameSite cookies stay home, so not even logged in
        assert statuses[:2] == [403, 403] and statuses[2] in (401, 403)
        assert not (await queue.get_state()).paused

    async with served(client, DashboardConfig(read_only=True, live_interval=LIVE)) as url:
        (tmp_path / "read-only").mkdir()
        async with browser(tmp_path / "read-only") as b:

            def read_only(page: Any) -> None:
                page.goto(url + f"/queue?queue={name}")
                assert page.locator("form[method=post]").count() == 0
                assert page.locator(".badge").inner_text() == "read-only"
                b.screenshot("read-only")
                status = page.request.post(url + "/queue/pause", form={"queue": name}).status
                assert status == 403

            await b.run(read_only, b.page)
        assert not (await queue.get_state()).paused
