"""Run chaos scenarios one after another, each bounded in time; never let one crash the run."""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence

import anyio

from .model import ChaosContext, Verdict
from .processes import stop_leftover_workers
from .scenarios import load_all
from .servers import ServerProcess, spawn_server


class UnknownScenario(ValueError):
    """``--only`` named a scenario that does not exist; the message lists the known ones."""


def select(only: Sequence[str] = (), *, ci: bool = False) -> list[str]:
    """Scenario names to run, in seed order: ``only`` (validated) or all (the CI subset when
    ``ci``)."""
    registry = load_all()
    ordered = sorted(registry.values(), key=lambda cls: cls.number)
    unknown = [name for name in only if name not in registry]
    if unknown:
        known = ", ".join(cls.name for cls in ordered)
        raise UnknownScenario(f"unknown scenario {', '.join(unknown)}; known: {known}")
    return [cls.name for cls in ordered if (cls.name in only if only else not ci or cls.ci)]


async def run_scenarios(ctx: ChaosContext, names: Sequence[str]) -> list[Verdict]:
    """Run ``names`` in order. A scenario that raises or overruns ``ctx.budget`` yields one
    failed verdict with the error instead of stopping the run. Without ``ctx.redis_url``,
    scenarios that need a server share one throwaway embedded server."""
    registry = load_all()
    verdicts: list[Verdict] = []
    shared: ServerProcess | None = None
    try:
        for name in names:
            scenario = registry[name]()
            if not scenario.own_servers and ctx.redis_url is None:
                shared = spawn_server(ctx.work_dir / "shared-server", binary=ctx.server_binary)
                ctx.redis_url = shared.url
            ctx.progress(f"{name}: {scenario.title}")
            started = time.monotonic()
            try:
                with anyio.fail_after(ctx.budget):
                    verdicts.extend(await scenario.run(ctx))
            except Exception as exc:  # a broken scenario is a failed verdict, not a crash
                ctx.progress(f"{name}: error\n{traceback.format_exc()}")
                verdicts.append(
                    Verdict(
                        scenario=name,
                        case="(scenario error)",
                        accepted=0,
                        completed=0,
                        duplicates=0,
                        lost=0,
                        dead_lettered=0,
                        seconds=round(time.monotonic() - started, 2),
                        passed=False,
                        violations=(f"{type(exc).__name__}: {exc}",),
                    )
                )
            finally:
                left = stop_leftover_workers()
                if left:
                    ctx.progress(f"{name}: killed {left} worker processes it left running")
    finally:
        if shared is not None:
            shared.stop()
            ctx.redis_url = None
    return verdicts
