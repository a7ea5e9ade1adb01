"""Cancellation safety of the shared client: random cancellations never corrupt replies,
never duplicate pipelines, never stall the pool; pipelines and transactions are shielded."""

from __future__ import annotations

import hashlib
import random
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import anyio
import pytest

from respire_actors.redis.client import RedisClient, connect
from respire_actors.redis.scripts import Script

pytestmark = pytest.mark.anyio

ROUNDS = 100  # per worker; 20 workers -> 2000 operations per (backend, server)
DEADLINES = (None, None, 0, 0.0001, 0.0005, 0.001, 0.002, 0.005)


@dataclass
class Tally:
    """What one worker knows about its own counter."""

    base: int
    ok: int = 0  # calls whose reply we saw (so they ran exactly once)
    cancelled: int = 0  # calls cancelled before a reply (each ran at most once)
    last: int = 0


def deadline(rng: random.Random) -> AbstractContextManager[object]:
    chosen = rng.choice(DEADLINES)
    return nullcontext() if chosen is None else anyio.move_on_after(chosen)


def check_reply(tally: Tally, reply: object) -> None:
    """A counter reply must be this key's, newer than the last, and explained by our calls."""
    assert isinstance(reply, int), f"not an INCR reply: {reply!r}"
    tally.ok += 1
    assert tally.last < reply, f"reply {reply} is not newer than {tally.last}"
    assert tally.base + tally.ok <= reply <= tally.base + tally.ok + tally.cancelled, (
        f"reply {reply} from another key or a duplicate (base {tally.base}, ok {tally.ok}, "
        f"cancelled {tally.cancelled})"
    )
    tally.last = reply


def counter_script(nonce: str) -> Script:
    # A fresh body per test run: the first EVALSHA answers NOSCRIPT and falls back to EVAL.
    source = f"-- {nonce}\nreturn redis.call('INCR', KEYS[1])"
    return Script("stress", 1, source, hashlib.sha1(source.encode()).hexdigest())


