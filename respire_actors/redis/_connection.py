"""Connections to one server: the shared multiplexed connection and dedicated connections.

:class:`Multiplexed` is the connection every task shares for ordinary commands. Callers append
their encoded command to one outgoing buffer and a FIFO of waiters; the caller that finds no
write in progress becomes the writer and sends everything buffered, looping until the buffer
is empty (tasks that submit while a write is under way join the next ``send``, so concurrent
callers are pipelined automatically); there is no reader task: a caller whose
reply is outstanding and who finds nobody reading reads the socket itself, feeding
``hiredis.Reader`` and handing each reply to the oldest waiter, until its own reply arrives;
then it hands the reading role to the oldest waiter still waiting. A lone caller so writes and
reads with no task switch.

* A caller cancelled before its command entered the buffer sent nothing. One cancelled later
  marks its waiter *abandoned*: whoever reads next reads and drops that reply, the stream
  stays aligned, and the command may still run on the server. A reading caller that is
  cancelled consumed nothing from the socket (a cancelled receive reads nothing) and hands the
  reading role on.
* The socket write runs shielded, so a cancellation never leaves a half-written command on
  the wire (a write that cannot finish is ended by the watchdog closing the socket).
* A lost connection fails every in-flight request with :class:`RedisUnavailable` ("outcome
  unknown"); nothing is ever re-sent. The next call reconnects (with backoff after failed
  attempts).
* A reply that does not arrive within the command timeout: a watchdog closes the connection,
  the late requests get :class:`CommandTimeout` and every other in-flight request
  :class:`RedisUnavailable` (replies are strictly ordered, so nothing behind a hung command
  could be answered anyway; the server may still run all of them).

:class:`Dedicated` is a connection used by one task at a time (blocking reads, WATCH
transactions, handshakes): the caller writes and reads itself. Cancelling or timing out a call
closes it. :class:`DedicatedPool` keeps a bounded set of them per server.
"""

from __future__ import annotations

import copy
import inspect
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from ..errors import (
    CommandTimeout,
    ConfigurationError,
    CredentialsRefused,
    PermissionDenied,
    RedisUnavailable,
    UnsupportedServer,
)
from ._protocol import Arg, ProtocolError, PushNotification, ReplyError, encode, new_reader

Address = tuple[str, int]
CredentialProvider = Callable[[], "tuple[str | None, str] | Awaitable[tuple[str | None, str]]"]

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]

_RECEIVE = 65536
_MAY_HAVE_RUN = "in-flight commands may have run"
_TRANSPORT_ERRORS = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    ProtocolError,
    ssl.SSLError,
)


