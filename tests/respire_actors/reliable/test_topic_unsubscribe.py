"""remove_subscription keeps the subscription's dead letters unless asked to delete them.

docs/topics.md: "`await topic.remove_subscription(name, delete_dead_letters=False)` destroys it
... Its dead letters are kept unless you ask otherwise." topic_unsubscribe-4.lua: "destroy the
group and its metadata (optionally the dead letters)". No test removes a subscription that has
dead letters, so a script that always deletes them passes the suite.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableTopic

pytestmark = pytest.mark.anyio


async def test_dead_letters_outlive_the_subscription_by_default(
    client: RedisClient, unique_name: str
) -> None:
    topic = ReliableTopic(client, unique_name, StrCodec())
    await topic.create_subscription("s", start="tail")
    dead = topic.subscription("s").dead_letter_stream_key
    await client.execute("XADD", dead, "*", "f", "v")  # a dead letter of subscription s
    assert await topic.remove_subscription("s") is True
    assert await client.execute("XLEN", dead) == 1  # kept
    # asked explicitly: deleted
    await topic.create_subscription("s", start="tail")
    assert await topic.remove_subscription("s", delete_dead_letters=True) is True
    assert await client.execute("EXISTS", dead) == 0
