"""The client key prefix: validated so it cannot break a queue's hash tag, and applied to every
key every role writes (script KEYS included)."""

from __future__ import annotations

import pytest
import role_paths
from helpers.keyspace import release_keys

from respire_actors.errors import ConfigurationError
from respire_actors.keys import JobQueueKeys, hash_tag, job_queue_key_pattern, queue_registry
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("prefix", ["{}", "{}{tenant}:", "a{}:", "{tenant", "x{"])
def test_a_prefix_that_breaks_the_hash_tag_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match="hash tag"):
        ConnectionSettings(key_prefix=prefix)
    with pytest.raises(ConfigurationError):
        ConnectionSettings.from_url(f"redis://127.0.0.1?key_prefix={prefix}")
    with pytest.raises(ConfigurationError):
        JobQueueKeys("q", prefix)


@pytest.mark.parametrize("prefix", ["", "app:", "{tenant-7}:", "{t}:{x}", "a}b:", "t[1]*:"])
def test_a_prefix_keeps_every_key_of_a_queue_in_one_slot(prefix: str) -> None:
    keys = JobQueueKeys("q", prefix)
    names = [keys.ready, keys.dedup("a"), keys.logs("b"), keys.group_policy, keys.recurring]
    assert all(name.startswith(prefix) for name in names)
    assert len({hash_tag(name) for name in names}) == 1


def test_a_prefix_must_be_a_string() -> None:
    with pytest.raises(ConfigurationError):
        ConnectionSettings(key_prefix=7)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ConnectionSettings(key_prefix="x" * 513)


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "hash-tagged"])
async def test_every_role_writes_only_prefixed_keys(
    client: RedisClient, server_url: str, unique_name: str, tagged: bool
) -> None:
    prefix = f"{{{unique_name}-p}}:" if tagged else f"{unique_name}-p:"
    async with connect(server_url, key_prefix=prefix) as prefixed:
        try:
            for path in (
                role_paths.producer_path,
                role_paths.scheduler_path,
                role_paths.worker_path,
                role_paths.observer_path,
                role_paths.operator_path,
            ):
                await path(prefixed, unique_name)
            found: list[bytes] = []
            cursor: object = b"0"
            while True:
                cursor, batch = await client.execute(
                    "SCAN", cursor, "MATCH", f"*{unique_name}*", "COUNT", 1000
                )
                found += batch
                if cursor in (b"0", 0, "0"):
                    break
            names = [k.decode() for k in found]
            assert len(names) > 10  # the paths wrote the queue's keys...
            assert all(n.startswith(prefix) for n in names), names  # ...all of them prefixed
            # the queue registry (workers register their queues) is the one shared key
            assert queue_registry(prefix) in names
            names.remove(queue_registry(prefix))
            pattern = job_queue_key_pattern(unique_name, prefix).replace("\\", "")
            assert all(n.startswith(pattern[:-1]) for n in names)
            assert len({hash_tag(n) for n in names}) == 1  # one cluster slot
        finally:
            await release_keys(client, f"*{unique_name}*")