class Endpoint:
    """How to reach one server and what to say first (credentials, protocol, database)."""

    def __init__(
        self,
        *,
        address: Address | None,
        unix_socket_path: str | None,
        ssl_context: ssl.SSLContext | None,
        username: str | None,
        password: str | None,
        credential_provider: CredentialProvider | None,
        db: int,
        client_name: str | None,
        connect_timeout: float,
        command_timeout: float,
        statistics: Statistics,
        spin_wait: float = 0.0,
    ) -> None:
        self.address = address
        self.unix_socket_path = unix_socket_path
        self.ssl_context = ssl_context
        self.username = username
        self.password = password
        self.credential_provider = credential_provider
        self.db = db
        self.client_name = client_name
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.statistics = statistics
        self.spin_wait = spin_wait

    def describe(self) -> str:
        if self.unix_socket_path:
            return f"unix://{self.unix_socket_path}"
        assert self.address is not None
        return f"{self.address[0]}:{self.address[1]}"

    def at(self, address: Address) -> Endpoint:
        """The same settings for another server (a cluster node)."""
        other = Endpoint.__new__(Endpoint)
        other.__dict__.update(self.__dict__)
        other.address = address
        other.unix_socket_path = None
        return other

    async def _credentials(self) -> tuple[str | None, str | None]:
        """The URL's credentials, or the provider's, asked within ``connect_timeout``: a
        secrets store that hangs or fails makes the connection attempt fail (RedisUnavailable,
        nothing sent), never a command that waits forever (a shielded pipeline could not even
        be cancelled)."""
        if self.credential_provider is None:
            return self.username, self.password
        try:
            with anyio.fail_after(self.connect_timeout):
                got = self.credential_provider()
                if inspect.isawaitable(got):
                    got = await got
        except TimeoutError:
            raise RedisUnavailable(
                f"the credential provider did not answer within {self.connect_timeout} s "
                f"(connect_timeout) while connecting to {self.describe()}; no command ran",
                ran=False,
            ) from None
        except Exception as exc:
            raise RedisUnavailable(
                f"the credential provider failed while connecting to {self.describe()} "
                f"({type(exc).__name__}: {exc}); no command ran",
                ran=False,
            ) from exc
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise ConfigurationError(
                "the credential provider must return (username, password), username None for "
                f"the default user; it returned {type(got).__name__}"
            )
        username, password = got
        return username, password

    async def open(self) -> Dedicated:
        """Connect and handshake (HELLO 3 with AUTH and SETNAME, then SELECT)."""
        where = self.describe()
        try:
            with anyio.fail_after(self.connect_timeout):
                stream: anyio.abc.ByteStream
                if self.unix_socket_path:
                    stream = await anyio.connect_unix(self.unix_socket_path)
                else:
                    assert self.address is not None
                    host, port = self.address
                    if self.ssl_context is not None:
                        stream = await anyio.connect_tcp(
                            host,
                            port,
                            ssl_context=self.ssl_context,
                            tls_hostname=host,
                            tls_standard_compatible=False,
                        )
                    else:
                        stream = await anyio.connect_tcp(host, port)
        except TimeoutError:
            raise RedisUnavailable(
                f"connecting to {where} timed out after {self.connect_timeout} s", ran=False
            ) from None
        except _TRANSPORT_ERRORS as exc:
            # a cancellation that lands while connecting may surface as a socket error: if our
            # scope is cancelled, let the cancellation win
            await anyio.lowlevel.checkpoint_if_cancelled()
            raise RedisUnavailable(f"cannot connect to {where}: {exc}", ran=False) from exc
        self.statistics.opened += 1
        conn = Dedicated(stream, self.statistics)
        try:
            username, password = await self._credentials()
            hello: list[Arg] = ["HELLO", 3]
            if password is not None or username:
                # a user without a password: a nopass ACL user accepts any password
                hello += ["AUTH", username or "default", password or ""]
            if self.client_name:
                hello += ["SETNAME", self.client_name]
            payload = encode(hello)
            count = 1
            if self.db:
                payload += encode(("SELECT", self.db))
                count += 1
            try:
                with anyio.fail_after(self.command_timeout):
                    replies = await conn.call(payload, count)
            except TimeoutError:
                raise CommandTimeout(
                    f"{where} did not answer the connection handshake within "
                    f"{self.command_timeout} s",
                    ran=False,
                ) from None
            except RedisUnavailable as exc:
                if self.ssl_context is None:
                    raise RedisUnavailable(
                        f"{where} closed the connection or did not answer like a Redis server "
                        f"during the handshake (no command ran; {_detail(exc)}): check that a "
                        "Redis or Valkey server listens at that host and port",
                        ran=False,
                    ) from exc
                # a TLS server that refuses the client certificate (none given, expired, or
                # from another CA) closes the connection right after the TLS handshake
                raise RedisUnavailable(
                    f"{where} closed the connection before answering HELLO (no command ran): "
                    "a TLS server that requires client certificates refuses a missing, expired "
                    "or unknown one this way; check ssl_certfile / ssl_keyfile and that the "
                    f"server's CA signed them ({exc})",
                    ran=False,
                ) from exc
            for index, reply in enumerate(replies):
                if isinstance(reply, ReplyError):
                    text = str(reply)
                    if index == 1 and text.startswith("NOPERM"):  # SELECT refused by ACL
                        raise PermissionDenied(
                            f"{where}: this user may not run SELECT ({text}); grant it +select "
                            "or use database 0 (drop the /DB part of the URL)",
                            "select",
                        )
                    if index == 1:  # SELECT
                        raise ConfigurationError(
                            f"{where} cannot select database {self.db}: {text}. Fix the /DB "
                            "part of the Redis URL (redis://host:port/DB): the server has fewer "
                            "databases, or is a cluster (database 0 only)"
                        )
                    if text.startswith(("WRONGPASS", "NOAUTH")) or "password" in text:
                        raise CredentialsRefused(
                            f"Redis at {where} refused the credentials: {text}. "
                            "Check the user and password in the URL"
                        )
                    if text.startswith("ERR unknown command") and "HELLO" in text.upper():
                        raise UnsupportedServer(
                            f"{where} does not know HELLO (Redis older than 6); "
                            "respire_actors needs Redis 7.0 or later (or any Valkey)"
                        )
                    if text.startswith("NOPERM"):
                        raise PermissionDenied(
                            f"{where}: this user may not open a connection ({text}); grant it "
                            "+hello",
                            "hello",
                        )
                    # e.g. "max number of clients reached": the server may take it later
                    raise RedisUnavailable(
                        f"{where} refused the connection handshake (no command ran): {text}",
                        ran=False,
                    )
            if isinstance(replies[0], dict):
                # What the server says it is (server, version, mode, role): server detection
                # reads it instead of INFO / ROLE, which an ACL user need not be granted.
                self.statistics.last_hello = replies[0]
        except BaseException:
            await conn.aclose()
            raise
        return conn


