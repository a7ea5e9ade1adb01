"""Flow completions through the fenced completion scripts, called directly (issue 11): a stale
attempt after recovery is refused (status 0, results unchanged, the parent activated once), a
lost reply repeated is harmless, recovery at the delivery limit fails the node, and the flow
state's version and limits are checked before any write (the delivery stays pending)."""

from __future__ import annotations

from typing import Any

import pytest
from test_job_scripts import (
    CLAIM_GROUP_KEYS,
    GROUP,
    complete,
    pairs,
    pending,
    read,
    restricted_client,
    s,
)

from respire_actors.codecs import StrCodec
from respire_actors.errors import (
    PermissionDenied,
    ScriptError,
    ServerError,
    UnsupportedSchema,
)
from respire_actors.jobs import FAIL_PARENT, FlowNode, FlowNodeResult, JobQueue
from respire_actors.jobs.flows import child_results
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio

FINISH = load("job_finish")
CLAIM = load("job_claim_pending")


@pytest.fixture
def queue(client: RedisClient, unique_name: str) -> JobQueue[str]:
    return JobQueue(client, unique_name, StrCodec())


@pytest.fixture
def keys(queue: JobQueue[str]) -> JobQueueKeys:
    return queue.keys


async def finish(
    client: RedisClient,
    keys: JobQueueKeys,
    consumer: str,
    entry: str,
    attempt: int,
    job_id: str,
    result: bytes | None,
    kind: str = "ack",
) -> int:
    reason = "explicit" if kind == "dead" else ""
    return int(
        await FINISH(
            client,
            (keys.ready, keys.events, keys.dead, keys.result(job_id), *keys.lease_keys),
            (GROUP, consumer, entry, attempt, kind, reason, job_id, "", 0, "", "", "ack")
            + (("0", "") if result is None else ("1", result)),
        )
    )


async def claim(client: RedisClient, keys: JobQueueKeys, consumer: str, limit: int = 0) -> Any:
    return await CLAIM(
        client,
        (keys.ready, keys.control, keys.events, keys.dead, *CLAIM_GROUP_KEYS(keys)),
        (GROUP, consumer, "recover", 0, "0-0", 10, limit),
    )


async def started(client: RedisClient, queue: JobQueue[str], tree: FlowNode[str]) -> list[str]:
    """Enqueue ``tree`` as flow "f" and deliver its leaves to c1; their entry ids."""
    assert await queue.enqueue_flow("f", tree, FAIL_PARENT)
    await client.execute("XGROUP", "CREATE", queue.keys.ready, GROUP, "0", "MKSTREAM")
    reply = await read(client, queue.keys, "c1", 100)
    return [s(e[0]) for e in reply[1]]


async def ready_job_ids(client: RedisClient, keys: JobQueueKeys) -> list[str]:
    rows = await client.execute("XRANGE", keys.ready, "-", "+")
    return [s(pairs(f)["_respire.job.id"]) for _, f in rows]


def pair() -> FlowNode[str]:
    return FlowNode("root", "r", [FlowNode("x", "px"), FlowNode("y", "py")])


