"""Admission permits when a suspect must run alone (actors/isolation.py): once held back,
nobody else takes a permit; the suspect takes every other permit as it comes back, and gives
them back if cancelled while waiting."""

from __future__ import annotations

import anyio
import pytest

from respire_actors.actors.admission import Admission
from respire_actors.actors.isolation import suspect_from

pytestmark = pytest.mark.anyio


def test_the_suspect_threshold_follows_the_delivery_limit() -> None:
    assert [suspect_from(limit) for limit in (0, 2, 3, 4, 5, 10)] == [3, 2, 2, 3, 3, 3]


async def test_a_suspect_waits_for_the_others_and_holds_everyone_else_back() -> None:
    admission = Admission(4)
    assert await admission.take(2) == 2  # two handlers running
    assert await admission.take(1) == 1  # the suspect's own permit
    admission.hold_back()
    assert admission.take_nowait(1) == 0  # a free permit, but held back
    got: list[int] = []
    reader_took: list[int] = []

    async def reader() -> None:
        reader_took.append(await admission.take(4))

    async def suspect() -> None:
        got.append(await admission.take_all_others())

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(suspect)
        await anyio.wait_all_tasks_blocked()
        assert got == [] and reader_took == []
        admission.release(1)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        admission.release(1)  # the last running handler ends: the suspect has them all
        await anyio.wait_all_tasks_blocked()
        assert got == [3] and reader_took == []
        admission.release(3)  # the suspect ends
        admission.release(1)
        admission.let_in()
    assert reader_took == [4]


async def test_a_cancelled_suspect_gives_back_what_it_took() -> None:
    admission = Admission(3)
    await admission.take(2)  # one running handler, one suspect
    admission.hold_back()
    with anyio.move_on_after(0.05):
        await admission.take_all_others()  # gets the free one, waits for the other
    admission.let_in()
    assert admission.statistics().in_use == 2
    assert admission.take_nowait(5) == 1
