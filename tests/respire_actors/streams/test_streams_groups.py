"""Consumer groups of a stream worker: start IDs, reuse of an existing group, custom groups."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest
from helpers.running import run_catching
from streams_helpers import (
    add,
    add_many,
    fast_options,
    groups,
    ordered,
    pairs,
    pending_rows,
    running,
    stats,
    text,
    wait_until,
    wait_until_async,
)

from respire_actors.errors import ConsumerGroupMissing
from respire_actors.jobs.model import ACK, Ack
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamEntry, StreamHandler, StreamWorker

pytestmark = pytest.mark.anyio


def recorder() -> tuple[list[StreamEntry], StreamHandler]:
    seen: list[StreamEntry] = []

    async def handler(entry: StreamEntry) -> Ack:
        seen.append(entry)
        return ACK

    return seen, handler


async def test_start_id_dollar_skips_entries_added_before_the_group(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add_many(client, stream, 2)
    seen, handler = recorder()
    async with running(client, stream, handler, fast_options(start_id="$")) as worker:
        later = await add(client, stream, n="later")
        await wait_until(lambda: stats(worker, stream).acked == 1)
        # every reader turn after the ack saw nothing more to admit
        calls = stats(worker, stream).read_calls
        await wait_until(lambda: stats(worker, stream).read_calls >= calls + 2)
    assert [(e.id, e.fields) for e in seen] == [(later, {b"n": b"later"})]
    assert stats(worker, stream).admitted == 1
    info = (await groups(client, stream))["respire"]
    assert text(info["last-delivered-id"]) == later
    assert await pending_rows(client, stream, "respire") == []


@pytest.mark.parametrize("start_id", ["0-0", "0"])
async def test_start_id_zero_processes_entries_added_before_the_group(
    client: RedisClient, unique_name: str, start_id: str
) -> None:
    stream = unique_name
    before = await add_many(client, stream, 3)
    seen, handler = recorder()
    async with running(client, stream, handler, fast_options(start_id=start_id)) as worker:
        later = await add(client, stream, n="later")
        await wait_until(lambda: stats(worker, stream).acked == 4)
    assert ordered(e.id for e in seen) == [*before, later]
    assert [e.attempt for e in seen] == [1, 1, 1, 1]
    assert {e.id: e.fields for e in seen}[before[0]] == {b"n": b"0"}
    assert all(e.stream == stream for e in seen)
    assert await pending_rows(client, stream, "respire") == []


async def test_explicit_start_id_processes_only_later_entries(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    first, second, third = await add_many(client, stream, 3)
    seen, handler = recorder()
    async with running(client, stream, handler, fast_options(start_id=first)) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 2)
        later = await add(client, stream, n="later")
        await wait_until(lambda: stats(worker, stream).acked == 3)
    assert ordered(e.id for e in seen) == [second, third, later]
    assert stats(worker, stream).admitted == 3


async def test_existing_group_is_reused_at_its_position(
    client: RedisClient, unique_name: str
) -> None:
    """BUSYGROUP is success, and the group's position wins over ``start_id``."""
    stream = unique_name
    await add_many(client, stream, 2)
    await client.execute("XGROUP", "CREATE", stream, "billing", "$")
    after = await add(client, stream, n="after")
    seen, handler = recorder()
    options = fast_options(group="billing", start_id="0-0")
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
        calls = stats(worker, stream).read_calls
        await wait_until(lambda: stats(worker, stream).read_calls >= calls + 2)
    assert ordered(e.id for e in seen) == [after]
    assert list(await groups(client, stream)) == ["billing"]


