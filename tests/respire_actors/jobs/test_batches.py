"""Batches without a worker: create / add / seal / cancel / status / remove through JobQueue on
both servers and backends, every limit and bad input (typed errors, nothing sent or nothing
written), the schema version check, preflight (wrong types, ACL) and removal rules. Member
completions and callbacks with real workers are in test_batches_worker.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from jobs_helpers import all_events, fields_of, forbid_commands, text

from respire_actors.codecs import JsonCodec, StrCodec
from respire_actors.errors import (
    BatchActive,
    BatchLimitExceeded,
    BatchSealed,
    PermissionDenied,
    UnknownBatch,
    UnsupportedSchema,
    ValidationError,
    WrongKeyType,
)
from respire_actors.jobs import BatchStatus, Callback, JobQueue
from respire_actors.jobs.batches import MAX_BYTES, MAX_MEMBERS, cancellation_requested
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio

CALLBACKS = dict(
    on_success=Callback("cb-ok", "success"),
    on_failure=Callback("cb-fail", "failure"),
    on_complete=Callback("cb-done", "complete"),
)


async def ready_entries(queue: JobQueue[Any]) -> list[dict[str, bytes]]:
    rows = await queue.client.execute("XRANGE", queue.keys.ready, "-", "+")
    return [fields_of(flat) for _, flat in rows or []]


async def ready_ids(queue: JobQueue[Any]) -> list[str]:
    return [text(e["_respire.job.id"]) for e in await ready_entries(queue)]


async def raw_state(queue: JobQueue[Any], batch_id: str) -> bytes | None:
    value = await queue.client.execute("GET", queue.keys.batch(batch_id))
    return None if value is None else bytes(value)


# -- create / add / seal / status -------------------------------------------------------------


async def test_create_add_seal_and_status(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(**CALLBACKS, batch_id="report-42")
    assert batch == "report-42"
    assert await queue.batch_status(batch) == BatchStatus(
        "report-42",
        0,
        0,
        0,
        0,
        sealed=False,
        cancellation_requested=False,
        completed=False,
        members=0,
    )
    assert await queue.add_to_batch(batch, "part-1", "p1") is True
    assert await queue.add_many_to_batch(batch, [("part-2", "p2"), ("part-3", "p3")]) == [
        True,
        True,
    ]
    # members are enqueued at once, each carrying the batch id and nothing else coordinating
    entries = await ready_entries(queue)
    assert [
        (e["_respire.job.id"], e["_respire.job.payload"], e["_respire.batch"]) for e in entries
    ] == [
        (b"part-1", b"p1", b"report-42"),
        (b"part-2", b"p2", b"report-42"),
        (b"part-3", b"p3", b"report-42"),
    ]
    assert await queue.seal_batch(batch) is True
    assert await queue.seal_batch(batch) is False  # idempotent
    status = await queue.batch_status(batch)
    assert status is not None
    assert (status.pending, status.members, status.sealed, status.completed) == (3, 3, True, False)
    # sealing with members pending publishes nothing
    assert await ready_ids(queue) == ["part-1", "part-2", "part-3"]
    assert [e.kind for e in await all_events(queue.client, queue.keys)] == []
    # the marker tells completion scripts that this queue has coordinated jobs
    assert text(await queue.client.execute("GET", queue.keys.coordinated)) == "1"


async def test_generated_ids_are_distinct(queue: JobQueue[str]) -> None:
    a = await queue.create_batch()
    b = await queue.create_batch()
    assert a != b and len(a) == 32
    assert (await queue.batch_status(a)) is not None


async def test_an_existing_member_keeps_its_payload_even_after_sealing(
    queue: JobQueue[str],
) -> None:
    batch = await queue.create_batch(batch_id="b")
    assert await queue.add_to_batch(batch, "m", "first") is True
    assert await queue.add_to_batch(batch, "m", "second") is False
    await queue.seal_batch(batch)
    assert await queue.add_to_batch(batch, "m", "third") is False
    assert await queue.add_many_to_batch(batch, [("m", "fourth")]) == [False]
    with pytest.raises(BatchSealed) as caught:
        await queue.add_to_batch(batch, "new", "x")
    assert caught.value.batch_id == "b"
    entries = await ready_entries(queue)
    assert [e["_respire.job.payload"] for e in entries] == [b"first"]
    assert (await queue.batch_status(batch)).members == 1  # type: ignore[union-attr]


async def test_member_ids_are_independent_of_enqueue_deduplication(queue: JobQueue[str]) -> None:
    await queue.enqueue("same", "plain")
    batch = await queue.create_batch()
    assert await queue.add_to_batch(batch, "same", "member") is True
    other = await queue.create_batch()
    assert await queue.add_to_batch(other, "same", "member of another batch") is True
    assert await ready_ids(queue) == ["same", "same", "same"]


async def test_reusing_an_id_keeps_the_first_callbacks(queue: JobQueue[str]) -> None:
    await queue.create_batch(on_success=Callback("first", "1"), batch_id="b")
    again = await queue.create_batch(
        on_success=Callback("second", "2"), on_complete=Callback("x", "y"), batch_id="b"
    )
    assert again == "b"
    await queue.seal_batch("b")
    assert await ready_ids(queue) == ["first"]


async def test_an_empty_sealed_batch_succeeds_at_once(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    assert await queue.seal_batch(batch) is True
    status = await queue.batch_status(batch)
    assert status is not None and status.completed and status.sealed
    entries = await ready_entries(queue)
    # callbacks are ordinary jobs: no batch field, in order on_success then on_complete
    assert entries == [
        {"_respire.job.id": b"cb-ok", "_respire.job.payload": b"success"},
        {"_respire.job.id": b"cb-done", "_respire.job.payload": b"complete"},
    ]
    (event,) = await all_events(queue.client, queue.keys)
    assert (event.kind, event.batch_id, event.extra.get("outcome")) == (
        "batch-completed",
        batch,
        "succeeded",
    )
    # sealing or cancelling again publishes nothing more and changes nothing
    before = await raw_state(queue, batch)
    assert await queue.seal_batch(batch) is False
    assert await queue.cancel_batch(batch) is False
    assert await raw_state(queue, batch) == before
    assert len(await ready_entries(queue)) == 2


async def test_cancelling_an_empty_open_batch_fails_it(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    assert await queue.cancel_batch(batch) is True
    status = await queue.batch_status(batch)
    assert status is not None
    assert (status.sealed, status.cancellation_requested, status.completed) == (True, True, True)
    assert await ready_ids(queue) == ["cb-fail", "cb-done"]
    (event,) = await all_events(queue.client, queue.keys)
    assert (event.kind, event.batch_id, event.extra.get("outcome")) == (
        "batch-completed",
        batch,
        "failed",
    )


async def test_cancel_is_idempotent_and_seals(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch()
    await queue.add_to_batch(batch, "m", "x")
    assert await queue.cancel_batch(batch) is True
    assert await queue.cancel_batch(batch) is False
    assert await queue.seal_batch(batch) is False
    with pytest.raises(BatchSealed):
        await queue.add_to_batch(batch, "n", "y")
    status = await queue.batch_status(batch)
    assert status is not None
    assert (status.pending, status.cancellation_requested, status.completed) == (1, True, False)
    assert await cancellation_requested(queue.client, queue.keys, batch) is True
    assert await cancellation_requested(queue.client, queue.keys, batch, "m") is True
    # a job that is not a pending member (e.g. a dead-letter replay) is not cancelled
    assert await cancellation_requested(queue.client, queue.keys, batch, "stranger") is False


async def test_sealing_an_open_batch_then_cancelling_requests_cancellation(
    queue: JobQueue[str],
) -> None:
    batch = await queue.create_batch()
    await queue.add_to_batch(batch, "m", "x")
    assert await cancellation_requested(queue.client, queue.keys, batch) is False
    assert await queue.seal_batch(batch) is True
    assert await queue.cancel_batch(batch) is True
    assert await cancellation_requested(queue.client, queue.keys, batch) is True


async def test_unknown_ids(queue: JobQueue[str]) -> None:
    assert await queue.batch_status("nope") is None
    assert await queue.remove_batch("nope") is False
    assert await cancellation_requested(queue.client, queue.keys, "nope") is False
    for call in (queue.seal_batch, queue.cancel_batch):
        with pytest.raises(UnknownBatch) as caught:
            await call("nope")
        assert caught.value.batch_id == "nope"
    with pytest.raises(UnknownBatch):
        await queue.add_to_batch("nope", "m", "x")
    with pytest.raises(UnknownBatch):
        await queue.add_many_to_batch("nope", [("m", "x")])
    assert await queue.client.execute("EXISTS", queue.keys.ready, queue.keys.batch("nope")) == 0


# -- removal ----------------------------------------------------------------------------------


async def test_remove_rules(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(on_success=Callback("ok", "1"), batch_id="b")
    with pytest.raises(BatchActive):  # open
        await queue.remove_batch(batch)
    await queue.add_to_batch(batch, "m", "x")
    await queue.seal_batch(batch)
    with pytest.raises(BatchActive):  # sealed, a member pending
        await queue.remove_batch(batch)
    assert (await queue.batch_status(batch)).pending == 1  # type: ignore[union-attr]

    empty = await queue.create_batch(on_success=Callback("ok-empty", "1"), batch_id="e")
    await queue.seal_batch(empty)
    assert await queue.remove_batch(empty) is True
    assert await queue.remove_batch(empty) is False
    assert await queue.batch_status(empty) is None
    # removal keeps the published callbacks; a removed id starts a new run
    assert await queue.create_batch(on_success=Callback("ok-again", "2"), batch_id="e") == "e"
    assert (await queue.batch_status("e")).completed is False  # type: ignore[union-attr]
    await queue.seal_batch("e")
    assert await ready_ids(queue) == ["m", "ok-empty", "ok-again"]


# -- limits and bad input ---------------------------------------------------------------------


async def test_the_257th_member_is_refused_without_writing(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(batch_id="big")
    added = await queue.add_many_to_batch(batch, [(f"m{i}", "x") for i in range(MAX_MEMBERS)])
    assert all(added) and len(added) == MAX_MEMBERS
    before = await raw_state(queue, batch)
    with pytest.raises(BatchLimitExceeded) as caught:
        await queue.add_to_batch(batch, "m256", "x")
    assert caught.value.limit == "members" and isinstance(caught.value, ValidationError)
    assert await raw_state(queue, batch) == before
    assert len(await ready_entries(queue)) == MAX_MEMBERS
    # an existing member is still just "not new"
    assert await queue.add_to_batch(batch, "m0", "x") is False


async def test_257_members_in_one_call_are_refused_before_sending(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch()
    with forbid_commands(queue.client), pytest.raises(BatchLimitExceeded) as caught:
        await queue.add_many_to_batch(batch, [(f"m{i}", "x") for i in range(MAX_MEMBERS + 1)])
    assert caught.value.limit == "members"


async def test_the_combined_size_limit_is_checked_by_the_script(queue: JobQueue[str]) -> None:
    third = "x" * (MAX_BYTES // 3)
    batch = await queue.create_batch(on_complete=Callback("cb", "y" * 100), batch_id="b")
    assert await queue.add_to_batch(batch, "a", third)
    assert await queue.add_to_batch(batch, "b", third)
    before = await raw_state(queue, batch)
    with pytest.raises(BatchLimitExceeded) as caught:  # the callback's bytes count too
        await queue.add_to_batch(batch, "c", third)
    assert caught.value.limit == "bytes"
    assert await raw_state(queue, batch) == before
    assert await ready_ids(queue) == ["a", "b"]
    # what still fits is accepted: 3 * (MAX_BYTES // 3) + 1 + 1 + 2 + 100 ... minus the callback
    room = MAX_BYTES - 2 * (1 + len(third)) - (2 + 100) - 1
    assert await queue.add_to_batch(batch, "c", "z" * room)
    with pytest.raises(BatchLimitExceeded):
        await queue.add_to_batch(batch, "d", "")


@pytest.mark.parametrize(
    "call",
    [
        "oversize member",
        "oversize many",
        "oversize callbacks",
        "bad batch id",
        "blank batch id",
        "long batch id",
        "bad member id",
        "not a pair",
        "bad callback",
        "bad callback id",
        "unencodable callback",
        "unencodable member",
        "bad status id",
        "bad seal id",
        "bad remove id",
    ],
)
async def test_bad_input_raises_before_anything_is_sent(queue: JobQueue[str], call: str) -> None:
    big = "x" * (MAX_BYTES + 1)
    q: Any = queue
    attempts: dict[str, Any] = {
        "oversize member": lambda: q.add_to_batch("b", "m", big),
        "oversize many": lambda: q.add_many_to_batch(
            "b", [("m1", big[: MAX_BYTES // 2]), ("m2", big[: MAX_BYTES // 2])]
        ),
        "oversize callbacks": lambda: q.create_batch(
            on_success=Callback("a", big[: MAX_BYTES // 2]),
            on_failure=Callback("b", big[: MAX_BYTES // 2]),
        ),
        "bad batch id": lambda: q.create_batch(batch_id=7),
        "blank batch id": lambda: q.add_to_batch("  ", "m", "x"),
        "long batch id": lambda: q.create_batch(batch_id="b" * 1025),
        "bad member id": lambda: q.add_to_batch("b", "", "x"),
        "not a pair": lambda: q.add_many_to_batch("b", ["m"]),
        "bad callback": lambda: q.create_batch(on_success=("id", "payload")),
        "bad callback id": lambda: q.create_batch(on_complete=Callback(b"id", "x")),
        "unencodable callback": lambda: q.create_batch(on_failure=Callback("id", 5)),
        "unencodable member": lambda: q.add_to_batch("b", "m", 5),
        "bad status id": lambda: q.batch_status(None),
        "bad seal id": lambda: q.cancel_batch(""),
        "bad remove id": lambda: q.remove_batch("\ud800"),
    }
    with forbid_commands(queue.client), pytest.raises(ValidationError) as caught:
        await attempts[call]()
    if call.startswith("oversize"):
        assert isinstance(caught.value, BatchLimitExceeded) and caught.value.limit == "bytes"


async def test_callbacks_use_the_queue_codec(client: RedisClient, unique_name: str) -> None:
    queue: JobQueue[dict[str, int]] = JobQueue(client, unique_name, JsonCodec(dict))
    batch = await queue.create_batch(on_complete=Callback("done", {"n": 1}))
    await queue.seal_batch(batch)
    (entry,) = await ready_entries(queue)
    assert entry["_respire.job.payload"] == b'{"n": 1}'


# -- stored state: schema version, wrong types, permissions ----------------------------------


async def test_an_unknown_schema_version_is_refused_without_mutation(
    queue: JobQueue[str],
) -> None:
    key = queue.keys.batch("v2")
    await queue.client.execute(
        "EVAL",
        "redis.call('SET', KEYS[1], cmsgpack.pack({v = 2, id = ARGV[1], m = {}, n = 0, "
        "pending = 0, succeeded = 0, failed = 0, cancelled = 0, bytes = 0, sealed = true, "
        "cancel = false, done = true, outcome = 'succeeded'}))",
        1,
        key,
        "v2",
    )
    stored = await raw_state(queue, "v2")
    calls: list[Any] = [
        lambda: queue.create_batch(batch_id="v2"),
        lambda: queue.add_to_batch("v2", "m", "x"),
        lambda: queue.add_many_to_batch("v2", [("m", "x")]),
        lambda: queue.seal_batch("v2"),
        lambda: queue.cancel_batch("v2"),
        lambda: queue.batch_status("v2"),
        lambda: queue.remove_batch("v2"),
        lambda: cancellation_requested(queue.client, queue.keys, "v2"),
    ]
    for call in calls:
        with pytest.raises(UnsupportedSchema) as caught:
            await call()
        assert caught.value.code == "RESPIRE_SCHEMA"
    assert await raw_state(queue, "v2") == stored
    assert await queue.client.execute("EXISTS", queue.keys.ready, queue.keys.events) == 0


async def test_a_state_of_another_type_is_refused(queue: JobQueue[str]) -> None:
    await queue.client.execute("RPUSH", queue.keys.batch("b"), "squatter")
    for call in (
        lambda: queue.create_batch(batch_id="b"),
        lambda: queue.add_to_batch("b", "m", "x"),
        lambda: queue.seal_batch("b"),
        lambda: queue.batch_status("b"),
        lambda: queue.remove_batch("b"),
    ):
        with pytest.raises(WrongKeyType):
            await call()
    assert await queue.client.execute("LLEN", queue.keys.batch("b")) == 1
    assert await queue.client.execute("EXISTS", queue.keys.ready) == 0


async def test_a_ready_stream_of_another_type_is_refused(queue: JobQueue[str]) -> None:
    batch = await queue.create_batch(on_complete=Callback("cb", "x"))
    before = await raw_state(queue, batch)
    await queue.client.execute("SET", queue.keys.ready, "squatter")
    with pytest.raises(WrongKeyType):
        await queue.add_to_batch(batch, "m", "x")
    with pytest.raises(WrongKeyType):
        await queue.seal_batch(batch)
    assert await raw_state(queue, batch) == before


@asynccontextmanager
async def restricted(
    server_url: str, client: RedisClient, user: str, rule: str
) -> AsyncIterator[RedisClient]:
    await client.execute("ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*", "+@all", rule)
    try:
        async with connect(server_url, username=user, password="pw") as limited:
            yield limited
    finally:
        await client.execute("ACL", "DELUSER", user)


@pytest.mark.parametrize("denied", ["-set", "-xadd", "-xdel"])
async def test_permissions_are_checked_before_writing(
    server_url: str, client: RedisClient, unique_name: str, denied: str
) -> None:
    owner = JobQueue(client, unique_name, StrCodec())
    batch = await owner.create_batch(on_complete=Callback("cb", "x"))
    before = await raw_state(owner, batch)
    async with restricted(server_url, client, unique_name, denied) as limited:
        queue = JobQueue(limited, unique_name, StrCodec())
        with pytest.raises(PermissionDenied):
            await queue.add_to_batch(batch, "m", "x")
        with pytest.raises(PermissionDenied):
            await queue.seal_batch(batch)
        if denied == "-set":
            with pytest.raises(PermissionDenied):
                await queue.create_batch(batch_id="other")
    assert await raw_state(owner, batch) == before
    assert await client.execute("EXISTS", owner.keys.ready, owner.keys.batch("other")) == 0


async def test_removal_needs_del(server_url: str, client: RedisClient, unique_name: str) -> None:
    owner = JobQueue(client, unique_name, StrCodec())
    batch = await owner.create_batch()
    await owner.seal_batch(batch)
    async with restricted(server_url, client, unique_name, "-del") as limited:
        with pytest.raises(PermissionDenied):
            await JobQueue(limited, unique_name, StrCodec()).remove_batch(batch)
    assert await owner.batch_status(batch) is not None


# -- cluster ----------------------------------------------------------------------------------


async def test_batch_keys_share_the_queue_slot_in_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("a", "1"), ("b", "2")])
    assert await queue.cancel_batch(batch) is True
    status = await queue.batch_status(batch)
    assert status is not None and status.pending == 2 and status.cancellation_requested
    slots = {
        int(await cluster_client.execute("CLUSTER", "KEYSLOT", k))
        for k in (queue.keys.batch(batch), queue.keys.coordinated, queue.keys.ready)
    }
    assert len(slots) == 1
