"""A payload over the client's ``max_payload_bytes`` is refused with ``PayloadTooLarge`` before
anything is sent, on every producer path; a server configured with a lower
``proto-max-bulk-len`` would otherwise close the connection and fail every command in flight
on it (reported as ``RedisUnavailable``, which a producer retries forever)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from helpers.keyspace import release_keys

from respire_actors import PayloadTooLarge
from respire_actors.codecs import BytesCodec, EncodeError, StrCodec
from respire_actors.errors import ConfigurationError, ValidationError
from respire_actors.jobs import (
    Callback,
    FlowNode,
    JobEnqueueOptions,
    JobQueue,
    PartitionedJobQueue,
)
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect
from respire_actors.reliable import ReliableQueue, ReliableTopic

pytestmark = pytest.mark.anyio

LIMIT = 1000


def test_the_limit_is_a_connection_setting() -> None:
    assert ConnectionSettings().max_payload_bytes == 512 * 1024 * 1024
    parsed = ConnectionSettings.from_url("redis://h:1?max_payload_bytes=1048576")
    assert parsed.max_payload_bytes == 1_048_576
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ConfigurationError, match="max_payload_bytes"):
            ConnectionSettings(max_payload_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_payload_bytes"):
        ConnectionSettings.from_url("redis://h:1?max_payload_bytes=big")


def test_payload_too_large_is_an_encode_error() -> None:
    assert issubclass(PayloadTooLarge, EncodeError)
    assert issubclass(PayloadTooLarge, ValidationError)


def _producers(client: RedisClient, name: str) -> dict[str, Callable[[bytes], Awaitable[Any]]]:
    jobs = JobQueue(client, name, BytesCodec())
    parts = PartitionedJobQueue(client, f"{name}-parts", BytesCodec(), partitions=4)
    reliable = ReliableQueue(client, f"{name}-rq", BytesCodec())
    topic = ReliableTopic(client, f"{name}-topic", BytesCodec())
    schedules = jobs.scheduler()

    async def in_transaction(body: bytes) -> None:
        async with client.transaction() as tx:
            jobs.enqueue_in(tx, "tx-job", body)
            await tx.commit()

    async def batch_member(body: bytes) -> None:
        batch = await jobs.create_batch(batch_id="b1")
        await jobs.add_to_batch(batch, "m", body)

    async def batch_members(body: bytes) -> None:
        batch = await jobs.create_batch(batch_id="b2")
        await jobs.add_many_to_batch(batch, [("m1", b"small"), ("m2", body)])

    return {
        "enqueue_flow": lambda body: jobs.enqueue_flow(
            "f", FlowNode("parent", b"small", [FlowNode("child", body)])
        ),
        "batch callback": lambda body: jobs.create_batch(on_success=Callback("cb", body)),
        "enqueue": lambda body: jobs.enqueue("a", body),
        "enqueue_many": lambda body: jobs.enqueue_many([("ok", b"small"), ("b", body)]),
        "enqueue_scheduled": lambda body: jobs.enqueue_scheduled(
            "c", body, JobEnqueueOptions(delay=60)
        ),
        "enqueue_in": in_transaction,
        "partitioned enqueue": lambda body: parts.enqueue("d", body),
        "send": lambda body: reliable.send(body),
        "send_many": lambda body: reliable.send_many([b"small", body]),
        "publish": lambda body: topic.publish(body),
        "publish_many": lambda body: topic.publish_many([b"small", body]),
        "recurring upsert": lambda body: schedules.upsert("s", body, interval=60),
        "add_to_batch": batch_member,
        "add_many_to_batch": batch_members,
    }


async def test_every_producer_refuses_an_oversized_payload_before_sending(
    server_url: str, unique_name: str
) -> None:
    async with connect(server_url, max_payload_bytes=LIMIT) as client:
        try:
            for what, produce in _producers(client, unique_name).items():
                before = client.round_trips
                with pytest.raises(PayloadTooLarge) as caught:
                    await produce(b"x" * (LIMIT + 1))
                if "to_batch" not in what:  # those created their batch first
                    assert client.round_trips == before, f"{what} sent a command"
                assert (caught.value.size, caught.value.limit) == (LIMIT + 1, LIMIT), what
                assert "max_payload_bytes" in str(caught.value), what
            # nothing of any of them reached the server (but the two empty batches)
            keys = await client.execute("KEYS", f"*{unique_name}*")
            queue_keys = JobQueue(client, unique_name, BytesCodec()).keys
            assert sorted(keys) == sorted(
                k.encode()
                for k in (queue_keys.batch("b1"), queue_keys.batch("b2"), queue_keys.coordinated)
            ), keys
            # a payload of exactly the limit is fine
            queue = JobQueue(client, unique_name, BytesCodec())
            result = await queue.enqueue("exact", b"x" * LIMIT)
            assert result.entry_id
        finally:
            await release_keys(client, f"*{unique_name}*")


async def test_a_lower_server_limit_no_longer_breaks_other_commands(
    spawn_valkey: Callable[..., Any], unique_name: str
) -> None:
    """Against a server whose proto-max-bulk-len is 1 MiB, a 2 MiB send with the limit set to
    match is refused on the client, and the small sends running beside it all succeed (before,
    the server closed the shared connection and they failed as RedisUnavailable)."""
    server = spawn_valkey("--proto-max-bulk-len", "1mb")
    async with connect(server.url, max_payload_bytes=1024 * 1024) as client:
        queue = ReliableQueue(client, unique_name, StrCodec())
        errors: list[BaseException] = []
        sent: list[str] = []

        async def small(i: int) -> None:
            try:
                for j in range(20):
                    sent.append(await queue.send(f"{i}-{j}"))
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(small, i)
            with pytest.raises(PayloadTooLarge):
                await queue.send("y" * (2 * 1024 * 1024))
        assert errors == []
        assert len(sent) == 80
        assert await client.execute("XLEN", queue.keys.stream) == 80