async def test_random_cancellation_stress(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    rng = random.Random(unique_name)
    script = counter_script(unique_name)
    tallies: dict[str, Tally] = {}
    pipelines: dict[str, int] = {}
    pipeline_base: dict[str, int] = {}

    # A small pool, so transactions (which hold a connection) make tasks wait for connections
    # and cancellations land on pool waiters too.
    async with connect(server_url, max_connections=4, command_timeout=10) as stressed:

        async def setup(key: str, base: int) -> None:
            await client.execute("SET", key, base)

        async def incr_worker(key: str) -> None:
            tally = tallies[key]
            for _ in range(ROUNDS):
                reply = None
                with deadline(rng):
                    reply = await stressed.execute("INCR", key)
                if reply is None:
                    tally.cancelled += 1
                else:
                    check_reply(tally, reply)

        async def script_worker(key: str) -> None:
            tally = tallies[key]
            for _ in range(ROUNDS):
                reply = None
                with deadline(rng):
                    reply = await script(stressed, [key], [])
                if reply is None:
                    tally.cancelled += 1
                else:
                    check_reply(tally, reply)

        async def transaction_worker(key: str) -> None:
            tally = tallies[key]
            for _ in range(ROUNDS):
                reply = None
                with deadline(rng):
                    async with stressed.transaction() as tx:
                        pending = tx.queue("INCR", key)
                        assert await tx.commit()
                    reply = pending.result()
                if reply is None:
                    tally.cancelled += 1
                else:
                    check_reply(tally, reply)

        async def pipeline_worker(key: str) -> None:
            base = pipeline_base[key]
            for _ in range(ROUNDS):
                replies = None
                with deadline(rng):
                    # the call itself always completes: pipelines are shielded
                    pipelines[key] += 1
                    replies = await stressed.pipeline([("INCR", key), ("INCR", key), ("GET", key)])
                    await anyio.lowlevel.checkpoint()
                if replies is not None:
                    expected = base + 2 * pipelines[key]
                    assert replies == [expected - 1, expected, str(expected).encode()]

        kinds = {
            "incr": incr_worker,
            "script": script_worker,
            "transaction": transaction_worker,
            "pipeline": pipeline_worker,
        }
        workers = []
        for i in range(20):
            key = f"{unique_name}:{i}"
            base = (i + 1) * 1_000_000
            await setup(key, base)
            kind = ("incr", "incr", "script", "transaction", "pipeline")[i % 5]
            if kind == "pipeline":
                pipelines[key] = 0
                pipeline_base[key] = base
            else:
                tallies[key] = Tally(base=base, last=base)
            workers.append((kinds[kind], key))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for worker, key in workers:
                    tg.start_soon(worker, key)

        # the stressed client still works, on every kind of call
        with anyio.fail_after(10):
            assert await stressed.execute("PING") == b"PONG"
            assert await stressed.pipeline([("PING",), ("PING",)]) == [b"PONG", b"PONG"]
            async with stressed.transaction() as tx:
                ping = tx.queue("PING")
                assert await tx.commit()
            assert ping.result() == b"PONG"

    cancelled = sum(t.cancelled for t in tallies.values())
    assert cancelled > 20, "the stress test cancelled too little to mean anything"
    assert sum(t.ok for t in tallies.values()) > 20
    for key, tally in tallies.items():
        final = int(await client.execute("GET", key))
        assert tally.base + tally.ok <= final <= tally.base + tally.ok + tally.cancelled, key
    for key, calls in pipelines.items():
        # every pipeline ran exactly once, even when its caller was cancelled
        assert int(await client.execute("GET", key)) == pipeline_base[key] + 2 * calls


async def test_cancelled_pipeline_completes_and_spares_other_commands(
    client: RedisClient, unique_name: str
) -> None:
    key = f"{unique_name}:piped"
    # large enough that the pipeline outlives the 2 ms deadline on a fast, idle machine too
    size = 20000
    others: list[int] = []

    async def other(i: int) -> None:
        for j in range(50):
            assert await client.execute("INCR", f"{unique_name}:other:{i}") == j + 1
        others.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(other, i)
        started = time.monotonic()
        with anyio.move_on_after(0.002) as scope:
            await client.pipeline([("INCR", key)] * size)
            returned = time.monotonic() - started
            await anyio.lowlevel.checkpoint()  # the cancellation is delivered here
        assert scope.cancelled_caught
        assert returned > 0.002  # the pipeline outlived the deadline: it was shielded
    assert sorted(others) == [0, 1, 2, 3]
    assert await client.execute("GET", key) == str(size).encode()  # ran fully, exactly once


async def test_cancelled_commit_completes_and_spares_other_commands(
    client: RedisClient, unique_name: str
) -> None:
    key = f"{{{unique_name}}}:tx"
    size = 2000
    others: list[int] = []

    async def other(i: int) -> None:
        for j in range(50):
            assert await client.execute("INCR", f"{unique_name}:other:{i}") == j + 1
        others.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(other, i)
        async with client.transaction() as tx:
            pending = [tx.queue("INCR", key) for _ in range(size)]
            order: list[str] = []
            with anyio.CancelScope() as scope:

                async def cancel_mid_commit() -> None:
                    # Runs at its first step, which the scheduler reaches only after commit()
                    # has yielded waiting for its reply (a second checkpoint here would race
                    # the reply on a fast server).
                    order.append("cancelled")
                    scope.cancel()

                tg.start_soon(cancel_mid_commit)
                committed = await tx.commit()
                order.append("returned")
                await anyio.lowlevel.checkpoint()
            assert scope.cancelled_caught
            assert order == ["cancelled", "returned"]  # the commit outlived its cancellation
            assert committed
    assert sorted(others) == [0, 1, 2, 3]
    assert [p.result() for p in pending] == list(range(1, size + 1))
    assert await client.execute("GET", key) == str(size).encode()


async def test_cancelled_commands_never_misdeliver_replies(
    client: RedisClient, unique_name: str
) -> None:
    """ECHO under random cancellation: a reply that arrives always belongs to its caller."""
    rng = random.Random(unique_name)
    received = 0

    async def echo_worker(i: int) -> None:
        nonlocal received
        for j in range(60):
            token = f"{unique_name}:{i}:{j}"
            reply = None
            with deadline(rng):
                reply = await client.execute("ECHO", token)
            if reply is not None:
                assert reply == token.encode()
                received += 1

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(echo_worker, i)
    assert received > 50
    assert await client.execute("ECHO", "after") == b"after"
