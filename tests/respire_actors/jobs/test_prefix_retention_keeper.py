"""Mutation-testing gap: the retention keeper honours the client's key prefix .

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from jobs_helpers import fast_options, running_worker, wait_until_async

from respire_actors.codecs import StrCodec
from respire_actors.jobs import Job, JobQueue, Retention
from respire_actors.redis.client import RedisClient, connect

SHORT = Retention(max_age=timedelta(milliseconds=300), interval=timedelta(milliseconds=50))


@pytest.mark.anyio
async def test_keeper_trims_the_prefixed_queue(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    async with connect(server_url, key_prefix=f"{unique_name}-p:") as prefixed:
        queue = JobQueue(prefixed, unique_name, StrCodec())
        assert queue.keys.ready.startswith(f"{unique_name}-p:")

        async def handler(job: Job[str]) -> Any:
            return None

        await queue.enqueue_many([(f"j{i}", "ok") for i in range(20)])
        async with running_worker(
            prefixed, queue.name, handler, options=fast_options(retention=SHORT)
        ) as worker:

            async def trimmed() -> bool:
                return int(await client.execute("XLEN", queue.keys.ready)) == 0

            await wait_until_async(trimmed, timeout=15)
            stats = worker.keeper_statistics(queue.name)
        assert stats.removed["ready"] == 20
