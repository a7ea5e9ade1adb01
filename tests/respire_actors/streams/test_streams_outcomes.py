"""What a stream handler's outcome does: ACK, DeadLetter, NACK and failures, delivery limits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest
from streams_helpers import (
    FAST,
    add,
    deliver_by_hand,
    entries,
    fast_options,
    pending_idle,
    pending_rows,
    running,
    stats,
    wait_until,
    wait_until_async,
)

from respire_actors.errors import ConfigurationError
from respire_actors.jobs.model import ACK, NACK, DeadLetter
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamEntry, StreamWorker

pytestmark = pytest.mark.anyio


async def xlen(client: RedisClient, key: str) -> int:
    return int(await client.execute("XLEN", key))


async def test_ack_acknowledges_and_keeps_the_entry(client: RedisClient, unique_name: str) -> None:
    stream = unique_name
    entry = await add(client, stream, order="1")

    async def handler(e: StreamEntry) -> Any:
        return ACK

    async with running(client, stream, handler) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
        assert await pending_rows(client, stream, "respire") == []
    assert [i for i, _ in await entries(client, stream)] == [entry]
    assert stats(worker, stream).dead_lettered == 0


async def test_returning_none_acknowledges(client: RedisClient, unique_name: str) -> None:
    stream = unique_name
    await add(client, stream)

    async def handler(e: StreamEntry) -> None:
        return None

    async with running(client, stream, handler) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
    assert await pending_rows(client, stream, "respire") == []


async def test_delete_acknowledged_also_deletes_the_entry(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add(client, stream, n="1")
    await add(client, stream, n="2")

    async def handler(e: StreamEntry) -> Any:
        return ACK

    options = fast_options(delete_acknowledged=True)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 2)
        assert await pending_rows(client, stream, "respire") == []
    assert await xlen(client, stream) == 0


def dead_fields(fields: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in fields.items() if k != "_respire.consumer"}


@pytest.mark.parametrize("explicit", [False, True], ids=["default-dead", "explicit-dead"])
async def test_dead_letter_copies_the_entry_with_its_reason(
    client: RedisClient, unique_name: str, explicit: bool
) -> None:
    stream = f"{{{unique_name}}}:s"  # an explicit dead-letter stream must share its slot
    dead = f"{{{unique_name}}}:rejected" if explicit else f"{stream}:dead"
    entry = await add(client, stream, order="42", amount="7")

    async def handler(e: StreamEntry) -> Any:
        return DeadLetter(detail="bad-amount")

    options = fast_options(dead_letter_stream=dead if explicit else None)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered == 1)
        consumer = worker.consumer_name(stream)
    assert await pending_rows(client, stream, "respire") == []
    assert [i for i, _ in await entries(client, stream)] == [entry]  # kept: delete is opt-in
    ((_, fields),) = await entries(client, dead)
    assert fields == {
        "order": b"42",
        "amount": b"7",
        "_respire.source_id": entry.encode(),
        "_respire.attempt": b"1",
        "_respire.reason": b"explicit",
        "_respire.consumer": consumer.encode(),
    }
    if explicit:
        assert await xlen(client, f"{stream}:dead") == 0
    assert stats(worker, stream).acked == 0


async def test_delete_acknowledged_is_refused_on_a_stream_another_group_reads(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: the XDEL after each ack removed entries another group ("audit") had
    not read yet. A worker with delete_acknowledged now refuses to start on such a stream."""
    stream = unique_name
    await client.execute("XGROUP", "CREATE", stream, "audit", "0", "MKSTREAM")
    for i in range(3):
        await add(client, stream, n=str(i))
    handled: list[str] = []

    async def handler(e: StreamEntry) -> Any:
        handled.append(e.id)
        return ACK

    worker = StreamWorker()
    worker.register(stream, handler, fast_options(delete_acknowledged=True))
    with anyio.fail_after(15), pytest.raises(Exception) as caught:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
    errors = [caught.value]
    while isinstance(errors[0], BaseExceptionGroup):
        errors = list(errors[0].exceptions)
    assert isinstance(errors[0], ConfigurationError) and "'audit'" in str(errors[0])
    assert handled == [] and await xlen(client, stream) == 3


async def test_dead_letter_default_reason_and_delete_acknowledged(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    entry = await add(client, stream, a="1")

    async def handler(e: StreamEntry) -> Any:
        return DeadLetter()

    options = fast_options(delete_acknowledged=True)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered == 1)
    ((_, fields),) = await entries(client, f"{stream}:dead")
    assert dead_fields(fields) == {
        "a": b"1",
        "_respire.source_id": entry.encode(),
        "_respire.attempt": b"1",
        "_respire.reason": b"explicit",
    }
    assert await xlen(client, stream) == 0