async def test_existing_group_position_is_kept_across_worker_runs(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    seen, handler = recorder()
    first = await add(client, stream, n="1")
    async with running(client, stream, handler, fast_options(start_id="0-0")) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
    second = await add(client, stream, n="2")
    async with running(client, stream, handler, fast_options(start_id="0-0")) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
    assert ordered(e.id for e in seen) == [first, second]


async def test_missing_stream_is_created_with_the_group(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    seen, handler = recorder()
    async with running(client, stream, handler, fast_options(start_id="$")) as worker:
        assert await client.execute("TYPE", stream) in (b"stream", "stream")
        entry = await add(client, stream)
        await wait_until(lambda: stats(worker, stream).acked == 1)
    assert ordered(e.id for e in seen) == [entry]


async def test_custom_group_and_two_groups_each_see_every_entry(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    before = await add_many(client, stream, 2)
    seen_a, handler_a = recorder()
    seen_b, handler_b = recorder()
    async with (
        running(client, stream, handler_a, fast_options(group="audit")) as a,
        running(client, stream, handler_b, fast_options(group="billing")) as b,
    ):
        later = await add(client, stream, n="later")
        await wait_until(lambda: stats(a, stream).acked == 3 and stats(b, stream).acked == 3)
    expected = [*before, later]
    assert ordered(e.id for e in seen_a) == expected
    assert ordered(e.id for e in seen_b) == expected
    info = await groups(client, stream)
    assert sorted(info) == ["audit", "billing"]
    for name in info:
        assert text(info[name]["last-delivered-id"]) == later
        assert int(info[name]["pending"]) == 0


async def test_a_group_deleted_under_a_running_stream_worker_stops_it_without_replaying(
    client: RedisClient, unique_name: str
) -> None:
    """The group used to be recreated at start_id (here 0-0), running every acknowledged entry
    again; now the worker stops with ConsumerGroupMissing."""
    stream = unique_name
    before = await add_many(client, stream, 3)
    seen, handler = recorder()
    worker = StreamWorker()
    worker.register(stream, handler, fast_options(start_id="0-0"))
    errors: list[BaseException] = []

    run = run_catching(worker, client, ConsumerGroupMissing, errors)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(run)
            await wait_until(lambda: stats(worker, stream).acked == 3)
            await client.execute("XGROUP", "DESTROY", stream, "respire")
            await add(client, stream, n="new")
            await wait_until(lambda: bool(errors))
    assert ordered(e.id for e in seen) == before  # nothing acknowledged ran again
    assert "recreate_missing_group" in str(errors[0])


async def test_recreate_missing_group_dollar_lets_a_stream_worker_go_on(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    before = await add_many(client, stream, 2)
    seen, handler = recorder()
    options = fast_options(start_id="0-0", recreate_missing_group="$")
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 2)
        await client.execute("XGROUP", "DESTROY", stream, "respire")
        await add(client, stream, n="lost")  # wakes the reader: NOGROUP, recreated at "$"

        async def recreated() -> bool:
            return "respire" in await groups(client, stream)

        await wait_until_async(recreated)
        late = await add(client, stream, n="late")
        await wait_until(lambda: late in [e.id for e in seen])
    ids = [e.id for e in seen]
    assert ids.count(before[0]) == ids.count(before[1]) == 1


async def test_a_clean_shutdown_removes_the_stream_workers_consumer(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add_many(client, stream, 2)
    _seen, handler = recorder()
    async with running(client, stream, handler) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 2)
        me = worker.consumer_name(stream)
        rows = await client.execute("XINFO", "CONSUMERS", stream, "respire")
        names = [text(pairs(row)["name"]) for row in rows]
        assert me in names
    assert await client.execute("XINFO", "CONSUMERS", stream, "respire") == []
    assert stats(worker, stream).consumers_removed == 1


async def test_a_dead_letter_key_of_another_type_is_refused_at_start(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: the worker started and read new entries while every recovery pass
    failed on the dead-letter key's type (the sweeper restarted for ever, so failed entries
    were never retried or dead-lettered). Start now refuses it, naming the key."""
    from respire_actors.errors import WrongKeyType

    stream = unique_name
    await add(client, stream, n="1")
    await client.execute("SET", f"{stream}:dead", "not a stream")
    _, handler = recorder()
    worker = StreamWorker()
    worker.register(stream, handler, fast_options())
    with anyio.fail_after(10), pytest.raises(WrongKeyType, match=f"{stream}:dead"):
        await worker.run(client)
    assert await groups(client, stream) == {}  # nothing was created
