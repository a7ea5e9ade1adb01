"""The operator commands of ``python -m respire_actors`` as real processes against real state:
each command's table and ``--json`` output, exit codes and one-line errors, ``events --follow``
stopped by SIGINT, and ``retry --all`` over 10,000 dead letters in bounded memory."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import tracemalloc
from datetime import timedelta
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from helpers.cli import ROOT, cli_env, run_cli
from jobs_helpers import create_group, deliver

from respire_actors.admin import QueueAdmin, register_queue
from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobQueue, RateLimit
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def cli(server_url: str, backend: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*args, "--redis-url", server_url, "--backend", backend]
    return await anyio.to_thread.run_sync(lambda: run_cli(*argv))


async def cli_json(server_url: str, backend: str, *args: str) -> Any:
    result = await cli(server_url, backend, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dead_letter(key: str, i: int, payload: bytes, reason: str) -> tuple[Any, ...]:
    """An XADD of a dead letter laid out as the completion scripts write it (every other one
    with reason 'explicit')."""
    return (
        "XADD", key, "*", "_respire.job.id", f"j{i}", "_respire.job.payload", payload,
        "_respire.reason", reason if i % 2 else "explicit", "_respire.attempt", "1",
    )  # fmt: skip


async def add_dead_letters(
    client: RedisClient, key: str, n: int, *, payload: bytes = b"p", reason: str = "nack"
) -> None:
    for start in range(0, n, 1000):
        chunk = range(start, min(n, start + 1000))
        await client.pipeline([dead_letter(key, i, payload, reason) for i in chunk])


@pytest.fixture
async def busy(client: RedisClient, unique_name: str) -> JobQueue[str]:
    return await fill_busy_queue(client, unique_name)


async def fill_busy_queue(client: RedisClient, unique_name: str) -> JobQueue[str]:
    """A registered queue with 4 ready entries (2 pending for consumer c1), one staged job,
    4 dead letters (2 'nack', 2 'explicit'), an event and a log line."""
    queue = JobQueue(client, unique_name, StrCodec())
    await register_queue(client, queue.name)
    await create_group(client, queue.keys)
    await queue.enqueue_many([(f"r{i}", "x") for i in range(4)])
    await deliver(client, queue.keys, "c1", 2)
    from respire_actors.jobs import JobEnqueueOptions

    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=timedelta(hours=1)))
    await add_dead_letters(client, queue.keys.dead, 4)
    await client.execute(
        "XADD", queue.keys.events, "*", "kind", "progress", "job_id", "r0", "entry_id", "1-0",
        "attempt", "1", "percent", "50",
    )  # fmt: skip
    await client.execute("RPUSH", queue.keys.logs("r0"), "hello from r0")
    return queue


async def test_queues(
    prefixed: RedisClient, server_url: str, anyio_backend: str, unique_name: str
) -> None:
    """``queues`` lists the registry of the URL's key prefix. The test uses its own prefix (the
    ``prefixed`` fixture's), so the listing holds its queue only: the unprefixed registry is
    shared with every other test, xdist worker and process on the server."""
    busy = await fill_busy_queue(prefixed, unique_name)
    url = f"{server_url}?key_prefix={unique_name}:"
    result = await cli(url, anyio_backend, "queues")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if unique_name in line]
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    assert cells[:8] == [busy.name, "4", "2", cells[3], "2", "1", "4", "no"]
    (mine,) = await cli_json(url, anyio_backend, "queues")
    assert mine["name"] == busy.name
    assert (mine["ready"], mine["pending"], mine["scheduled"], mine["dead_letters"]) == (4, 2, 1, 4)


async def test_queue_detail_says_when_reasons_count_only_the_newest_letters(
    client: RedisClient, server_url: str, anyio_backend: str, unique_name: str
) -> None:
    """Found by review: with 3,000 dead letters the detail said "processing-failed 1000", the
    count of the newest 1,000 it reads, without saying so."""
    admin = QueueAdmin(client, unique_name)
    await register_queue(client, unique_name)
    fields = ("_respire.job.id", "j", "_respire.job.payload", "p", "_respire.reason", "nack")
    await client.pipeline([("XADD", admin.dead_key, "*", *fields) for _ in range(1200)])
    result = await cli(server_url, anyio_backend, "queue", unique_name)
    assert result.returncode == 0, result.stderr
    assert "dead letters by reason (newest 1,000 of 1,200)" in result.stdout
    assert "nack 1000" in result.stdout


async def test_queue_detail_and_unknown_queue(
    server_url: str, anyio_backend: str, busy: JobQueue[str], unique_name: str
) -> None:
    result = await cli(server_url, anyio_backend, "queue", busy.name)
    assert result.returncode == 0, result.stderr
    assert "dead letters by reason" in result.stdout and "nack 2" in result.stdout
    data = await cli_json(server_url, anyio_backend, "queue", busy.name)
    assert data["summary"]["pending"] == 2
    assert data["dead_letter_reasons"] == {"nack": 2, "explicit": 2}
    missing = await cli(server_url, anyio_backend, "queue", f"{unique_name}-nope")
    assert missing.returncode == 1
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith("error: no job queue named") and "queues" in line


async def test_dead_letters(server_url: str, anyio_backend: str, busy: JobQueue[str]) -> None:
    result = await cli(server_url, anyio_backend, "dead-letters", busy.name, "--reason", "nack")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("nack") >= 2 and "explicit" not in result.stdout
    page = await cli_json(server_url, anyio_backend, "dead-letters", busy.name, "--count", "3")
    assert len(page["rows"]) == 3 and page["next_before"].startswith("(")
    assert page["rows"][0]["payload"] == "p" and page["rows"][0]["job_id"] == "j3"


async def test_tables_print_queue_data_as_text_never_as_markup(
    client: RedisClient, server_url: str, anyio_backend: str, unique_name: str
) -> None:
    """Found by review: table cells went through Rich markup, so a dead-letter detail with
    "[/api/v1/users]" in it crashed `dead-letters` (MarkupError) and "[bold]" in a job id
    vanished from the table (the id an operator copies from it was wrong)."""
    queue = JobQueue(client, f"{unique_name}[bold]x", StrCodec())
    await register_queue(client, queue.name)
    await create_group(client, queue.keys)
    await client.execute(
        "XADD", queue.keys.dead, "*", "_respire.job.id", "order-[red]42",
        "_respire.job.payload", "p", "_respire.reason", "processing-failed",
        "_respire.attempt", "1", "_respire.detail", "KeyError: '[/api/v1/users]'",
    )  # fmt: skip
    result = await cli(server_url, anyio_backend, "dead-letters", queue.name)
    assert result.returncode == 0, result.stderr
    assert "order-[red]42" in result.stdout
    assert f"{unique_name}[bold]x" in result.stdout  # the title
    result = await cli(server_url, anyio_backend, "queue", queue.name)
    assert result.returncode == 0, result.stderr
    assert f"{unique_name}[bold]x" in result.stdout


async def test_retry_ids_and_all(
    client: RedisClient, server_url: str, anyio_backend: str, busy: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, busy.name)
    first = (await admin.dead_letters(count=1)).rows[0]
    result = await cli(server_url, anyio_backend, "retry", busy.name, first.dead_id)
    assert result.returncode == 0, result.stderr
    assert "retried 1 of 1" in result.stdout
    data = await cli_json(
        server_url, anyio_backend, "retry", busy.name, "--all", "--reason", "nack"
    )
    assert data == {"queue": busy.name, "scanned": 3, "retried": 1}
    assert (await admin.summary()).dead_letters == 2
    assert await client.execute("XLEN", busy.keys.ready) == 6
    usage = await cli(server_url, anyio_backend, "retry", busy.name)
    assert usage.returncode == 2
    assert usage.stderr.startswith("error: give dead-letter ids or --all")
    # every id is checked before any letter is retried (they went in chunks of 500, checked
    # chunk by chunk: 500 letters were retried before a bad 501st id was refused), and the
    # refusal is one line with no progress bar before it
    letters = [row.dead_id for row in (await admin.dead_letters(count=10)).rows]
    ready = await client.execute("XLEN", busy.keys.ready)
    bad = await cli(server_url, anyio_backend, "retry", busy.name, *letters * 250, "nope")
    assert bad.returncode == 2 and bad.stderr.startswith("error: "), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert await client.execute("XLEN", busy.keys.ready) == ready
    assert (await admin.summary()).dead_letters == 2
    # ids that are not (or no longer) dead letters: a failure that says what to do (it was
    # "retried 0 of 1" with exit 0), and a mistyped queue is refused (it was "0 of 0")
    again = await cli(server_url, anyio_backend, "retry", busy.name, first.dead_id)
    assert again.returncode == 1, again
    assert "retried 0 of 1" in again.stdout
    assert "not dead letters" in again.stderr and "dead-letters" in again.stderr
    unknown = await cli(server_url, anyio_backend, "retry", busy.name + "-typo", "--all")
    assert unknown.returncode == 1 and "no job queue named" in unknown.stderr, unknown


async def test_a_partitioned_queue_is_paused_whole_and_named_in_errors(
    server_url: str, anyio_backend: str, client: RedisClient, unique_name: str
) -> None:
    """Its own name used to be "no job queue named ...": an operator had to pause every
    partition by hand (up to 1,024 commands)."""
    from respire_actors.jobs import PartitionedJobQueue

    queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=4)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(8)])
    paused = await cli(server_url, anyio_backend, "pause", unique_name)
    assert paused.returncode == 0, paused.stderr
    assert "4 of its 4 partitions" in paused.stdout
    assert all(p.paused for p in (await queue.get_state()).partitions)
    resumed = await cli(server_url, anyio_backend, "resume", unique_name)
    assert resumed.returncode == 0 and "4 of its 4" in resumed.stdout
    assert not any(p.paused for p in (await queue.get_state()).partitions)
    shown = await cli(server_url, anyio_backend, "queue", unique_name)
    assert shown.returncode == 1
    assert "partitioned queue of 4 partitions" in shown.stderr and ":p0" in shown.stderr
    assert (await cli(server_url, anyio_backend, "queue", f"{unique_name}:p0")).returncode == 0


async def test_reading_commands_refuse_a_partitioned_queues_own_name(
    server_url: str, anyio_backend: str, client: RedisClient, unique_name: str
) -> None:
    """Found by review: dead-letters, events, pending, logs and rate (show) given the whole
    name printed empty tables and exit 0 while a partition held a dead letter and its logs
    (the name's own keys hold nothing), and ``events --follow`` waited forever."""
    from respire_actors.jobs import PartitionedJobQueue

    queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=4)
    await queue.enqueue("j1", "x")
    for args in (
        ("dead-letters", unique_name),
        ("events", unique_name),
        ("pending", unique_name),
        ("logs", unique_name, "j1"),
        ("rate", unique_name),
    ):
        refused = await cli(server_url, anyio_backend, *args)
        assert refused.returncode == 1, (args, refused)
        assert "partitioned queue of 4 partitions" in refused.stderr, (args, refused.stderr)
    argv = ("events", unique_name, "--follow", "--redis-url", server_url)
    followed = await anyio.to_thread.run_sync(
        lambda: run_cli(*argv, "--backend", anyio_backend, timeout=30)
    )
    assert followed.returncode == 1 and "partitioned queue of 4" in followed.stderr


