"""Parent/child job flows: a tree of jobs on one queue where a parent runs only after every
direct child is terminal, and reads its children's results. :class:`~respire_actors.jobs.
JobQueue` exposes these as methods; see docs/flows.md for the guarantees.

A flow's state is one cmsgpack string under the queue's hash tag (``JobQueueKeys.flow``),
written by Lua only: ``flow_enqueue`` stores the tree and appends the leaves; the completion
scripts (through ``lib/coordination.lua`` and ``lib/flow.lua``) record each node's outcome and
activate or fail parents in the same fenced call that acknowledges the delivery. Every tree is
validated here, completely, before anything is sent to Redis.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ..codecs import Codec, encode_with
from ..errors import (
    FlowActive,
    FlowCycle,
    FlowDuplicateJob,
    FlowNotFound,
    FlowSharedNode,
    FlowTooLarge,
    InvalidFlow,
    ScriptError,
    ValidationError,
)
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load
from .options import validate_job_id

T = TypeVar("T")

MAX_FLOW_NODES = 256
"""Most nodes in one flow tree."""
MAX_FLOW_INPUT_BYTES = 256 * 1024
"""Most bytes of UTF-8 job ids plus encoded payloads in one flow."""
MAX_FLOW_RESULT_BYTES = 4 * 1024
"""Largest result one flow node may retain (``job.complete(result)``)."""
MAX_FLOW_RESULTS_BYTES = 1024 * 1024
"""Most bytes of retained results in one flow (256 nodes of 4 KiB fit)."""

_ENQUEUE = load("flow_enqueue")
_RESULTS = load("flow_results")
_CHILDREN = load("flow_children")
_REMOVE = load("flow_remove")


class FlowFailurePolicy(enum.Enum):
    """What a parent does once its children are terminal and at least one of them failed.

    ``FAIL_PARENT`` (the default): the parent fails without its handler being called, and its
    own parent sees a failed child (the failure propagates up). ``IGNORE``: the handler runs;
    failed children are left out of :meth:`Job.child_results`. ``CONTINUE``: the handler runs
    with failed children included (status ``"failed"``, no result).
    """

    FAIL_PARENT = "fail-parent"
    IGNORE = "ignore"
    CONTINUE = "continue"


FAIL_PARENT = FlowFailurePolicy.FAIL_PARENT
IGNORE = FlowFailurePolicy.IGNORE
CONTINUE = FlowFailurePolicy.CONTINUE

FlowStatus = Literal["waiting", "ready", "completed", "failed"]


@dataclass(slots=True)
class FlowNode(Generic[T]):
    """One job of a flow tree: its job id, payload (encoded with the queue's codec) and direct
    children (a list or tuple of nodes). ``queue`` may name the flow's own queue (None means
    the same); a flow never spans queues. A node object may appear only once in a tree."""

    job_id: str
    payload: T
    children: Sequence[FlowNode[T]] = ()
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class FlowNodeResult:
    """The state of one flow node.

    ``status``: ``"waiting"`` (some child not terminal yet), ``"ready"`` (queued, running,
    pending or retrying), ``"completed"`` or ``"failed"``. ``result`` is what the handler
    returned with ``job.complete(result)``; None when it acknowledged without a result or did
    not complete (``b""`` is a result). ``parent`` is the parent's job id, None for the root.
    """

    id: str
    status: FlowStatus
    result: bytes | None
    parent: str | None = None


def _s(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def validate_flow_id(flow_id: object) -> str:
    try:
        return validate_job_id(flow_id, what="flow id")
    except ValidationError as exc:
        raise InvalidFlow(str(exc)) from None


def flatten(tree: FlowNode[T], queue: str) -> list[tuple[FlowNode[T], int]]:
    """The nodes of ``tree`` in breadth-first order, each with its parent's 1-based index (0
    for the root). Raises an :class:`InvalidFlow` subclass for anything that is not a tree of
    at most :data:`MAX_FLOW_NODES` nodes of ``queue`` with unique job ids."""
    if not isinstance(tree, FlowNode):
        raise InvalidFlow(f"a flow tree must be a FlowNode, got {type(tree).__name__}")
    order: list[tuple[FlowNode[T], int]] = []
    index_of: dict[int, int] = {}
    ids: set[str] = set()

    def add(node: object, parent: int) -> None:
        if not isinstance(node, FlowNode):
            raise InvalidFlow(f"a flow child must be a FlowNode, got {type(node).__name__}")
        seen = index_of.get(id(node))
        if seen is not None:
            ancestor = parent
            while ancestor:
                if ancestor == seen:
                    raise FlowCycle(f"flow node {node.job_id!r} is its own ancestor")
                ancestor = order[ancestor - 1][1]
            raise FlowSharedNode(f"flow node {node.job_id!r} appears under two parents")
        if len(order) == MAX_FLOW_NODES:
            raise FlowTooLarge(f"a flow has at most {MAX_FLOW_NODES} nodes")
        try:
            validate_job_id(node.job_id)
        except ValidationError as exc:
            raise InvalidFlow(str(exc)) from None
        if node.job_id in ids:
            raise FlowDuplicateJob(f"job id {node.job_id!r} appears twice in the flow")
        if node.queue is not None and node.queue != queue:
            raise InvalidFlow(
                f"flow node {node.job_id!r} belongs to queue {node.queue!r}, not {queue!r}:"
                " a flow never spans queues"
            )
        if not isinstance(node.children, list | tuple):
            raise InvalidFlow(f"the children of {node.job_id!r} must be a list or tuple")
        ids.add(node.job_id)
        order.append((node, parent))
        index_of[id(node)] = len(order)

    add(tree, 0)
    at = 0
    while at < len(order):
        node = order[at][0]
        at += 1
        for child in node.children:
            add(child, at)
    return order


def prepare_enqueue(
    keys: JobQueueKeys,
    codec: Codec[T],
    flow_id: str,
    tree: FlowNode[T],
    policy: FlowFailurePolicy,
    limit: int | None = None,
) -> tuple[tuple[str, ...], tuple[str | bytes | int, ...]]:
    """The keys and arguments of ``flow_enqueue``; every check runs here, before sending
    (``limit``: the client's ``max_payload_bytes``)."""
    validate_flow_id(flow_id)
    if not isinstance(policy, FlowFailurePolicy):
        raise InvalidFlow(f"failure_policy must be a FlowFailurePolicy, got {policy!r}")
    nodes = flatten(tree, keys.name)
    args: list[str | bytes | int] = [flow_id, policy.value, len(nodes)]
    size = 0
    for node, parent in nodes:
        body = encode_with(codec, node.payload, limit=limit)
        size += len(node.job_id.encode("utf-8")) + len(body)
        args += (node.job_id, parent, body)
    if size > MAX_FLOW_INPUT_BYTES:
        raise FlowTooLarge(
            f"the flow's job ids and payloads are {size} bytes; the limit is {MAX_FLOW_INPUT_BYTES}"
        )
    return (
        (keys.ready, keys.flow(flow_id), keys.coordinated, keys.control, keys.scheduled),
        tuple(args),
    )


async def enqueue_flow(
    client: RedisClient,
    keys: JobQueueKeys,
    codec: Codec[T],
    flow_id: str,
    tree: FlowNode[T],
    policy: FlowFailurePolicy,
) -> bool:
    script_keys, args = prepare_enqueue(
        keys, codec, flow_id, tree, policy, client.settings.max_payload_bytes
    )
    return bool(int(await _ENQUEUE(client, script_keys, args)))


def _result(has: Any, raw: Any) -> bytes | None:
    return bytes(raw) if int(has) else None


async def flow_results(
    client: RedisClient, keys: JobQueueKeys, flow_id: str
) -> list[FlowNodeResult]:
    validate_flow_id(flow_id)
    reply = await _RESULTS(client, (keys.flow(flow_id),), (flow_id,))
    ids = [_s(row[0]) for row in reply]
    return [
        FlowNodeResult(
            ids[i],
            _s(status),  # type: ignore[arg-type]
            _result(has, raw),
            ids[int(parent) - 1] if int(parent) else None,
        )
        for i, (_, status, parent, has, raw) in enumerate(reply)
    ]


async def child_results(
    client: RedisClient, keys: JobQueueKeys, flow_id: str, node: int, job_id: str
) -> list[FlowNodeResult]:
    reply = await _CHILDREN(client, (keys.flow(flow_id),), (flow_id, node, job_id))
    if not int(reply[0]):
        raise FlowNotFound(f"flow {flow_id!r} of queue {keys.name!r} no longer exists")
    return [
        FlowNodeResult(_s(child), _s(status), _result(has, raw), job_id)  # type: ignore[arg-type]
        for child, status, has, raw in reply[1]
    ]


async def remove_flow(client: RedisClient, keys: JobQueueKeys, flow_id: str) -> bool:
    validate_flow_id(flow_id)
    try:
        reply = await _REMOVE(client, (keys.flow(flow_id),), (flow_id,))
    except ScriptError as exc:
        if exc.code == "RESPIRE_FLOW_ACTIVE":
            raise FlowActive(f"flow {flow_id!r} is still active: {exc.detail}") from None
        raise
    return bool(int(reply))


__all__ = [
    "CONTINUE",
    "FAIL_PARENT",
    "IGNORE",
    "MAX_FLOW_INPUT_BYTES",
    "MAX_FLOW_NODES",
    "MAX_FLOW_RESULTS_BYTES",
    "MAX_FLOW_RESULT_BYTES",
    "FlowFailurePolicy",
    "FlowNode",
    "FlowNodeResult",
    "FlowStatus",
]
