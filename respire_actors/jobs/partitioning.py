"""How a partitioned job queue routes a job to a partition, and how producers and workers agree
on the partition count.

Routing is ``zlib.crc32(ordering_key.encode("utf-8")) % partitions``: CRC-32 (IEEE 802.3, the
one ``zlib``, ``binascii``, Java's ``java.util.zip.CRC32`` and Go's ``hash/crc32.ChecksumIEEE``
compute) of the UTF-8 bytes of the ordering key, which defaults to the job id. It is stable
across processes, Python versions and languages (never Python's randomized ``hash()``), so every
producer sends one key to one partition, and a repeated job id is deduplicated there.

The count is recorded in Redis (``{respire-job:<name>}:partitions``) by the first producer or
worker and compared by every later one; a different count raises
:class:`~respire_actors.errors.PartitionCountMismatch` instead of misrouting.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

from ..actors._util import text
from ..errors import (
    PartitionCountMismatch,
    PermissionDenied,
    RedisUnavailable,
    ServerLoading,
    ValidationError,
)
from ..keys import MAX_PARTITIONS, JobQueueKeys, partition_name, partitions_key, validate_name
from ..redis.client import RedisClient
from ..redis.scripts import load, run_many
from .options import validate_job_id

_PARTITIONS = load("job_partitions")
_PROBE = load("partition_probe")
_TRANSIENT = (RedisUnavailable, ServerLoading)
R = TypeVar("R")


async def run_all(
    calls: Sequence[Callable[[], Awaitable[R]]],
) -> tuple[list[Any], dict[int, Exception]]:
    """Run the calls concurrently (the client pipelines them), every call to its end: their
    results (None where one failed) and the failures by index. One partition's error never
    cancels another's in-flight script call."""
    out: list[Any] = [None] * len(calls)
    failures: dict[int, Exception] = {}

    async def one(i: int) -> None:
        try:
            out[i] = await calls[i]()
        except Exception as exc:
            failures[i] = exc

    if len(calls) == 1:
        await one(0)
    else:
        async with anyio.create_task_group() as tg:
            for i in range(len(calls)):
                tg.start_soon(one, i)
    return out, failures


