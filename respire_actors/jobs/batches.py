"""Batches: a flat set of independent jobs with aggregate counts and completion callbacks.

:class:`~respire_actors.jobs.JobQueue` exposes these as methods (``create_batch``,
``add_to_batch``, ``seal_batch``, ``cancel_batch``, ``batch_status``, ``remove_batch``); the
worker's gate calls :func:`cancellation_requested` before a member's handler. The rules are in
docs/batches.md; the state and its transitions are in ``scripts/lib/batch.lua``.

Every argument is checked before anything is sent to Redis; limits the call's own arguments
already exceed are refused here, the rest by the scripts (which then write nothing).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..actors.options import iterate
from ..codecs import Codec, encode_with
from ..errors import (
    BatchActive,
    BatchLimitExceeded,
    BatchSealed,
    RespireError,
    ScriptError,
    UnknownBatch,
    ValidationError,
)
from ..keys import JobQueueKeys
from ..redis.client import Arg, RedisClient
from ..redis.scripts import load, run_many
from .options import validate_job_id

T = TypeVar("T")

MAX_MEMBERS = 256
"""Most members of one batch."""
MAX_BYTES = 256 * 1024
"""Most combined UTF-8 member and callback ids and serialized payloads of one batch."""

_CREATE = load("batch_create")
_ADD = load("batch_add")
_SEAL = load("batch_seal")
_STATUS = load("batch_status")
_CHECK = load("batch_check")
_REMOVE = load("batch_remove")


@dataclass(frozen=True, slots=True)
class Callback(Generic[T]):
    """A job the batch enqueues on its own queue when it completes: ``job_id`` and
    ``payload`` (encoded with the queue's codec, handled by the queue's handler). Callbacks are
    ordinary jobs: they do not count as members and are not deduplicated against other jobs."""

    job_id: str
    payload: T


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A snapshot of one batch (see :meth:`JobQueue.batch_status`).

    ``pending`` members have no terminal outcome yet (retries stay pending); ``succeeded``,
    ``failed`` (dead-lettered, explicitly or after the delivery limit) and ``cancelled`` count
    terminal outcomes, each member once. ``sealed``: no new members; ``cancellation_requested``:
    :meth:`JobQueue.cancel_batch` was called; ``completed``: the callbacks were published (not
    necessarily run). ``members`` is the number of members added.
    """

    batch_id: str
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    sealed: bool
    cancellation_requested: bool
    completed: bool
    members: int


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _size(job_id: str, body: bytes) -> int:
    return len(job_id.encode("utf-8")) + len(body)


def _too_large(batch_id: str, limit: str, what: str) -> BatchLimitExceeded:
    if limit == "members":
        text = f"batch {batch_id!r} cannot have more than {MAX_MEMBERS} members ({what})"
    else:
        text = (
            f"batch {batch_id!r} cannot hold more than {MAX_BYTES} bytes of ids and payloads "
            f"({what})"
        )
    return BatchLimitExceeded(text, batch_id, limit)


def _callback(
    codec: Codec[T], name: str, callback: object, limit: int | None = None
) -> tuple[str, bytes]:
    """('', b'') for no callback, else the checked job id and the encoded payload."""
    if callback is None:
        return "", b""
    if not isinstance(callback, Callback):
        raise ValidationError(f"{name} must be a Callback or None, got {type(callback).__name__}")
    validate_job_id(callback.job_id, what=f"{name} job id")
    return callback.job_id, encode_with(codec, callback.payload, limit=limit)


async def create_batch(
    client: RedisClient,
    keys: JobQueueKeys,
    codec: Codec[T],
    on_success: Callback[T] | None,
    on_failure: Callback[T] | None,
    on_complete: Callback[T] | None,
    batch_id: str | None,
) -> str:
    batch_id = uuid.uuid4().hex if batch_id is None else validate_job_id(batch_id, what="batch id")
    callbacks = [
        _callback(codec, name, cb, client.settings.max_payload_bytes)
        for name, cb in (
            ("on_success", on_success),
            ("on_failure", on_failure),
            ("on_complete", on_complete),
        )
    ]
    if sum(_size(job, body) for job, body in callbacks) > MAX_BYTES:
        raise _too_large(batch_id, "bytes", "the callbacks alone")
    args: list[Arg] = [batch_id]
    for job, body in callbacks:
        args += [job, body]
    reply = _s(await _CREATE(client, (keys.batch(batch_id), keys.coordinated), args))
    if reply == "too-large":  # pragma: no cover - refused above with the same rule
        raise _too_large(batch_id, "bytes", "the callbacks alone")
    return batch_id


def _member(
    codec: Codec[T], item: object, index: int | None, limit: int | None = None
) -> tuple[str, bytes]:
    if index is not None and (not isinstance(item, tuple | list) or len(item) != 2):
        raise ValidationError(
            f"item {index} must be a (job_id, payload) pair, got {type(item).__name__}"
        )
    pair: Sequence[Any] = item  # type: ignore[assignment]
    job_id: str = validate_job_id(pair[0])
    return job_id, encode_with(codec, pair[1], limit=limit)


def _add_args(batch_id: str, job_id: str, body: bytes, envelope: Sequence[Arg]) -> tuple[Arg, ...]:
    return (batch_id, job_id, body, *envelope)


