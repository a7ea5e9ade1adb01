"""Bad input across the public API (issue 8, items 15 and 21): every case raises a documented
typed error (``ValidationError`` or ``ConfigurationError``) before any command is sent.

Each check runs with the client's commands forbidden and its ``round_trips`` counter watched,
on both servers and both anyio backends.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from respire_actors.codecs import JsonCodec, StrCodec
from respire_actors.errors import ConfigurationError, RespireError, ValidationError
from respire_actors.jobs import (
    JobEnqueueOptions,
    JobQueue,
    LogPolicy,
    QueueOptions,
    Worker,
    WorkerOptions,
)
from respire_actors.redis.client import ConnectionSettings, RedisClient
from respire_actors.reliable import ReliableQueue
from respire_actors.streams import StreamWorker, StreamWorkerOptions

pytestmark = pytest.mark.anyio


@contextmanager
def nothing_sent(client: RedisClient) -> Iterator[None]:
    """Fails the test if any command goes out through ``client`` inside the block."""

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a command was sent: {args[:1]!r}")

    before = client.round_trips
    client.execute = refuse  # type: ignore[method-assign]
    client.pipeline = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        del client.execute, client.pipeline
    assert client.round_trips == before


async def handler(job: Any) -> None:
    return None


def sync_handler(job: Any) -> None:
    return None


class AsyncCallable:
    async def __call__(self, job: Any) -> None:
        return None


async def no_argument() -> None:
    return None


async def two_arguments(job: Any, extra: Any) -> None:
    return None


async def keyword_only(*, job: Any) -> None:
    return None


async def yielding(job: Any) -> Any:
    yield job


class SyncCallable:
    def __call__(self, job: Any) -> None:
        return None


# -- item 15: registration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"handler": None}, "async function"),
        ({"handler": "send_email"}, "async function"),
        ({"handler": sync_handler}, "async def"),
        ({"handler": SyncCallable()}, "async def"),
        ({"handler": AsyncCallable}, "async function"),  # the class, not an instance
        ({"handler": lambda job: handler(job)}, "async def"),
        # the arity: a handler is called with the job alone (found by review: these used to
        # register and then dead-letter every job with a TypeError)
        ({"handler": no_argument}, "exactly one positional argument"),
        ({"handler": two_arguments}, "exactly one positional argument"),
        ({"handler": keyword_only}, "exactly one positional argument"),
        ({"handler": yielding}, "async generator"),
        ({"codec": None}, "encode"),
        ({"codec": JsonCodec}, r"pass JsonCodec\(Email\)"),
        ({"codec": StrCodec}, r"pass StrCodec\(\)"),
        ({"codec": "json"}, "encode"),
        ({"options": {"consumer_count": 2}}, "WorkerOptions"),
        ({"options": StreamWorkerOptions()}, "WorkerOptions"),
        ({"queue_options": {"retry_backoff": 1}}, "QueueOptions"),
        ({"result_codec": JsonCodec}, "instance"),
    ],
)
def test_job_registration_refuses_what_could_never_run(
    kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"queue": "email", "handler": handler, "codec": StrCodec()}
    args.update(kwargs)
    worker = Worker()
    with pytest.raises(ValidationError, match=message):
        worker.register(**args)
    assert worker.registrations == []


def test_the_decorator_checks_codec_and_options_before_the_function() -> None:
    worker = Worker()
    with pytest.raises(ValidationError, match="instance"):
        worker.job("email", JsonCodec)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="WorkerOptions"):
        worker.job("email", StrCodec(), {"consumer_count": 2})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="async"):
        worker.job("email", StrCodec())(sync_handler)  # type: ignore[arg-type]


def test_async_handlers_of_every_shape_are_accepted() -> None:
    worker = Worker()
    worker.register("a", handler, StrCodec())
    worker.register("b", AsyncCallable(), StrCodec())
    worker.register("c", functools.partial(handler), StrCodec())

    async def with_defaults(job: Any, extra: int = 1, *rest: Any, **options: Any) -> None:
        return None

    worker.register("d", with_defaults, StrCodec())
    worker.register("e", functools.partial(two_arguments, extra=2), StrCodec())
    assert [r.queue for r in worker.registrations] == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"handler": sync_handler}, ValidationError, "async def"),
        ({"handler": None}, ValidationError, "async function"),
        ({"options": {"concurrency": 2}}, ValidationError, "StreamWorkerOptions"),
        ({"options": WorkerOptions()}, ValidationError, "StreamWorkerOptions"),
        ({"stream": "s" * 100_000}, ValidationError, "limit"),
        ({"stream": "\ud800"}, ValidationError, "Unicode"),
        (
            {"options": StreamWorkerOptions(dead_letter_stream="{elsewhere}:dead")},
            ConfigurationError,
            "slot",
        ),
    ],
)
def test_stream_registration_refuses_what_could_never_run(
    kwargs: dict[str, Any], error: type[RespireError], message: str
) -> None:
    args: dict[str, Any] = {"stream": "{orders}", "handler": handler}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        StreamWorker().register(**args)


def test_stream_options_refuse_a_huge_dead_letter_key() -> None:
    with pytest.raises(ValidationError, match="limit"):
        StreamWorkerOptions(dead_letter_stream="d" * 100_000)


# -- item 21: options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: WorkerOptions(logs="100"),  # type: ignore[arg-type]
        lambda: WorkerOptions(logs={"max_lines": 5}),  # type: ignore[arg-type]
        lambda: WorkerOptions(visibility_timeout=0.0001),  # 0.1 ms: was a 1 ms lease
        lambda: WorkerOptions(visibility_timeout=timedelta(milliseconds=9)),
        lambda: WorkerOptions(visibility_timeout=10**400),
        lambda: WorkerOptions(recovery_interval=10**400),
        lambda: WorkerOptions(dead_letter_undecodable=1),  # type: ignore[arg-type]
        lambda: StreamWorkerOptions(visibility_timeout=timedelta(microseconds=100)),
        lambda: JobEnqueueOptions(dedup_window=10**400),
        lambda: JobEnqueueOptions(delay=-(10**400)),
        lambda: JobEnqueueOptions(ttl=10**400),
        lambda: QueueOptions(retry_backoff=10**400),
        lambda: LogPolicy(retention=10**400),  # type: ignore[arg-type]
    ],
)
def test_option_objects_refuse_bad_values(build: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        build()


def test_the_shortest_visibility_timeout_is_ten_ms_everywhere() -> None:
    assert WorkerOptions(visibility_timeout=0.01).visibility_timeout == 0.01
    assert StreamWorkerOptions(visibility_timeout=timedelta(milliseconds=10))


@pytest.mark.parametrize(
    "query",
    ["command_timeout=nan", "command_timeout=inf", "connect_timeout=nan", "connect_timeout=inf"],
)
def test_a_non_finite_timeout_in_the_url_is_refused(query: str) -> None:
    with pytest.raises(ConfigurationError):
        ConnectionSettings.from_url(f"redis://127.0.0.1:6379?{query}")


# -- item 21: the job queue ----------------------------------------------------------------------


async def test_job_queue_construction_refuses_bad_arguments(client: RedisClient) -> None:
    with nothing_sent(client):
        for build in (
            lambda: JobQueue(client, "q", None),  # type: ignore[arg-type]
            lambda: JobQueue(client, "q", JsonCodec),  # type: ignore[arg-type]
            lambda: JobQueue(client, "q", "str"),  # type: ignore[arg-type]
            lambda: JobQueue("str", "q", StrCodec()),  # type: ignore[arg-type]
            lambda: JobQueue(None, "q", StrCodec()),  # type: ignore[arg-type]
            lambda: JobQueue(client, "", StrCodec()),
            lambda: JobQueue(client, "a{b}", StrCodec()),
        ):
            with pytest.raises(ValidationError):
                build()


JOB_CALLS: dict[str, Callable[[JobQueue[str]], Awaitable[Any]]] = {
    "window-huge-int": lambda q: q.enqueue("j", "p", dedup_window=10**400),
    "window-huge-float": lambda q: q.enqueue("j", "p", dedup_window=1e300),
    "window-nan": lambda q: q.enqueue("j", "p", dedup_window=float("nan")),
    "many-not-iterable": lambda q: q.enqueue_many(5),  # type: ignore[arg-type]
    "scheduled-many-not-iterable": lambda q: q.enqueue_scheduled_many(5),  # type: ignore[arg-type]
    "batch-many-not-iterable": lambda q: q.add_many_to_batch("b", 5),  # type: ignore[arg-type]
    "delay-negative-tiny": lambda q: q.enqueue_scheduled("j", "p", JobEnqueueOptions(delay=-1e-10)),
    "events-cursor-beyond-64-bits": lambda q: q.read_events("18446744073709551616-0").__aenter__(),
    "events-cursor-newline": lambda q: q.read_events("1-0\n").__aenter__(),
    "many-1-tuple": lambda q: q.enqueue_many([("a",)]),  # type: ignore[list-item]
    "many-3-tuple": lambda q: q.enqueue_many([("a", "p", "x")]),  # type: ignore[list-item]
    "many-str": lambda q: q.enqueue_many(["ab"]),  # type: ignore[list-item]
    "many-none": lambda q: q.enqueue_many([None]),  # type: ignore[list-item]
    "many-late-bad": lambda q: q.enqueue_many([("a", "p"), ("b",)]),  # type: ignore[list-item]
    "many-window": lambda q: q.enqueue_many([("a", "p")], dedup_window=10**400),
    "sched-many-shape": lambda q: q.enqueue_scheduled_many([("a",)]),  # type: ignore[list-item]
    "sched-options": lambda q: q.enqueue_scheduled("j", "p", {"delay": 1}),  # type: ignore[arg-type]
    "blank-id": lambda q: q.enqueue(" ", "p"),
    "payload-type": lambda q: q.enqueue("j", 7),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", list(JOB_CALLS))
async def test_job_queue_calls_refuse_bad_input_before_sending(
    client: RedisClient, unique_name: str, call: str
) -> None:
    queue: JobQueue[str] = JobQueue(client, unique_name, StrCodec())
    with nothing_sent(client), pytest.raises(ValidationError):
        await JOB_CALLS[call](queue)


# -- item 21: the reliable queue -----------------------------------------------------------------


RELIABLE_CALLS: dict[str, Callable[[ReliableQueue[str]], Awaitable[Any]]] = {
    "send-many-not-iterable": lambda q: q.send_many(5),  # type: ignore[arg-type]
    "send-many-one-str": lambda q: q.send_many("hello"),  # type: ignore[arg-type]
    "ack-many-not-iterable": lambda q: q.ack_many(5),  # type: ignore[arg-type]
    "ack-receipt-newline": lambda q: q.ack("1-0:1:5\n"),
    "nack-receipt-newline": lambda q: q.nack("1-0:1:5\n"),
    "dead-letters-after-newline": lambda q: q.dead_letters(after="1-0\n"),
    "dead-letters-after-beyond-64-bits": lambda q: q.dead_letters(after="18446744073709551616-0"),
    "dead-letters-after-arabic-digits": lambda q: q.dead_letters(after="\u0661-\u0660"),
    "dedup-blank": lambda q: q.send("p", dedup_id="   "),
    "dedup-empty": lambda q: q.send("p", dedup_id=""),
    "dedup-1mb": lambda q: q.send("p", dedup_id="x" * 1_000_000),
    "visibility-0.1ms": lambda q: q.receive(0.0001),
    "visibility-9ms": lambda q: q.receive(timedelta(milliseconds=9)),
    "visibility-huge": lambda q: q.receive(10**400),
}


@pytest.mark.parametrize("call", list(RELIABLE_CALLS))
async def test_reliable_queue_calls_refuse_bad_input_before_sending(
    client: RedisClient, unique_name: str, call: str
) -> None:
    queue: ReliableQueue[str] = ReliableQueue(client, unique_name, StrCodec())
    with nothing_sent(client), pytest.raises(ValidationError):
        await RELIABLE_CALLS[call](queue)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"poll_interval": 1.0, "max_poll_interval": 0.5},
        {"batch_size": 10, "max_leased": 5},
        {"visibility": 0.0001},
    ],
)
async def test_iter_messages_refuses_inconsistent_settings(
    client: RedisClient, unique_name: str, kwargs: dict[str, Any]
) -> None:
    queue: ReliableQueue[str] = ReliableQueue(client, unique_name, StrCodec())
    args: dict[str, Any] = {"visibility": 30}
    args.update(kwargs)
    with nothing_sent(client), pytest.raises(ValidationError):
        queue.iter_messages(**args)


async def test_reliable_queue_construction_refuses_bad_arguments(client: RedisClient) -> None:
    with nothing_sent(client):
        for build in (
            lambda: ReliableQueue(client, "q", JsonCodec),  # type: ignore[arg-type]
            lambda: ReliableQueue(client, "q", None),  # type: ignore[arg-type]
            lambda: ReliableQueue("str", "q", StrCodec()),  # type: ignore[arg-type]
            lambda: ReliableQueue(client, "q", StrCodec(), dedup_window=10**400),
        ):
            with pytest.raises(ValidationError):
                build()