def validate_partitions(partitions: object) -> int:
    """A partition count: an int from 1 to :data:`~respire_actors.keys.MAX_PARTITIONS`, else
    :class:`ValidationError`."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ValidationError(f"partitions must be an int, got {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValidationError(
            f"partitions must be from 1 to {MAX_PARTITIONS}, got {partitions} (it is fixed per "
            "queue: choose it for the parallelism you may need, not the worker count)"
        )
    return partitions


def partition_of(ordering_key: str, partitions: int) -> int:
    """The partition (0-based) of ``ordering_key`` among ``partitions``: CRC-32 of its UTF-8
    bytes, modulo the count. Raises :class:`ValidationError` for a key that is not a nonblank
    str of valid Unicode (the job id rules) or a bad count."""
    validate_partitions(partitions)
    validate_job_id(ordering_key, what="ordering key")
    return zlib.crc32(ordering_key.encode("utf-8")) % partitions


def partition_names(name: str, partitions: int) -> tuple[str, ...]:
    """The queue names a partitioned queue uses: ``name`` itself (where the count is
    recorded) and every partition ``name:p<i>``; e.g. for
    ``respire_actors.acl.acl_rules(role, partition_names("orders", 16))``."""
    validate_name(name)
    validate_partitions(partitions)
    return (name, *(partition_name(name, i) for i in range(partitions)))


async def verify_partition_count(
    client: RedisClient,
    name: str,
    partitions: int,
    *,
    record: bool = True,
    copy: bool = False,
    first: str = "enqueue",
) -> bool:
    """:func:`check_partition_count`, surviving the loss of the count key's node.

    The count is kept twice: under the queue's own name (the record) and, once a producer or
    worker has confirmed it, in a copy in every partition's slot
    (``{respire-job:<name>:p<i>}:partitions``). When the record's node cannot be reached,
    the copies of the partitions on the other nodes answer instead: one that matches verifies
    the count (all copies hold the recorded one), one that differs raises
    :class:`PartitionCountMismatch`, and with no copy reachable the record's error is raised.
    So one node's outage stops only the partitions it holds, for a producer or observer
    started during it too. The copies are written by whoever records the count, and with
    ``copy`` (a worker at start) by whoever confirms it: one pipelined call per partition,
    too many for every producer object. ``first`` names what the caller does first
    (``enqueue``, ``schedule`` or ``worker``): before recording a count, it is checked that
    the caller may do that on every partition."""
    try:
        status = await _check(client, name, partitions, record=record, first=first)
    except _TRANSIENT as exc:
        if await _verify_by_copies(client, name, partitions):
            return True
        raise exc from None
    if status == "stored" or (status == "match" and copy):
        await _write_copies(client, name, partitions)
    return status != "absent"


def _copy_key(client: RedisClient, name: str, index: int) -> str:
    return partitions_key(partition_name(name, index), client.key_prefix)


async def _verify_by_copies(client: RedisClient, name: str, partitions: int) -> bool:
    calls = [(_PARTITIONS, (_copy_key(client, name, i),), ("get",)) for i in range(partitions)]
    for i, reply in enumerate(await run_many(client, calls, per_node_errors=True)):
        if isinstance(reply, BaseException):
            if isinstance(reply, _TRANSIENT):
                continue
            raise reply
        if text(reply[0]) == "match":
            _compare(name, partitions, int(reply[1]), _copy_key(client, name, i))
            return True
    return False


async def _write_copies(client: RedisClient, name: str, partitions: int) -> None:
    """Copy the count the record holds (just confirmed) into every partition's slot,
    replacing a copy an earlier count left there (a migration deletes only the record); nodes
    that cannot be reached are passed over: a later start copies it there."""
    calls = [
        (_PARTITIONS, (_copy_key(client, name, i),), ("set", partitions)) for i in range(partitions)
    ]
    for reply in await run_many(client, calls, per_node_errors=True):
        if isinstance(reply, BaseException) and not isinstance(reply, _TRANSIENT):
            raise reply


def _compare(name: str, partitions: int, stored: int, key: str) -> None:
    if stored != partitions:
        raise PartitionCountMismatch(
            f"partitioned queue {name!r} has {stored} partitions recorded in Redis ({key}), "
            f"but this process was configured with {partitions}: a job would go to a "
            "partition the other side does not read. Use the recorded count, or migrate the "
            "queue (docs/partitions.md#changing-the-partition-count)",
            queue=name,
            configured=partitions,
            stored=stored,
        )


async def check_partition_count(
    client: RedisClient, name: str, partitions: int, *, record: bool = True, first: str = "enqueue"
) -> bool:
    """Record ``partitions`` as queue ``name``'s count, or compare it with the recorded one.
    Before recording it checks that this client may write every partition (a producer whose
    ACL user lacks them is refused with nothing recorded). With ``record=False`` only compare
    (nothing is written; a queue with no recorded count passes). Returns whether a count is
    recorded now. Raises :class:`PartitionCountMismatch` when they differ."""
    return await _check(client, name, partitions, record=record, first=first) != "absent"


async def _check(
    client: RedisClient, name: str, partitions: int, *, record: bool, first: str = "enqueue"
) -> str:
    """:func:`check_partition_count`, returning ``absent``, ``stored`` (recorded now) or
    ``match``."""
    key = partitions_key(name, client.key_prefix)
    reply = await _PARTITIONS(client, (key,), ("get",))
    if record and text(reply[0]) == "absent":
        # first of all: may this client write the partitions? A refused producer must not
        # leave a count behind that later ones would have to match
        await _probe_partitions(client, name, partitions, first)
        reply = await _PARTITIONS(client, (key,), ("init", partitions))
    status = text(reply[0])
    if status == "absent":
        return status
    _compare(name, partitions, int(reply[1]), key)
    return "stored" if status == "stored" else "match"


PROBE_MODES = ("enqueue", "schedule", "worker", "pause", "backlog")


async def _probe_partitions(client: RedisClient, name: str, partitions: int, first: str) -> None:
    """Raise :class:`~respire_actors.errors.PermissionDenied` unless this client may do
    ``first`` (see :data:`PROBE_MODES`) on every partition: every command the first script
    needs (one pipelined round trip, nothing written)."""
    if first not in PROBE_MODES:
        raise ValueError(f"unknown first operation {first!r}")
    calls = []
    keys = [JobQueueKeys(partition_name(name, i), client.key_prefix) for i in range(partitions)]
    for k in keys:
        calls.append(
            (_PROBE, (k.ready, k.control, k.dedup("probe"), k.scheduled, k.due, k.events), (first,))
        )
    for i, reply in enumerate(await run_many(client, calls)):
        if isinstance(reply, PermissionDenied) and not reply.command:
            # the server refused a key before the probe ran: say which partition's
            raise PermissionDenied(
                f"{reply} (partition {i} of {name!r}: keys {keys[i].ready} and the rest of"
                f" its hash tag; grant the key pattern of every partition, see"
                f" docs/security.md)",
                reply.command,
            ) from reply
        if isinstance(reply, BaseException):
            raise reply


__all__ = [
    "run_all",
    "verify_partition_count",
    "check_partition_count",
    "partition_names",
    "partition_of",
    "validate_partitions",
]
