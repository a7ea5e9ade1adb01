"""Validation before any command, cluster slots, and fencing of stale completions."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from streams_helpers import (
    add,
    deliver_by_hand,
    entries,
    fast_options,
    forbid_commands,
    pending_rows,
    running,
    stats,
    wait_until,
)

from respire_actors.actors.completer import commit
from respire_actors.actors.messages import Completion
from respire_actors.errors import ConfigurationError, ValidationError
from respire_actors.jobs.model import ACK, DeadLetter, Delivery
from respire_actors.redis.client import RedisClient
from respire_actors.streams import (
    StreamEntry,
    StreamRegistration,
    StreamSource,
    StreamWorker,
    StreamWorkerOptions,
)

pytestmark = pytest.mark.anyio


async def ack(entry: StreamEntry) -> Any:
    return ACK


@pytest.mark.parametrize(
    "start_id", ["", "abc", "1-x", "-1", "1-", "1-0-0", " 1-0", "1-0\n", "\u0661", ">", None, 0]
)
async def test_bad_start_ids_are_rejected(client: RedisClient, start_id: Any) -> None:
    with forbid_commands(client), pytest.raises(ValidationError, match="start_id"):
        StreamWorkerOptions(start_id=start_id)


@pytest.mark.parametrize("start_id", ["$", "0", "0-0", "1700000000000", "1700000000000-5"])
def test_good_start_ids_are_accepted(start_id: str) -> None:
    assert StreamWorkerOptions(start_id=start_id).start_id == start_id


@pytest.mark.parametrize(
    "changes",
    [
        {"group": ""},
        {"group": "   "},
        {"group": "{billing}"},
        {"group": "bill}ing"},
        {"concurrency": 0},
        {"concurrency": True},
        {"batch_size": 0},
        {"batch_size": 1001},
        {"recovery_page_size": 0},
        {"delivery_limit": 0},
        {"consumer_name": "a{b}"},
        {"dead_letter_stream": " "},
        {"visibility_timeout": 0},
        # "false" used to switch recovery on (truthy) and crash-loop the completer
        {"recovery": "false"},
        {"recovery": None},
        {"recovery": 0},
        {"delete_acknowledged": "false"},
        {"delete_acknowledged": 1},
        {"delete_acknowledged": None},
    ],
)
async def test_bad_options_are_rejected_before_any_command(
    client: RedisClient, changes: dict[str, Any]
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        StreamWorkerOptions(**changes)


@pytest.mark.parametrize("stream", ["", "   ", None, 5])
async def test_blank_stream_is_rejected(client: RedisClient, stream: Any) -> None:
    worker = StreamWorker()
    with forbid_commands(client), pytest.raises(ValidationError, match="stream"):
        worker.register(stream, ack)
    with forbid_commands(client), pytest.raises(ValidationError, match="no registered"):
        await worker.run(client)


async def test_duplicate_registration_is_rejected(unique_name: str) -> None:
    worker = StreamWorker()
    reg = worker.register(unique_name, ack)
    assert reg == StreamRegistration(unique_name, ack, StreamWorkerOptions())

    @worker.stream(f"{unique_name}:other", fast_options())
    async def other(entry: StreamEntry) -> Any:
        return ACK

    with pytest.raises(ValidationError, match="already registered"):
        worker.register(unique_name, ack)


async def test_dead_letter_stream_must_differ_from_the_stream(
    client: RedisClient, unique_name: str
) -> None:
    worker = StreamWorker()
    # refused at registration now (was: when the worker ran); nothing is sent either way
    with forbid_commands(client), pytest.raises(ConfigurationError, match="differ"):
        worker.register(unique_name, ack, fast_options(dead_letter_stream=unique_name))
    assert worker._registrations == {}


@pytest.mark.parametrize("tagged", [False, True])
async def test_explicit_dead_letter_stream_in_another_slot_is_refused_everywhere(
    client: RedisClient, unique_name: str, tagged: bool
) -> None:
    """Item 21: accepted silently on a single node before; refused at registration on every
    server now, so a configuration that works on one node also works on a cluster."""
    stream = f"{{{unique_name}}}:s" if tagged else unique_name
    worker = StreamWorker()
    with forbid_commands(client), pytest.raises(ConfigurationError, match="slot"):
        worker.register(stream, ack, fast_options(dead_letter_stream=f"{unique_name}-dlq"))
    assert worker._registrations == {}


# -------------------------------------------------------------------------------------------
# cluster


async def test_tagged_stream_with_default_dead_letter_works_on_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    client = cluster_client
    stream = f"{{{unique_name}}}:x"
    kept = await add(client, stream, n="ok")
    rejected = await add(client, stream, n="bad")

    async def handler(e: StreamEntry) -> Any:
        return ACK if e.fields[b"n"] == b"ok" else DeadLetter(detail="rejected")

    async with running(client, stream, handler) as worker:
        await wait_until(lambda: stats(worker, stream).dead_lettered == 1)
        await wait_until(lambda: stats(worker, stream).acked == 1)
        later = await add(client, stream, n="ok")
        await wait_until(lambda: stats(worker, stream).acked == 2)
    assert kept != later
    assert await pending_rows(client, stream, "respire") == []
    ((_, fields),) = await entries(client, f"{stream}:dead")
    assert fields["_respire.source_id"] == rejected.encode()
    assert fields["_respire.reason"] == b"explicit"


async def test_stream_outside_the_dead_letter_slot_is_refused_on_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    # the default dead-letter stream of an untagged stream: only a cluster can tell
    stream = unique_name
    worker = StreamWorker()
    worker.register(stream, ack, fast_options())
    with forbid_commands(cluster_client):
        with pytest.raises(ConfigurationError, match="slot"):
            worker.build(cluster_client)
        with pytest.raises(ConfigurationError, match="slot"):
            await worker.run(cluster_client)


# -------------------------------------------------------------------------------------------
# fencing


async def test_stale_completion_is_fenced(client: RedisClient, unique_name: str) -> None:
    """A slow consumer whose entry was recovered by another cannot complete it any more."""
    stream = unique_name
    dead = f"{stream}:dead"
    await client.execute("XGROUP", "CREATE", stream, "respire", "0", "MKSTREAM")
    first = await add(client, stream, n="1")
    second = await add(client, stream, n="2")
    assert await deliver_by_hand(client, stream, "respire", "slow") == [first, second]
    await client.execute("XCLAIM", stream, "respire", "fast", 0, first)
    source = StreamSource(client, stream, dead, "respire", "0-0", delete_acknowledged=True)
    stale = [
        Completion(Delivery(first, {}, 1), "dead", "explicit"),  # now fast's, attempt 2
        Completion(Delivery(second, {}, 2), "ack"),  # slow's, but attempt 1
        Completion(Delivery(second, {}, 1), "ack"),  # current
    ]
    assert await source.complete("slow", stale) == [0, 0, 1]
    assert await pending_rows(client, stream, "respire") == [(first, "fast", 2)]
    assert [i for i, _ in await entries(client, stream)] == [first]  # second deleted
    assert await entries(client, dead) == []
    # the same outcome again (a retry after a lost reply) writes nothing
    assert await source.complete("slow", stale[2:]) == [0]
    assert await source.complete("fast", [Completion(Delivery(first, {}, 2), "ack")]) == [1]
    assert await pending_rows(client, stream, "respire") == []


async def test_completer_counts_stale_completions(client: RedisClient, unique_name: str) -> None:
    stream = unique_name
    await client.execute("XGROUP", "CREATE", stream, "respire", "0", "MKSTREAM")
    entry = await add(client, stream)
    assert await deliver_by_hand(client, stream, "respire", "other") == [entry]
    worker = StreamWorker()
    reg = worker.register(stream, ack, fast_options(consumer_name="me"))
    rt = worker._runtime(client, reg)
    try:
        statuses = await commit(rt, [Completion(Delivery(entry, {}, 1), "ack")])
    finally:
        rt.deliveries.close()
        rt.completions.close()
    assert statuses == [0]
    assert (rt.stats.stale_completions, rt.stats.acked) == (1, 0)
    assert await pending_rows(client, stream, "respire") == [(entry, "other", 1)]


async def test_worker_does_not_complete_an_entry_recovered_by_another_consumer(
    client: RedisClient, unique_name: str
) -> None:
    """The handler outlives nothing here: another consumer claims the entry while it runs, and
    the handler's ACK (before its own lease ends) is fenced out."""
    stream = unique_name
    entry = await add(client, stream)
    claimed = anyio.Event()
    started = anyio.Event()

    async def handler(e: StreamEntry) -> Any:
        started.set()
        await claimed.wait()
        return ACK

    async with running(client, stream, handler) as worker:
        with anyio.fail_after(10):
            await started.wait()
        await client.execute("XCLAIM", stream, "respire", "thief", 0, entry)
        claimed.set()
        await wait_until(lambda: stats(worker, stream).stale_completions == 1)
        assert stats(worker, stream).acked == 0
    assert await pending_rows(client, stream, "respire") == [(entry, "thief", 2)]
