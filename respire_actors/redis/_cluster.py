"""Redis Cluster routing: the slot map, one multiplexed connection per node, redirections.

The slot map comes from ``CLUSTER SLOTS`` (asked of any known node). A command goes to the
primary owning the hash slot of its first key (keyless commands go to any primary). Redirections
are followed only for commands the server did *not* run:

* ``MOVED slot host:port``: the slot lives elsewhere for good; the slot is re-pointed at once,
  the whole map is refreshed, and the command is sent again to the new owner (at most
  :data:`MAX_REDIRECTS` times).
* ``ASK slot host:port``: the slot is being migrated and this key is already on the target;
  the command is sent once to the target, preceded by ``ASKING`` in the same write.

A command whose outcome is unknown (lost connection, timeout) is never re-sent, but the node
that failed it is suspect: the map is marked stale and reloaded before the next command
(:meth:`ClusterRouter.unreachable`). A primary that died never answers MOVED, so without this a
client would keep routing its slots to the dead address after a replica took them over.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio

from ..errors import RedisUnavailable
from ._connection import Address, DedicatedPool, Endpoint, Multiplexed, Spawn
from ._protocol import CLUSTER_SLOTS, ReplyError, encode

MAX_REDIRECTS = 5
ASKING = encode(("ASKING",))
_SLOTS = encode(("CLUSTER", "SLOTS"))


class ClusterRouter:
    def __init__(
        self,
        seeds: list[Address],
        endpoint: Endpoint,
        spawn: Spawn,
        pool_size: int,
    ) -> None:
        self._seeds = seeds
        self._endpoint = endpoint
        self._spawn = spawn
        self._pool_size = pool_size
        self._slots: list[Address | None] = [None] * CLUSTER_SLOTS
        self._primaries: list[Address] = []
        # where keyless commands go: the node that last answered CLUSTER SLOTS (it was up), or
        # after a failure there, the next primary (never always the first one: with the owner
        # of slot 0 down, no keyless command, and so no connect(), could succeed)
        self._keyless: Address | None = None
        self._failed: dict[Address, float] = {}  # when a command to each node last failed
        self._nodes: dict[Address, Multiplexed] = {}
        self._pools: dict[Address, DedicatedPool] = {}
        self._lock = anyio.Lock()
        self._stale = True
        self.refreshes = 0

    # -- nodes ----------------------------------------------------------------------------
    def node(self, address: Address) -> Multiplexed:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = Multiplexed(self._endpoint.at(address), self._spawn)
        return node

    def pool(self, address: Address) -> DedicatedPool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = DedicatedPool(self._endpoint.at(address), self._pool_size)
        return pool

    def endpoint(self, address: Address) -> Endpoint:
        return self._endpoint.at(address)

    def address_for(self, slot: int | None) -> Address:
        if slot is not None:
            address = self._slots[slot]
            if address is not None:
                return address
        return self.keyless_candidates()[0]

    def keyless_candidates(self) -> list[Address]:
        """Where to send a command with no key, in order: the preferred node first, then the
        other primaries, then the seeds."""
        order = [self._keyless] if self._keyless is not None else []
        return list(dict.fromkeys([*order, *self._primaries, *self._seeds]))

    def keyless_failed(self, address: Address) -> None:
        """A keyless command could not reach ``address``: prefer the next candidate."""
        candidates = self.keyless_candidates()
        if address in candidates and len(candidates) > 1:
            self._keyless = candidates[(candidates.index(address) + 1) % len(candidates)]
        self._stale = True

    def nodes(self) -> list[Multiplexed]:
        return list(self._nodes.values())

    # -- slot map -------------------------------------------------------------------------
    def unreachable(self, address: Address) -> None:
        """A command to ``address`` failed without a reply (refused, closed, timed out): reload
        the map before the next command, in case its slots moved to another node (asking the
        nodes that did not just fail first)."""
        self._stale = True
        self._failed[address] = time.monotonic()

    async def route(self, slot: int | None) -> Address:
        """The address for ``slot``, reloading the map first if it is stale."""
        if self._stale:
            await self.refresh()
        return self.address_for(slot)

    async def refresh(self, *, force: bool = False) -> None:
        """Reload the slot map (skipped if another task refreshed it since it went stale)."""
        if not force and not self._stale:
            return
        async with self._lock:
            if not force and not self._stale:
                return
            candidates = list(dict.fromkeys([*self._primaries, *self._seeds]))
            random.shuffle(candidates)
            # a node that failed lately is asked last: it would cost a timeout, under this lock
            recent = time.monotonic() - 30.0
            candidates.sort(key=lambda a: self._failed.get(a, 0.0) > recent)
            errors: list[str] = []
            for address in candidates:
                try:
                    with anyio.fail_after(self._endpoint.command_timeout):
                        (reply,) = await self.node(address).request(_SLOTS, 1)
                except (RedisUnavailable, TimeoutError) as exc:
                    errors.append(f"{address[0]}:{address[1]}: {exc}")
                    continue
                if isinstance(reply, ReplyError):
                    errors.append(f"{address[0]}:{address[1]}: {reply}")
                    continue
                self._load(reply, address)
                self._keyless = address
                self._stale = False
                self.refreshes += 1
                return
            raise RedisUnavailable(
                "no cluster node answered CLUSTER SLOTS: " + "; ".join(errors or ["no nodes"]),
                ran=False,
            )

    def _load(self, reply: Any, asked: Address) -> None:
        slots: list[Address | None] = [None] * CLUSTER_SLOTS
        primaries: list[Address] = []
        for entry in reply:
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            if host in ("", "?"):
                host = asked[0]
            address = (host, int(primary[1]))
            if address not in primaries:
                primaries.append(address)
            for slot in range(start, end + 1):
                slots[slot] = address
        self._slots = slots
        self._primaries = primaries

    def redirection(self, reply: Any, asked: Address) -> tuple[str, Address] | None:
        """``("MOVED" | "ASK", address)`` if ``reply`` redirects the command, else None.

        A MOVED re-points its slot at once and marks the map stale.
        """
        if type(reply) is not ReplyError:
            return None
        text = str(reply)
        if not text.startswith(("MOVED ", "ASK ")):
            return None
        kind, slot_text, target = text.split(" ", 2)
        host, _, port = target.strip().rpartition(":")
        address = (host or asked[0], int(port))
        if kind == "MOVED":
            self._slots[int(slot_text)] = address
            self._stale = True
            self._endpoint.statistics.moved += 1
        else:
            self._endpoint.statistics.asked += 1
        return kind, address

    def close(self) -> None:
        for node in self._nodes.values():
            node.close()

    async def aclose_pools(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
