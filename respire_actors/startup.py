"""Start-up waits shared by the CLI, the embedded server and workers.

A server that has just restarted answers some commands (``INFO``, ``COMMAND``) while it is
still loading its data set, and refuses the rest with ``LOADING``. Nothing runs during that
time, so a start-up step that is refused this way is safe to repeat: :func:`wait_until_loaded`
waits for the data set, and :func:`retry_while_loading` repeats one start-up step. The same
holds for a cluster that is reconfiguring (:class:`ClusterReconfiguring`: a slot half-migrated,
or a failover in progress): the refused step did not run, and a worker started meanwhile waits
instead of failing.
:func:`connect_when_loaded` is :func:`~respire_actors.redis.client.connect` plus that wait; it
also retries a connection whose handshake the loading server refused (``serve`` uses it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio

from .errors import ClusterReconfiguring, PermissionDenied, RedisUnavailable, ServerLoading
from .redis.client import RedisClient, connect

T = TypeVar("T")

log = logging.getLogger("respire_actors.startup")

DEFAULT_LOADING_TIMEOUT = 300.0
"""How long start-up waits for a server to load its data set before giving up (seconds)."""


async def wait_until_loaded(
    client: RedisClient, *, timeout: float = DEFAULT_LOADING_TIMEOUT
) -> None:
    """Return once the server answers ``PING`` (so it has finished loading its data set).

    An ACL user without ``PING`` (the documented operator and dashboard user, say) cannot
    wait this way: the wait is skipped (commands sent while the server loads are refused with
    :class:`ServerLoading`, which is transient). Raises :class:`RedisUnavailable` if it is
    still loading after ``timeout`` seconds. Cancelling it sends nothing that writes.
    """
    try:
        await retry_while_loading(lambda: client.execute("PING"), timeout=timeout)
    except PermissionDenied:
        log.debug("this ACL user may not run PING: not waiting for the data set to load")


async def retry_while_loading(
    step: Callable[[], Awaitable[T]], *, timeout: float = DEFAULT_LOADING_TIMEOUT
) -> T:
    """Run ``step`` and repeat it while the server answers ``LOADING`` or the cluster is
    reconfiguring (:class:`ClusterReconfiguring`, after the client's own retries).

    Only for steps that are safe to repeat (both refusals mean nothing ran). Waits with a
    growing pause (50 ms up to 1 s); raises :class:`RedisUnavailable` after ``timeout``.
    """
    delay = 0.05
    told = False
    with anyio.move_on_after(timeout):
        while True:
            try:
                return await step()
            except ClusterReconfiguring as exc:
                if not told:
                    log.info("the cluster is reconfiguring (%s); waiting for it", exc)
                    told = True
            except (ServerLoading, RedisUnavailable) as exc:
                # a new pooled connection's handshake refused with LOADING arrives as
                # RedisUnavailable: retried too, any other RedisUnavailable is not
                if not is_loading_refusal(exc):
                    raise
                if not told:
                    log.info("the server is loading its data set; waiting for it")
                    told = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise RedisUnavailable(
        f"the server was still loading its data set (or the cluster reconfiguring) after "
        f"{timeout:g} s; wait for it to finish (INFO persistence shows loading:0, CLUSTER INFO "
        "cluster_state:ok with no slot migrating) and start again"
    )


def is_loading_refusal(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a server's ``LOADING`` refusal.

    Besides :class:`ServerLoading` this recognises a ``LOADING`` refusal wrapped in another
    error (a refused connection handshake surfaces as :class:`RedisUnavailable` caused by it).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ServerLoading):
            return True
        if str(current).startswith("LOADING"):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextlib.asynccontextmanager
async def connect_when_loaded(
    url: str | None = None, *, timeout: float = DEFAULT_LOADING_TIMEOUT, **options: Any
) -> AsyncIterator[RedisClient]:
    """``async with connect_when_loaded(url) as client:`` - :func:`connect`, then
    :func:`wait_until_loaded`; a connection refused because the server is loading is retried
    (nothing was sent that writes). Raises :class:`RedisUnavailable` after ``timeout``, and
    whatever :func:`connect` raises for any other failure."""
    deadline = anyio.current_time() + timeout
    delay = 0.05
    told = False
    while True:
        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(connect(url, **options))
        except RedisUnavailable as exc:
            if not is_loading_refusal(exc) or anyio.current_time() >= deadline:
                raise
            if not told:
                log.info("the server is loading its data set; waiting for it")
                told = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        async with stack:
            await wait_until_loaded(client, timeout=max(0.0, deadline - anyio.current_time()))
            yield client
        return


__all__ = [
    "DEFAULT_LOADING_TIMEOUT",
    "connect_when_loaded",
    "is_loading_refusal",
    "retry_while_loading",
    "wait_until_loaded",
]
