"""Parent/child flows, the producer side (issue 11, docs/flows.md): enqueue, permanent flow-id
deduplication, flow_results, remove_flow, every refused tree (typed error, nothing sent) and
the versioned stored schema (an unknown version is refused without mutation)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.keyspace import release_keys
from jobs_helpers import fields_of, forbid_commands, text

from respire_actors.actors.messages import Complete
from respire_actors.codecs import BytesCodec, EncodeError, StrCodec
from respire_actors.errors import (
    FlowActive,
    FlowCycle,
    FlowDuplicateJob,
    FlowSharedNode,
    FlowTooLarge,
    InvalidFlow,
    ResultTooLarge,
    ServerError,
    ValidationError,
    WrongKeyType,
)
from respire_actors.jobs import CONTINUE, IGNORE, FlowNode, FlowNodeResult, JobQueue
from respire_actors.jobs.flows import MAX_FLOW_INPUT_BYTES
from respire_actors.redis.client import RedisClient, connect
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio


def three_levels() -> FlowNode[str]:
    """root -> (a -> (a1, a2), b); breadth-first: root, a, b, a1, a2."""
    return FlowNode(
        "root",
        "r",
        [FlowNode("a", "pa", [FlowNode("a1", "p1"), FlowNode("a2", "p2")]), FlowNode("b", "pb")],
    )


async def ready_entries(client: RedisClient, queue: JobQueue[Any]) -> list[dict[str, bytes]]:
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    return [fields_of(f) for _, f in rows or []]


async def keys_of(client: RedisClient, queue: JobQueue[Any]) -> list[str]:
    found = await client.execute("KEYS", f"*{queue.name}*")
    return sorted(text(k) for k in found)


async def test_enqueue_appends_the_leaves_and_keeps_parents_waiting(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.enqueue_flow("f1", three_levels()) is True

    entries = await ready_entries(client, queue)
    assert [(e["_respire.job.id"], e["_respire.flow.node"]) for e in entries] == [
        (b"b", b"3"),
        (b"a1", b"4"),
        (b"a2", b"5"),
    ]
    assert all(e["_respire.flow"] == b"f1" for e in entries)
    assert [e["_respire.job.payload"] for e in entries] == [b"pb", b"p1", b"p2"]
    assert await queue.flow_results("f1") == [
        FlowNodeResult("root", "waiting", None, None),
        FlowNodeResult("a", "waiting", None, "root"),
        FlowNodeResult("b", "ready", None, "root"),
        FlowNodeResult("a1", "ready", None, "a"),
        FlowNodeResult("a2", "ready", None, "a"),
    ]
    # the state and the marker live in the queue's slot, under the client's prefix
    assert await client.execute("TYPE", queue.keys.flow("f1")) in (b"string", "string")
    assert await client.execute("GET", queue.keys.coordinated) == b"1"


async def test_a_single_node_flow_is_a_ready_leaf(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.enqueue_flow("solo", FlowNode("only", "x"), IGNORE)
    assert [e["_respire.job.id"] for e in await ready_entries(client, queue)] == [b"only"]
    assert await queue.flow_results("solo") == [FlowNodeResult("only", "ready", None)]


async def test_flow_ids_deduplicate_permanently_and_the_first_tree_wins(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.enqueue_flow("f", three_levels()) is True
    before = await client.execute("GET", queue.keys.flow("f"))
    other = FlowNode("x", "y", [FlowNode("z", "w")])
    assert await queue.enqueue_flow("f", other, CONTINUE) is False
    assert await client.execute("GET", queue.keys.flow("f")) == before
    assert len(await ready_entries(client, queue)) == 3
    # independent of ordinary job deduplication
    assert (await queue.enqueue("f", "plain")).enqueued
    assert (await queue.enqueue("root", "plain")).enqueued


async def test_unknown_flow_reads_as_empty_and_removes_as_false(queue: JobQueue[str]) -> None:
    assert await queue.flow_results("nope") == []
    assert await queue.remove_flow("nope") is False


async def test_remove_refuses_an_active_flow_and_deletes_a_finished_one(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue_flow("f", three_levels())
    with pytest.raises(FlowActive):
        await queue.remove_flow("f")
    assert await client.execute("EXISTS", queue.keys.flow("f")) == 1
    # finish every node by rewriting the state's statuses (as completions would)
    await client.execute(
        "EVAL",
        "local st = cmsgpack.unpack(redis.call('GET', KEYS[1]));"
        " st.status = string.rep('c', st.n);"
        " redis.call('SET', KEYS[1], cmsgpack.pack(st))",
        1,
        queue.keys.flow("f"),
    )
    assert await queue.remove_flow("f") is True
    assert await client.execute("EXISTS", queue.keys.flow("f")) == 0
    assert await queue.remove_flow("f") is False
    # a removed id can be enqueued again
    assert await queue.enqueue_flow("f", FlowNode("again", "x")) is True


async def test_the_key_prefix_and_hash_tag_are_respected(server_url: str, unique_name: str) -> None:
    async with connect(server_url, key_prefix=f"{unique_name}:") as prefixed:
        try:
            queue = JobQueue(prefixed, "reports", StrCodec())
            await queue.enqueue_flow("f", three_levels())
            assert queue.keys.flow("f").startswith(f"{unique_name}:{{respire-job:reports}}:flow:")
            assert await prefixed.execute("EXISTS", queue.keys.flow("f")) == 1
            assert await prefixed.execute("EXISTS", queue.keys.coordinated) == 1
            assert await prefixed.execute("XLEN", queue.keys.ready) == 3
        finally:
            await release_keys(prefixed, f"*{unique_name}*")


# -- refused before anything is sent ---------------------------------------------------------


def cyclic() -> FlowNode[str]:
    root = FlowNode[str]("root", "r", [])
    child = FlowNode[str]("child", "c", [root])
    root.children = [child]
    return root


def self_parent() -> FlowNode[str]:
    root = FlowNode[str]("root", "r", [])
    root.children = [root]
    return root


def shared() -> FlowNode[str]:
    leaf = FlowNode("leaf", "l")
    return FlowNode("root", "r", [FlowNode("a", "a", [leaf]), FlowNode("b", "b", [leaf])])


def wide(n: int) -> FlowNode[str]:
    return FlowNode("root", "r", [FlowNode(f"c{i}", "p") for i in range(n - 1)])


def deep(n: int) -> FlowNode[str]:
    node = FlowNode(f"n{n - 1}", "p")
    for i in range(n - 2, -1, -1):
        node = FlowNode(f"n{i}", "p", [node])
    return node


DEFAULT: Any = object()  # leave failure_policy at its default

BAD_TREES: list[tuple[str, Any, Any, type[Exception]]] = [
    ("cycle", cyclic, DEFAULT, FlowCycle),
    ("self-parent", self_parent, DEFAULT, FlowCycle),
    ("shared-child", shared, DEFAULT, FlowSharedNode),
    (
        "duplicate-id",
        lambda: FlowNode("r", "x", [FlowNode("a", "1"), FlowNode("a", "2")]),
        DEFAULT,
        FlowDuplicateJob,
    ),
    (
        "duplicate-root-id",
        lambda: FlowNode("r", "x", [FlowNode("r", "1")]),
        DEFAULT,
        FlowDuplicateJob,
    ),
    ("257-nodes-wide", lambda: wide(257), DEFAULT, FlowTooLarge),
    ("257-nodes-deep", lambda: deep(257), DEFAULT, FlowTooLarge),
    (
        "oversize-payloads",
        lambda: FlowNode(
            "r",
            "x" * (MAX_FLOW_INPUT_BYTES // 2),
            [FlowNode("a", "y" * (MAX_FLOW_INPUT_BYTES // 2))],
        ),
        DEFAULT,
        FlowTooLarge,
    ),
    (
        "other-queue",
        lambda: FlowNode("r", "x", [FlowNode("a", "1", queue="elsewhere")]),
        DEFAULT,
        InvalidFlow,
    ),
    ("child-not-a-node", lambda: FlowNode("r", "x", ["a"]), DEFAULT, InvalidFlow),
    ("children-not-a-list", lambda: FlowNode("r", "x", "ab"), DEFAULT, InvalidFlow),
    ("tree-not-a-node", lambda: ("r", "x"), DEFAULT, InvalidFlow),
    ("blank-job-id", lambda: FlowNode("r", "x", [FlowNode(" ", "1")]), DEFAULT, InvalidFlow),
    ("policy-as-str", three_levels, "ignore", InvalidFlow),
    ("policy-none", three_levels, None, InvalidFlow),
]


@pytest.mark.parametrize(
    ("make", "policy", "error"), [b[1:] for b in BAD_TREES], ids=[b[0] for b in BAD_TREES]
)
async def test_bad_trees_raise_typed_errors_with_nothing_sent(
    client: RedisClient, queue: JobQueue[str], make: Any, policy: Any, error: type[Exception]
) -> None:
    tree = make()
    kwargs = {} if policy is DEFAULT else {"failure_policy": policy}
    with forbid_commands(client), pytest.raises(error):
        await queue.enqueue_flow("f", tree, **kwargs)
    assert await keys_of(client, queue) == []


async def test_exactly_256_nodes_and_256_kib_are_accepted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.enqueue_flow("wide", wide(256))
    assert len(await queue.flow_results("wide")) == 256
    assert await queue.enqueue_flow("deep", deep(256))
    size = MAX_FLOW_INPUT_BYTES - len("r") - len("a") - 10
    tree = FlowNode("r", "x" * 10, [FlowNode("a", "y" * size)])
    assert await queue.enqueue_flow("full", tree)


@pytest.mark.parametrize("flow_id", ["", "  ", 7, "x" * 1025, "\ud800"])
async def test_bad_flow_ids_are_refused_before_sending(
    client: RedisClient, queue: JobQueue[str], flow_id: Any
) -> None:
    with forbid_commands(client):
        with pytest.raises(InvalidFlow):
            await queue.enqueue_flow(flow_id, three_levels())
        with pytest.raises(ValidationError):
            await queue.flow_results(flow_id)
        with pytest.raises(ValidationError):
            await queue.remove_flow(flow_id)


async def test_an_unencodable_payload_sends_nothing(client: RedisClient, unique_name: str) -> None:
    queue: JobQueue[bytes] = JobQueue(client, unique_name, BytesCodec())
    tree = FlowNode(b"r", b"x", [FlowNode("a", "not bytes")])  # type: ignore[arg-type]
    tree.job_id = "r"  # type: ignore[assignment]
    with forbid_commands(client), pytest.raises(EncodeError):
        await queue.enqueue_flow("f", tree)  # type: ignore[arg-type]


# -- the script checks the same limits on its own ------------------------------------------


async def test_the_enqueue_script_refuses_what_the_client_would(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    script = load("flow_enqueue")
    k = queue.keys
    keys = (k.ready, k.flow("f"), k.coordinated, k.control, k.scheduled)
    big = "x" * (MAX_FLOW_INPUT_BYTES)
    cases = [
        ("fail-parent", 2, "r", 0, "p", "r", 1, "p"),  # duplicate id
        ("fail-parent", 2, "r", 0, "p", "a", 2, "p"),  # parent not before the child
        ("fail-parent", 1, "r", 1, "p"),  # the root has a parent
        ("fail-parent", 1, "r", 0, big),  # ids + payloads over the limit
        ("sometimes", 1, "r", 0, "p"),  # unknown policy
        ("fail-parent", 3, "r", 0, "p", "a", 1, "p", "b", 2, "p", "c", 1, "p"),  # malformed
        ("fail-parent", 257, *[v for i in range(257) for v in (f"n{i}", min(i, 1), "p")]),
    ]
    for case in cases:
        with pytest.raises(ServerError):
            await script(client, keys, ("f", *case))
    assert await keys_of(client, queue) == []


async def test_unknown_schema_versions_are_refused_without_mutation(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    key = queue.keys.flow("f")
    await client.execute(
        "EVAL",
        "redis.call('SET', KEYS[1], cmsgpack.pack({v = 2, id = ARGV[1], nodes = {}, results = 0}))",
        1,
        key,
        "f",
    )
    stored = await client.execute("GET", key)
    for call in (
        queue.flow_results("f"),
        queue.enqueue_flow("f", three_levels()),
        queue.remove_flow("f"),
    ):
        with pytest.raises(ServerError) as info:
            await call
        assert info.value.code == "RESPIRE_SCHEMA"
    assert await client.execute("GET", key) == stored
    assert await keys_of(client, queue) == [key]


async def test_a_flow_key_of_another_type_is_refused(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await client.execute("HSET", queue.keys.flow("f"), "a", "b")
    for call in (
        queue.flow_results("f"),
        queue.enqueue_flow("f", three_levels()),
        queue.remove_flow("f"),
    ):
        with pytest.raises(WrongKeyType):
            await call
    assert await client.execute("XLEN", queue.keys.ready) == 0


async def test_an_oversize_result_is_refused_in_the_handler(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """``job.complete`` (the Complete outcome) refuses a result over 4 KiB before anything is
    sent; exactly 4 KiB is fine."""
    with forbid_commands(client), pytest.raises(ResultTooLarge):
        Complete(b"x" * 4097)
    assert Complete(b"x" * 4096).result == b"x" * 4096