async def test_pause_resume_and_rate(
    server_url: str, anyio_backend: str, busy: JobQueue[str]
) -> None:
    assert (await cli(server_url, anyio_backend, "pause", busy.name)).returncode == 0
    assert (await busy.get_state()).paused
    again = await cli(server_url, anyio_backend, "pause", busy.name)
    assert "already" in again.stdout
    assert (await cli(server_url, anyio_backend, "resume", busy.name)).returncode == 0
    assert not (await busy.get_state()).paused
    data = await cli_json(
        server_url, anyio_backend, "rate", busy.name, "--limit", "5", "--window", "2"
    )
    assert data["rate_limit"] == {"permit_limit": 5, "window": 2.0}
    assert (await busy.get_state()).rate_limit == RateLimit(5, timedelta(seconds=2))
    shown = await cli(server_url, anyio_backend, "rate", busy.name)
    assert "5/2s" in shown.stdout
    await cli(server_url, anyio_backend, "rate", busy.name, "--clear")
    assert (await busy.get_state()).rate_limit is None
    bad = await cli(server_url, anyio_backend, "rate", busy.name, "--limit", "5")
    assert bad.returncode == 2 and "go together" in bad.stderr
    for window in ("nan", "inf", "1e300"):  # were a ValueError / OverflowError and exit 1
        bad = await cli(
            server_url, anyio_backend, "rate", busy.name, "--limit", "5", "--window", window
        )
        assert bad.returncode == 2 and "--window" in bad.stderr, bad.stderr
    assert (await busy.get_state()).rate_limit is None


