"""Bounded, typed mailboxes for actors, on anyio memory object streams.

Ownership rule: the mailbox belongs to whoever created it, normally the code that builds the
supervisor (or a parent child) and passes it to the producer and consumer children as ``args``.
Children only send and receive; they never close it. A consumer that crashes and is restarted
therefore finds the same mailbox, with every message that was buffered (or sent while it was
down) still waiting. The owner closes it, after the supervisor has stopped, with
``async with Mailbox[...](capacity) as mailbox:`` or :meth:`Mailbox.aclose`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Self, TypeVar

import anyio

from ._errors import MailboxClosed, MailboxEmpty, MailboxFull

__all__ = ["Mailbox", "MailboxReceiver", "MailboxSender", "MailboxStatistics"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)


@dataclass(frozen=True)
class MailboxStatistics:
    """Counters and current state of a mailbox.

    Attributes:
        name: the mailbox's name.
        capacity: buffer size (messages).
        buffered: messages waiting in the buffer.
        senders_waiting: tasks blocked in ``send`` because the buffer is full.
        receivers_waiting: tasks blocked in ``receive`` because the buffer is empty.
        sent: messages accepted so far (by ``send`` or ``send_nowait``).
        received: messages taken out so far.
        rejected: ``send_nowait`` calls refused with :exc:`MailboxFull`.
        closed: whether the owner has closed it.
    """

    name: str
    capacity: int
    buffered: int
    senders_waiting: int
    receivers_waiting: int
    sent: int
    received: int
    rejected: int
    closed: bool


class Mailbox(Generic[T]):
    """A bounded FIFO of messages of type ``T`` between tasks.

    ``Mailbox[Job](capacity, *, name="mailbox")``

    ``send`` waits while the buffer is full (back-pressure); ``send_nowait`` raises
    :exc:`MailboxFull` instead. The buffer never grows beyond ``capacity``. Any number of tasks
    may send and receive concurrently; each message goes to exactly one receiver, in order.

    Use as ``async with Mailbox[int](10) as mailbox:``, which closes it on exit. Give children
    the narrower :attr:`sender` / :attr:`receiver` views, which cannot close it.

    Raises:
        TypeError, ValueError: ``capacity`` is not an int >= 1.
    """

    def __init__(self, capacity: int, *, name: str = "mailbox") -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"Mailbox {name!r}: capacity must be an int, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"Mailbox {name!r}: capacity must be >= 1, got {capacity}")
        self._name = name
        self._capacity = capacity
        self._send, self._receive = anyio.create_memory_object_stream[T](capacity)
        self._sent = 0
        self._received = 0
        self._rejected = 0

    @property
    def name(self) -> str:
        """The mailbox's name (used in errors)."""
        return self._name

    @property
    def capacity(self) -> int:
        """How many messages the buffer holds."""
        return self._capacity

    @property
    def sender(self) -> MailboxSender[T]:
        """A send-only view of this mailbox."""
        return MailboxSender(self)

    @property
    def receiver(self) -> MailboxReceiver[T]:
        """A receive-only view of this mailbox."""
        return MailboxReceiver(self)

    async def send(self, message: T) -> None:
        """Add ``message``, waiting while the buffer is full.

        Raises:
            MailboxClosed: the mailbox is (or gets) closed; the message was not delivered.

        If cancelled, the message was not added.
        """
        try:
            await self._send.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise MailboxClosed(mailbox=self._name) from None
        self._sent += 1

    def send_nowait(self, message: T) -> None:
        """Add ``message`` if there is room right now.

        Raises:
            MailboxFull: the buffer is full; the message was not added.
            MailboxClosed: the mailbox is closed.
        """
        try:
            self._send.send_nowait(message)
        except anyio.WouldBlock:
            self._rejected += 1
            raise MailboxFull(mailbox=self._name, capacity=self._capacity) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise MailboxClosed(mailbox=self._name) from None
        self._sent += 1

    async def receive(self) -> T:
        """Take the oldest message, waiting while there is none.

        Raises:
            MailboxClosed: the mailbox is (or gets) closed.

        If cancelled, no message is taken.
        """
        try:
            message = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise MailboxClosed(mailbox=self._name) from None
        self._received += 1
        return message

    def receive_nowait(self) -> T:
        """Take the oldest message if there is one right now.

        Raises:
            MailboxEmpty: nothing is buffered and no sender is waiting.
            MailboxClosed: the mailbox is closed.
        """
        try:
            message = self._receive.receive_nowait()
        except anyio.WouldBlock:
            raise MailboxEmpty(mailbox=self._name) from None
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise MailboxClosed(mailbox=self._name) from None
        self._received += 1
        return message

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        """The next message; iteration ends when the mailbox is closed."""
        try:
            return await self.receive()
        except MailboxClosed:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Close the mailbox (owner only); buffered messages are dropped.

        Waiting senders and receivers wake up with :exc:`MailboxClosed`; ``async for`` loops
        over it end. Closing twice is harmless.
        """
        # Send side first: that wakes waiting receivers with end-of-stream; then the receive
        # side, which wakes waiting senders.
        self._send.close()
        self._receive.close()

    async def aclose(self) -> None:
        """Close the mailbox; see :meth:`close`."""
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def statistics(self) -> MailboxStatistics:
        """Current counters and state (see :class:`MailboxStatistics`)."""
        stats = self._send.statistics()
        closed = stats.open_send_streams == 0
        return MailboxStatistics(
            name=self._name,
            capacity=self._capacity,
            # a closed mailbox has dropped what it buffered (nobody can receive it any more)
            buffered=0 if closed else stats.current_buffer_used,
            senders_waiting=stats.tasks_waiting_send,
            receivers_waiting=stats.tasks_waiting_receive,
            sent=self._sent,
            received=self._received,
            rejected=self._rejected,
            closed=closed,
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"<Mailbox {self._name!r} {stats.buffered}/{self._capacity}"
            f"{' closed' if stats.closed else ''}>"
        )


class MailboxSender(Generic[T_contra]):
    """The send-only side of a :class:`Mailbox` (cannot close it)."""

    __slots__ = ("_mailbox",)

    def __init__(self, mailbox: Mailbox[T_contra]) -> None:
        self._mailbox = mailbox

    async def send(self, message: T_contra) -> None:
        """See :meth:`Mailbox.send`."""
        await self._mailbox.send(message)

    def send_nowait(self, message: T_contra) -> None:
        """See :meth:`Mailbox.send_nowait`."""
        self._mailbox.send_nowait(message)

    def statistics(self) -> MailboxStatistics:
        """See :meth:`Mailbox.statistics`."""
        return self._mailbox.statistics()


class MailboxReceiver(Generic[T_co]):
    """The receive-only side of a :class:`Mailbox` (cannot close it)."""

    __slots__ = ("_mailbox",)

    def __init__(self, mailbox: Mailbox[T_co]) -> None:
        self._mailbox = mailbox

    async def receive(self) -> T_co:
        """See :meth:`Mailbox.receive`."""
        return await self._mailbox.receive()

    def receive_nowait(self) -> T_co:
        """See :meth:`Mailbox.receive_nowait`."""
        return self._mailbox.receive_nowait()

    def __aiter__(self) -> AsyncIterator[T_co]:
        return self._mailbox.__aiter__()

    def statistics(self) -> MailboxStatistics:
        """See :meth:`Mailbox.statistics`."""
        return self._mailbox.statistics()
