"""Mutation-testing gaps: the client key prefix reaches the queue registry removal and the
partition-count copies . client.py ConnectionSettings: "``key_prefix`` is prepended
to every key the runtime generates".

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

import pytest

from respire_actors.codecs import StrCodec
from respire_actors.jobs import PartitionedJobQueue
from respire_actors.keys import partitions_key
from respire_actors.redis.client import RedisClient, connect
from respire_actors.registry import list_queues, register_queue, unregister_queue


async def _names(client: RedisClient, pattern: str) -> list[str]:
    found: list[bytes] = []
    cursor: object = b"0"
    while True:
        cursor, batch = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        found += batch
        if cursor in (b"0", 0, "0"):
            return sorted(k.decode() for k in found)


@pytest.mark.anyio
async def test_unregister_removes_the_name_from_the_prefixed_registry(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    async with connect(server_url, key_prefix=f"{unique_name}-p:") as prefixed:
        assert await register_queue(prefixed, unique_name)
        assert unique_name in await list_queues(prefixed)
        assert await unregister_queue(prefixed, unique_name)
        assert unique_name not in await list_queues(prefixed)
        assert not await unregister_queue(prefixed, unique_name)


@pytest.mark.anyio
@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "hash-tagged"])
async def test_partition_count_copies_carry_the_prefix(
    client: RedisClient, server_url: str, unique_name: str, tagged: bool
) -> None:
    prefix = f"{{{unique_name}-p}}:" if tagged else f"{unique_name}-p:"
    async with connect(server_url, key_prefix=prefix) as prefixed:
        queue = PartitionedJobQueue(prefixed, unique_name, StrCodec(), partitions=4)
        await queue.enqueue("job-1", "a")  # records the count (and writes its copies)
        names = await _names(client, f"*{unique_name}*")
        assert names and all(n.startswith(prefix) for n in names), names
        for i in range(4):
            copy = partitions_key(f"{unique_name}:p{i}", prefix)
            assert int(await client.execute("EXISTS", copy)) == 1, copy
