"""Bounded typed mailboxes: back-pressure, MailboxFull, closing, and surviving a restart."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskStatus
from supervisors_helpers import Recorder, settle, start_supervisor

from supervisors import (
    ChildSpec,
    Mailbox,
    MailboxClosed,
    MailboxEmpty,
    MailboxFull,
    MailboxReceiver,
    MailboxSender,
    Supervisor,
    current_child,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("capacity", "error", "match"),
    [
        (0, ValueError, "Mailbox 'm': capacity must be >= 1, got 0"),
        (-3, ValueError, "capacity must be >= 1, got -3"),
        (2.5, TypeError, "Mailbox 'm': capacity must be an int, got 2.5"),
        (True, TypeError, "capacity must be an int, got True"),
    ],
)
def test_capacity_must_be_a_positive_int(
    capacity: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Mailbox[int](capacity, name="m")  # type: ignore[arg-type]


async def test_send_nowait_raises_mailbox_full_instead_of_growing() -> None:
    async with Mailbox[int](2, name="jobs") as mailbox:
        mailbox.send_nowait(1)
        mailbox.send_nowait(2)
        with pytest.raises(MailboxFull) as info:
            mailbox.send_nowait(3)
        assert (info.value.mailbox, info.value.capacity) == ("jobs", 2)
        stats = mailbox.statistics()
        assert (stats.buffered, stats.capacity, stats.sent, stats.rejected) == (2, 2, 2, 1)
        assert mailbox.receive_nowait() == 1
        mailbox.send_nowait(3)
        assert [mailbox.receive_nowait(), mailbox.receive_nowait()] == [2, 3]
        with pytest.raises(MailboxEmpty):
            mailbox.receive_nowait()
        assert mailbox.statistics().received == 3


async def test_send_waits_for_room_back_pressure() -> None:
    async with Mailbox[str](1) as mailbox, anyio.create_task_group() as tg:
        await mailbox.send("first")
        delivered = anyio.Event()

        async def producer() -> None:
            await mailbox.send("second")
            delivered.set()

        tg.start_soon(producer)
        await settle()
        stats = mailbox.statistics()
        assert (stats.buffered, stats.senders_waiting) == (1, 1)
        assert not delivered.is_set()
        assert await mailbox.receive() == "first"
        await delivered.wait()
        assert await mailbox.receive() == "second"
        assert mailbox.statistics().senders_waiting == 0


async def test_receive_waits_and_messages_arrive_in_order() -> None:
    async with Mailbox[int](3) as mailbox, anyio.create_task_group() as tg:
        received: list[int] = []

        async def consumer() -> None:
            async for message in mailbox:
                received.append(message)

        tg.start_soon(consumer)
        await settle()
        assert mailbox.statistics().receivers_waiting == 1
        for n in range(10):
            await mailbox.send(n)
        await settle()
        assert received == list(range(10))
        await mailbox.aclose()  # ends the consumer's async for
    assert mailbox.statistics().closed


async def test_close_wakes_waiting_senders_and_receivers() -> None:
    mailbox = Mailbox[int](1)
    mailbox.send_nowait(0)
    outcomes: list[str] = []

    async def blocked_sender() -> None:
        with pytest.raises(MailboxClosed):
            await mailbox.send(1)
        outcomes.append("sender woke")

    async with anyio.create_task_group() as tg:
        tg.start_soon(blocked_sender)
        await settle()
        await mailbox.aclose()
    assert outcomes == ["sender woke"]

    other = Mailbox[int](1)

    async def blocked_receiver() -> None:
        with pytest.raises(MailboxClosed):
            await other.receive()
        outcomes.append("receiver woke")

    async with anyio.create_task_group() as tg:
        tg.start_soon(blocked_receiver)
        await settle()
        other.close()
    assert outcomes == ["sender woke", "receiver woke"]


async def test_closed_mailbox_refuses_everything() -> None:
    mailbox = Mailbox[int](1, name="done")
    mailbox.close()
    mailbox.close()  # harmless
    with pytest.raises(MailboxClosed, match="'done' is closed"):
        mailbox.send_nowait(1)
    with pytest.raises(MailboxClosed):
        await mailbox.send(1)
    with pytest.raises(MailboxClosed):
        await mailbox.receive()
    with pytest.raises(MailboxClosed):
        mailbox.receive_nowait()
    assert [m async for m in mailbox] == []


async def test_a_closed_mailbox_reports_nothing_buffered() -> None:
    """Found by review: the messages dropped by close() were still reported as buffered."""
    mailbox = Mailbox[int](4, name="m")
    mailbox.send_nowait(1)
    mailbox.send_nowait(2)
    assert mailbox.statistics().buffered == 2
    mailbox.close()
    stats = mailbox.statistics()
    assert (stats.buffered, stats.sent, stats.received, stats.closed) == (0, 2, 0, True)


async def test_views_expose_only_their_side() -> None:
    async with Mailbox[int](2) as mailbox:
        sender: MailboxSender[int] = mailbox.sender
        receiver: MailboxReceiver[int] = mailbox.receiver
        await sender.send(1)
        sender.send_nowait(2)
        with pytest.raises(MailboxFull):
            sender.send_nowait(3)
        assert await receiver.receive() == 1
        assert receiver.receive_nowait() == 2
        assert sender.statistics() == receiver.statistics() == mailbox.statistics()
        for attribute in ("close", "aclose", "receive"):
            assert not hasattr(sender, attribute)
        for attribute in ("close", "aclose", "send", "send_nowait"):
            assert not hasattr(receiver, attribute)


async def producer(
    outbox: MailboxSender[int], count: int, *, task_status: TaskStatus[None]
) -> None:
    task_status.started()
    for n in range(count):
        await outbox.send(n)
    await current_child().wait_stop_requested()


async def consumer(
    inbox: MailboxReceiver[int],
    rec: Recorder,
    *,
    task_status: TaskStatus[None],
) -> None:
    ctx = current_child()
    task_status.started()
    with ctx.stop_scope():  # the stop request ends the wait for the next message
        async for message in inbox:
            rec.record(f"got:{message}")
            if message == 3 and ctx.restart_count == 0:
                raise RuntimeError("consumer crashed on 3")
    rec.record("consumer stopped")


async def test_mailbox_survives_a_consumer_restart(rec: Recorder) -> None:
    async with Mailbox[int](2, name="work") as mailbox:
        sup = Supervisor(
            "pipeline",
            [
                ChildSpec("consumer", consumer, mailbox.receiver, rec),
                ChildSpec("producer", producer, mailbox.sender, 10),
            ],
            backoff=None,
        )
        async with anyio.create_task_group() as tg:
            await start_supervisor(tg, sup)
            await rec.wait_for("got:9")
            # Message 3 was taken by the run that crashed; nothing else was lost, the order
            # held, and the restarted consumer kept reading the same, still open, mailbox.
            assert rec.events == [f"got:{n}" for n in range(10)]
            assert sup.snapshot().children[0].restart_count == 1
            stats = mailbox.statistics()
            assert (stats.closed, stats.sent, stats.received, stats.buffered) == (False, 10, 10, 0)
            with anyio.fail_after(1):  # well within the 5 s shutdown deadline
                await sup.stop()
        assert rec.events[-1] == "consumer stopped"
        assert not mailbox.statistics().closed  # the owner closes it, not the children
    assert mailbox.statistics().closed
