"""A subscription's lifecycle: re-creating one clears what an earlier one of that name left
behind; removing one keeps its dead letters unless asked.

Creating a subscription clears metadata left behind by an earlier one of that name.

docs/topics.md (script table): "`topic_subscribe-3` ... create the group at `0` or `$` unless
it exists; clear stale metadata", and "Re-creating the name starts afresh." Metadata outlives
its group when the topic stream itself is deleted (the group goes with the stream) while a
delivery was in flight. No test creates a subscription over leftover deadlines/receipts, so a
script that no longer clears them passes the suite; the leftovers then feed the new
subscription's recovery with leases of messages it never delivered.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableTopic

pytestmark = pytest.mark.anyio


async def test_a_recreated_subscription_starts_without_old_leases(
    client: RedisClient, unique_name: str
) -> None:
    topic = ReliableTopic(client, unique_name, StrCodec())
    keys = topic._keys
    deadlines, receipts = keys.subscription("s", "deadlines"), keys.subscription("s", "receipts")
    await topic.create_subscription("s", start="tail")
    await topic.publish("a")
    (leased,) = await topic.subscription("s").receive(timedelta(minutes=5))
    assert await client.execute("EXISTS", deadlines) + await client.execute("EXISTS", receipts) >= 1
    await client.execute("DEL", keys.stream)  # the stream, and with it the group, is gone
    assert await topic.create_subscription("s", start="beginning") is True
    assert await client.execute("EXISTS", deadlines, receipts) == 0
    # the old receipt does not complete anything in the new subscription
    assert await topic.subscription("s").ack(leased) is False


async def test_dead_letters_outlive_the_subscription_by_default(
    client: RedisClient, unique_name: str
) -> None:
    """remove_subscription keeps the subscription's dead letters unless asked to delete them.

    docs/topics.md: "`await topic.remove_subscription(name, delete_dead_letters=False)` destroys it
    ... Its dead letters are kept unless you ask otherwise." topic_unsubscribe-4.lua: "destroy the
    group and its metadata (optionally the dead letters)". No test removes a subscription that has
    dead letters, so a script that always deletes them passes the suite."""
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
