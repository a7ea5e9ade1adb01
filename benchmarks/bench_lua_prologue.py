"""What a script's included helpers cost the server on every call, before its first line of work.

    python benchmarks/bench_lua_prologue.py [--redis-url URL] [--calls 20000] [--rounds 5]
                                            [--scripts job_complete,job_read,...]

Lua runs a script's whole text on every EVALSHA, so each top-level helper its libraries define
costs a closure per call. For each script this loads three variants whose body is replaced by
``return 1`` and reads the server's µs per call (``INFO commandstats``, median of the rounds):

- ``return 1`` alone (the cost of any EVALSHA with this many keys and arguments);
- every included helper (the scripts' text before helpers were pruned);
- the helpers the shipped script keeps (``respire_actors/redis/lua_prune.py``).

The prologue is each helpers variant minus ``return 1``. Server CPU per call is robust to a
busy client, but pin the server to a core of its own for steady figures.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from _common import print_table, run_benchmark

from respire_actors.redis.client import connect
from respire_actors.redis.lua_prune import prune
from respire_actors.redis.scripts import _resolve, load

HOT = "job_enqueue,job_read,job_complete,job_finish,job_claim_pending,job_lease_renew,job_retry"


def helpers_then_return(source: str) -> str:
    """``source`` up to the end of its last top-level helper, then ``return 1``."""
    last = source.rfind("\nlocal function")
    end = source.find("\nend", last) + len("\nend") if last >= 0 else 0
    return source[:end] + "\nreturn 1\n"


async def usec_per_call(client: Any, source: str, numkeys: int, calls: int) -> float:
    sha = await client.execute("SCRIPT", "LOAD", source)
    keys = [f"{{bench-prologue}}:k{i}" for i in range(numkeys)]
    await client.execute("CONFIG", "RESETSTAT")
    for start in range(0, calls, 1000):
        n = min(1000, calls - start)
        await client.pipeline([("EVALSHA", sha, numkeys, *keys, "g", "c", "0")] * n)
    text = await client.execute("INFO", "commandstats")
    text = text.decode() if isinstance(text, bytes) else str(text)
    line = next(x for x in text.splitlines() if x.startswith("cmdstat_evalsha:"))
    fields = dict(kv.split("=", 1) for kv in line.partition(":")[2].split(","))
    return float(fields["usec_per_call"])


async def run(url: str, args: argparse.Namespace) -> None:
    rows = []
    async with connect(url) as client:
        for name in args.scripts.split(","):
            script = load(name)
            included = _resolve(f"{name}-{script.numkeys}.lua", ())
            variants = {
                "return 1": "return 1\n",
                "all included": helpers_then_return(included),
                "kept": helpers_then_return(prune(included)),
            }
            figures: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for label, source in variants.items():
                    figures[label].append(
                        await usec_per_call(client, source, script.numkeys, args.calls)
                    )
            base, every, kept = (statistics.median(figures[v]) for v in variants)
            helpers = (included.count("\nlocal function"), script.source.count("\nlocal function"))
            rows.append(
                (
                    name,
                    f"prologue {every - base:5.2f} µs/call with all {helpers[0]} helpers, "
                    f"{kept - base:5.2f} with the {helpers[1]} kept "
                    f"(EVALSHA 'return 1': {base:.2f})",
                )
            )
            print(f"{name}: {rows[-1][1]}", flush=True)
    print()
    print_table(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=20000, help="EVALSHA calls per variant")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--scripts", default=HOT, help=f"comma-separated (default {HOT})")


if __name__ == "__main__":
    run_benchmark(__doc__, run, add_arguments)
