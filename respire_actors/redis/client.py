"""The one module that talks to coredis.

Everything the runtime sends to Redis goes through :class:`RedisClient`, which makes the rules in
``docs/decisions.md`` hold by construction:

* no automatic retries: coredis's default policy re-sends commands whose reply was lost, which
  duplicated XADDs and script runs in measurements; here a lost reply surfaces as
  :class:`~respire_actors.errors.RedisUnavailable` and the caller decides (every respire_actors
  transition is written to be safe to repeat);
* a command timeout on every ordinary command, so a hung server cannot hang a worker;
* pipelines and transactions are shielded from cancellation (cancelling one would close the
  shared socket under every other in-flight command), bounded by the command timeout instead;
* blocking reads get their own client with a single connection (:meth:`RedisClient.open_blocking`);
* the coredis pool stall on cancelled waiters is fixed (:mod:`respire_actors.redis._pool`);
* coredis exceptions are mapped to :mod:`respire_actors.errors` here and nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.lowlevel
import coredis
import coredis.exceptions as cx
from coredis.commands._routing import RandomStrategy
from coredis.response._callbacks import NoopCallback
from coredis.retry import NoRetryPolicy

from ..errors import (
    CommandTimeout,
    ConfigurationError,
    PermissionDenied,
    RedisUnavailable,
    RespireError,
    ScriptError,
    ServerError,
    ServerLoading,
    TransactionAborted,
    UnsupportedServer,
    ValidationError,
    WrongKeyType,
)
from ._pool import SafeClusterConnectionPool, SafeConnectionPool
from ._routing import cluster_request_args, key_indices, plain

Arg = str | bytes | int | float
T = TypeVar("T")

DEFAULT_URL_ENV = "RESPIRE_REDIS_URL"
MIN_SERVER_VERSION = (7, 0)

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "valkey", "valkeys"}


# --------------------------------------------------------------------------------------------
# settings


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Where and how to connect. Build it with :meth:`from_url` or directly.

    ``key_prefix`` is prepended to every key the runtime generates; put a hash tag in it
    (``"{tenant-7}:"``) only if you want every queue of the tenant in one cluster slot.
    """

    host: str = "127.0.0.1"
    port: int = 6379
    unix_socket_path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_ca_certs: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cert_reqs: Literal["optional", "required", "none"] | None = None
    cluster: bool = False
    cluster_nodes: tuple[tuple[str, int], ...] = ()
    key_prefix: str = ""
    command_timeout: float = 5.0
    connect_timeout: float = 5.0
    max_connections: int = 64
    client_name: str | None = None

    def __post_init__(self) -> None:
        if self.command_timeout <= 0:
            raise ConfigurationError("command_timeout must be positive (seconds)")
        if self.connect_timeout <= 0:
            raise ConfigurationError("connect_timeout must be positive (seconds)")
        if self.max_connections < 2:
            raise ConfigurationError("max_connections must be at least 2")
        if "{" in self.key_prefix and "}" not in self.key_prefix.split("{", 1)[1]:
            raise ConfigurationError(
                f"key_prefix {self.key_prefix!r} opens a hash tag it never closes"
            )

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> ConnectionSettings:
        """Parse ``redis://``, ``rediss://`` (TLS), ``unix://`` and ``redis+cluster://`` URLs.

        Forms::

            redis://[user[:password]@]host[:port][/db][?key_prefix=..&command_timeout=..]
            rediss://...                         TLS; ?ssl_ca_certs=/path&ssl_cert_reqs=required
            unix://[user[:password]@]/path/to/socket[?db=0]
            redis+cluster://host:port[,host:port...]   (or redis://host:port?cluster=true)

        Raises :class:`ConfigurationError` with what to fix when the URL is malformed.
        """
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ConfigurationError(f"cannot parse Redis URL {_redact(url)!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES:
            raise ConfigurationError(
                f"unsupported Redis URL scheme {parts.scheme!r} in {_redact(url)!r}: "
                "use redis://, rediss://, unix:// or redis+cluster://"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        kwargs: dict[str, Any] = {}
        # netloc may hold several hosts for a cluster: split credentials off by hand
        netloc = parts.netloc
        userinfo, _, hosts = netloc.rpartition("@")
        if userinfo:
            user, sep, password = userinfo.partition(":")
            if sep:
                kwargs["username"] = unquote(user) or None
                kwargs["password"] = unquote(password)
            else:
                kwargs["password"] = unquote(user)
        tls = scheme in {"rediss", "rediss+cluster", "valkeys"}
        kwargs["tls"] = tls
        if scheme == "unix":
            if not parts.path:
                raise ConfigurationError(f"unix URL {_redact(url)!r} names no socket path")
            kwargs["unix_socket_path"] = unquote(parts.path)
        else:
            nodes = []
            for item in hosts.split(","):
                if not item:
                    continue
                host, port = _split_host_port(item, url)
                nodes.append((host, port))
            if not nodes:
                nodes = [("127.0.0.1", 6379)]
            kwargs["host"], kwargs["port"] = nodes[0]
            cluster = scheme.endswith("+cluster") or _truthy(query.pop("cluster", "no"))
            if cluster:
                kwargs["cluster"] = True
                kwargs["cluster_nodes"] = tuple(nodes)
            elif len(nodes) > 1:
                raise ConfigurationError(
                    f"{_redact(url)!r} lists several hosts: use redis+cluster:// for a cluster"
                )
            path = parts.path.strip("/")
            if path:
                if not path.isdigit():
                    raise ConfigurationError(f"database in {_redact(url)!r} must be a number")
                kwargs["db"] = int(path)
        for name, conv in (
            ("db", int),
            ("key_prefix", str),
            ("command_timeout", float),
            ("connect_timeout", float),
            ("max_connections", int),
            ("client_name", str),
            ("ssl_ca_certs", str),
            ("ssl_certfile", str),
            ("ssl_keyfile", str),
            ("ssl_cert_reqs", str),
        ):
            if name in query:
                raw = query.pop(name)
                try:
                    value = conv(raw)
                except ValueError:
                    raise ConfigurationError(f"bad value {raw!r} for {name} in Redis URL") from None
                kwargs[name.replace("ssl_", "tls_")] = value
        if query:
            raise ConfigurationError(
                f"unknown Redis URL option(s) {sorted(query)} in {_redact(url)!r}"
            )
        if kwargs.get("tls_cert_reqs") not in (None, "optional", "required", "none"):
            raise ConfigurationError("ssl_cert_reqs must be optional, required or none")
        if kwargs.get("db", 0) and kwargs.get("cluster"):
            raise ConfigurationError("a Redis Cluster has only database 0")
        kwargs.update(overrides)
        return cls(**kwargs)

    def describe(self) -> str:
        """A human-readable location without credentials."""
        if self.unix_socket_path:
            return f"unix://{self.unix_socket_path}"
        scheme = "rediss" if self.tls else "redis"
        if self.cluster:
            hosts = ",".join(f"{h}:{p}" for h, p in self.cluster_nodes)
            return f"{scheme}+cluster://{hosts}"
        return f"{scheme}://{self.host}:{self.port}/{self.db}"


def _truthy(value: str) -> bool:
    return value.lower() in {"1", "true", "yes", "on"}


def _split_host_port(item: str, url: str) -> tuple[str, int]:
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, _, port_text = item.partition(":")
    if not port_text:
        return host or "127.0.0.1", 6379
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(f"bad port {port_text!r} in Redis URL {_redact(url)!r}")
    return host or "127.0.0.1", int(port_text)


def _redact(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if "@" not in parts.netloc:
        return url
    return url.replace(parts.netloc, "***@" + parts.netloc.rpartition("@")[2], 1)


# --------------------------------------------------------------------------------------------
# errors


def map_error(exc: BaseException) -> BaseException:
    """Translate a coredis (or transport) exception into the respire_actors tree.

    Anything that is not a Redis error is returned unchanged.
    """
    if isinstance(exc, RespireError):
        return exc
    if isinstance(exc, TimeoutError):
        return CommandTimeout("Redis did not reply within the command timeout; it may have run")
    if isinstance(exc, cx.WatchError):
        return TransactionAborted()
    if isinstance(exc, cx.AuthenticationError):
        return ConfigurationError(
            f"Redis refused the credentials: {exc}. Check the user and password in the URL"
        )
    if isinstance(exc, cx.ConnectionError | OSError | cx.ClusterDownError):
        return RedisUnavailable(f"Redis connection failed: {exc}")
    if isinstance(exc, cx.RedisError):
        message = str(exc.args[0]) if exc.args else str(exc)
        # coredis rewrites errors raised inside pipelines to name the whole command; keep the
        # server's text only, so script bodies and arguments never reach logs.
        marker = "of pipeline caused error: "
        if marker in message:
            message = message.split(marker, 1)[1]
        if message.startswith("LOADING"):
            return ServerLoading(message)
        if isinstance(exc, cx.WrongTypeError) or message.startswith("WRONGTYPE"):
            return WrongKeyType(_with_code("WRONGTYPE", message))
        if isinstance(exc, cx.AuthorizationError) or message.startswith("NOPERM"):
            # coredis strips the NOPERM code from the text; keep it in ServerError.code.
            return PermissionDenied(_with_code("NOPERM", message))
        if message.startswith("RESPIRE_"):
            code = message.split(" ", 1)[0]
            if code == "RESPIRE_WRONGTYPE":
                return WrongKeyType(message)
            if code == "RESPIRE_NOPERM":
                return PermissionDenied(message)
            return ScriptError(message)
        if isinstance(exc, cx.NoScriptError) and not message.startswith("NOSCRIPT"):
            message = "NOSCRIPT " + message
        if isinstance(exc, cx.StreamDuplicateConsumerGroupError):
            message = _with_code("BUSYGROUP", message)
        if isinstance(exc, cx.StreamConsumerGroupError) and not message.startswith("BUSY"):
            message = _with_code("NOGROUP", message)
        return ServerError(message)
    return exc


def _with_code(code: str, message: str) -> str:
    return message if message.startswith(code) else f"{code} {message}"


# --------------------------------------------------------------------------------------------
# capabilities


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What one server is and can do; detected per server, refreshed after reconnects."""

    flavor: Literal["redis", "valkey"]
    version: tuple[int, int, int]
    mode: str
    role: str
    commands: frozenset[str] = field(default=frozenset())

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def has_xackdel(self) -> bool:
        """XACKDEL (Redis 8.2+): acknowledge and delete in one command."""
        return "xackdel" in self.commands

    @property
    def has_xautoclaim_deleted(self) -> bool:
        """XAUTOCLAIM reports (and clears) PEL entries whose bodies were deleted (7.0+)."""
        return self.version >= (7, 0, 0)

    def describe(self) -> str:
        name = "Valkey" if self.flavor == "valkey" else "Redis"
        return f"{name} {self.version_text} ({self.mode}, {self.role})"


def _parse_version(text: str) -> tuple[int, int, int]:
    numbers = [int(p) if p.isdigit() else 0 for p in text.split(".")[:3]]
    while len(numbers) < 3:
        numbers.append(0)
    return numbers[0], numbers[1], numbers[2]


_PROBED_COMMANDS = ("xackdel", "xdelex", "hgetdel", "hexpire")


# --------------------------------------------------------------------------------------------
# the client


class RedisClient:
    """A coredis client wrapped so it is safe under cancellation. Use :func:`connect`.

    Enter it once (``async with``) in a long-lived task; share the entered client freely
    between tasks. Commands take and return raw RESP values (``bytes``, ``int``, lists).
    """

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        self._raw: Any = None
        self._stack: AsyncExitStack | None = None
        self._info: ServerInfo | None = None
        self.round_trips = 0
        """Requests sent (a pipeline or a transaction counts once), blocking reads included."""

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def key_prefix(self) -> str:
        return self.settings.key_prefix

    @property
    def is_cluster(self) -> bool:
        return self.settings.cluster

    def _build(self, *, blocking: bool) -> Any:
        s = self.settings
        common: dict[str, Any] = dict(
            username=s.username,
            password=s.password,
            # Blocking readers wait longer than any command timeout; their own deadlines apply.
            stream_timeout=None if blocking else s.command_timeout,
            connect_timeout=s.connect_timeout,
            retry_policy=NoRetryPolicy(),
            decode_responses=False,
            verify_version=False,
        )
        if s.tls:
            common.update(
                ssl=True,
                ssl_ca_certs=s.tls_ca_certs,
                ssl_certfile=s.tls_certfile,
                ssl_keyfile=s.tls_keyfile,
                ssl_cert_reqs=s.tls_cert_reqs,
            )
        if s.cluster:
            nodes = [coredis.connection.TCPLocation(h, p) for h, p in s.cluster_nodes]
            return coredis.RedisCluster(
                startup_nodes=nodes,
                max_connections=max(3, 3 if blocking else s.max_connections),
                max_connections_per_node=blocking,
                connection_pool_cls=SafeClusterConnectionPool,
                **common,
            )
        if s.unix_socket_path:
            common["unix_socket_path"] = s.unix_socket_path
        return coredis.Redis(
            host=s.host,
            port=s.port,
            db=s.db,
            max_connections=1 if blocking else s.max_connections,
            connection_pool_cls=SafeConnectionPool,
            client_name=s.client_name,
            **common,
        )

    async def __aenter__(self) -> RedisClient:
        if self._raw is not None:
            raise RuntimeError("this RedisClient is already entered; enter it once")
        stack = AsyncExitStack()
        raw = self._build(blocking=False)
        try:
            # coredis opens its task group here: no cancel scope may wrap this call.
            await stack.enter_async_context(raw)
        except BaseException as exc:
            await stack.aclose()
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise RedisUnavailable(
                f"cannot connect to {self.settings.describe()}: {exc}. "
                "Is the server running, and is the URL right?"
            ) from exc
        self._raw, self._stack = raw, stack
        try:
            await self.server_info(refresh=True)
        except RedisUnavailable as exc:
            await self.aclose()
            raise RedisUnavailable(
                f"cannot reach Redis at {self.settings.describe()} ({exc}). Start the server, "
                f"check the URL, or unset {DEFAULT_URL_ENV} to use the embedded server"
            ) from exc
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._raw, self._stack = self._stack, None, None
        if stack is not None:
            # coredis's task group lives in this stack: close it in the scope that opened it.
            await stack.aclose()

    @property
    def raw(self) -> Any:
        """The underlying coredis client (for tests and advanced use); None until entered."""
        return self._raw

    def _require(self) -> Any:
        if self._raw is None:
            raise RuntimeError("enter the RedisClient (async with) before sending commands")
        return self._raw

    # -- commands -------------------------------------------------------------------------
    async def execute(self, *args: Arg) -> Any:
        """Send one command and return its raw reply.

        Raises a :class:`~respire_actors.errors.RespireError`. If cancelled, the command may
        still run on the server; its reply is discarded.
        """
        raw = self._require()
        self.round_trips += 1
        request = _request(raw, args, cluster=self.settings.cluster)
        try:
            return await raw.execute_command(request)
        except Exception as exc:
            await _raise_cancelled_instead()
            raise map_error(exc) from exc

    async def pipeline(
        self, commands: Sequence[Sequence[Arg]], *, transaction: bool = False
    ) -> list[Any]:
        """Send many commands in one round trip; return each reply or its mapped exception.

        With ``transaction=True`` they run in MULTI/EXEC. The pipeline is shielded from
        cancellation (bounded by the command timeout), because cancelling it mid-flight would
        break the shared socket for every other task.
        """
        if not commands:
            return []
        raw = self._require()
        self.round_trips += 1
        if self.settings.cluster:
            keyless = sorted({_text(c[0]) for c in commands if not key_indices(_name(c[0]), c[1:])})
            if keyless:
                # coredis cannot place a keyless command in a cluster pipeline (it crashes when
                # one comes first); run such commands with execute().
                raise ValidationError(
                    f"commands without keys cannot be pipelined on a cluster: {keyless}"
                )
        results: list[Any] = []
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(self.settings.command_timeout * 2):
                    async with raw.pipeline(transaction=transaction, raise_on_error=False) as p:
                        requests = [
                            _request(p, c, cluster=self.settings.cluster) for c in commands
                        ]
                for r in requests:
                    try:
                        results.append(await r)
                    except Exception as exc:
                        results.append(map_error(exc))
            except Exception as exc:
                raise map_error(exc) from exc
        return results

    def transaction(self, *watch: str) -> Transaction:
        """Open a MULTI/EXEC transaction, optionally WATCHing keys. See :class:`Transaction`."""
        return Transaction(self, tuple(watch))

    @asynccontextmanager
    async def open_blocking(self) -> AsyncIterator[BlockingConnection]:
        """A dedicated connection for blocking reads, never shared with other commands.

        Cancelling a blocking read closes only this connection; it reconnects on next use.
        """
        raw = self._build(blocking=True)
        try:
            async with raw:
                yield BlockingConnection(raw, cluster=self.settings.cluster, owner=self)
        except Exception as exc:
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    # -- capabilities ---------------------------------------------------------------------
    async def server_info(self, *, refresh: bool = False) -> ServerInfo:
        """Detect the server (Redis or Valkey), its version and optional commands.

        Raises :class:`UnsupportedServer` if it is older than Redis 7.0.
        """
        if self._info is not None and not refresh:
            return self._info
        info_text = await self.execute("INFO", "server")
        fields: dict[str, str] = {}
        for line in _text(info_text).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        flavor: Literal["redis", "valkey"] = "valkey" if "valkey_version" in fields else "redis"
        version = _parse_version(fields.get("valkey_version") or fields.get("redis_version", "0"))
        if version[:2] < MIN_SERVER_VERSION and flavor == "redis":
            raise UnsupportedServer(
                f"{self.settings.describe()} runs Redis {'.'.join(map(str, version))}; "
                "respire_actors needs Redis 7.0 or later (or any Valkey)"
            )
        commands: set[str] = set()
        try:
            reply = await self.execute("COMMAND", "INFO", *_PROBED_COMMANDS)
            for name, entry in zip(_PROBED_COMMANDS, reply or [], strict=False):
                if entry:
                    commands.add(name)
        except PermissionDenied:
            pass  # denied discovery: behave as if the optional commands were absent
        role = fields.get("role", "")
        if not role:
            try:
                role_reply = await self.execute("ROLE")
                role = _text(role_reply[0]) if role_reply else "unknown"
            except ServerError:
                role = "unknown"
        self._info = ServerInfo(
            flavor=flavor,
            version=version,
            mode=fields.get("redis_mode") or fields.get("server_mode") or "standalone",
            role=role or "master",
            commands=frozenset(commands),
        )
        return self._info

    async def time_ms(self) -> int:
        """The server's clock in milliseconds (``TIME``)."""
        seconds, micros = await self.execute("TIME")
        return int(seconds) * 1000 + int(micros) // 1000


class BlockingConnection:
    """A connection reserved for blocking reads; see :meth:`RedisClient.open_blocking`."""

    def __init__(
        self, raw: Any, *, cluster: bool = False, owner: RedisClient | None = None
    ) -> None:
        self._owner = owner
        self._raw = raw
        self._cluster = cluster

    async def execute(self, *args: Arg) -> Any:
        """Send one (typically blocking) command. Cancelling it closes this connection only."""
        if self._owner is not None:
            self._owner.round_trips += 1
        request = _request(self._raw, args, cluster=self._cluster)
        try:
            return await self._raw.execute_command(request)
        except Exception as exc:
            await _raise_cancelled_instead()
            raise map_error(exc) from exc


class Pending(Generic[T]):
    """The result of a command queued in a :class:`Transaction`, readable after commit."""

    __slots__ = ("_convert", "_done", "_error", "_value")

    def __init__(self, convert: Callable[[Any], T] | None = None) -> None:
        self._convert = convert
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def _set(self, value: Any) -> None:
        self._done = True
        if isinstance(value, BaseException):
            self._error = value
            return
        try:
            self._value = self._convert(value) if self._convert else value
        except Exception as exc:
            self._error = map_error(exc)

    def _abort(self, error: BaseException) -> None:
        self._done = True
        self._error = error

    @property
    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        """The command's result; raises its error, or :class:`TransactionAborted` if the
        transaction was discarded, or ``RuntimeError`` before the transaction ended."""
        if not self._done:
            raise RuntimeError("the transaction has not been committed yet")
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


class Transaction(AbstractAsyncContextManager["Transaction"]):
    """MULTI/EXEC on a dedicated connection, with optional WATCH.

    ::

        async with client.transaction("{shop}:order:42") as tx:
            status = await tx.read("GET", "{shop}:order:42")   # before MULTI, watched
            saved = tx.queue("SET", "{shop}:order:42", "paid")
            job = queue.enqueue_in(tx, "receipt:42", payload)
            committed = await tx.commit()                       # False if WATCH aborted
        saved.result(); job.result()

    Nothing queued is sent before :meth:`commit`. Leaving the block without committing
    discards everything. Redis does not roll back a command that fails at run time inside
    EXEC: inspect every :class:`Pending` result. All keys must hash to one cluster slot.
    """

    def __init__(self, client: RedisClient, watch: tuple[str, ...]) -> None:
        self._client = client
        self._watch = watch
        self._commands: list[tuple[tuple[Arg, ...], Pending[Any]]] = []
        self._pipe: Any = None
        self._stack: AsyncExitStack | None = None
        self._finished = False

    @property
    def client(self) -> RedisClient:
        return self._client

    async def __aenter__(self) -> Transaction:
        raw = self._client._require()
        stack = AsyncExitStack()
        pipe = raw.pipeline(transaction=True, raise_on_error=False)
        try:
            await stack.enter_async_context(pipe)
            if self._watch:
                await stack.enter_async_context(pipe.watch(*self._watch))
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        self._pipe, self._stack = pipe, stack
        return self

    async def read(self, *args: Arg) -> Any:
        """Run a read command now, on the watched connection (only valid with WATCH keys)."""
        if not self._watch:
            raise RuntimeError("read() needs a transaction opened with keys to WATCH")
        if self._commands:
            raise RuntimeError("read() must come before the first queued command")
        raw = self._client._require()
        try:
            if self._client.is_cluster:
                # coredis's cluster pipeline has no immediate execution: use the connection
                # that holds the WATCH (the keys' node) directly.
                return await self._pipe._watched_connection.create_request(
                    _name(args[0]), *plain(args[1:])
                )
            return await self._pipe._immediate_execute_command(
                _request(raw, args, cluster=False)
            )
        except Exception as exc:
            raise map_error(exc) from exc

    def queue(self, *args: Arg, convert: Callable[[Any], T] | None = None) -> Pending[T]:
        """Queue a command for EXEC; returns its :class:`Pending` result."""
        if self._finished or self._pipe is None:
            raise RuntimeError("the transaction is not open")
        pending: Pending[T] = Pending(convert)
        self._commands.append((tuple(args), pending))
        return pending

    async def commit(self) -> bool:
        """Send MULTI, the queued commands and EXEC. Returns False if a WATCHed key changed
        (every pending result then raises :class:`TransactionAborted`).

        Shielded from cancellation once started; bounded by twice the command timeout. A lost
        reply leaves the outcome unknown: retry with the same job IDs (they deduplicate).
        """
        if self._finished or self._pipe is None:
            raise RuntimeError("the transaction is not open")
        self._finished = True
        pipe, stack = self._pipe, self._stack
        assert stack is not None
        cluster = self._client.is_cluster
        requests = [_request(pipe, args, cluster=cluster) for args, _ in self._commands]
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(self._client.settings.command_timeout * 2):
                    await stack.aclose()
            except Exception as exc:
                mapped = map_error(exc)
                for _, pending in self._commands:
                    pending._abort(mapped)
                if isinstance(mapped, TransactionAborted):
                    return False
                raise mapped from exc
        for request, (_, pending) in zip(requests, self._commands, strict=True):
            try:
                pending._set(await request)
            except Exception as exc:
                pending._set(map_error(exc))
        return True

    async def discard(self) -> None:
        """Drop everything queued; nothing is sent."""
        if self._finished:
            return
        self._finished = True
        for _, pending in self._commands:
            pending._abort(TransactionAborted("the transaction was discarded"))
        if self._pipe is not None:
            self._pipe.command_stack.clear()
        if self._stack is not None:
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.discard()


async def _raise_cancelled_instead() -> None:
    # On trio a cancellation landing while a connection opens can surface as ConnectionError;
    # if our scope is cancelled, let the cancellation win.
    await anyio.lowlevel.checkpoint_if_cancelled()


def _request(factory: Any, args: Sequence[Arg], *, cluster: bool) -> Any:
    """A coredis request for a raw command; on a cluster, with its keys marked for routing."""
    name = _name(args[0])
    rest: tuple[Any, ...] = tuple(args[1:])
    if not cluster:
        return factory.create_request(name, *rest, callback=NoopCallback())
    name, rest = cluster_request_args(name, rest)
    request = factory.create_request(name, *rest, callback=NoopCallback())
    if request.routing_strategy is None and not request.keys:
        # A keyless command coredis has no strategy for (TIME, ROLE, CLIENT ID...): any node.
        request.routing_strategy = RandomStrategy()
    return request


def _name(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value.upper()
    return str(value).upper().encode()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# --------------------------------------------------------------------------------------------
# entry point


def connect(url: str | None = None, **options: Any) -> RedisClient:
    """Create a client for ``url`` (or ``$RESPIRE_REDIS_URL``). Enter it with ``async with``.

    ``options`` override URL settings (``key_prefix``, ``command_timeout``, ...). Raises
    :class:`ConfigurationError` for a malformed URL; connection errors surface on entry as
    :class:`RedisUnavailable`, with what to check.
    """
    target = url or os.environ.get(DEFAULT_URL_ENV)
    if not target:
        raise ConfigurationError(
            f"no Redis URL given: pass one or set {DEFAULT_URL_ENV} "
            "(the CLI starts an embedded server when neither is set)"
        )
    return RedisClient(ConnectionSettings.from_url(target, **options))


def with_settings(client: RedisClient, **changes: Any) -> RedisClient:
    """A new, unentered client with some settings changed (e.g. another key prefix)."""
    return RedisClient(replace(client.settings, **changes))


__all__ = [
    "Arg",
    "BlockingConnection",
    "ConnectionSettings",
    "Pending",
    "RedisClient",
    "ServerInfo",
    "Transaction",
    "connect",
    "map_error",
    "with_settings",
]

