"""A polling async iterator over a queue or subscription, with a bound on leased messages."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import anyio

from ._types import Message

T = TypeVar("T")

MIN_LEASE_LEFT = 0.1
"""A buffered message is yielded only while at least this fraction of its visibility timeout
(at most :data:`MIN_LEASE_LEFT_CAP_S`) surely remains; with less, it is handed back unseen."""
MIN_LEASE_LEFT_CAP_S = 1.0


class LeaseSource(Protocol[T]):
    """What the iterator needs from a queue or subscription (a ``Consumer``): leased receives
    and a bulk nack. Declared here so the iterator never imports the consumer back."""

    async def _receive_ms(self, visibility_ms: int, count: int) -> list[Message[T]]: ...

    async def nack_many(self, messages: Iterable[Message[Any] | str], delay: Any = 0) -> Any: ...

    async def _release_unseen(self, messages: Iterable[Message[Any]]) -> Any: ...


class MessageIterator(Generic[T]):
    """Yields messages from :meth:`Consumer.receive` one at a time; see
    :meth:`Consumer.iter_messages` for the contract.

    ``held`` is the number of messages this iterator currently counts as leased. The iterator is
    meant for one task; completing its messages from other tasks of the same event loop (through
    the same queue or subscription instance) is fine.
    """

    def __init__(
        self,
        consumer: LeaseSource[T],
        visibility_ms: int,
        *,
        batch_size: int,
        max_leased: int,
        poll_interval: float,
        max_poll_interval: float,
    ) -> None:
        self._consumer = consumer
        self._visibility_ms = visibility_ms
        self._batch_size = batch_size
        self._max_leased = max_leased
        self._poll_interval = poll_interval
        self._max_poll_interval = max(max_poll_interval, poll_interval)
        self._interval = poll_interval
        self._buffer: deque[Message[T]] = deque()
        # receipt -> local (monotonic) time after which the server lease has surely expired
        # (counts toward max_leased until then)
        self._held: dict[str, float] = {}
        # receipt -> local time until which the lease surely still holds (a buffered message
        # is handed out only before it)
        self._valid: dict[str, float] = {}
        self._wake: anyio.Event | None = None
        self._closed = False

    @property
    def held(self) -> int:
        """Messages counted as leased: buffered, or yielded and not yet completed/expired."""
        self._forget_expired()
        return len(self._held)

    @property
    def max_leased(self) -> int:
        return self._max_leased

    def __aiter__(self) -> MessageIterator[T]:
        return self

    async def __anext__(self) -> Message[T]:
        while True:
            if self._closed:
                raise StopAsyncIteration
            now = anyio.current_time()
            margin = min(self._visibility_ms / 1000 * MIN_LEASE_LEFT, MIN_LEASE_LEFT_CAP_S)
            short: list[Message[T]] = []
            found: Message[T] | None = None
            while self._buffer:
                message = self._buffer.popleft()
                valid = self._valid.pop(message.receipt, 0.0)
                if valid - now >= margin:
                    found = message
                    break
                if valid > now:
                    # too little of its lease is left for the application to finish with it:
                    # hand it back unseen (due at once, the delivery not counted)
                    short.append(message)
                # else its lease may have run out while buffered: the server redelivers it
                # once it has; don't hand it out (it counts toward max_leased until surely
                # expired)
            if short:
                await self._hand_back(short)
            if found is not None:
                return found
            self._forget_expired()
            room = self._max_leased - len(self._held)
            if room <= 0:
                await self._wait_for_room()
                continue
            sent = anyio.current_time()
            batch = await self._consumer._receive_ms(
                self._visibility_ms, min(room, self._batch_size)
            )
            if batch:
                # measured before the request: the server set the deadline later, so the
                # lease holds at least until then
                valid = sent + self._visibility_ms / 1000
                # measured after the reply: the server set the deadline earlier, so this local
                # expiry is never before the real one
                expires = anyio.current_time() + self._visibility_ms / 1000
                for message in batch:
                    self._held[message.receipt] = expires
                    self._valid[message.receipt] = valid
                self._buffer.extend(batch)
                self._interval = self._poll_interval
            else:
                await anyio.sleep(self._interval)
                self._interval = min(self._interval * 2, self._max_poll_interval)

    async def _hand_back(self, messages: list[Message[T]]) -> None:
        """Release buffered messages the application never saw (see :meth:`aclose`)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._consumer._release_unseen(messages)
            except Exception:  # best effort: the leases expire on their own
                self._release(m.receipt for m in messages)

    async def _wait_for_room(self) -> None:
        earliest = min(self._held.values())
        self._wake = anyio.Event()
        try:
            with anyio.move_on_after(max(earliest - anyio.current_time(), 0.0)):
                await self._wake.wait()
        finally:
            self._wake = None

    def _forget_expired(self) -> None:
        now = anyio.current_time()
        for receipt, expires in list(self._held.items()):
            if expires <= now:
                del self._held[receipt]

    def _release(self, receipts: Iterable[str]) -> None:
        released = False
        for receipt in receipts:
            if self._held.pop(receipt, None) is not None:
                released = True
        if released and self._wake is not None:
            self._wake.set()

    async def aclose(self) -> None:
        """Stop iterating and hand back buffered messages not yet yielded: due again at once,
        without counting the delivery they never had (their next delivery has the same
        ``delivery_count``, so closing never moves a message closer to the delivery limit).

        Shielded from cancellation while it sends the NACK; if the connection fails they stay
        leased until their visibility timeout instead.
        """
        self._closed = True
        pending, self._buffer = list(self._buffer), deque()
        self._valid.clear()
        if not pending:
            return
        await self._hand_back(pending)

    async def __aenter__(self) -> MessageIterator[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
