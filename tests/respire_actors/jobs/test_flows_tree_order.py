"""flow_enqueue refuses a tree whose parent indexes decrease (not breadth-first).

flow_enqueue-5.lua: "parent index (0 for node 1, the root; else 1 .. own index - 1, never
decreasing from one node to the next)"; "Errors (nothing written): ... RESPIRE_ARGUMENT
(malformed tree, ...)". The existing script test only sends trees whose parents are not
before their children; a tree listed depth-first (every parent still before its children) is
accepted when the ordering check is removed (the stored node indexes then no longer match the
documented 1-based breadth-first numbering that Job.flow_node and flow_results report).

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from typing import Any

import pytest

from respire_actors.errors import ServerError
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio


async def test_a_depth_first_listing_is_refused_and_writes_nothing(
    client: RedisClient, queue: JobQueue[Any]
) -> None:
    script = load("flow_enqueue")
    k = queue.keys
    keys = (k.ready, k.flow("f"), k.coordinated, k.control, k.scheduled)
    # root -> (a -> a1, b): depth-first order root, a, a1, b has parents 0, 1, 2, 1
    depth_first = ("f", "fail-parent", 4, "root", 0, "p", "a", 1, "p", "a1", 2, "p", "b", 1, "p")
    with pytest.raises(ServerError) as caught:
        await script(client, keys, depth_first)
    assert (
        "RESPIRE_ARGUMENT" in str(caught.value)
        or getattr(caught.value, "code", "") == "RESPIRE_ARGUMENT"
    )
    assert await client.execute("EXISTS", k.flow("f"), k.ready, k.coordinated) == 0
