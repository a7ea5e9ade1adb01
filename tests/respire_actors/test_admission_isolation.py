"""Admission permits when a suspect must run alone (actors/isolation.py): once one is held
back, nobody else takes a permit; a suspect runs when every permit still taken is a suspect's,
and suspects run one at a time (two held back at once used to wait for each other for ever)."""

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
    events: list[str] = []

    async def reader() -> None:
        events.append(f"reader took {await admission.take(4)}")

    async def suspect() -> None:
        await admission.wait_alone()
        events.append("suspect runs")

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(suspect)
        await anyio.wait_all_tasks_blocked()
        admission.release(1)
        await anyio.wait_all_tasks_blocked()
        assert events == []
        admission.release(1)  # the last running handler ends: the suspect runs alone
        await anyio.wait_all_tasks_blocked()
        assert events == ["suspect runs"]
        admission.alone_done()  # it ends
        admission.release(1)
        admission.let_in()
    assert events == ["suspect runs", "reader took 4"]


async def test_two_suspects_held_back_at_once_run_one_after_the_other() -> None:
    """Found by review: the reader's recover claim and the sweeper's claim each dispatched a
    suspect; each waited for the other's permit, and the registration stopped for good."""
    admission = Admission(2)
    await admission.take(2)
    admission.hold_back()
    admission.hold_back()
    ran: list[str] = []

    async def suspect(name: str) -> None:
        await admission.wait_alone()
        ran.append(f"{name} starts")
        await anyio.sleep(0.01)
        ran.append(f"{name} ends")
        admission.alone_done()
        admission.release(1)
        admission.let_in()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(suspect, "a")
            tg.start_soon(suspect, "b")
    assert ran in (
        ["a starts", "a ends", "b starts", "b ends"],
        ["b starts", "b ends", "a starts", "a ends"],
    )
    assert admission.statistics().in_use == 0 and admission.take_nowait(2) == 2