def _added(batch_id: str, job_id: str, reply: Any) -> bool:
    status = _s(reply[0])
    if status == "added":
        return True
    if status == "exists":
        return False
    if status == "unknown":
        raise UnknownBatch(f"no batch {batch_id!r} (never created, or removed)", batch_id)
    if status == "sealed":
        raise BatchSealed(f"batch {batch_id!r} is sealed: job {job_id!r} cannot be added", batch_id)
    if status in ("members", "bytes"):
        raise _too_large(batch_id, status, f"adding job {job_id!r}")
    raise ScriptError(f"RESPIRE_BATCH unexpected batch_add reply {status!r}")


async def add_to_batch(
    client: RedisClient,
    keys: JobQueueKeys,
    codec: Codec[T],
    batch_id: str,
    job_id: str,
    payload: T,
    envelope: Sequence[Arg] = (),
) -> bool:
    validate_job_id(batch_id, what="batch id")
    job_id, body = _member(codec, (job_id, payload), None, client.settings.max_payload_bytes)
    if _size(job_id, body) > MAX_BYTES:
        raise _too_large(batch_id, "bytes", f"job {job_id!r} alone")
    reply = await _ADD(
        client,
        (keys.batch(batch_id), keys.ready, keys.control, keys.scheduled),
        _add_args(batch_id, job_id, body, envelope),
    )
    return _added(batch_id, job_id, reply)


async def add_many_to_batch(
    client: RedisClient,
    keys: JobQueueKeys,
    codec: Codec[T],
    batch_id: str,
    jobs: Iterable[tuple[str, T]],
    envelope: Sequence[Arg] = (),
) -> list[bool]:
    validate_job_id(batch_id, what="batch id")
    limit = client.settings.max_payload_bytes
    members = [_member(codec, item, i, limit) for i, item in enumerate(iterate(jobs, what="jobs"))]
    distinct = dict(reversed(members))  # a repeated id keeps its first payload
    if len(distinct) > MAX_MEMBERS:
        raise _too_large(batch_id, "members", f"{len(members)} jobs in one call")
    if sum(_size(job, body) for job, body in distinct.items()) > MAX_BYTES:
        raise _too_large(batch_id, "bytes", f"{len(members)} jobs in one call")
    state = keys.batch(batch_id)
    replies = await run_many(
        client,
        [
            (
                _ADD,
                (state, keys.ready, keys.control, keys.scheduled),
                _add_args(batch_id, j, b, envelope),
            )
            for j, b in members
        ],
    )
    # every add ran; raise the first failure only after looking at all of them
    added: list[bool] = []
    first: BaseException | None = None
    for (job_id, _), reply in zip(members, replies, strict=True):
        try:
            if isinstance(reply, BaseException):
                raise reply
            added.append(_added(batch_id, job_id, reply))
        except RespireError as exc:
            first = first or exc
    if first is not None:
        raise first
    return added


async def seal_batch(
    client: RedisClient, keys: JobQueueKeys, batch_id: str, *, cancel: bool
) -> bool:
    validate_job_id(batch_id, what="batch id")
    reply = _s(
        await _SEAL(
            client,
            (keys.batch(batch_id), keys.ready, keys.events),
            ("cancel" if cancel else "seal", batch_id),
        )
    )
    if reply == "unknown":
        raise UnknownBatch(f"no batch {batch_id!r} (never created, or removed)", batch_id)
    return reply in ("changed", "completed")


async def batch_status(
    client: RedisClient, keys: JobQueueKeys, batch_id: str
) -> BatchStatus | None:
    validate_job_id(batch_id, what="batch id")
    reply = await _STATUS(client, (keys.batch(batch_id),), (batch_id,))
    if reply is None:
        return None
    pending, succeeded, failed, cancelled, sealed, cancel, done, members = (int(x) for x in reply)
    return BatchStatus(
        batch_id,
        pending=pending,
        succeeded=succeeded,
        failed=failed,
        cancelled=cancelled,
        sealed=sealed == 1,
        cancellation_requested=cancel == 1,
        completed=done == 1,
        members=members,
    )


async def remove_batch(client: RedisClient, keys: JobQueueKeys, batch_id: str) -> bool:
    validate_job_id(batch_id, what="batch id")
    reply = _s(await _REMOVE(client, (keys.batch(batch_id),), (batch_id,)))
    if reply == "active":
        raise BatchActive(
            f"batch {batch_id!r} has not completed (unsealed, or members pending)", batch_id
        )
    return reply == "removed"


async def cancellation_requested(
    client: RedisClient, keys: JobQueueKeys, batch_id: str, job_id: str | None = None
) -> bool:
    """Whether cancellation of ``batch_id`` was requested (False when the batch is unknown or
    removed). With ``job_id``, True only while that job is a pending member: a dead-letter
    replay of a finished member runs as an independent job. The worker's gate calls this
    before a member's handler. Raises :class:`~respire_actors.errors.ServerError` subclasses
    for a state of an unknown schema version or a wrong key type."""
    args: tuple[Arg, ...] = (batch_id,) if job_id is None else (batch_id, job_id)
    return int(await _CHECK(client, (keys.batch(batch_id),), args)) == 1


__all__ = ["MAX_BYTES", "MAX_MEMBERS", "BatchStatus", "Callback", "cancellation_requested"]
