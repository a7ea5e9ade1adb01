"""Added after a mutation review: a recovery pass asks for at most recovery_page_size x
recovery_max_pages entries, also when free permits shrank an earlier page (sweeper.py: the
last page asks only for what is left of the budget)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import create_group, deliver, fast_options, wait_until
from sched_helpers import sched_options, scheduling_worker
from test_jobs_recovery_bounds import recovery_passes

from respire_actors.jobs import Job, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_no_recovery_pass_claims_more_than_its_budget_with_partial_pages(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    stale = 90
    await queue.enqueue_many([(f"s{i}", "x") for i in range(stale)])
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "crashed", stale)
    await anyio.sleep(0.4)  # idle past the visibility timeout below

    async def handler(job: Job[str]) -> Any:
        await anyio.sleep(0.001)
        return None

    # 3 permits, pages of up to 4: pages are shrunk by free permits (3, 3, ...), so the
    # pass's last page must ask for less than a page to stay within 4 x 2 = 8
    options = fast_options(
        consumer_count=3,
        visibility_timeout=timedelta(milliseconds=300),
        recovery_page_size=4,
        recovery_max_pages=2,
        recovery_interval=timedelta(milliseconds=100),
    )
    with recovery_passes() as passes:
        async with scheduling_worker(
            client, queue.name, handler, queue_options=sched_options(), options=options
        ) as worker:
            stats = worker.statistics(queue.name)
            await wait_until(lambda: stats.recovered >= stale, timeout=30)
    assert passes and max(claimed for claimed, _ in passes) <= 8, passes
