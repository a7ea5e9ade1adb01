"""Mutation-testing gaps: cluster redirection and hash slots .

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

import pytest
from helpers.servers import Cluster
from helpers.servers import key_slot as reference_slot

from respire_actors.redis._protocol import key_slot
from respire_actors.redis.client import RedisClient, connect


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.anyio
async def test_empty_hash_tag_hashes_the_whole_key(
    cluster_client: RedisClient, unique_name: str
) -> None:
    """Redis hashes a key whole when its first ``{`` is followed directly by ``}``."""
    keys = [f"{{}}{unique_name}:{i}" for i in range(8)] + [f"a{{}}{{{unique_name}}}"]
    for key in keys:
        server = int(await cluster_client.execute("CLUSTER", "KEYSLOT", key))
        assert key_slot(key) == server, key
    before = cluster_client.statistics().moved
    for key in keys:
        await cluster_client.execute("SET", key, "v")
    assert cluster_client.statistics().moved == before  # routed right the first time


def _migrating(cluster: Cluster, tag: str):
    slot = reference_slot(tag)
    src = cluster.node_for_slot(slot)
    dst = next(n for n in cluster.nodes if n is not src)
    dst.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", _text(src.execute("CLUSTER", "MYID")))
    src.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", _text(dst.execute("CLUSTER", "MYID")))
    return slot, src, dst


@pytest.mark.anyio
async def test_a_blocking_execute_follows_ask_with_asking(
    small_cluster: Cluster, unique_name: str
) -> None:
    """client.execute of a blocking command (pooled dedicated connection) follows ASK by
    sending ASKING before the command on the target."""
    tag = unique_name
    moved = f"{{{tag}}}:moved"
    async with connect(small_cluster.url) as client:
        await client.execute("XADD", moved, "1-1", "f", "moved")
        await client.execute("RPUSH", f"{{{tag}}}:list", "x")
        _slot, src, dst = _migrating(small_cluster, tag)
        src.execute("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", moved, f"{{{tag}}}:list")
        reply = await client.execute("XREAD", "BLOCK", 100, "STREAMS", moved, "0")
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        assert entries[0][0] == b"1-1"
        assert await client.execute("BLPOP", f"{{{tag}}}:list", 1) is not None
        assert client.statistics().asked >= 2


@pytest.mark.anyio
async def test_a_pipeline_resends_ask_redirected_commands_in_order(
    small_cluster: Cluster, unique_name: str
) -> None:
    """A pipeline command answered ASK did not run: it is sent again (to the target, with
    ASKING) and its reply lands at its own index."""
    tag = unique_name
    moved, staying = f"{{{tag}}}:moved", f"{{{tag}}}:staying"
    async with connect(small_cluster.url) as client:
        await client.execute("SET", moved, 10)
        await client.execute("SET", staying, 100)
        _slot, src, dst = _migrating(small_cluster, tag)
        src.execute("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", moved)
        replies = await client.pipeline(
            [("INCR", moved), ("INCR", staying), ("INCR", moved), ("GET", staying)]
        )
        assert replies == [11, 101, 12, b"101"]
        assert await client.execute("GET", moved) == b"12"  # each ran exactly once


@pytest.mark.anyio
async def test_moved_reloads_the_whole_slot_map(small_cluster: Cluster, unique_name: str) -> None:
    """After a MOVED the whole map is refreshed: another slot that moved with it is routed
    right without a second MOVED."""
    async with connect(small_cluster.url) as client:
        tags = [f"{unique_name}a", f"{unique_name}b"]
        slots = [reference_slot(t) for t in tags]
        src = small_cluster.node_for_slot(slots[0])
        while small_cluster.node_for_slot(slots[1]) is not src:
            tags[1] += "x"
            slots[1] = reference_slot(tags[1])
        dst = next(n for n in small_cluster.nodes if n is not src)
        dst_id = _text(dst.execute("CLUSTER", "MYID"))
        for t in tags:
            await client.execute("SET", f"{{{t}}}", 1)  # the map is loaded
        for slot, t in zip(slots, tags, strict=True):
            dst.execute(
                "CLUSTER", "SETSLOT", slot, "IMPORTING", _text(src.execute("CLUSTER", "MYID"))
            )
            src.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            src.execute("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", f"{{{t}}}")
            for node in small_cluster.nodes:
                node.execute("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        before = client.statistics().moved
        assert int(await client.execute("INCR", f"{{{tags[0]}}}")) == 2
        assert client.statistics().moved == before + 1
        assert int(await client.execute("INCR", f"{{{tags[1]}}}")) == 2
        assert client.statistics().moved == before + 1