@pytest.mark.parametrize("how", ["exception", "nack"])
async def test_failure_is_redelivered_then_dead_lettered_at_the_limit(
    client: RedisClient, unique_name: str, how: str
) -> None:
    stream = unique_name
    entry = await add(client, stream, job="j")
    attempts: list[int] = []

    async def handler(e: StreamEntry) -> Any:
        attempts.append(e.attempt)
        if how == "exception":
            raise RuntimeError("boom")
        return NACK

    options = fast_options(visibility_timeout=FAST, delivery_limit=3)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered == 1)
        s = stats(worker, stream)
        assert s.recovered == 2
        assert s.nacked == 3
        assert s.failed == (3 if how == "exception" else 0)
        assert s.dead_lettered_by_recovery == 0
    assert attempts == [1, 2, 3]
    assert await pending_rows(client, stream, "respire") == []
    ((_, fields),) = await entries(client, f"{stream}:dead")
    reason = b"processing-failed" if how == "exception" else b"nack"
    assert dead_fields(fields) == {
        "job": b"j",
        "_respire.source_id": entry.encode(),
        "_respire.attempt": b"3",
        "_respire.reason": reason,
    }


async def test_nack_without_a_limit_is_retried_until_acked(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add(client, stream)
    attempts: list[int] = []

    async def handler(e: StreamEntry) -> Any:
        attempts.append(e.attempt)
        return NACK if e.attempt < 3 else ACK

    options = fast_options(visibility_timeout=FAST, delivery_limit=None)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
    assert attempts == [1, 2, 3]
    assert await xlen(client, f"{stream}:dead") == 0


async def test_recovery_dead_letters_entries_past_the_limit(
    client: RedisClient, unique_name: str
) -> None:
    """An entry a crashed consumer held at the limit never reaches the handler again."""
    stream = unique_name
    await client.execute("XGROUP", "CREATE", stream, "respire", "0", "MKSTREAM")
    entry = await add(client, stream, k="v")
    assert await deliver_by_hand(client, stream, "respire", "crashed") == [entry]
    calls: list[StreamEntry] = []

    async def handler(e: StreamEntry) -> Any:
        calls.append(e)
        return ACK

    options = fast_options(visibility_timeout=FAST, delivery_limit=1)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered_by_recovery == 1)
        consumer = worker.consumer_name(stream)
    assert calls == []
    assert await pending_rows(client, stream, "respire") == []
    ((_, fields),) = await entries(client, f"{stream}:dead")
    assert fields == {
        "k": b"v",
        "_respire.source_id": entry.encode(),
        "_respire.attempt": b"1",
        "_respire.reason": b"delivery-limit",
        "_respire.consumer": consumer.encode(),
    }


async def test_recovery_deletes_what_it_dead_letters_with_delete_acknowledged(
    client: RedisClient, unique_name: str
) -> None:
    """With delete_acknowledged, an entry recovery dead-letters at the limit (a crashed
    consumer's) used to stay in the stream for good, acknowledged by every group: a poison
    entry or crash loop leaked one entry each."""
    stream = unique_name
    await client.execute("XGROUP", "CREATE", stream, "respire", "0", "MKSTREAM")
    entry = await add(client, stream, k="v")
    assert await deliver_by_hand(client, stream, "respire", "crashed") == [entry]

    async def handler(e: StreamEntry) -> Any:
        return ACK

    options = fast_options(visibility_timeout=FAST, delivery_limit=1, delete_acknowledged=True)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered_by_recovery == 1)
    assert await xlen(client, stream) == 0
    assert await xlen(client, f"{stream}:dead") == 1
    assert await pending_rows(client, stream, "respire") == []


async def test_recovery_off_leaves_a_crashed_consumers_entries_pending(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await client.execute("XGROUP", "CREATE", stream, "respire", "0", "MKSTREAM")
    crashed = await add(client, stream, n="crashed")
    assert await deliver_by_hand(client, stream, "respire", "crashed") == [crashed]

    async def idle_past_visibility() -> bool:
        return all(i > 100 for i in await pending_idle(client, stream, "respire"))

    await wait_until_async(idle_past_visibility)
    seen: list[tuple[str, int]] = []

    async def handler(e: StreamEntry) -> Any:
        seen.append((e.id, e.attempt))
        return ACK

    quick = fast_options(visibility_timeout=FAST / 3)
    async with running(client, stream, handler, replace(quick, recovery=False)) as worker:
        assert worker.snapshot() is not None
        fresh = await add(client, stream, n="fresh")
        await wait_until(lambda: stats(worker, stream).acked == 1)
        # many recovery intervals and blocking reads later, the crashed entry is still pending
        calls = stats(worker, stream).read_calls
        await wait_until(lambda: stats(worker, stream).read_calls >= calls + 3)
        assert stats(worker, stream).recovered == 0
    assert seen == [(fresh, 1)]
    assert await pending_rows(client, stream, "respire") == [(crashed, "crashed", 1)]

    async with running(client, stream, handler, quick) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
        assert stats(worker, stream).recovered == 1
    assert seen == [(fresh, 1), (crashed, 2)]
    assert await pending_rows(client, stream, "respire") == []
