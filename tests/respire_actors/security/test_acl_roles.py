"""Each role's documented ACL rules (respire_actors.acl, docs/security.md) on real servers.

A user holding exactly the role's rules runs the role's whole path (role_paths.py) and leaves
nothing in the ACL log; a user missing one command the path needs fails before anything is
written, with PermissionDenied naming that command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path as FilePath

import anyio
import pytest
import role_paths
from helpers.acl import acl_denials, acl_user, key_dump
from helpers.servers import Cluster

from respire_actors.acl import ROLE_COMMANDS, ROLES, Role, acl_rules
from respire_actors.actors.source import remove_idle_consumers
from respire_actors.codecs import StrCodec
from respire_actors.errors import PermissionDenied, ValidationError
from respire_actors.jobs import (
    ACK,
    FlowNode,
    JobEnqueueOptions,
    JobQueue,
    Outcome,
    RateLimit,
    Worker,
)
from respire_actors.jobs.job import Job
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.keys import job_queue_key_pattern
from respire_actors.redis import scripts
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio

Path = Callable[[RedisClient, str], Awaitable[None]]

PATHS: dict[Role, Path] = {
    "producer": role_paths.producer_path,
    "scheduler": role_paths.scheduler_path,
    "worker": role_paths.worker_path,
    "observer": role_paths.observer_path,
    "operator": role_paths.operator_path,
}

BEFORE: dict[Role, tuple[Role, ...]] = {
    "producer": (),
    "scheduler": (),
    "worker": ("producer", "scheduler"),
    "observer": ("producer", "scheduler", "worker"),
    "operator": ("producer",),
}
"""The paths an unrestricted client runs first, so the role has something to work on."""


@pytest.mark.parametrize("role", ROLES)
async def test_role_runs_its_whole_path_with_exactly_its_rules(
    role: Role, client: RedisClient, server_url: str, unique_name: str
) -> None:
    for earlier in BEFORE[role]:
        await PATHS[earlier](client, unique_name)
    user = f"{role}-{unique_name}"
    rules = acl_rules(role, (unique_name,))
    async with acl_user(client, server_url, user, rules) as restricted:
        info = await restricted.server_info()  # no INFO, no ROLE: the handshake tells
        assert info.version >= (7, 0, 0)
        await PATHS[role](restricted, unique_name)
        assert await acl_denials(client, user) == []


async def test_rules_cover_only_the_queues_named(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    other = f"{unique_name}-other"
    user = f"producer-{unique_name}"
    async with acl_user(client, server_url, user, acl_rules("producer", (unique_name,))) as c:
        await JobQueue(c, unique_name, StrCodec()).enqueue("a", "x")
        with pytest.raises(PermissionDenied):
            await JobQueue(c, other, StrCodec()).enqueue("a", "x")
    assert await key_dump(client, job_queue_key_pattern(other)) == {}


async def test_a_prefixed_role_is_confined_to_its_prefix(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    prefix = f"{{{unique_name}}}:"
    user = f"producer-{unique_name}"
    rules = acl_rules("producer", key_prefix=prefix)
    async with acl_user(client, server_url, user, rules, key_prefix=prefix) as restricted:
        await role_paths.producer_path(restricted, unique_name)
        assert await acl_denials(client, user) == []
    async with acl_user(client, server_url, user, rules) as unprefixed:
        with pytest.raises(PermissionDenied):
            await JobQueue(unprefixed, unique_name, StrCodec()).enqueue("b", "x")


async def test_the_operator_removes_finished_flows_and_batches(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    for earlier in ("producer", "scheduler", "worker"):
        await PATHS[earlier](client, unique_name)
    user = f"operator-{unique_name}"
    async with acl_user(client, server_url, user, acl_rules("operator", (unique_name,))) as c:
        queue = JobQueue(c, unique_name, StrCodec())
        assert await queue.remove_flow("flow")
        assert await queue.remove_batch("batch")
        assert await queue.flow_results("flow") == []
        assert await queue.batch_status("batch") is None
        assert await acl_denials(client, user) == []


def test_rules_refuse_unknown_roles_and_names() -> None:
    with pytest.raises(ValidationError):
        acl_rules("admin")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        acl_rules("worker", ("bad{name}",))
    with pytest.raises(ValidationError):
        acl_rules("worker", ())
    assert acl_rules("observer", ("a*b",), key_prefix="t[1]:")[3] == (
        "~t\\[1\\]:{respire-job:a\\*b}:*"
    )


# ------------------------------------------------------------------------------------------
# one missing permission: refused before any write, with the command named


async def _enqueue(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).enqueue("job", "x")


async def _upsert(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).scheduler().upsert("s", "x", interval=60)


async def _pause(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).pause()


async def _get_logs(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).get_logs("job")


async def _read_metrics(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).read_metrics(5)


async def _enqueue_flow(c: RedisClient, name: str) -> None:
    tree = FlowNode("f2-root", "r", [FlowNode("f2-leaf", "l")])
    await JobQueue(c, name, StrCodec()).enqueue_flow("f2", tree)


async def _add_to_batch(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).add_to_batch("open", "batch-4", "4")


async def _flow_results(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).flow_results("flow")


async def _cancel_batch(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).cancel_batch("batch")


async def _enqueue_in_transaction(c: RedisClient, name: str) -> None:
    """A business write and an enqueue, atomically (the transactional enqueue)."""
    queue = JobQueue(c, name, StrCodec())
    async with c.transaction() as tx:
        tx.queue("SET", queue.keys.custom("order"), "paid")
        queue.enqueue_in(tx, "tx-job", "x")
        await tx.commit()


async def _enqueue_grouped(c: RedisClient, name: str) -> None:
    options = JobEnqueueOptions(group="tenant-a")
    await JobQueue(c, name, StrCodec()).enqueue_scheduled("grouped-2", "x", options)


async def _set_group_options(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).set_group_options("tenant-a", max_concurrency=2)


async def _list_schedules(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).scheduler().list()


async def _set_rate_limit(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).set_rate_limit(RateLimit(10, 1))


async def _enqueue_delayed(c: RedisClient, name: str) -> None:
    options = JobEnqueueOptions(delay=30)
    await JobQueue(c, name, StrCodec()).enqueue_scheduled("delayed-2", "x", options)


async def _get_group(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).get_group("tenant-a")


async def _backlog(c: RedisClient, name: str) -> None:
    await JobQueue(c, name, StrCodec()).backlog()


async def _start_worker(c: RedisClient, name: str) -> None:
    """A worker's start: it creates the consumer group (or checks it exists)."""
    keys = JobQueue(c, name, StrCodec()).keys
    await JobSource(c, keys, "unused", CONSUMER_GROUP).ensure_group("start")


