"""The operator API and the retention keeper under the documented ACL rules: an operator user
runs every admin call and a worker user's keeper registers and trims, with nothing in the ACL
log; an operator without XTRIM is refused a trim before anything is removed."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from helpers.acl import acl_denials, acl_user
from helpers.waiting import wait_until_async

from respire_actors.acl import acl_rules
from respire_actors.admin import QueueAdmin, list_queues, register_queue, unregister_queue
from respire_actors.codecs import StrCodec
from respire_actors.errors import PermissionDenied
from respire_actors.jobs import (
    DeadLetter,
    Job,
    JobEnqueueOptions,
    JobQueue,
    Outcome,
    Retention,
    Worker,
    WorkerOptions,
)
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio


async def test_a_worker_user_keeper_registers_and_trims(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.enqueue_many([(f"j{i}", "x") for i in range(5)])

    async def handler(job: Job[str]) -> Outcome:
        return DeadLetter() if job.id == "j0" else None

    retention = Retention(max_age=timedelta(milliseconds=200), interval=timedelta(milliseconds=50))
    user = f"worker-{unique_name}"
    async with acl_user(client, server_url, user, acl_rules("worker", (unique_name,))) as w:
        worker = Worker()
        worker.register(queue.name, handler, StrCodec(), WorkerOptions(retention=retention))
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, w)

            async def trimmed() -> bool:
                stats = worker.keeper_statistics(queue.name)
                return stats.removed.get("ready", 0) == 5 and stats.removed.get("dead", 0) == 1

            await wait_until_async(trimmed, timeout=15)
            await worker.stop()
        assert worker.keeper_statistics(queue.name).failed_passes == 0
        assert unique_name in await list_queues(client)
        assert await acl_denials(client, user) == []


async def test_an_operator_user_runs_the_admin_api(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await client.execute("XGROUP", "CREATE", queue.keys.ready, "respire", "0", "MKSTREAM")
    entry = (await queue.enqueue("a", "x")).entry_id
    await client.execute(
        "XREADGROUP", "GROUP", "respire", "c", "COUNT", 1, "STREAMS", queue.keys.ready, ">"
    )
    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=timedelta(hours=1)))
    admin_key = QueueAdmin(client, unique_name).dead_key
    for i in range(3):
        await client.execute(
            "XADD", admin_key, "*", "_respire.job.id", f"d{i}", "_respire.job.payload", "p",
            "_respire.reason", "nack",
        )  # fmt: skip
    await client.execute("XADD", queue.keys.events, "*", "kind", "progress", "job_id", "a")
    user = f"operator-{unique_name}"
    async with acl_user(client, server_url, user, acl_rules("operator", (unique_name,))) as op:
        admin = QueueAdmin(op, unique_name)
        assert await register_queue(op, unique_name)
        assert unique_name in await list_queues(op)
        summary = await admin.summary()
        assert (summary.ready, summary.pending, summary.scheduled) == (1, 1, 1)
        assert (await admin.pending()).rows[0].entry_id == entry
        assert (await admin.scheduled()).rows[0].job_id == "later"
        assert len((await admin.events()).rows) == 1
        detail = await admin.job(entry)
        assert detail is not None and detail.pending is not None
        page = await admin.dead_letters()
        assert await admin.retry_dead_letters([page.rows[0].dead_id]) == 1
        assert await admin.delete_dead_letters([page.rows[2].dead_id]) == 1
        assert [p.retried async for p in admin.retry_all(reason="nack")] == [1]
        plan = await admin.trim_plan("events", max_length=0)
        assert (await admin.trim(plan)).removed == 1
        await admin.pause()
        await admin.resume()
        # events --follow: a blocking XREAD on a connection of its own
        async with JobQueue(op, unique_name, StrCodec()).read_events() as reader:
            with anyio.fail_after(5):
                assert (await reader.__anext__()).kind == "paused"
        assert await unregister_queue(op, unique_name)
        assert await acl_denials(client, user) == []


async def test_an_operator_without_xtrim_is_refused_before_removing(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await client.execute("XADD", queue.keys.events, "*", "kind", "progress")
    user = f"operator-{unique_name}"
    rules = [*acl_rules("operator", (unique_name,)), "-xtrim"]
    async with acl_user(client, server_url, user, rules) as op:
        admin = QueueAdmin(op, unique_name)
        plan = await admin.trim_plan("events", max_length=0)
        with pytest.raises(PermissionDenied) as caught:
            await admin.trim(plan)
    assert caught.value.command == "xtrim"
    assert await client.execute("XLEN", queue.keys.events) == 1


async def test_an_operator_without_ping_gets_past_the_loading_wait(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Found by review: `python -m respire_actors dashboard` with the documented operator
    user stopped at start-up with NOPERM on PING (the wait for a restarted server to load);
    a user without PING now skips that wait."""
    from respire_actors.startup import wait_until_loaded

    user = f"operator-{unique_name}"
    async with acl_user(client, server_url, user, acl_rules("operator", (unique_name,))) as op:
        with anyio.fail_after(10):
            await wait_until_loaded(op)
        admin = QueueAdmin(op, unique_name)
        assert (await admin.summary()).name == unique_name


async def test_an_operator_scoped_to_one_queue_still_lists_and_shows_it(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Found by review: the registry lists every queue, and one queue the operator's key
    patterns do not cover failed the whole `queues` command (NOPERM naming nothing) and made
    the dashboard overview a 500. The readable queues are listed; the others are named as
    not readable."""
    import subprocess
    import sys
    from urllib.parse import quote

    from helpers.cli import ROOT, cli_env

    prefix = f"{unique_name}:"
    mine, other = "mine", "other"
    async with connect(server_url, key_prefix=prefix) as prefixed:
        await register_queue(prefixed, mine)
        await register_queue(prefixed, other)
        await JobQueue(prefixed, mine, StrCodec()).enqueue("j1", "x")
    user = f"operator-{unique_name}"
    rules = acl_rules("operator", (mine,), key_prefix=prefix)
    await client.execute("ACL", "SETUSER", user, "reset", "on", ">pw", *rules, "+ping")
    try:
        host = server_url.split("://", 1)[1]
        url = f"redis://{user}:pw@{host}?key_prefix={quote(prefix)}"
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "respire_actors", "queues", "--redis-url", url],
                cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60,
            )
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert mine in done.stdout and other not in done.stdout
        assert f"queue '{other}' is not readable by this Redis user" in done.stderr

        import httpx

        from respire_actors.dashboard import Dashboard, DashboardConfig

        async with connect(url) as op:
            app = Dashboard(DashboardConfig(queues=(mine, other)), client=op)
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
                page = await web.get("/")
        assert page.status_code == 200, page.text
        assert 'data-queue="other" class="denied"' in page.text
        assert f'href="/queue?queue={mine}"' in page.text or mine in page.text
    finally:
        await client.execute("ACL", "DELUSER", user)
