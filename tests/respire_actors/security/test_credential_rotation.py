"""Rotating an ACL user's password under a running worker: its connections are killed and come
back with the new password from ``credential_provider``; every job completes exactly once."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import anyio
import pytest
from helpers.acl import acl_denials
from helpers.waiting import wait_until

from respire_actors.acl import acl_rules
from respire_actors.codecs import StrCodec
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, Worker, WorkerOptions
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio

PER_PHASE = 15


def _options() -> WorkerOptions:
    return WorkerOptions(
        consumer_count=4,
        visibility_timeout=timedelta(seconds=30),
        recovery_interval=timedelta(milliseconds=50),
        poll_interval=timedelta(milliseconds=100),
        shutdown_grace=timedelta(seconds=5),
    )


@pytest.mark.parametrize("window", [False, True], ids=["overlapping", "refused-meanwhile"])
async def test_a_worker_survives_a_password_rotation(
    client: RedisClient, server_url: str, unique_name: str, window: bool
) -> None:
    """``overlapping``: the documented procedure (add the new password, switch the provider,
    reconnect, remove the old one). ``refused-meanwhile``: the server switches first, so every
    reconnect is refused until the provider catches up; the worker waits and goes on."""
    user = f"worker-{unique_name}"
    old, new = f"old-{unique_name}", f"new-{unique_name}"
    await client.execute(
        "ACL", "SETUSER", user, "reset", "on", f">{old}", *acl_rules("worker", (unique_name,))
    )
    current = {"password": old}
    calls = 0

    def provider() -> tuple[str, str]:
        nonlocal calls
        calls += 1
        return user, current["password"]

    queue = JobQueue(client, unique_name, StrCodec())
    handled: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        handled[job.id] += 1
        return ACK

    async def enqueue(phase: str) -> None:
        await queue.enqueue_many([(f"{phase}-{i}", "x") for i in range(PER_PHASE)])

    def all_handled(count: int) -> bool:
        return sum(handled.values()) >= count

    try:
        async with connect(server_url, credential_provider=provider) as worker_client:
            worker = Worker()
            worker.register(unique_name, handler, StrCodec(), _options())
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run, worker_client)
                await enqueue("before")
                await wait_until(lambda: all_handled(PER_PHASE), timeout=10)
                opened = worker_client.statistics().connections_opened
                asked = calls
                if window:
                    await client.execute("ACL", "SETUSER", user, "resetpass", f">{new}")
                    await client.execute("CLIENT", "KILL", "USER", user)
                    await enqueue("during")
                    await anyio.sleep(0.5)  # reconnects are refused meanwhile
                    refused = [d for d in await acl_denials(client, user) if d[0] == "auth"]
                    assert refused, "no reconnect was refused: the window was not exercised"
                    current["password"] = new
                else:
                    await client.execute("ACL", "SETUSER", user, f">{new}")
                    current["password"] = new
                    await client.execute("CLIENT", "KILL", "USER", user)
                    await enqueue("during")
                    await wait_until(lambda: all_handled(2 * PER_PHASE), timeout=10)
                    await client.execute("ACL", "SETUSER", user, f"<{old}")
                    await client.execute("CLIENT", "KILL", "USER", user)
                await enqueue("after")
                await wait_until(lambda: all_handled(3 * PER_PHASE), timeout=15)
                assert worker_client.statistics().connections_opened > opened
                assert calls > asked
                with anyio.fail_after(15):
                    await worker.stop()
    finally:
        await client.execute("ACL", "DELUSER", user)
    expected = {f"{p}-{i}" for p in ("before", "during", "after") for i in range(PER_PHASE)}
    assert set(handled) == expected  # nothing lost...
    assert max(handled.values()) == 1  # ...and nothing run twice (no lease was lost)
    pending = await client.execute("XPENDING", queue.keys.ready, "respire")
    assert int(pending[0]) == 0