class Statistics:
    """Counters for tests and monitoring (see :meth:`RedisClient.statistics`)."""

    __slots__ = (
        "asked",
        "cluster_retries",
        "dedicated_idle",
        "dedicated_in_use",
        "dedicated_waiting",
        "last_hello",
        "moved",
        "opened",
        "push_frames",
        "spin_hits",
        "spin_misses",
    )

    def __init__(self) -> None:
        self.opened = 0
        self.push_frames = 0
        self.moved = 0
        self.asked = 0
        self.cluster_retries = 0
        # Replies read by busy-polling (see _Spinner) and polls that gave up and parked.
        self.spin_hits = 0
        self.spin_misses = 0
        self.dedicated_in_use = 0
        self.dedicated_idle = 0
        self.dedicated_waiting = 0
        # The HELLO reply of the newest connection (a map: server, version, mode, role...).
        self.last_hello: dict[Any, Any] | None = None


class Dedicated:
    """A connection used by one task at a time; the caller writes and reads itself."""

    def __init__(self, stream: anyio.abc.ByteStream, statistics: Statistics) -> None:
        self.stream = stream
        self.reader = new_reader()
        self.broken = False
        self._statistics = statistics

    async def call(self, payload: bytes, count: int) -> list[Any]:
        """Send ``payload`` and read ``count`` replies. Any failure or cancellation closes the
        connection (a half-read reply cannot be resumed)."""
        if self.broken:
            raise RedisUnavailable("this connection was closed; open a new one", ran=False)
        try:
            await self.stream.send(payload)
            replies: list[Any] = []
            reader = self.reader
            while len(replies) < count:
                reply = reader.gets()
                if reply is False:
                    reader.feed(await self.stream.receive(_RECEIVE))
                elif type(reply) is not PushNotification:
                    replies.append(reply)
            return replies
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, anyio.EndOfStream):
                raise RedisUnavailable(
                    "the server closed the connection; the command may have run"
                ) from exc
            if isinstance(exc, _TRANSPORT_ERRORS):
                raise RedisUnavailable(
                    f"connection lost ({exc!r}); the command may have run"
                ) from exc
            raise

    async def aclose(self) -> None:
        if not self.broken:
            self.broken = True
            await anyio.aclose_forcefully(self.stream)


class _Waiter:
    __slots__ = ("abandoned", "count", "done", "error", "event", "lead", "replies", "sent")

    def __init__(self, count: int, event: anyio.Event) -> None:
        self.event = event
        self.count = count
        self.replies: list[Any] = []
        self.error: RedisUnavailable | None = None
        self.abandoned = False
        self.done = False
        # Set (with the event) when the reading role is handed to this waiter.
        self.lead = False
        self.sent = time.monotonic()


