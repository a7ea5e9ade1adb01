"""Leases, admission bounds, graceful stop, and a worker process killed mid-handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import anyio
import pytest
from streams_helpers import (
    FAST,
    add,
    add_many,
    child_error,
    child_state,
    fast_options,
    ordered,
    pending_rows,
    running,
    runtime,
    stats,
    wait_until,
    wait_until_async,
)

from respire_actors.jobs.model import ACK
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamEntry, StreamSource, StreamWorker

pytestmark = pytest.mark.anyio


async def test_handler_running_past_the_visibility_timeout_is_cancelled(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add(client, stream)
    cancelled: list[int] = []
    attempts: list[int] = []

    async def handler(e: StreamEntry) -> Any:
        attempts.append(e.attempt)
        if e.attempt == 1:
            assert e.cancel_scope is not None
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(e.attempt)
                raise
        return ACK

    # the fixed lease (no renewal): the visibility timeout is the handler's deadline
    options = fast_options(visibility_timeout=FAST, renew_leases=False)
    async with running(client, stream, handler, options) as worker:
        # attempt 1 counts its lost lease when its task next runs: on a loaded machine that
        # can come after attempt 2 (claimed by the sweeper at the same moment) was acked
        await wait_until(lambda: stats(worker, stream).acked == 1)
        await wait_until(lambda: stats(worker, stream).leases_lost >= 1)
        s = stats(worker, stream)
        assert s.leases_lost == 1
        assert s.recovered == 1
        assert s.stale_completions == 0
    assert cancelled == [1]
    assert attempts == [1, 2]
    assert await pending_rows(client, stream, "respire") == []
    assert int(await client.execute("XLEN", f"{stream}:dead")) == 0


async def test_concurrency_bounds_the_handlers_in_flight(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    await add_many(client, stream, 10)
    gate = anyio.Event()
    in_flight = 0
    most = 0

    async def handler(e: StreamEntry) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await gate.wait()
        finally:
            in_flight -= 1
        return ACK

    options = fast_options(concurrency=3, batch_size=10)
    async with running(client, stream, handler, options) as worker:
        rt = runtime(worker, stream)
        await wait_until(lambda: in_flight == 3)
        # the reader now waits for a permit: nothing more can be admitted
        await wait_until(lambda: rt.admission.statistics().waiting >= 1)
        assert rt.admission.statistics().in_use == 3
        assert stats(worker, stream).admitted == 3
        assert len(await pending_rows(client, stream, "respire")) == 3
        gate.set()
        await wait_until(lambda: stats(worker, stream).acked == 10)
    assert most == 3


async def test_batch_size_bounds_each_read(
    client: RedisClient, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = unique_name
    ids = await add_many(client, stream, 7)
    reads: list[tuple[int, int]] = []
    original = StreamSource.read

    async def read(self: StreamSource, consumer: str, count: int, min_idle_ms: int = 0) -> Any:
        result = await original(self, consumer, count, min_idle_ms)
        reads.append((count, len(result.deliveries)))
        return result

    monkeypatch.setattr(StreamSource, "read", read)
    seen: list[str] = []

    async def handler(e: StreamEntry) -> Any:
        seen.append(e.id)
        return ACK

    options = fast_options(concurrency=8, batch_size=2)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 7)
    assert ordered(seen) == ids
    assert reads and all(count <= 2 and got <= count for count, got in reads)
    assert sum(got for _, got in reads) == 7
    assert sum(1 for _, got in reads if got) >= 4


async def test_graceful_stop_leaves_unstarted_entries_unacked(
    client: RedisClient, unique_name: str
) -> None:
    """Running handlers finish and are acknowledged; nothing else is started or acknowledged,
    and the next run picks up exactly the rest."""
    stream = unique_name
    ids = await add_many(client, stream, 6)
    started: list[str] = []
    release = anyio.Event()

    async def handler(e: StreamEntry) -> Any:
        started.append(e.id)
        await release.wait()
        return ACK

    worker = StreamWorker()
    worker.register(stream, handler, fast_options(concurrency=2, batch_size=6))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until(lambda: len(started) == 2)
        worker.request_stop()
        # intake stops first: once the reader is gone, let the running handlers finish
        await wait_until(lambda: child_state(worker, "reader") == "stopped")
        assert child_state(worker, "runners") in ("running", "stopping")  # not stopped before
        # the supervisor asks the runners to stop in its next step (under load that is not
        # always done by the time the reader's state is seen)
        await wait_until(lambda: child_state(worker, "runners") == "stopping")
        # the two running handlers still hold their admission permits
        assert runtime(worker, stream).admission.statistics().in_use == 2
        release.set()
    s = stats(worker, stream)
    assert ordered(started) == ids[:2]
    assert (s.acked, s.leases_lost, s.started) == (2, 0, 2)
    assert child_error(worker, "runners") is None
    assert await pending_rows(client, stream, "respire") == []

    rest: list[str] = []

    async def second(e: StreamEntry) -> Any:
        rest.append(e.id)
        return ACK

    async with running(client, stream, second) as again:
        await wait_until(lambda: stats(again, stream).acked == 4)
    assert ordered(rest) == ids[2:]


async def test_stop_during_a_handler_past_the_grace_leaves_it_pending(
    client: RedisClient, unique_name: str
) -> None:
    stream = unique_name
    (entry,) = await add_many(client, stream, 1)
    started = anyio.Event()

    async def handler(e: StreamEntry) -> Any:
        started.set()
        await anyio.sleep_forever()

    worker = StreamWorker()
    options = fast_options(concurrency=1, shutdown_grace=timedelta(milliseconds=50))
    worker.register(stream, handler, options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with anyio.fail_after(10):
            await started.wait()
        with anyio.fail_after(10):
            await worker.stop()
    assert stats(worker, stream).acked == 0
    assert await pending_rows(client, stream, "respire") == [
        (entry, worker.consumer_name(stream), 1)
    ]


CRASHING_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import anyio

    from respire_actors.redis.client import connect
    from respire_actors.streams import StreamWorker, StreamWorkerOptions

    url, stream, marker, backend = sys.argv[1:5]

    async def main():
        async with connect(url) as client:
            async def handler(entry):
                await client.execute("SET", marker, entry.id)
                await anyio.sleep_forever()

            worker = StreamWorker()
            options = StreamWorkerOptions(
                start_id="0-0", consumer_name="doomed", visibility_timeout=timedelta(seconds=60)
            )
            worker.register(stream, handler, options)
            await worker.run(client)

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.slow
async def test_killed_worker_process_entry_is_recovered_exactly_once(
    client: RedisClient, server_url: str, unique_name: str, anyio_backend: str
) -> None:
    stream = unique_name
    entry = await add(client, stream, order="1")
    marker = f"{unique_name}:marker"
    process = await anyio.open_process(
        [sys.executable, "-c", CRASHING_WORKER, server_url, stream, marker, anyio_backend],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )
    try:

        async def handler_running() -> bool:
            assert process.returncode is None, "the worker process exited early"
            return bool(await client.execute("EXISTS", marker))

        await wait_until_async(handler_running, timeout=30)
    finally:
        process.kill()  # SIGKILL: no cleanup, no acknowledgement
        with anyio.fail_after(10, shield=True):
            await process.aclose()
    assert process.returncode == -signal.SIGKILL
    assert await client.execute("GET", marker) == entry.encode()
    assert await pending_rows(client, stream, "respire") == [(entry, "doomed", 1)]

    calls: list[tuple[str, int]] = []

    async def handler(e: StreamEntry) -> Any:
        calls.append((e.id, e.attempt))
        return ACK

    options = fast_options(visibility_timeout=FAST)
    async with running(client, stream, handler, options) as worker:
        await wait_until(lambda: stats(worker, stream).acked == 1)
        # further recovery passes find nothing more to run
        passes = stats(worker, stream).read_calls
        await wait_until(lambda: stats(worker, stream).read_calls >= passes + 2)
        assert stats(worker, stream).recovered == 1
    assert calls == [(entry, 2)]
    assert await pending_rows(client, stream, "respire") == []


async def test_stop_while_reader_and_sweeper_wait_for_permits_is_clean(
    client: RedisClient, unique_name: str
) -> None:
    """At full capacity both intake actors wait for a permit; stopping them must not give back
    permits they never took (the running handler still owns its permit)."""
    stream = unique_name
    (entry,) = await add_many(client, stream, 1)
    started = anyio.Event()
    release = anyio.Event()

    async def handler(e: StreamEntry) -> Any:
        started.set()
        await release.wait()
        return ACK

    worker = StreamWorker()
    worker.register(stream, handler, fast_options(concurrency=1))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with anyio.fail_after(10):
            await started.wait()
        rt = runtime(worker, stream)
        await wait_until(lambda: rt.admission.statistics().waiting == 2)
        worker.request_stop()
        await wait_until(lambda: child_state(worker, "sweeper") == "stopped")
        assert rt.admission.statistics().in_use == 1
        release.set()
    assert [child_error(worker, c) for c in ("reader", "sweeper", "runners")] == [None] * 3
    assert stats(worker, stream).acked == 1
    assert await pending_rows(client, stream, "respire") == []
    assert entry