async def test_events_logs_pending(
    server_url: str, anyio_backend: str, busy: JobQueue[str]
) -> None:
    events = await cli_json(server_url, anyio_backend, "events", busy.name)
    assert [(e["kind"], e["job_id"], e["percent"]) for e in events["rows"]] == [
        ("progress", "r0", 50)
    ]
    table = await cli(server_url, anyio_backend, "events", busy.name)
    assert "progress" in table.stdout
    logs = await cli(server_url, anyio_backend, "logs", busy.name, "r0")
    assert logs.stdout.strip() == "hello from r0"
    assert (await cli_json(server_url, anyio_backend, "logs", busy.name, "r0"))["lines"] == [
        "hello from r0"
    ]
    pending = await cli_json(server_url, anyio_backend, "pending", busy.name)
    assert [(r["job_id"], r["consumer"]) for r in pending["rows"]] == [("r0", "c1"), ("r1", "c1")]
    table = await cli(server_url, anyio_backend, "pending", busy.name)
    assert "r1" in table.stdout and "c1" in table.stdout


async def test_events_follow_until_interrupted(
    client: RedisClient, server_url: str, anyio_backend: str, busy: JobQueue[str]
) -> None:
    argv = [sys.executable, "-m", "respire_actors", "events", busy.name, "--follow", "--json",
            "--cursor", "0-0", "--redis-url", server_url, "--backend", anyio_backend]  # fmt: skip

    def follow() -> tuple[list[str], int, str]:
        with subprocess.Popen(
            argv, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        ) as proc:  # fmt: skip
            try:
                assert proc.stdout is not None and proc.stderr is not None
                lines = [proc.stdout.readline()]
                anyio.from_thread.run(
                    client.execute, "XADD", busy.keys.events, "*", "kind", "completed",
                    "job_id", "r9",
                )  # fmt: skip
                lines.append(proc.stdout.readline())
                proc.send_signal(signal.SIGINT)
                # communicate, not wait: a child blocked on a full stderr pipe must not look
                # like one that ignored the signal
                try:
                    _, stderr = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired as exc:
                    proc.kill()
                    _, stderr = proc.communicate()
                    raise AssertionError(f"SIGINT did not stop the follower: {stderr}") from exc
                return lines, proc.returncode, stderr
            finally:
                if proc.poll() is None:
                    proc.kill()

    lines, code, stderr = await anyio.to_thread.run_sync(follow)
    assert code == 0, stderr
    assert json.loads(lines[0])["job_id"] == "r0"
    assert json.loads(lines[1])["kind"] == "completed"