class _Link:
    """One socket of a :class:`Multiplexed` connection (a reconnect makes a new link).

    There is no reader task: the caller whose reply is outstanding and who finds nobody
    reading becomes the reader. It reads and hands every reply to its waiter until its own
    arrives, then hands the reading role to the oldest waiter still waiting. One caller at a
    time therefore writes its command and reads its reply itself, with no task switch, while
    concurrent callers share one reader as before. ``reading`` is True while a caller reads or
    the role has been handed to a waiter that has not woken yet.
    """

    def __init__(self, conn: Dedicated, endpoint: Endpoint) -> None:
        self.stream = conn.stream
        self.reader = conn.reader
        self.endpoint = endpoint
        self.timeout = endpoint.command_timeout
        self.pending: deque[_Waiter] = deque()
        self.out: list[bytes] = []
        self.writing = False
        self.reading = False
        self.error: RedisUnavailable | None = None
        self.scope = anyio.CancelScope()
        # The running backend's Event class, so each request skips anyio's backend lookup.
        self._event_class = type(anyio.Event())
        raw = _raw_socket(conn.stream)
        self._raw_socket = raw
        self._own_socket = raw is not None and raw.fileno() != _fileno(conn.stream)
        self.spinner = _Spinner.for_stream(conn.stream, raw, endpoint)

    def submit(self, payload: bytes, count: int) -> _Waiter:
        if self.error is not None:
            raise self.error  # closed since the caller picked it: nothing was queued
        waiter = _Waiter(count, self._event_class())
        self.out.append(payload)
        self.pending.append(waiter)
        return waiter

    def new_event(self) -> anyio.Event:
        return self._event_class()

    def idle_and_closed(self) -> bool:
        """With nothing in flight, True when the server has closed the socket (checked without
        blocking). Nobody reads an idle link, so this is how a restart of the server between
        commands is noticed before a command is sent on a dead socket."""
        sock = self._raw_socket
        if sock is None or self.pending or self.reading:
            return False
        return _peer_closed(sock)

    async def flush(self) -> None:
        """Write everything buffered. The caller has set ``writing``; callers that submit
        while a write is in progress are sent by the same loop (auto-pipelining: the stream's
        own checkpoint before each write lets every task of this event-loop turn join).

        Shielded, so a cancellation never tears a command in half; a write that never ends
        (a server that stopped reading) is ended by the watchdog, which closes the socket.
        """
        try:
            with anyio.CancelScope(shield=True):
                out = self.out
                while out and self.error is None:
                    data = b"".join(out) if len(out) > 1 else out[0]
                    out.clear()
                    await self.stream.send(data)
        except _TRANSPORT_ERRORS as exc:
            self.fail(RedisUnavailable(f"connection lost while writing ({exc!r})"))
        finally:
            self.writing = False

    def fail(self, error: RedisUnavailable, *, now: float | None = None) -> None:
        """Close the link: every in-flight request gets ``error`` (timed-out ones a
        :class:`CommandTimeout` when ``now`` is given)."""
        if self.error is not None:
            return
        self.error = error
        pending, self.pending = self.pending, deque()
        self.out.clear()
        for waiter in pending:
            if now is not None and now - waiter.sent >= self.timeout * 0.99:
                waiter.error = CommandTimeout(
                    f"Redis did not reply within {self.timeout} s; the command may have run"
                )
            else:
                waiter.error = error
            waiter.event.set()
        # Ends run(), which closes the socket: a caller blocked reading it is woken with an
        # error and finds its waiter failed.
        self.scope.cancel()

    async def run(self) -> None:
        """The link's background task: the command-timeout watchdog, and closing the socket
        once the link fails or the client closes."""
        try:
            with self.scope:
                await self._watchdog()
        finally:
            self.fail(
                RedisUnavailable(
                    "the Redis client was closed with this command in flight; it may have run"
                )
            )
            self.close_peek()
            await anyio.aclose_forcefully(self.stream)

    def close_peek(self) -> None:
        """Close the descriptor duplicated for peeking, if one was made."""
        raw, self._raw_socket = self._raw_socket, None
        if raw is not None and self._own_socket:
            raw.close()

    async def read_until(self, waiter: _Waiter | None) -> None:
        """Read as the link's reader until ``waiter`` has its replies (``None``: until no
        abandoned request heads the queue) or the link fails. The caller holds the reading role
        (``reading`` is True); it is handed on when this returns, also when the caller is
        cancelled (a cancelled receive consumed nothing)."""
        stream, reader = self.stream, self.reader
        pending = self.pending
        try:
            while self.error is None and (
                not waiter.done if waiter is not None else bool(pending and pending[0].abandoned)
            ):
                # polling pays for a lone request; concurrent ones gain more from batching
                data = None
                if self.spinner is not None and len(pending) == 1:
                    data = await self.spinner.receive()
                reader.feed(data if data is not None else await stream.receive(_RECEIVE))
                reply = reader.gets()
                while reply is not False:
                    if type(reply) is PushNotification:
                        self.endpoint.statistics.push_frames += 1  # never a command's reply
                    else:
                        head = self.pending[0]
                        replies = head.replies
                        replies.append(reply)
                        if len(replies) >= head.count:
                            self.pending.popleft()
                            head.done = True
                            if head is not waiter and not head.abandoned:
                                head.event.set()
                    reply = reader.gets()
        except anyio.EndOfStream:
            self.fail(RedisUnavailable(f"the server closed the connection; {_MAY_HAVE_RUN}"))
        except _TRANSPORT_ERRORS as exc:
            self.fail(RedisUnavailable(f"connection lost ({exc!r}); {_MAY_HAVE_RUN}"))
        except IndexError:
            self.fail(RedisUnavailable("Redis sent a reply nobody asked for; connection closed"))
        finally:
            self.reading = False
            self.hand_off()

    def hand_off(self) -> None:
        """Give the reading role to the oldest waiter still waiting, if nobody holds it."""
        if self.reading or self.error is not None:
            return
        for candidate in self.pending:
            if not candidate.abandoned and not candidate.done:
                self.reading = True
                candidate.lead = True
                candidate.event.set()
                return

    async def _watchdog(self) -> None:
        period = min(max(self.timeout / 8, 0.005), 0.5)
        last = time.monotonic()
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            stalled, last = now - last - period, now
            if stalled > period:
                # This process did not run on time (a handler's blocking call, SIGSTOP, a
                # suspended VM, a starved event loop): replies that arrived meanwhile wait
                # unread in the socket, so the stall is not the server's and must not count
                # against the commands in flight.
                for waiter in self.pending:
                    waiter.sent = min(now, waiter.sent + stalled)
            if self.pending and not self.reading and self.pending[0].abandoned:
                # Replies of cancelled callers with nobody left to read them: drain them here
                # (bounded, so the timeout check below keeps its cadence).
                self.reading = True
                with anyio.move_on_after(period):
                    await self.read_until(None)
                now = last = time.monotonic()
            if self.pending and now - self.pending[0].sent >= self.timeout:
                self.fail(
                    RedisUnavailable(
                        "the connection was closed because an earlier command timed out; "
                        "this command may have run"
                    ),
                    now=now,
                )
                return