async def _sweep_idle_consumers(c: RedisClient, name: str) -> None:
    """The consumer sweeper: it lists the group's consumers, then removes idle ones."""
    ready = JobQueue(c, name, StrCodec()).keys.ready
    await remove_idle_consumers(c, ready, CONSUMER_GROUP, "sweeper", 1)


MISSING: list[tuple[Role, str, Path]] = [
    # reads before the first write that no probe checks: Redis 7.0's refusal names only the
    # script and line, and the command is read off that line
    ("producer", "hget", _enqueue),  # the backlog bound
    # reads before the first write, named by the script's probes
    ("scheduler", "hget", _list_schedules),
    ("scheduler", "zrangebylex", _list_schedules),
    ("observer", "hget", _read_metrics),
    ("operator", "hget", _pause),
    ("operator", "hmget", _set_rate_limit),
    ("producer", "time", _enqueue_delayed),
    ("producer", "get", _enqueue_delayed),
    ("operator", "zlexcount", _get_group),
    ("operator", "time", _get_group),
    # a refused MULTI used to let the queued commands run at once, outside any transaction,
    # while commit() raised: MULTI now goes alone and the commands only after its OK
    ("producer", "multi", _enqueue_in_transaction),
    ("producer", "exec", _enqueue_in_transaction),  # EXECABORT used to be an untyped error
    # reads a script makes after its first write are checked before it (they used to fail
    # after the write: XADD then ZSCORE, HSET then ZSCORE)
    ("producer", "zscore", _enqueue_grouped),
    ("operator", "zscore", _set_group_options),
    ("operator", "zrangebylex", _set_group_options),
    ("producer", "type", _enqueue),  # the preflight checks TYPE before calling it
    ("producer", "xdel", _enqueue),  # needed to roll an append back
    ("scheduler", "zadd", _upsert),
    ("operator", "xadd", _pause),  # the paused event
    ("observer", "lrange", _get_logs),
    ("observer", "type", _read_metrics),
    ("producer", "exists", _enqueue_flow),  # the flow marker
    ("producer", "set", _add_to_batch),  # the batch state
    ("observer", "get", _flow_results),
    ("operator", "set", _cancel_batch),
    ("observer", "xinfo|groups", _backlog),  # the exact count reads the group's lag
    ("observer", "xrange", _backlog),  # ... or counts entries when the server has no lag
    # a subcommand is named as ACL SETUSER spells it (it used to be "xgroup", the message
    # calling CREATE the key), and a consumer listing refused used to be read as "no group"
    ("worker", "xgroup|create", _start_worker),
    ("worker", "xinfo|consumers", _sweep_idle_consumers),
    ("worker", "xgroup|delconsumer", _sweep_idle_consumers),
]