async def test_a_stale_attempt_after_recovery_changes_nothing(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    x, y = await started(client, queue, pair())
    assert await finish(client, keys, "c1", y, 1, "y", b"y-result") == 1
    # x is recovered by c2 (delivery 2): c1's attempt 1 is stale from now on
    reply = await claim(client, keys, "c2")
    assert [s(e[0]) for e in reply[2]] == [x]
    before = await client.execute("GET", keys.flow("f"))
    assert await finish(client, keys, "c1", x, 1, "x", b"stale") == 0
    assert await client.execute("GET", keys.flow("f")) == before
    assert await ready_job_ids(client, keys) == ["x", "y"]  # the parent is not activated

    assert await finish(client, keys, "c2", x, 2, "x", b"fresh") == 1
    assert await ready_job_ids(client, keys) == ["x", "y", "root"]
    # the stale attempt again, after the current one committed: still nothing
    after = await client.execute("GET", keys.flow("f"))
    assert await finish(client, keys, "c1", x, 1, "x", b"stale") == 0
    assert await client.execute("GET", keys.flow("f")) == after
    assert await ready_job_ids(client, keys) == ["x", "y", "root"]
    assert (await queue.flow_results("f"))[1:] == [
        FlowNodeResult("x", "completed", b"fresh", "root"),
        FlowNodeResult("y", "completed", b"y-result", "root"),
    ]


async def test_a_lost_reply_repeated_queues_the_parent_once(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    x, y = await started(client, queue, pair())
    assert await complete(client, keys, "c1", (x, 1, "ack", "", "x")) == [1]
    assert await finish(client, keys, "c1", y, 1, "y", b"") == 1
    assert await finish(client, keys, "c1", y, 1, "y", b"") == 0  # the repeated call
    assert await complete(client, keys, "c1", (x, 1, "ack", "", "x")) == [0]
    assert await ready_job_ids(client, keys) == ["x", "y", "root"]
    root_entry = (await client.execute("XRANGE", keys.ready, "-", "+"))[-1][1]
    fields = pairs(root_entry)
    assert fields["_respire.flow"] == b"f" and fields["_respire.flow.node"] == b"1"
    assert fields["_respire.job.payload"] == b"r"
    assert [(n.id, n.status, n.result) for n in await queue.flow_results("f")] == [
        ("root", "ready", None),
        ("x", "completed", None),
        ("y", "completed", b""),
    ]


async def test_recovery_at_the_delivery_limit_fails_the_node_and_its_parent(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    x, y = await started(client, queue, pair())
    assert await finish(client, keys, "c1", y, 1, "y", b"ok") == 1
    reply = await claim(client, keys, "c2", limit=1)  # x had its one delivery
    assert int(reply[4]) == 1 and reply[2] == []
    assert [(n.id, n.status) for n in await queue.flow_results("f")] == [
        ("root", "failed"),
        ("x", "failed"),
        ("y", "completed"),
    ]
    events = [pairs(f) for _, f in await client.execute("XRANGE", keys.events, "-", "+")]
    dead = [
        (e["job_id"], e["reason"], e["entry_id"], e.get("flow"))
        for e in events
        if e["kind"] == b"dead-letter"
    ]
    assert dead == [
        (b"x", b"delivery-limit", x.encode(), b"f"),
        (b"root", b"child-failed", b"0-0", b"f"),
    ]
    assert await ready_job_ids(client, keys) == ["x", "y"]
    assert await pending(client, keys) == []


async def test_an_unknown_schema_version_refuses_the_completion_without_mutation(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    x, _ = await started(client, queue, pair())
    await client.execute(
        "EVAL",
        "local st = cmsgpack.unpack(redis.call('GET', KEYS[1])); st.v = 2;"
        " redis.call('SET', KEYS[1], cmsgpack.pack(st))",
        1,
        keys.flow("f"),
    )
    before = await client.execute("GET", keys.flow("f"))
    events = await client.execute("XLEN", keys.events)
    with pytest.raises(UnsupportedSchema):
        await finish(client, keys, "c1", x, 1, "x", b"r")
    with pytest.raises(UnsupportedSchema):
        await complete(client, keys, "c1", (x, 1, "ack", "", "x"))
    assert await client.execute("GET", keys.flow("f")) == before
    assert await client.execute("XLEN", keys.events) == events
    assert (await pending(client, keys))[0][0] == x  # still pending, recoverable
    with pytest.raises(UnsupportedSchema):
        await queue.flow_results("f")


async def test_the_completion_checks_the_retained_results_limit_before_writing(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    x, _ = await started(client, queue, pair())
    # pretend the flow already retains 1 MiB - 10 bytes of results
    await client.execute(
        "EVAL",
        "local st = cmsgpack.unpack(redis.call('GET', KEYS[1])); st.results = 1048566;"
        " redis.call('SET', KEYS[1], cmsgpack.pack(st))",
        1,
        keys.flow("f"),
    )
    before = await client.execute("GET", keys.flow("f"))
    with pytest.raises(ScriptError, match="RESPIRE_FLOW_LIMIT"):
        await finish(client, keys, "c1", x, 1, "x", b"x" * 11)
    assert await client.execute("GET", keys.flow("f")) == before
    assert (await pending(client, keys))[0][0] == x
    assert await finish(client, keys, "c1", x, 1, "x", b"x" * 10) == 1


async def test_a_removed_flow_completes_its_stragglers_as_plain_jobs(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    (only,) = await started(client, queue, FlowNode("solo", "s"))
    await client.execute("DEL", keys.flow("f"))
    assert await finish(client, keys, "c1", only, 1, "solo", b"r") == 1
    assert await pending(client, keys) == []
    assert await client.execute("EXISTS", keys.flow("f")) == 0


async def test_fail_parent_propagates_when_the_last_child_to_finish_succeeded(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    """root -> (a -> (a1, a2), b): a1 fails first, a2 then completes: a fails without running
    (its last open child succeeded, an earlier one failed) and root, whose other child b
    completed, fails too."""
    tree = FlowNode(
        "root",
        "r",
        [FlowNode("a", "pa", [FlowNode("a1", "1"), FlowNode("a2", "2")]), FlowNode("b", "pb")],
    )
    b, a1, a2 = await started(client, queue, tree)
    assert await finish(client, keys, "c1", b, 1, "b", b"b") == 1
    assert await finish(client, keys, "c1", a1, 1, "a1", None, kind="dead") == 1
    assert await finish(client, keys, "c1", a2, 1, "a2", b"a2") == 1
    assert [(n.id, n.status) for n in await queue.flow_results("f")] == [
        ("root", "failed"),
        ("a", "failed"),
        ("b", "completed"),
        ("a1", "failed"),
        ("a2", "completed"),
    ]
    assert await ready_job_ids(client, keys) == ["b", "a1", "a2"]  # no parent was activated
    events = [pairs(f) for _, f in await client.execute("XRANGE", keys.events, "-", "+")]
    assert [(e["job_id"], e.get("reason")) for e in events if e["kind"] == b"dead-letter"] == [
        (b"a1", b"explicit"),
        (b"a", b"child-failed"),
        (b"root", b"child-failed"),
    ]


async def test_a_replayed_node_runs_as_an_independent_job(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    """A dead-lettered node replayed by an operator (its envelope appended again) completes
    as a plain job: its node stays failed and its parent is not activated a second time."""
    x, y = await started(client, queue, pair())
    assert await finish(client, keys, "c1", x, 1, "x", None, kind="dead") == 1
    assert await finish(client, keys, "c1", y, 1, "y", b"y") == 1
    before = await client.execute("GET", keys.flow("f"))
    body = (await client.execute("XRANGE", keys.ready, x, x))[0][1]
    replay = s(await client.execute("XADD", keys.ready, "*", *body))
    reply = await read(client, keys, "c1", 10)
    assert [s(e[0]) for e in reply[1]] == [replay]
    assert await finish(client, keys, "c1", replay, 1, "x", b"late") == 1
    assert await client.execute("GET", keys.flow("f")) == before
    assert [(n.id, n.status) for n in await queue.flow_results("f")] == [
        ("root", "failed"),
        ("x", "failed"),
        ("y", "completed"),
    ]


@pytest.mark.parametrize("denied", ["-set", "-xdel", "-xadd", "-get", "-exists", "-type"])
async def test_enqueue_checks_permissions_before_writing(
    server_url: str, client: RedisClient, queue: JobQueue[str], unique_name: str, denied: str
) -> None:
    # TYPE is not probed (the preflight runs it): its ACL refusal is the server's own error
    expected = ServerError if denied == "-type" else PermissionDenied
    async with restricted_client(server_url, client, unique_name, denied) as restricted:
        with pytest.raises(expected):
            await JobQueue(restricted, queue.name, StrCodec()).enqueue_flow("f", pair())
    keys = queue.keys
    assert await client.execute("EXISTS", keys.ready, keys.flow("f"), keys.coordinated) == 0


@pytest.mark.parametrize("denied", ["-set", "-xdel", "-xadd"])
async def test_a_completion_checks_flow_permissions_before_writing(
    server_url: str,
    client: RedisClient,
    queue: JobQueue[str],
    keys: JobQueueKeys,
    unique_name: str,
    denied: str,
) -> None:
    x, _ = await started(client, queue, pair())
    before = await client.execute("GET", keys.flow("f"))
    async with restricted_client(server_url, client, unique_name, denied) as restricted:
        with pytest.raises(PermissionDenied):
            await finish(restricted, keys, "c1", x, 1, "x", b"r")
    assert await client.execute("GET", keys.flow("f")) == before
    assert (await pending(client, keys))[0][0] == x
    assert await client.execute("EXISTS", keys.events) == 0


async def test_removal_needs_del(
    server_url: str, client: RedisClient, queue: JobQueue[str], unique_name: str
) -> None:
    assert await queue.enqueue_flow("f", FlowNode("solo", "s"))
    await client.execute(
        "EVAL",
        "local st = cmsgpack.unpack(redis.call('GET', KEYS[1])); st.status = 'c';"
        " redis.call('SET', KEYS[1], cmsgpack.pack(st))",
        1,
        queue.keys.flow("f"),
    )
    async with restricted_client(server_url, client, unique_name, "-del") as restricted:
        with pytest.raises(PermissionDenied):
            await JobQueue(restricted, queue.name, StrCodec()).remove_flow("f")
    assert await client.execute("EXISTS", queue.keys.flow("f")) == 1


async def test_child_results_refuse_an_unknown_schema_version(
    client: RedisClient, queue: JobQueue[str], keys: JobQueueKeys
) -> None:
    await started(client, queue, pair())
    await client.execute(
        "EVAL",
        "local st = cmsgpack.unpack(redis.call('GET', KEYS[1])); st.v = 2;"
        " redis.call('SET', KEYS[1], cmsgpack.pack(st))",
        1,
        keys.flow("f"),
    )
    with pytest.raises(UnsupportedSchema):
        await child_results(client, keys, "f", 1, "root")
