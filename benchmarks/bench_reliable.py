"""Throughput of the reliable queue: send, receive and ack with batches of 1, 10 and 100.

Usage::

    python benchmarks/bench_reliable.py                       # starts an embedded valkey-server
    python benchmarks/bench_reliable.py redis://127.0.0.1:6379 --messages 5000 --backend trio

Each batch size runs three phases on a fresh queue, one after the other, from one task:
``send`` (``send`` for batch 1, ``send_many`` otherwise), ``receive`` (``receive(max=batch)``
until empty) and ``ack`` (``ack`` for batch 1, ``ack_many`` otherwise). Every call waits for its
reply before the next, so the figures are per-connection latency bound; run several processes to
measure server capacity. Set ``COREDIS_OPTIMIZED=true`` before starting for faster pipelines.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio

from respire_actors.codecs import BytesCodec
from respire_actors.embedded import EmbeddedConfig, open_embedded_server
from respire_actors.redis.client import RedisClient, connect
from respire_actors.reliable import Message, ReliableQueue


@dataclass
class Row:
    batch: int
    send: float
    receive: float
    ack: float


async def run_batch(client: RedisClient, batch: int, messages: int, payload: bytes) -> Row:
    queue = ReliableQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    try:
        start = time.perf_counter()
        if batch == 1:
            for _ in range(messages):
                await queue.send(payload)
        else:
            for offset in range(0, messages, batch):
                await queue.send_many([payload] * min(batch, messages - offset))
        send_s = time.perf_counter() - start

        received: list[Message[bytes]] = []
        start = time.perf_counter()
        while chunk := await queue.receive(300, max=batch):
            received.extend(chunk)
        receive_s = time.perf_counter() - start
        if len(received) != messages:
            raise RuntimeError(f"received {len(received)} of {messages} messages")

        start = time.perf_counter()
        if batch == 1:
            for message in received:
                if not await queue.ack(message):
                    raise RuntimeError("an ack was refused")
        else:
            for offset in range(0, messages, batch):
                if not all(await queue.ack_many(received[offset : offset + batch])):
                    raise RuntimeError("an ack was refused")
        ack_s = time.perf_counter() - start
        return Row(batch, messages / send_s, messages / receive_s, messages / ack_s)
    finally:
        keys = [queue.keys.stream, queue.keys.deadlines, queue.keys.receipts, queue.keys.dead]
        await client.execute("DEL", *keys)


async def bench(url: str, batches: list[int], messages: int, size: int) -> list[Row]:
    payload = b"x" * size
    async with connect(url) as client:
        info = await client.server_info()
        print(f"server: {info.describe()} at {client.settings.describe()}")
        await run_batch(client, 10, min(messages, 200), payload)  # warm-up: load scripts
        return [await run_batch(client, b, messages, payload) for b in batches]


def print_table(rows: list[Row], backend: str, messages: int, size: int) -> None:
    print(f"backend: {backend}; {messages} messages of {size} bytes per batch size; messages/s")
    header = f"| {'batch':>5} | {'send':>9} | {'receive':>9} | {'ack':>9} |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r.batch:>5} | {r.send:>9,.0f} | {r.receive:>9,.0f} | {r.ack:>9,.0f} |")


async def main_async(args: argparse.Namespace) -> None:
    if args.url:
        rows = await bench(args.url, args.batches, args.messages, args.size)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-valkey-") as data:
            config = EmbeddedConfig(data_dir=Path(data), persistent=False)
            async with open_embedded_server(config) as url:
                rows = await bench(url, args.batches, args.messages, args.size)
    print_table(rows, args.backend, args.messages, args.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="Redis URL (default: start an embedded valkey)")
    parser.add_argument("--messages", type=int, default=2000, help="messages per batch size")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    if args.messages < 1 or any(not 1 <= b <= 1000 for b in args.batches):
        parser.error("--messages must be positive and every batch within 1..1000")
    anyio.run(main_async, args, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