@pytest.mark.parametrize(
    ("role", "command", "action"), MISSING, ids=[f"{r}-{c}" for r, c, _ in MISSING]
)
async def test_a_missing_command_fails_before_any_write(
    role: Role,
    command: str,
    action: Path,
    client: RedisClient,
    server_url: str,
    unique_name: str,
) -> None:
    assert command in ROLE_COMMANDS[role]
    await role_paths.producer_path(client, unique_name)  # something to change
    before = await key_dump(client, f"*{unique_name}*")
    user = f"{role}-{unique_name}"
    rules = [*acl_rules(role, (unique_name,)), f"-{command}"]
    async with acl_user(client, server_url, user, rules) as restricted:
        with pytest.raises(PermissionDenied) as caught:
            await action(restricted, unique_name)
    assert caught.value.command == command
    assert await key_dump(client, f"*{unique_name}*") == before


async def test_a_worker_without_pexpiretime_appends_no_log_line(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """job_log used to append the line before calling PEXPIRETIME: a user without it got a log
    list that never expires. Now the preflight refuses first and nothing is appended."""
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.enqueue("job", "x")
    refused: list[PermissionDenied] = []
    done = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        try:
            await job.log("a line")
        except PermissionDenied as exc:
            refused.append(exc)
        done.set()
        return ACK

    user = f"worker-{unique_name}"
    rules = [*acl_rules("worker", (unique_name,)), "-pexpiretime"]
    async with acl_user(client, server_url, user, rules) as restricted:
        worker = Worker()
        worker.register(unique_name, handler, StrCodec(), role_paths.worker_options())
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, restricted)
            with anyio.fail_after(10):
                await done.wait()
            await worker.stop()
    assert [e.command for e in refused] == ["pexpiretime"]
    assert await client.execute("EXISTS", queue.keys.logs("job")) == 0


def test_the_documented_recipes_are_the_rules() -> None:
    docs = FilePath(__file__).resolve().parents[3] / "docs" / "security.md"
    recipes = {}
    for line in docs.read_text().splitlines():
        if line.startswith("ACL SETUSER "):
            _, _, role, on, password, *rules = line.split()
            assert (on, password) == ("on", ">secret")
            recipes[role] = rules
    assert recipes == {role: acl_rules(role) for role in ROLES}


CLUSTER_EXTRA = ("+cluster|slots", "+asking")


async def test_roles_on_a_cluster_need_only_the_slot_map_besides(
    cluster_nodes: Cluster, cluster_client: RedisClient, unique_name: str
) -> None:
    """On Redis Cluster the documented extras (CLUSTER SLOTS, ASKING) are all a role needs
    more; ACL users are per node, so each node gets the same users."""
    order = ("producer", "scheduler", "worker", "observer", "operator")  # each uses the last
    users = {role: f"{role}-{unique_name}" for role in order}
    for role, user in users.items():
        for node in cluster_nodes.nodes:
            node.execute(
                "ACL", "SETUSER", user, "reset", "on", f">pw-{user}",
                *acl_rules(role, (unique_name,)), *CLUSTER_EXTRA,
            )  # fmt: skip
    try:
        for role, user in users.items():
            async with connect(
                cluster_nodes.url, username=user, password=f"pw-{user}"
            ) as restricted:
                await PATHS[role](restricted, unique_name)
        for node in cluster_nodes.nodes:
            entries = node.execute("ACL", "LOG")
            assert not [e for e in entries if any(u.encode() in e for u in users.values())]
    finally:
        for user in users.values():
            for node in cluster_nodes.nodes:
                node.execute("ACL", "DELUSER", user)


async def test_a_command_refused_inside_a_script_is_named_on_every_server(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """A worker's completion reads the pending entry (XPENDING, the fence) before any write and
    no probe checks it: Redis 7.0 names only the script's line, Valkey the command. Both give
    a PermissionDenied naming ``xpending``; nothing is acknowledged."""
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.enqueue("job", "x")
    keys = queue.keys
    await client.execute("XGROUP", "CREATE", keys.ready, "g", "0", "MKSTREAM")
    read = await client.execute(
        "XREADGROUP", "GROUP", "g", "c", "COUNT", 1, "STREAMS", keys.ready, ">"
    )
    entry = _entry_id(read)
    before = await key_dump(client, f"*{unique_name}*")
    user = f"worker-{unique_name}"
    rules = [*acl_rules("worker", (unique_name,)), "-xpending"]
    complete = scripts.load("job_complete")
    script_keys = [
        keys.ready,
        keys.events,
        keys.dead,
        keys.group_leases,
        keys.group_owners,
        keys.group_parked,
    ]
    async with acl_user(client, server_url, user, rules) as restricted:
        with pytest.raises(PermissionDenied) as caught:
            await complete(restricted, script_keys, ["g", "c", 1, entry, 1, "ack", "", "job"])
    assert caught.value.command == "xpending"
    assert "xpending" in str(caught.value).lower()
    assert await key_dump(client, f"*{unique_name}*") == before


def _entry_id(read: object) -> str:
    entries = next(iter(read.values())) if isinstance(read, dict) else read[0][1]  # type: ignore[index]
    first = entries[0]
    entry = first[0]
    return entry.decode() if isinstance(entry, bytes) else str(entry)
