"""A group-lease release that finds its lease no longer held is not a stale outcome.

actors/completer.py commit(): "A ``release`` (a grouped delivery that failed and stays pending
gives back its group lease) reports 1 released or 0 not held", and the count of stale outcomes
skips it ("a lease no longer held is not a stale outcome"): stale_completions counts outcomes
the fence rejected (docs/job-queue.md: "the late outcome is rejected
(`statistics().stale_completions`)"). No test commits a release that holds nothing through the
completer, so counting it as stale goes unnoticed.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from respire_actors.actors.completer import commit
from respire_actors.actors.messages import Completion
from respire_actors.actors.runtime import QueueRuntime
from respire_actors.jobs import JobEnqueueOptions, JobQueue
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_a_release_of_a_lost_lease_counts_nothing(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    await queue.set_group_options("g", max_concurrency=2, lease_duration=timedelta(minutes=5))
    await queue.enqueue_scheduled("a", "1", JobEnqueueOptions(group="g"))
    keys = JobQueueKeys(queue.name, client.key_prefix)
    src = JobSource(client, keys, keys.dead, CONSUMER_GROUP, selection_batch=64)
    await src.ensure_group("fail")
    (old,) = (await src.read("c1", 1, 0)).deliveries
    assert old.group == "g"
    # recovered by c2: the new attempt holds the group lease now
    (new,) = (await src.claim("c2", "recover", "0-0", 10, 0, 0)).deliveries
    assert new.entry_id == old.entry_id
    rt = make_runtime(queue.name, consumer="c1")
    assert await commit(rt, [Completion(old, "release")]) == [0]  # not held
    assert (rt.stats.stale_completions, rt.stats.group_releases) == (0, 0)
    assert rt.stats.rejected_completions == 0
    assert (await queue.get_group("g")).running == 1  # c2's lease untouched
