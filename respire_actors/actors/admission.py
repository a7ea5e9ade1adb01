"""Admission permits: local handler capacity, reserved before Redis delivers anything.

A reader takes permits first and asks Redis for at most that many entries, so Redis never
delivers work this process has no room for. Unused permits go back at once; a used permit is
returned when its handler's outcome has been handed to the completer.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    capacity: int
    in_use: int
    waiting: int


class Admission:
    """A counting semaphore that hands out as many permits as are free, up to a maximum."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._in_use = 0
        self._waiting = 0
        self._draining = 0  # held-back holders (hold_back): suspects to run alone
        self._alone = False  # one of them runs now
        self._changed = anyio.Event()

    @property
    def free(self) -> int:
        return self._capacity - self._in_use

    def take_nowait(self, most: int) -> int:
        """Take up to ``most`` free permits without waiting; returns how many were taken (none
        while a holder waits to run alone)."""
        if self._draining:
            return 0
        n = max(0, min(most, self.free))
        self._in_use += n
        return n

    async def take(self, most: int) -> int:
        """Wait until at least one permit is free (and no holder waits to run alone), then
        take up to ``most`` of them."""
        while self.free <= 0 or self._draining:
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1
        return self.take_nowait(most)

    def hold_back(self) -> None:
        """A permit holder will run alone (a suspect, see actors/isolation.py): from now on
        nobody else takes a permit, until :meth:`let_in`. Called when such a delivery is
        dispatched, so nothing more is read or claimed while it waits for its turn."""
        self._draining += 1

    def let_in(self) -> None:
        """The end of :meth:`hold_back` (the suspect ended, or never ran)."""
        self._draining -= 1
        self._notify()

    async def wait_alone(self) -> None:
        """For a held-back holder: wait until it may run alone, that is until every permit
        still taken is a held-back holder's (they run one at a time; the ones waiting run
        nothing) and no other runs alone. Then it runs alone until :meth:`alone_done`."""
        while self._alone or self._in_use > self._draining:
            await self._changed.wait()
        self._alone = True

    def alone_done(self) -> None:
        self._alone = False
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def release(self, n: int = 1) -> None:
        if n <= 0:
            return
        if n > self._in_use:
            raise RuntimeError("released more permits than were taken")
        self._in_use -= n
        self._notify()

    async def wait_idle(self) -> None:
        """Wait until every permit is back."""
        while self._in_use:
            await self._changed.wait()

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self._capacity, self._in_use, self._waiting)
