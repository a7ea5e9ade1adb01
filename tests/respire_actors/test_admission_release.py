"""Admission refuses to take back more permits than were taken.

actors/admission.py: "A counting semaphore that hands out as many permits as are free, up to a
maximum"; release() raises RuntimeError("released more permits than were taken"). No test
releases too many, so without the check a double release silently raises the capacity: free
exceeds the configured maximum and the reader asks Redis for more entries than the process has
handler room for (the module docstring: "Redis never delivers work this process has no room
for").

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.actors.admission import Admission

pytestmark = pytest.mark.anyio


async def test_releasing_more_than_taken_raises_and_changes_nothing() -> None:
    permits = Admission(2)
    assert await permits.take(5) == 2
    permits.release(1)
    with pytest.raises(RuntimeError):
        permits.release(2)  # only one is still taken
    assert permits.statistics().in_use == 1
    assert permits.free == 1
    permits.release(1)
    with pytest.raises(RuntimeError):
        permits.release(1)  # nothing taken
    assert permits.take_nowait(10) == 2  # never more than the capacity
