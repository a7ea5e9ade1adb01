"""Where a job queue keeps its data (spec: "Storage and delivery guarantees")."""

from __future__ import annotations

import hashlib
import re

import pytest
from jobs_helpers import fast_options, running_worker, text, wait_until

from respire_actors.codecs import StrCodec
from respire_actors.errors import WrongKeyType
from respire_actors.jobs import ACK, DeadLetter, Job, JobQueue, Outcome
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio


async def keys_matching(client: RedisClient, pattern: str) -> set[str]:
    found: set[str] = set()
    cursor: object = b"0"
    while True:
        cursor, batch = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 10000)
        found |= {text(k) for k in batch}
        if text(cursor) == "0":
            return found


async def test_key_layout(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue_many([("ok", "x"), ("bad", "y")])

    async def handler(job: Job[str]) -> Outcome:
        assert await job.log("hello")
        return ACK if job.id == "ok" else DeadLetter()

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1 and stats.dead_lettered == 1)

    base = f"{{respire-job:{queue.name}}}"
    sha = {j: hashlib.sha256(j.encode()).hexdigest() for j in ("ok", "bad")}
    assert await keys_matching(client, f"*{queue.name}*") == {
        f"{base}:ready",
        f"{base}:dead",
        f"{base}:events",
        f"{base}:control",  # group.created: the worker created this queue's consumer group
        f"{base}:dedup:{sha['ok']}",
        f"{base}:dedup:{sha['bad']}",
        f"{base}:logs:{sha['ok']}",
        f"{base}:logs:{sha['bad']}",
    }
    assert queue.keys.ready == f"{base}:ready"


async def test_a_key_prefix_applies_to_every_key(
    server_url: str, client: RedisClient, unique_name: str
) -> None:
    prefix = f"{unique_name}-tenant:"
    async with connect(server_url, key_prefix=prefix) as prefixed:
        queue = JobQueue(prefixed, "email", StrCodec())
        assert queue.keys.ready == f"{prefix}{{respire-job:email}}:ready"
        await queue.enqueue("j", "x")
        done: list[str] = []

        async def handler(job: Job[str]) -> Outcome:
            assert await job.report_progress(50)
            done.append(job.payload)
            return ACK

        async with running_worker(prefixed, "email", handler, options=fast_options()) as worker:
            await wait_until(lambda: worker.statistics("email").acked == 1)
        async with queue.read_events() as reader:
            kinds = [(await reader.__anext__()).kind for _ in range(2)]

    assert done == ["x"] and kinds == ["progress", "completed"]
    found = await keys_matching(client, f"*{unique_name}*")
    assert found and all(k.startswith(prefix) for k in found)
    assert f"{prefix}{{respire-job:email}}:events" in found


async def test_a_key_of_the_wrong_type_is_named_by_reads_and_pipelines(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A plain WRONGTYPE reply names no key: the client adds the command's keys, so the
    queue's read methods (not only its scripts) say which key is in the way."""
    await client.execute("SET", queue.keys.dead, "not a stream")
    await client.execute("SET", queue.keys.control, "not a hash")
    with pytest.raises(WrongKeyType, match=rf"XRANGE on '{re.escape(queue.keys.dead)}'") as dead:
        await queue.read_dead_letters()
    assert dead.value.code == "WRONGTYPE"
    with pytest.raises(WrongKeyType, match=rf"HMGET on '{re.escape(queue.keys.control)}'"):
        await queue.get_state()
    wrong, pong = await client.pipeline([("XLEN", queue.keys.dead), ("PING",)])
    assert isinstance(wrong, WrongKeyType) and queue.keys.dead in str(wrong)
    assert pong == b"PONG"
