"""retry_while_full (backpressure.py): "The last QueueFull is raised at the deadline; any other
error at once." An enqueue with wait= must not repeat a call that failed for another reason.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import anyio
import pytest

from respire_actors.errors import RedisUnavailable, ValidationError
from respire_actors.jobs.backpressure import retry_while_full

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("error", [ValidationError("bad"), RedisUnavailable("lost", ran=None)])
async def test_other_errors_are_raised_at_once(error: Exception) -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise error

    start = anyio.current_time()
    with pytest.raises(type(error)):
        await retry_while_full(attempt, 1.0)
    assert calls == 1
    assert anyio.current_time() - start < 0.5
