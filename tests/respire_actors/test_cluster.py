"""Smoke tests through the cluster client (3 valkey masters), plus the key routing table."""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

import anyio
import pytest
from helpers.servers import Cluster, key_slot
from helpers.waiting import wait_until

from respire_actors.chaos.cluster import replication_lag
from respire_actors.errors import (
    RedisUnavailable,
    RespireError,
    TransactionAborted,
    ValidationError,
)
from respire_actors.redis._routing import key_indices
from respire_actors.redis.client import RedisClient, connect
from respire_actors.redis.scripts import Script, run_many

MOVE_SOURCE = """\
-- move ARGV[1] units from KEYS[1] to KEYS[2]; returns both new values
local moved = tonumber(ARGV[1])
local from = redis.call('DECRBY', KEYS[1], moved)
local to = redis.call('INCRBY', KEYS[2], moved)
return {from, to}
"""


def move_script(nonce: str) -> Script:
    # A body never seen by the servers: the first call must take the NOSCRIPT fallback.
    source = f"-- {nonce}\n{MOVE_SOURCE}"
    return Script("move", 2, source, hashlib.sha1(source.encode()).hexdigest())


def tags_on_every_node(cluster: Cluster, name: str) -> list[str]:
    """One hash tag per master, so the calls below hit all three nodes."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(cluster.nodes):
        tag = f"{name}-{i}"
        node = cluster.node_for_slot(key_slot(tag)).port
        found.setdefault(node, tag)
        i += 1
    return [found[n.port] for n in cluster.nodes]


@pytest.mark.anyio
async def test_cluster_client_basics(cluster_client: RedisClient) -> None:
    info = await cluster_client.server_info(refresh=True)
    assert info.flavor == "valkey"
    assert info.mode == "cluster"
    assert await cluster_client.execute("PING") == b"PONG"
    assert await cluster_client.time_ms() > 0
    slots = await cluster_client.execute("CLUSTER", "SLOTS")
    assert len(slots) == 3


@pytest.mark.anyio
async def test_script_with_noscript_fallback_on_every_node(
    cluster_client: RedisClient, cluster_nodes: Cluster, unique_name: str
) -> None:
    script = move_script(unique_name)
    for tag in tags_on_every_node(cluster_nodes, unique_name):
        src, dst = f"{{{tag}}}:from", f"{{{tag}}}:to"
        owner = cluster_nodes.node_for_slot(key_slot(tag))
        assert owner.execute("SCRIPT", "EXISTS", script.sha) == [0]
        assert await script(cluster_client, [src, dst], [5]) == [-5, 5]  # NOSCRIPT -> EVAL
        assert owner.execute("SCRIPT", "EXISTS", script.sha) == [1]  # ran on the owner
        assert await script(cluster_client, [src, dst], [2]) == [-7, 7]  # EVALSHA now
        assert owner.execute("GET", src) == b"-7"


@pytest.mark.anyio
async def test_run_many_spans_nodes(
    cluster_client: RedisClient, cluster_nodes: Cluster, unique_name: str
) -> None:
    script = move_script(unique_name + "-many")
    tags = tags_on_every_node(cluster_nodes, unique_name)
    calls: list[tuple[Script, list[str], list[Any]]] = [
        (script, [f"{{{t}}}:a", f"{{{t}}}:b"], [1]) for t in tags for _ in range(3)
    ]
    # NOSCRIPT, then sent again: on each node one full EVAL, which loads the script there,
    # and the node's other calls after it as EVALSHA; each ran once, in order
    assert await run_many(cluster_client, calls) == [[-1, 1], [-2, 2], [-3, 3]] * 3
    assert await run_many(cluster_client, calls) == [[-4, 4], [-5, 5], [-6, 6]] * 3


@pytest.mark.anyio
async def test_cross_slot_script_is_refused(cluster_client: RedisClient, unique_name: str) -> None:
    script = move_script(unique_name)
    with pytest.raises(RespireError):
        await script(cluster_client, [f"{{{unique_name}-x}}:a", f"{{{unique_name}-y}}:b"], [1])


@pytest.mark.anyio
async def test_streams_and_blocking_read(cluster_client: RedisClient, unique_name: str) -> None:
    stream = f"{{{unique_name}}}:stream"
    assert await cluster_client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM") == b"OK"
    first = await cluster_client.execute("XADD", stream, "*", "job", "1")
    reply = await cluster_client.execute(
        "XREADGROUP", "GROUP", "g", "c1", "COUNT", 10, "STREAMS", stream, ">"
    )
    entries = _entries(reply, stream)
    assert [e[0] for e in entries] == [first]
    assert await cluster_client.execute("XACK", stream, "g", first) == 1

    async with cluster_client.open_blocking() as blocking:
        got: list[Any] = []

        async def read() -> None:
            got.append(
                await blocking.execute(
                    "XREADGROUP", "GROUP", "g", "c2", "BLOCK", 5000, "STREAMS", stream, ">"
                )
            )

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await _wait_for_blocked_reader(cluster_client, stream)
                second = await cluster_client.execute("XADD", stream, "*", "job", "2")
    assert [e[0] for e in _entries(got[0], stream)] == [second]
    pending = await cluster_client.execute("XPENDING", stream, "g")
    assert pending[0] == 1


async def _wait_for_blocked_reader(client: RedisClient, stream: str) -> None:
    # XINFO CONSUMERS lists c2 once its XREADGROUP has reached the server.
    while True:
        consumers = await client.execute("XINFO", "CONSUMERS", stream, "g")
        names = [_field(c, b"name") for c in consumers]
        if b"c2" in names:
            return
        await anyio.sleep(0.01)


def _field(entry: Any, name: bytes) -> Any:
    if isinstance(entry, dict):
        return entry.get(name)
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs.get(name)


def _entries(reply: Any, stream: str) -> list[Any]:
    # RESP3 gives {stream: entries}; RESP2 gives [[stream, entries]]
    if isinstance(reply, dict):
        return list(reply[stream.encode()])
    return list(reply[0][1])


@pytest.mark.anyio
async def test_single_slot_transaction(cluster_client: RedisClient, unique_name: str) -> None:
    balance, log = f"{{{unique_name}}}:balance", f"{{{unique_name}}}:log"
    await cluster_client.execute("SET", balance, 10)
    async with cluster_client.transaction(balance) as tx:
        current = int(await tx.read("GET", balance))
        new = tx.queue("DECRBY", balance, 3)
        entry = tx.queue("RPUSH", log, f"{current}->{current - 3}")
        assert await tx.commit() is True
    assert (new.result(), entry.result()) == (7, 1)

    # a WATCHed change aborts it
    async with cluster_client.transaction(balance) as tx:
        await tx.read("GET", balance)
        await cluster_client.execute("SET", balance, 100)
        lost = tx.queue("DECRBY", balance, 3)
        assert await tx.commit() is False
    with pytest.raises(RespireError):
        lost.result()
    assert await cluster_client.execute("GET", balance) == b"100"

    replies = await cluster_client.pipeline(
        [("INCR", balance), ("RPUSH", log, "x")], transaction=True
    )
    assert replies == [101, 2]


@pytest.mark.anyio
async def test_cross_slot_transaction_is_refused(
    cluster_client: RedisClient, unique_name: str
) -> None:
    with pytest.raises(RespireError):
        await cluster_client.pipeline(
            [("SET", f"{{{unique_name}-a}}:k", 1), ("SET", f"{{{unique_name}-b}}:k", 1)],
            transaction=True,
        )
    assert await cluster_client.execute("EXISTS", f"{{{unique_name}-a}}:k") == 0


@pytest.mark.anyio
async def test_pipeline_rules_on_a_cluster(
    cluster_client: RedisClient, cluster_nodes: Cluster, unique_name: str
) -> None:
    tags = tags_on_every_node(cluster_nodes, unique_name)
    replies = await cluster_client.pipeline([("INCR", f"{{{t}}}:n") for t in tags])
    assert replies == [1, 1, 1]
    with pytest.raises(ValidationError, match="TIME"):
        await cluster_client.pipeline([("INCR", f"{{{tags[0]}}}:n"), ("TIME",)])


# ------------------------------------------------------------------------------------------
# key routing (no server)


@pytest.mark.parametrize(
    ("command", "keys"),
    [
        (("GET", "k"), ["k"]),
        (("XADD", "s", "*", "f", "v"), ["s"]),
        (("DEL", "a", "b", "c"), ["a", "b", "c"]),
        (("MSET", "a", "1", "b", "2"), ["a", "b"]),
        (("BLPOP", "a", "b", "5"), ["a", "b"]),
        (("LMOVE", "a", "b", "LEFT", "RIGHT"), ["a", "b"]),
        (("EVALSHA", "0" * 40, "2", "a", "b", "arg"), ["a", "b"]),
        (("EVAL", "return 1", "0", "arg"), []),
        (("FCALL", "f", "1", "a", "x"), ["a"]),
        (("ZUNIONSTORE", "d", "2", "a", "b", "WEIGHTS", "1", "2"), ["d", "a", "b"]),
        (("ZINTER", "2", "a", "b"), ["a", "b"]),
        (("BLMPOP", "1", "2", "a", "b", "LEFT"), ["a", "b"]),
        (
            ("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "s1", "s2", ">", ">"),
            ["s1", "s2"],
        ),
        (("XREAD", "BLOCK", "0", "streams", "s", "$"), ["s"]),
        (("XGROUP", "CREATE", "s", "g", "$"), ["s"]),
        (("XINFO", "STREAM", "s"), ["s"]),
        (("XINFO", "HELP"), []),
        (("OBJECT", "ENCODING", "k"), ["k"]),
        (("MEMORY", "USAGE", "k"), ["k"]),
        (("MEMORY", "STATS"), []),
        (("BITOP", "AND", "d", "a", "b"), ["d", "a", "b"]),
        (("PING",), []),
        (("INFO", "server"), []),
        (("SCRIPT", "LOAD", "return 1"), []),
        (("CLIENT", "KILL", "ID", "5"), []),
    ],
)
def test_key_indices(command: tuple[str, ...], keys: list[str]) -> None:
    name, args = command[0].encode(), command[1:]
    assert [args[i] for i in key_indices(name, args)] == keys


# ------------------------------------------------------------------------------------------
# live slot migration (MOVED and ASK) under concurrent traffic


@pytest.mark.anyio
async def test_slot_migration_with_concurrent_traffic(
    small_cluster: Cluster, unique_name: str
) -> None:
    """Move a slot between the masters while tasks INCR keys in it: ASK redirections during
    the migration, MOVED after it; every acknowledged INCR ran exactly once."""
    tag = unique_name
    slot = key_slot(tag)
    src = small_cluster.node_for_slot(slot)
    dst = next(n for n in small_cluster.nodes if n is not src)
    src_id = _text(src.execute("CLUSTER", "MYID"))
    dst_id = _text(dst.execute("CLUSTER", "MYID"))
    keys = [f"{{{tag}}}:k{i}" for i in range(12)]
    acknowledged = dict.fromkeys(keys, 0)
    aborted = 0
    stop = anyio.Event()

    async with connect(small_cluster.url) as client:
        for key in keys:
            await client.execute("SET", key, 0)

        async def incr_worker(key: str) -> None:
            while not stop.is_set():
                assert await client.execute("INCR", key) > 0
                acknowledged[key] += 1
                await anyio.sleep(0.001)

        async def pipeline_worker(key: str) -> None:
            while not stop.is_set():
                replies = await client.pipeline([("INCR", key), ("INCR", key)])
                assert all(isinstance(r, int) for r in replies), replies
                acknowledged[key] += 2
                await anyio.sleep(0.001)

        async def transaction_worker(key: str) -> None:
            nonlocal aborted
            while not stop.is_set():
                try:
                    await client.pipeline([("INCR", key)], transaction=True)
                except TransactionAborted:
                    aborted += 1  # nothing ran (slot migrating): safe to retry
                else:
                    acknowledged[key] += 1
                await anyio.sleep(0.001)

        async def run(*args: object) -> object:
            return await anyio.to_thread.run_sync(lambda: src.execute(*args))  # type: ignore[arg-type]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i, key in enumerate(keys):
                    worker = (incr_worker, incr_worker, pipeline_worker, transaction_worker)[i % 4]
                    tg.start_soon(worker, key)
                await anyio.sleep(0.1)
                await anyio.to_thread.run_sync(
                    lambda: dst.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
                )
                await run("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
                half = keys[: len(keys) // 2]
                await run("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *half)
                await anyio.sleep(0.1)  # traffic on moved keys is answered ASK now
                assert int(await client.execute("GET", half[0])) >= 0  # via ASK, explicitly
                assert client.statistics().asked > 0
                rest = keys[len(keys) // 2 :]
                await run("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *rest)
                await anyio.to_thread.run_sync(
                    lambda: dst.execute("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
                )
                await run("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
                await anyio.sleep(0.2)  # traffic to the old owner is answered MOVED now
                stop.set()
        stats = client.statistics()
        assert stats.moved > 0
        assert stats.asked > 0
        # every acknowledged increment ran exactly once, on whichever node held the key
        for key in keys:
            assert int(dst.execute("GET", key)) == acknowledged[key], key  # type: ignore[arg-type]
        assert src.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert sum(acknowledged.values()) > 50
        # the client follows the new owner without further redirections
        moved = stats.moved
        for key in keys:
            await client.execute("INCR", key)
        assert client.statistics().moved == moved


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------------------
# failover after the primary died (issue #16, scenario 7)


async def _until_answered(call: Any, timeout: float = 15.0) -> tuple[Any, int]:
    """Repeat ``call`` while it raises RedisUnavailable; return its reply and the failures."""
    failures = 0
    with anyio.fail_after(timeout):
        while True:
            try:
                return await call(), failures
            except RedisUnavailable:
                failures += 1
                await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_the_client_follows_a_replica_that_took_over_a_dead_primary(
    small_cluster: Cluster, unique_name: str
) -> None:
    """A SIGKILLed primary never answers MOVED: a command to it fails (its outcome unknown),
    and the client must reload the slot map so the next ones reach the promoted replica, on
    the shared connection, on blocking connections and in pipelines."""
    key = f"{{{unique_name}}}:k"
    master = small_cluster.owner_of(key_slot(key))
    replica = small_cluster.add_replica(master)
    async with connect(small_cluster.url, command_timeout=2.0) as client:
        await client.execute("SET", key, "before")
        await client.execute("XADD", f"{key}:s", "*", "f", "v")
        await wait_until(lambda: replication_lag(master, replica) == 0, timeout=10)
        master.process.kill()
        master.process.wait()
        replica.execute("CLUSTER", "FAILOVER", "TAKEOVER")
        value, failures = await _until_answered(lambda: client.execute("GET", key))
        assert value == b"before"
        assert failures <= 3  # one failure per connection that still pointed at the dead node
        entries, _ = await _until_answered(
            lambda: client.execute("XREAD", "BLOCK", 10, "STREAMS", f"{key}:s", "0")
        )
        assert entries  # the entry written before the failover
        replies, _ = await _until_answered(lambda: client.pipeline([("INCR", f"{key}:n")]))
        assert replies == [1]


# ------------------------------------------------------------------------------------------
# what a caller is told when one node stops answering (found by review)


def _publish_calls(node: Any) -> int:
    stats = _text(node.execute("INFO", "commandstats"))
    for line in stats.splitlines():
        if line.startswith("cmdstat_publish:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


@pytest.mark.anyio
async def test_outcomes_are_told_truly_when_a_node_stops_answering(
    small_cluster: Cluster, unique_name: str
) -> None:
    """A keyless write whose node does not answer in time was sent again to another node (a
    PUBLISH delivered twice, reported as success); a pipeline over two nodes, one of them
    down, raised that node's ``ran=False`` although the other node's commands had run."""
    a_tag, b_tag = tags_on_every_node(small_cluster, unique_name)
    async with connect(small_cluster.url, command_timeout=1) as client:
        await client.execute("PING")
        router = client._router
        assert router is not None
        port = router.keyless_candidates()[0][1]
        stopped = next(n for n in small_cluster.nodes if n.port == port)
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisUnavailable) as raised:
                await client.execute("PUBLISH", f"{unique_name}:channel", "once")
            assert raised.value.ran is None  # it may have run: never sent to the other node
            assert await client.execute("TIME")  # a read-only one is asked elsewhere
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        # the resumed node runs the PUBLISH it had received: once in all
        await wait_until(lambda: sum(_publish_calls(n) for n in small_cluster.nodes) >= 1)
        await anyio.sleep(0.3)
        assert sum(_publish_calls(n) for n in small_cluster.nodes) == 1

        a_key, b_key = f"{{{a_tag}}}:n", f"{{{b_tag}}}:n"
        b_node = small_cluster.node_for_slot(key_slot(b_tag))
        b_node.stop()
        with pytest.raises(RedisUnavailable) as raised:
            await client.pipeline([("INCR", a_key), ("INCR", b_key)])
        assert raised.value.ran is None  # the INCR on the live node ran
        assert raised.value.partial_results is not None
        assert raised.value.partial_results[0] == 1
        assert isinstance(raised.value.partial_results[1], RedisUnavailable)
        assert await client.execute("GET", a_key) == b"1"
        with pytest.raises(RedisUnavailable) as raised:  # only the dead node's: nothing ran
            await client.pipeline([("INCR", b_key), ("INCR", b_key)])
        assert raised.value.ran is False


@pytest.mark.anyio
async def test_a_blocking_connection_follows_ask_while_a_slot_migrates(
    small_cluster: Cluster, unique_name: str
) -> None:
    """Found by review: a blocking connection re-sent an ASK-redirected command to the
    target without ASKING; the target answered MOVED back, and after five rounds the read
    failed, so every blocking wait of a migrating queue fell back to polling."""
    tag = unique_name
    slot = key_slot(tag)
    src = small_cluster.node_for_slot(slot)
    dst = next(n for n in small_cluster.nodes if n is not src)
    moved, staying = f"{{{tag}}}:moved", f"{{{tag}}}:staying"
    async with connect(small_cluster.url) as client:
        await client.execute("XADD", moved, "1-1", "f", "moved")
        await client.execute("XADD", staying, "1-1", "f", "staying")
        dst.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", _text(src.execute("CLUSTER", "MYID")))
        src.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", _text(dst.execute("CLUSTER", "MYID")))
        src.execute("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", moved)
        async with client.open_blocking() as blocking:
            for key in (moved, staying, moved):
                reply = await blocking.execute("XREAD", "BLOCK", 100, "STREAMS", key, "0")
                assert reply, key
                entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
                assert entries[0][0] == b"1-1"
