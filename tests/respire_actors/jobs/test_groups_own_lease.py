"""A pending grouped entry's own live lease does not count against its group's concurrency
limit when that entry is recovered or replayed.

lib/group_lease.lua respire_group_check: "entry: the pending entry being recovered, whose own
old lease does not count"; job_claim_pending: "An admitted grouped entry gets a new lease for
its new attempt, replacing the old attempt's lease". Every existing recovery test waits until
the old lease has expired (or another delivery holds the permit), so the exclusion of the
entry's own lease is untested: without it a worker restarted under the same consumer name
cannot replay its own grouped job (max_concurrency=1) until the old lease runs out, and the
replay pass yields as if the group were busy.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobEnqueueOptions, JobQueue
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["replay", "recover"])
async def test_an_entry_holding_its_groups_only_permit_is_claimed_again(
    client: RedisClient, unique_name: str, mode: str
) -> None:
    """Replay (the same consumer restarted) or recovery (another consumer) of the delivery
    that holds the group's only permit: its own lease does not block it, and the new attempt's
    lease replaces the old one."""
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.set_group_options("a", max_concurrency=1, lease_duration=timedelta(minutes=5))
    await queue.enqueue_scheduled("j1", "p", JobEnqueueOptions(group="a"))
    keys = JobQueueKeys(unique_name, client.key_prefix)
    src = JobSource(client, keys, keys.dead, CONSUMER_GROUP, selection_batch=64)
    await src.ensure_group("fail")
    (first,) = (await src.read("c1", 1, 0)).deliveries
    assert (await queue.get_group("a")).running == 1  # its lease is live for 5 minutes
    consumer = "c1" if mode == "replay" else "c2"  # visibility timeout 0: already idle
    page = await src.claim(consumer, mode, "0-0", 10, 0, 0)
    assert [(d.entry_id, d.attempt) for d in page.deliveries] == [(first.entry_id, 2)]
    assert (await queue.get_group("a")).running == 1  # still one permit in use
