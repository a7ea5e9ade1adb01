"""One read makes at most 64 group visits (JobSource.MAX_GROUP_VISITS).

docs/groups.md: "A read with `n` free runners makes up to `n` selections (one per visit),
stopping early when a whole lap of the rotation dispatched nothing or after 64 visits."
job_select-10.lua: "ARGV[7] most group visits this call may make". The existing tests never
offer more than 64 selectable groups to one read, so an off-by-one in the budget (65 visits)
goes unnoticed.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobEnqueueOptions, JobQueue
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import MAX_GROUP_VISITS, JobSource
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_a_read_stops_after_the_visit_budget(client: RedisClient, unique_name: str) -> None:
    assert MAX_GROUP_VISITS == 64
    queue = JobQueue(client, unique_name, StrCodec())
    groups = [f"g{i:03d}" for i in range(MAX_GROUP_VISITS + 6)]
    for g in groups:
        await queue.enqueue_scheduled(f"{g}-job", "p", JobEnqueueOptions(group=g))
    keys = JobQueueKeys(unique_name, client.key_prefix)
    src = JobSource(client, keys, keys.dead, CONSUMER_GROUP, selection_batch=64)
    await src.ensure_group("fail")
    first = (await src.read("c1", len(groups), 0)).deliveries
    assert len(first) == MAX_GROUP_VISITS  # one selection per visit, 64 visits
    assert [d.group for d in first] == groups[:MAX_GROUP_VISITS]
    rest = (await src.read("c1", len(groups), 0)).deliveries
    assert [d.group for d in rest] == groups[MAX_GROUP_VISITS:]