async def test_trim_dry_run_then_trim(
    client: RedisClient, server_url: str, anyio_backend: str, busy: JobQueue[str]
) -> None:
    dry = await cli(server_url, anyio_backend, "trim", busy.name, "--max-length", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout and "group respire: 2 pending" in dry.stdout
    # the ready stream stops at once, at its group boundary (not "policy": max-length 0 would
    # take everything)
    ready_row = next(
        line for line in dry.stdout.splitlines() if line.strip("│ ").startswith("ready")
    )
    assert "group boundary" in ready_row, dry.stdout
    assert await client.execute("XLEN", busy.keys.ready) == 4
    assert await client.execute("XLEN", busy.keys.dead) == 4
    data = await cli_json(server_url, anyio_backend, "trim", busy.name, "--max-length", "0")
    by_stream = {p["stream"]: p for p in data["plans"]}
    assert by_stream["ready"]["count"] == 0  # everything is pending or undelivered
    assert by_stream["ready"]["cutoff"] is None and by_stream["ready"]["safe"] is True
    assert [r["removed"] for r in data["results"]] == [0, 1, 4]
    assert await client.execute("XLEN", busy.keys.ready) == 4
    assert await client.execute("XLEN", busy.keys.dead) == 0
    usage = await cli(server_url, anyio_backend, "trim", busy.name)
    assert usage.returncode == 2 and "--max-age" in usage.stderr


async def test_unreachable_server_is_a_startup_failure(anyio_backend: str) -> None:
    result = await cli("redis://127.0.0.1:1", anyio_backend, "queues")
    assert result.returncode == 3
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "cannot reach" in line


async def test_retry_all_of_10000_dead_letters_in_bounded_memory(
    client: RedisClient, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """20 MB of dead letters are retried page by page: the peak of Python allocations stays
    far below what holding them all would take."""
    # pytest keeps every captured log record: 10,000 INFO lines (one per retried letter) held by
    # the capture handler are the harness's memory, not retry_all's (they made this flaky
    # whenever an earlier test in the same process had left the logger at INFO)
    caplog.set_level(logging.WARNING, logger="respire_actors.admin")
    admin = QueueAdmin(client, unique_name)
    await add_dead_letters(client, admin.dead_key, 10_000, payload=b"x" * 2048)
    tracemalloc.start()
    try:
        last = None
        async for progress in admin.retry_all(batch=500):
            last = progress
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last is not None and (last.scanned, last.retried) == (10_000, 10_000)
    assert await client.execute("XLEN", admin.dead_key) == 0
    assert await client.execute("XLEN", admin.keys.ready) == 10_000
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
