"""Scenario 6 (trim near the oldest pending entry) at its CI size: here on Redis with trio
workers; test_chaos_cli.py runs it on Valkey with asyncio workers through the command."""

from __future__ import annotations

import pytest
from helpers.chaos import chaos_ctx, check_trim_verdicts

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s6_trim import TrimScenario

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


@pytest.mark.parametrize(("server", "anyio_backend"), [("redis", "trio")])
async def test_the_safe_trim_never_removes_a_needed_payload(chaos_ctx: ChaosContext) -> None:
    check_trim_verdicts([v.as_json() for v in await TrimScenario().run(chaos_ctx)])