class _Spinner:
    """Polls a link's socket for a reply, between event-loop turns, before its reader parks.

    On a server that answers in tens of microseconds (loopback, the same rack), parking costs
    more than the wait: the task sleeps in ``epoll_wait``, the core idles, and waking it again
    takes longer than the server took to reply (measured here: a 70 µs round trip parked,
    25 µs polled). So the reader of a lone request (concurrent requests gain more from being
    batched into one write and one read) polls the socket without blocking for up to
    ``spin_wait`` seconds, yielding to the event loop before every poll: every other ready
    task runs in between and the loop keeps serving its other sockets, so nothing waits
    behind a poll. Never on TLS (the raw bytes are TLS records) nor while the stream still
    holds data it received; and after a poll that found nothing in time, the next 1, 2, 4 ...
    1024 chances are skipped, so against a distant server (replies slower than
    ``spin_wait``) polling costs next to nothing.
    """

    __slots__ = ("_budget", "_buffered", "_next_skip", "_skip", "_sock", "_stats")

    def __init__(
        self,
        sock: socket.socket,
        budget: float,
        buffered: Callable[[], bool],
        statistics: Statistics,
    ) -> None:
        self._sock = sock
        self._budget = budget
        self._buffered = buffered
        self._stats = statistics
        self._skip = 0
        self._next_skip = 1

    @classmethod
    def for_stream(
        cls, stream: anyio.abc.ByteStream, raw: socket.socket | None, endpoint: Endpoint
    ) -> _Spinner | None:
        """A spinner for ``stream``, or None where polling its socket is not safe or not wanted
        (``spin_wait`` 0, TLS, a stream class whose buffering is unknown)."""
        if endpoint.spin_wait <= 0 or raw is None:
            return None
        kind = type(stream)
        module, name = kind.__module__, kind.__name__
        if name not in ("SocketStream", "UNIXSocketStream"):
            return None  # TLS or a wrapper: raw bytes are not the stream's bytes
        budget, stats = endpoint.spin_wait, endpoint.statistics
        if module == "anyio._backends._trio" or (
            module == "anyio._backends._asyncio" and name == "UNIXSocketStream"
        ):
            return cls(raw, budget, lambda: False, stats)  # they read the socket directly
        if module == "anyio._backends._asyncio":
            # a protocol that queues what the transport read (reading is paused between
            # receives, so the socket is ours to poll while the queue is empty)
            protocol = getattr(stream, "_protocol", None)
            queue = getattr(protocol, "read_queue", None)
            event = getattr(protocol, "read_event", None)
            if queue is None or event is None:
                return None  # anyio's internals changed: do not guess
            return cls(raw, budget, lambda: bool(queue) or event.is_set(), stats)
        return None

    async def receive(self) -> bytes | None:
        """Bytes read by polling, or None: park in ``stream.receive`` instead (nothing came
        within the budget, polling is backed off, or the stream already holds data or has
        reached its end). A socket error is raised as the stream would raise it; a
        cancellation arrives at a yield, before a poll, and reads nothing."""
        if self._skip:
            self._skip -= 1
            return None
        if self._buffered():
            return None
        recv, flags = self._sock.recv, _POLL_FLAGS
        clock = time.perf_counter
        checkpoint = anyio.lowlevel.checkpoint
        deadline = clock() + self._budget
        while True:
            await checkpoint()
            try:
                data = recv(_RECEIVE, flags)
            except (BlockingIOError, InterruptedError):
                if clock() < deadline:
                    continue
                self._stats.spin_misses += 1
                self._skip = self._next_skip
                self._next_skip = min(self._next_skip * 2, 1024)
                return None
            if not data:
                return None  # end of stream: the stream's own receive reports it
            self._stats.spin_hits += 1
            self._next_skip = 1
            return data


