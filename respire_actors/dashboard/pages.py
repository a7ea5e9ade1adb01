"""The read-only pages. Every Redis read goes through the public API (``respire_actors.admin``
and :class:`~respire_actors.jobs.JobQueue`) and is one bounded page."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ..admin import QueueAdmin, QueueSummary, list_queues
from ..codecs import BytesCodec
from ..errors import PermissionDenied, RedisUnavailable, RespireError, ValidationError
from ..jobs import DeadLetterReason, FlowNodeResult, JobQueue
from .charts import minute_chart
from .web import NotFound, config_of, dashboard_of, log, page, queue_param, render

PAYLOAD_SHOWN = 4096  # bytes of a payload shown on a page (the page says when there are more)


def _queue(request: Request, name: str) -> JobQueue[bytes]:
    return JobQueue(dashboard_of(request).client, name, BytesCodec())


def queue_admin(request: Request, name: str) -> QueueAdmin:
    dead_stream = config_of(request).dead_stream(name)
    return QueueAdmin(dashboard_of(request).client, name, dead_stream=dead_stream)


def _count(request: Request) -> int:
    return config_of(request).page_size


async def queue_names(request: Request, after: str | None) -> tuple[list[str], str | None]:
    """One page of queue names after ``after`` (configured ones, else the registry)."""
    configured = config_of(request).queues
    names = sorted(configured) if configured is not None else await list_queues(
        dashboard_of(request).client
    )  # fmt: skip
    if after is not None:
        names = [n for n in names if n > after]
    size = _count(request)
    shown = names[:size]
    return shown, (shown[-1] if len(names) > size else None)


async def summaries(
    request: Request, names: Sequence[str]
) -> tuple[dict[str, QueueSummary], dict[str, tuple[str, str]]]:
    """The summary of each queue, read concurrently (each one bounded), and the queues that
    could not be read (name -> (kind, why); kind ``denied`` when the dashboard's ACL user may
    not read it, ``error`` for any other Redis error): one such queue never hides the others
    (a user scoped to some queues still sees them, as the registry lists every queue)."""
    found: dict[str, QueueSummary] = {}
    denied: dict[str, tuple[str, str]] = {}

    async def one(name: str) -> None:
        try:
            found[name] = await queue_admin(request, name).summary()
        except PermissionDenied as exc:
            denied[name] = ("denied", f"not readable by this dashboard's Redis user ({exc})")
        except RedisUnavailable:
            raise  # the server, not this queue: the page fails, a live stream ends and retries
        except RespireError as exc:
            log.warning("dashboard: queue %r could not be read: %r", name, exc)
            denied[name] = ("error", f"could not be read: {type(exc).__name__}: {exc}")

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(one, name)
    return found, denied


async def known_summary(request: Request, name: str) -> QueueSummary:
    """The queue's summary; raises :class:`~.web.NotFound` for a queue that is neither shown by
    configuration nor registered and holds nothing, so a typo in a link cannot create state
    (the rule of the operator commands)."""
    summary = await queue_admin(request, name).summary()
    if config_of(request).queues is not None:
        return summary  # queue_param already checked the allow-list
    empty = not (summary.ready or summary.dead_letters or summary.scheduled or summary.paused)
    if empty and name not in await list_queues(dashboard_of(request).client):
        raise NotFound(f"no job queue named {name!r}: it is not registered and holds nothing")
    return summary


@page
async def overview(request: Request) -> Response:
    after = request.query_params.get("after")
    names, next_after = await queue_names(request, after)
    found, denied = await summaries(request, names)
    charts: dict[str, Any] = {}
    minutes = config_of(request).metrics_minutes

    async def chart(name: str) -> None:
        try:
            charts[name] = minute_chart(await _queue(request, name).read_metrics(minutes))
        except RedisUnavailable:
            raise
        except RespireError as exc:  # its row says the rest; one queue never fails the page
            log.warning("dashboard: metrics of %r could not be read: %r", name, exc)

    async with anyio.create_task_group() as tg:
        for name, summary in found.items():
            if summary.metrics_enabled:
                tg.start_soon(chart, name)
    return render(
        request,
        "overview.html",
        {
            "names": names,
            "summaries": found,
            "denied": denied,
            "charts": charts,
            "next_after": next_after,
            "after": after,
        },
    )


@page
async def queue_detail(request: Request) -> Response:
    name = queue_param(request)
    admin = queue_admin(request, name)
    pending_start = request.query_params.get("pending", "-")
    scheduled_cursor = request.query_params.get("scheduled") or None
    count = _count(request)
    summary = await known_summary(request, name)
    pending = await admin.pending(start=pending_start, count=count)
    scheduled = await admin.scheduled(cursor=scheduled_cursor, count=count)
    chart = None
    if getattr(summary, "metrics_enabled", False):
        chart = minute_chart(
            await _queue(request, name).read_metrics(config_of(request).metrics_minutes)
        )
    return render(
        request,
        "queue.html",
        {
            "name": name,
            "summary": summary,
            "pending": pending,
            "scheduled": scheduled,
            "chart": chart,
            "pending_start": pending_start,
            "scheduled_cursor": scheduled_cursor,
        },
    )


@page
async def job_detail(request: Request) -> Response:
    name = queue_param(request)
    entry_id = request.query_params.get("entry")
    if not entry_id:
        raise ValidationError("the entry parameter (a stream entry id) is missing")
    job = await queue_admin(request, name).job(entry_id)
    fields: list[tuple[str, Any]] = []
    payload = None
    events: Sequence[Any] = ()
    logs: Sequence[str] = ()
    if job is not None:
        fields = sorted(job.fields.items())
        payload = _payload_view(request, job.payload)
        events, logs = job.events, job.logs
    return render(
        request,
        "job.html",
        {
            "name": name,
            "entry_id": entry_id,
            "job": job,
            "fields": fields,
            "payload": payload,
            "events": events,
            "logs": logs,
        },
        status=200 if job is not None else 404,
    )


@page
async def dead_letters(request: Request) -> Response:
    name = queue_param(request)
    before = request.query_params.get("before") or None
    reason = request.query_params.get("reason") or None
    result = await queue_admin(request, name).dead_letters(
        before=before, count=_count(request), reason=reason
    )
    rows = [(row, _payload_view(request, row.payload)) for row in result.rows]
    return render(
        request,
        "dead.html",
        {
            "name": name,
            "rows": rows,
            "next_before": result.next_before,
            "before": before,
            "reason": reason,
            "reasons": [r.value for r in DeadLetterReason],
            "notice": _action_notice(request),
        },
    )


def _action_notice(request: Request) -> str:
    """The result of a retry or delete the page was redirected from, built here from numbers
    (a link cannot put its own text on the page)."""
    params = request.query_params
    counts = {k: params.get(k, "") for k in ("retried", "deleted", "of")}
    if not counts["of"].isdigit():
        return ""
    for verb in ("retried", "deleted"):
        if counts[verb].isdigit():
            return f"{verb} {int(counts[verb])} of {int(counts['of'])}"
    return ""


@page
async def groups(request: Request) -> Response:
    name = queue_param(request)
    cursor = request.query_params.get("cursor") or None
    summary = await known_summary(request, name)
    result = await _queue(request, name).list_groups(cursor, _count(request))
    return render(
        request,
        "groups.html",
        {
            "name": name,
            "groups": result.groups,
            "next_cursor": result.next_cursor,
            "cursor": cursor,
            "in_use": bool(result.groups) or cursor is not None or summary.groups_in_use,
        },
    )


@page
async def batches(request: Request) -> Response:
    """Look up a batch or a flow by id (there is no listing of batches or flows to page)."""
    name = queue_param(request)
    queue = _queue(request, name)
    kind = request.query_params.get("kind", "flow")
    if kind not in ("batch", "flow"):
        raise ValidationError("kind must be batch or flow")
    lookup = request.query_params.get("id") or None
    batch: Any = None
    flow: list[FlowTreeNode] = []
    if lookup is not None:
        if kind == "batch":
            batch = _describe(await queue.batch_status(lookup))
        else:
            flow = flow_tree(request, await queue.flow_results(lookup))
    return render(
        request,
        "batches.html",
        {
            "name": name,
            "kind": kind,
            "lookup": lookup,
            "batch": batch,
            "flow": flow,
            "searched": lookup is not None,
        },
    )


@dataclasses.dataclass(frozen=True, slots=True)
class FlowTreeNode:
    node: FlowNodeResult
    result: PayloadView | None
    children: list[FlowTreeNode]


def flow_tree(request: Request, nodes: Sequence[FlowNodeResult]) -> list[FlowTreeNode]:
    """The flow's nodes (breadth-first, at most 256) as a tree under its root(s)."""
    built = {
        n.id: FlowTreeNode(
            n, _payload_view(request, n.result) if n.result is not None else None, []
        )
        for n in nodes
    }
    roots: list[FlowTreeNode] = []
    for n in nodes:
        parent = built.get(n.parent) if n.parent is not None else None
        (parent.children if parent is not None else roots).append(built[n.id])
    return roots


def _describe(value: Any) -> Any:
    """A dataclass as (field, value) rows."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class PayloadView:
    shown: bool
    size: int
    text: str
    cut: bool


def _payload_view(request: Request, payload: Any) -> PayloadView | None:
    if payload is None:
        return None
    raw = payload if isinstance(payload, bytes) else str(payload).encode()
    if not config_of(request).show_payloads:
        return PayloadView(False, len(raw), "", False)
    head = raw[:PAYLOAD_SHOWN]
    return PayloadView(True, len(raw), head.decode("utf-8", "replace"), len(raw) > PAYLOAD_SHOWN)


__all__ = [
    "known_summary",
    "batches",
    "dead_letters",
    "groups",
    "job_detail",
    "overview",
    "queue_detail",
    "queue_admin",
    "queue_names",
    "summaries",
]
