"""What the benchmark scripts share: key cleanup, the results table, and the command line
(``--redis-url`` or an embedded valkey-server without persistence, ``--backend``, ``--jobs``).

The scripts run as ``python benchmarks/<name>.py``, so this module is imported by its bare name.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from respire_actors.embedded import EmbeddedConfig, open_embedded_server


async def cleanup(client: Any, queue: Any) -> None:
    """Delete every key of ``queue`` (SCAN + UNLINK on its key base)."""
    cursor = 0
    pattern = queue.keys.base.replace("{", "[{]").replace("}", "[}]") + "*"
    while True:
        cursor, keys = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        if keys:
            await client.execute("UNLINK", *keys)
        if int(cursor) == 0:
            return


# Commands a client sends itself. Commands a script runs are counted twice by the server (in the
# script's EVALSHA time and under their own name), so only these top-level ones are summed.
TOP_LEVEL_COMMANDS = ("cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_xread:", "cmdstat_xreadgroup:")


def top_level_usec(commandstats: bytes | str) -> int:
    """Server CPU (µs) spent so far in the commands the runtime sends, from the text of
    ``INFO commandstats``."""
    text = commandstats.decode() if isinstance(commandstats, bytes) else str(commandstats)
    total = 0
    for line in text.splitlines():
        if line.startswith(TOP_LEVEL_COMMANDS):
            fields = dict(kv.split("=", 1) for kv in line.partition(":")[2].split(","))
            total += int(fields["usec"])
    return total


def print_table(rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def run_benchmark(
    doc: str | None,
    run: Callable[[str, argparse.Namespace], Awaitable[None]],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Parse ``--redis-url``, ``--backend`` and the script's own options, print the machine
    line and ``await run(url, args)`` on the chosen backend, against ``--redis-url`` or a fresh
    embedded server."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("RESPIRE_REDIS_URL"))
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, backend {args.backend}"
    )

    async def main() -> None:
        if args.redis_url:
            await run(args.redis_url, args)
            return
        with tempfile.TemporaryDirectory() as tmp:
            config = EmbeddedConfig(data_dir=Path(tmp), persistent=False)
            async with open_embedded_server(config) as url:
                await run(url, args)

    anyio.run(main, backend=args.backend)
    return args
