"""remove_flow must refuse a flow whose nodes are only 'ready' (no 'waiting' node).

docs/flows.md: "remove_flow(flow_id) ... raises FlowActive (deleting nothing) while any node is
`waiting` or `ready`." The existing test only covers a tree with waiting parents.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.errors import FlowActive
from respire_actors.jobs import FlowNode, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_a_flow_of_ready_nodes_only_is_active(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    # a single-node flow: its only node is a ready leaf, nothing waits
    assert await queue.enqueue_flow("solo", FlowNode("only", "x")) is True
    assert [n.status for n in await queue.flow_results("solo")] == ["ready"]
    with pytest.raises(FlowActive):
        await queue.remove_flow("solo")
    assert await client.execute("EXISTS", queue.keys.flow("solo")) == 1
    # and the id still deduplicates: the flow was not deleted
    assert await queue.enqueue_flow("solo", FlowNode("other", "y")) is False
