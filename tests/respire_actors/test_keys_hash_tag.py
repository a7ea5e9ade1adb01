"""An empty hash tag does not count: Redis Cluster hashes such a key whole.

keys.py hash_tag: "The part of key Redis Cluster hashes (the first non-empty {...}, else all)".
StreamWorker.register: "ConfigurationError for a dead-letter stream that ... hashes to another
cluster slot (checked on every server, so a configuration that works on a single node also works
on a cluster)". With "{}" keys the two streams hash whole, to different slots; treating the empty
tag as a shared tag lets the registration through and the dead-letter write fails later with
CROSSSLOT on a cluster. No test gives hash_tag / same_slot a key starting with "{}".

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.errors import ConfigurationError
from respire_actors.keys import hash_tag, same_slot
from respire_actors.streams import StreamWorker, StreamWorkerOptions


def test_an_empty_tag_hashes_the_whole_key() -> None:
    assert hash_tag("{}orders") == "{}orders"
    assert hash_tag("{}{orders}") == "{}{orders}"  # Redis does not look past an empty tag
    assert hash_tag("{orders}:dead") == "orders"
    assert not same_slot("{}orders", "{}orders:dead")


def test_a_dead_letter_stream_behind_an_empty_tag_is_refused() -> None:
    async def handler(entry: object) -> None:
        return None

    worker = StreamWorker()
    with pytest.raises(ConfigurationError):
        worker.register(
            "{}orders", handler, StreamWorkerOptions(dead_letter_stream="{}orders:dead")
        )