def _raw_socket(stream: anyio.abc.ByteStream) -> socket.socket | None:
    """A socket object to peek at ``stream``'s socket with. asyncio hands out a restricted
    wrapper that cannot ``recv``: peek through a duplicate of its descriptor instead (closed
    with the link)."""
    try:
        raw: Any = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    except anyio.TypedAttributeLookupError:
        return None
    if isinstance(raw, socket.socket):
        return raw
    try:
        return socket.fromfd(raw.fileno(), raw.family, raw.type)
    except (OSError, AttributeError):
        return None


def _detail(exc: BaseException) -> str:
    """What broke a handshake, in a few words (its cause's text, or that it was closed)."""
    cause = exc.__cause__
    if isinstance(cause, anyio.EndOfStream):
        return "the server closed the connection"
    return str(cause) if cause is not None and str(cause) else str(exc)


def _closed_by_server(stream: anyio.abc.ByteStream) -> bool:
    """True when the server has closed an idle connection's socket (checked without blocking;
    False when it cannot be told, as for an unknown stream)."""
    raw = _raw_socket(stream)
    if raw is None:
        return False
    own = raw.fileno() != _fileno(stream)
    try:
        return _peer_closed(raw)
    finally:
        if own:
            raw.close()


def _peer_closed(sock: socket.socket) -> bool:
    """Peek (without blocking or consuming) whether the peer closed an idle socket."""
    try:
        return sock.recv(1, _PEEK_FLAGS) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _fileno(stream: anyio.abc.ByteStream) -> int:
    try:
        return int(stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno())
    except (anyio.TypedAttributeLookupError, OSError, AttributeError):
        return -1


_PEEK_FLAGS = socket.MSG_PEEK | socket.MSG_DONTWAIT
_POLL_FLAGS = socket.MSG_DONTWAIT


