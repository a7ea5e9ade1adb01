"""Stream workers renew their leases too (on by default): a long handler keeps its entry with
no recovery, a handler whose entry another consumer took is cancelled, the execution budget
cancels a handler and the nack policy applies, and renewal off keeps the fixed lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from streams_helpers import (
    add,
    child_state,
    fast_options,
    pending_idle,
    pending_rows,
    running,
    stats,
    wait_until,
)

from respire_actors.errors import ValidationError
from respire_actors.jobs.model import ACK
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamEntry, StreamWorkerOptions

pytestmark = pytest.mark.anyio

LEASE = timedelta(milliseconds=300)


async def test_a_long_handler_keeps_its_entry_and_completes_once(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    entry = await add(client, stream)
    calls: list[tuple[str, int]] = []

    async def handler(e: StreamEntry) -> Any:
        calls.append((e.id, e.attempt))
        for _ in range(15):  # five visibility timeouts
            await anyio.sleep(LEASE.total_seconds() / 3)
        return ACK

    opts = fast_options(concurrency=1, visibility_timeout=LEASE)
    async with running(client, stream, handler, opts) as worker:
        assert child_state(worker, "renewer") == "running"
        await wait_until(lambda: stats(worker, stream).started == 1)
        for _ in range(4):  # while it runs, its entry never idles for a visibility timeout
            await anyio.sleep(LEASE.total_seconds())
            if stats(worker, stream).acked:
                break
            assert max(await pending_idle(client, stream, "respire")) < LEASE.total_seconds() * 1000
        await wait_until(lambda: stats(worker, stream).acked == 1, timeout=30)
        s = stats(worker, stream)
        assert s.recovered == s.leases_lost == 0 and s.leases_renewed >= 5
    assert calls == [(entry, 1)]
    assert await pending_rows(client, stream, "respire") == []


async def test_a_handler_whose_entry_was_taken_is_cancelled(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    entry = await add(client, stream)
    started = anyio.Event()
    cancelled: list[str] = []

    async def handler(e: StreamEntry) -> Any:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(e.id)
            raise

    async with running(client, stream, handler, fast_options(visibility_timeout=LEASE)) as worker:
        with anyio.fail_after(10):
            await started.wait()
        await client.execute("XCLAIM", stream, "respire", "thief", 0, entry)
        await wait_until(lambda: stats(worker, stream).leases_lost == 1)
        await wait_until(lambda: cancelled == [entry])
        assert stats(worker, stream).acked == stats(worker, stream).leases_expired == 0
    assert await pending_rows(client, stream, "respire") == [(entry, "thief", 2)]


async def test_the_budget_cancels_a_stream_handler_and_dead_letters_at_the_limit(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    entry = await add(client, stream)
    attempts: list[int] = []

    async def handler(e: StreamEntry) -> Any:
        attempts.append(e.attempt)
        await anyio.sleep_forever()

    opts = fast_options(concurrency=1, visibility_timeout=LEASE, timeout=0.2, delivery_limit=2)
    async with running(client, stream, handler, opts) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered == 1, timeout=20)
        s = stats(worker, stream)
        assert s.timed_out == 2 and s.leases_lost == 0
    assert attempts == [1, 2]
    (letter,) = await client.execute("XRANGE", f"{stream}:dead", "-", "+")
    fields = dict(zip(letter[1][0::2], letter[1][1::2], strict=True))
    assert fields[b"_respire.source_id"] == entry.encode()
    assert fields[b"_respire.reason"] == b"processing-failed"
    assert await pending_rows(client, stream, "respire") == []


async def test_renewal_off_keeps_the_fixed_lease_and_runs_no_renewer(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add(client, stream)

    async def handler(e: StreamEntry) -> Any:
        if e.attempt == 1:
            await anyio.sleep_forever()
        return ACK

    opts = fast_options(concurrency=1, visibility_timeout=LEASE, renew_leases=False)
    async with running(client, stream, handler, opts) as worker:
        assert child_state(worker, "renewer") is None
        await wait_until(lambda: stats(worker, stream).acked == 1)
        s = stats(worker, stream)
        assert s.leases_lost == 1 and s.recovered == 1 and s.renewal_passes == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"renew_leases": "yes"}, "renew_leases must be a bool"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"timeout": -1}, "timeout must be positive"),
        ({"timeout": float("nan")}, "timeout must be finite"),
        ({"timeout": "5"}, "timeout must be a timedelta"),
        ({"timeout": 10**400}, "timeout must be at most"),
        ({"renew_leases": False, "timeout": 3.0, "visibility_timeout": 2.0}, "exceeds"),
    ],
)
def test_stream_options_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        StreamWorkerOptions(**changes)
