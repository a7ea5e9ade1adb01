"""A receiver process killed while holding leases: its messages come back after expiry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest
from reliable_helpers import wait_for_server_time

from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableQueue

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CHILD = textwrap.dedent(
    """
    import sys, time, anyio
    from respire_actors.codecs import StrCodec
    from respire_actors.redis.client import connect
    from respire_actors.reliable import ReliableQueue

    async def main(url, name):
        async with connect(url) as client:
            queue = ReliableQueue(client, name, StrCodec())
            batch = await queue.receive(1.0, max=3)
            print(" ".join(f"{m.id}/{m.lease_deadline_ms}" for m in batch), flush=True)
            time.sleep(60)  # "processing": never acks; the parent kills us here

    anyio.run(main, sys.argv[1], sys.argv[2], backend=sys.argv[3])
    """
)


async def test_messages_leased_by_a_killed_process_are_redelivered_after_expiry(
    client: RedisClient, server_url: str, unique_name: str, anyio_backend: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    ids = await queue.send_many(["a", "b", "c", "d"])
    child = await anyio.open_process(
        [sys.executable, "-c", CHILD, server_url, unique_name, anyio_backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout is not None
        with anyio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await child.stdout.receive()
                line += chunk
        leased = [item.split("/") for item in line.decode().split()]
        assert [i for i, _ in leased] == ids[:3]
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL

    # the dead process's leases still hold: only the fourth message is available
    (fourth,) = await queue.receive(30, max=10)
    assert fourth.id == ids[3]
    await wait_for_server_time(client, max(int(d) for _, d in leased))
    back = await queue.receive(30, max=10)

    assert [(m.id, m.delivery_count) for m in back] == [(i, 2) for i in ids[:3]]
    assert await queue.ack_many([*back, fourth]) == [True] * 4
    assert (await queue.inspect()).messages == 0