class Multiplexed:
    """The shared, auto-pipelined connection to one server. See the module docstring."""

    def __init__(self, endpoint: Endpoint, spawn: Spawn):
        self.endpoint = endpoint
        self._spawn = spawn
        self._link: _Link | None = None
        self._lock = anyio.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._last_failure: tuple[float, Exception] | None = None  # the last connect failure

    @property
    def in_flight(self) -> int:
        link = self._link
        return len(link.pending) if link is not None and link.error is None else 0

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.error is None

    async def _connect(self) -> _Link:
        asked = time.monotonic()
        async with self._lock:
            link = self._link
            if link is not None and link.error is None:
                return link
            failure = self._last_failure
            if failure is not None and failure[0] >= asked:
                # an attempt made while this caller waited for the lock has just failed: fail
                # with it rather than queue another (callers waiting on a dead node would
                # otherwise each spend a connect timeout in turn)
                raise copy.copy(failure[1])
            delay = self._retry_at - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            try:
                conn = await self.endpoint.open()
            except Exception as exc:
                self._failures += 1
                self._retry_at = time.monotonic() + min(0.025 * 2**self._failures, 1.0)
                self._last_failure = (time.monotonic(), exc)
                raise
            self._failures = 0
            link = _Link(conn, self.endpoint)
            try:
                self._spawn(link.run)
            except BaseException:
                link.close_peek()
                await conn.aclose()  # the client was closed meanwhile
                raise
            self._link = link
            return link

    async def ensure_connected(self) -> None:
        """Connect (and handshake) now unless connected; sends no command of its own."""
        link = self._link
        if link is None or link.error is not None or link.idle_and_closed():
            if link is not None and link.error is None:
                link.fail(RedisUnavailable("the server closed the idle connection"))
            await self._connect()

    async def request(self, payload: bytes, count: int, *, shielded: bool = False) -> list[Any]:
        """Send one encoded request expecting ``count`` replies; return the replies.

        ``shielded``: wait for the replies even if the caller is cancelled (pipelines and
        transactions), bounded by the command timeout (the watchdog).
        """
        link = self._link
        if link is not None and link.idle_and_closed():
            link.fail(RedisUnavailable("the server closed the idle connection"))
        if link is None or link.error is not None:
            link = await self._connect()
        else:
            await anyio.lowlevel.checkpoint_if_cancelled()
        waiter = link.submit(payload, count)
        if not link.writing:
            link.writing = True
            await link.flush()
        if shielded:
            with anyio.CancelScope(shield=True):
                await self._wait(link, waiter)
        else:
            try:
                await self._wait(link, waiter)
            except BaseException:
                waiter.abandoned = True
                if waiter.lead:  # handed the reading role but cancelled before taking it
                    waiter.lead = False
                    link.reading = False
                    link.hand_off()
                raise
        if waiter.error is not None:
            raise waiter.error
        return waiter.replies

    @staticmethod
    async def _wait(link: _Link, waiter: _Waiter) -> None:
        """Wait for ``waiter``'s replies, reading them (and others') while nobody else reads."""
        while not waiter.done and waiter.error is None:
            if waiter.lead:
                waiter.lead = False  # the role is ours now; read_until hands it on
                await link.read_until(waiter)
            elif not link.reading and link.error is None:
                link.reading = True
                await link.read_until(waiter)
            else:
                await waiter.event.wait()
                if not waiter.done and waiter.error is None:
                    waiter.event = link.new_event()  # woken to read: the loop takes the role

    def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.fail(RedisUnavailable("the Redis client was closed"))


class DedicatedPool:
    """A bounded pool of dedicated connections to one server (LIFO reuse)."""

    def __init__(self, endpoint: Endpoint, size: int) -> None:
        self.endpoint = endpoint
        self._idle: list[Dedicated] = []
        self._slots = anyio.Semaphore(size)
        self._closed = False

    async def acquire(self) -> Dedicated:
        stats = self.endpoint.statistics
        stats.dedicated_waiting += 1
        try:
            await self._slots.acquire()
        finally:
            stats.dedicated_waiting -= 1
        try:
            while self._idle:
                conn = self._idle.pop()
                stats.dedicated_idle -= 1
                if conn.broken:
                    continue
                if _closed_by_server(conn.stream):
                    # a server restart, CLIENT KILL or its idle timeout while pooled: reconnect
                    # now rather than fail the next command with "may have run"
                    await conn.aclose()
                    continue
                stats.dedicated_in_use += 1
                return conn
            conn = await self.endpoint.open()
        except BaseException:
            self._slots.release()
            raise
        stats.dedicated_in_use += 1
        return conn

    async def release(self, conn: Dedicated) -> None:
        stats = self.endpoint.statistics
        stats.dedicated_in_use -= 1
        try:
            if conn.broken or self._closed:
                await conn.aclose()
            else:
                self._idle.append(conn)
                stats.dedicated_idle += 1
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        self.endpoint.statistics.dedicated_idle -= len(idle)
        for conn in idle:
            await conn.aclose()
