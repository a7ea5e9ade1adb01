"""The one module the rest of respire_actors uses to talk to Redis.

Everything the runtime sends goes through :class:`RedisClient`, built on the project's own
connection layer (:mod:`respire_actors.redis._connection`: anyio streams, ``hiredis`` reply
parsing, one multiplexed auto-pipelined connection per server). The rules of
``docs/connection.md`` hold by construction:

* no automatic retries: a request whose reply was lost fails with
  :class:`~respire_actors.errors.RedisUnavailable` and is never re-sent (every respire_actors
  transition is written to be safe to repeat);
* a command timeout on every ordinary command, so a hung server cannot hang a worker;
* pipelines and transactions are written in one piece and their replies awaited even if the
  caller is cancelled (bounded by the command timeout), so they run exactly once;
* blocking commands and WATCH transactions get dedicated connections, never the shared one;
* errors are mapped to :mod:`respire_actors.errors` here (:func:`map_error`) and nowhere else.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.abc

from ..errors import (
    ClusterReconfiguring,
    CommandTimeout,
    ConfigurationError,
    CredentialsRefused,
    PermissionDenied,
    QueueFull,
    RedisUnavailable,
    RespireError,
    ScriptError,
    ServerError,
    ServerLoading,
    TransactionAborted,
    UnsupportedSchema,
    UnsupportedServer,
    ValidationError,
    WrongKeyType,
)
from ..keys import validate_key_prefix
from ._cluster import ASKING, MAX_REDIRECTS, ClusterRouter
from ._connection import (
    Address,
    CredentialProvider,
    Dedicated,
    DedicatedPool,
    Endpoint,
    Multiplexed,
    Statistics,
    _closed_by_server,
)
from ._protocol import (
    Arg,
    ProtocolError,
    ReplyError,
    command_name,
    encode,
    encode_many,
    is_blocking,
    is_stateful,
    key_slot,
)
from ._routing import key_indices
from .script_lines import refused_in_script

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
    cluster_retry_timeout: float = 2.0
    """How long a command refused with TRYAGAIN or CLUSTERDOWN (a slot migrating, a failover)
    is retried, with backoff, before :class:`ClusterReconfiguring` is raised (it never ran)."""
    max_connections: int = 64
    client_name: str | None = None
    max_payload_bytes: int = 512 * 1024 * 1024
    """The largest encoded payload (job, message, publication, recurring template) a producer
    may send, in bytes; a larger one raises :class:`~respire_actors.codecs.PayloadTooLarge`
    before anything is sent. The default is the server's default ``proto-max-bulk-len``
    (512 MiB): a server configured lower closes the connection on a larger argument, failing
    every command in flight on it, so set this to the server's value."""
    spin_wait: float = 0.0001
    """Seconds the reader of a lone request may poll the shared connection's socket, yielding
    to the event loop between polls, before it parks (0 turns polling off; at most 0.01).
    Never on TLS, and backed off after polls that found nothing: a lone caller on a fast
    server (loopback) gets its reply in about half the time, while against a distant server
    the polling costs next to nothing. See docs/connection.md."""
    tls_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)
    """A ready TLS context; overrides the ``tls_*`` file settings (implies TLS)."""
    credential_provider: CredentialProvider | None = field(default=None, compare=False, repr=False)
    """Called for every new connection; returns ``(username, password)`` (sync or async),
    for rotating credentials. Overrides ``username``/``password``."""

    def __post_init__(self) -> None:
        for name in ("command_timeout", "connect_timeout", "cluster_retry_timeout"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(f"{name} must be positive and finite (seconds)")
        spin = self.spin_wait
        if (
            isinstance(spin, bool)
            or not isinstance(spin, int | float)
            or not math.isfinite(spin)
            or not 0 <= spin <= 0.01
        ):
            raise ConfigurationError("spin_wait must be between 0 and 0.01 seconds")
        client_name = self.client_name
        if client_name is not None and (
            not isinstance(client_name, str)
            or not client_name
            or any(not "!" <= c <= "~" for c in client_name)
        ):
            raise ConfigurationError(
                f"client_name {client_name!r} must be a non-empty str of printable ASCII without "
                "spaces (the server refuses others)"
            )
        if self.max_connections < 2:
            raise ConfigurationError("max_connections must be at least 2")
        limit = self.max_payload_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError("max_payload_bytes must be a positive int (bytes)")
        validate_key_prefix(self.key_prefix)

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
        parsed = parse_qs(parts.query, keep_blank_values=True)
        repeated = sorted(k for k, v in parsed.items() if len(v) > 1)
        if repeated:
            raise ConfigurationError(
                f"Redis URL option(s) {repeated} given more than once in {_redact(url)!r}"
            )
        blank = sorted(k for k, v in parsed.items() if not v[0])
        if blank:
            raise ConfigurationError(
                f"Redis URL option(s) {blank} have no value in {_redact(url)!r}: write "
                "name=value (cluster=true, command_timeout=2, ...)"
            )
        query = {k: v[0] for k, v in parsed.items()}
        kwargs: dict[str, Any] = {}
        # netloc may hold several hosts for a cluster: split credentials off by hand
        netloc = parts.netloc
        userinfo, _, hosts = netloc.rpartition("@")
        if userinfo:
            # user[:password]: a user alone is an ACL user without a password (nopass)
            user, sep, password = userinfo.partition(":")
            kwargs["username"] = unquote(user) or None
            if sep:
                kwargs["password"] = unquote(password)
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
            flag = _flag("cluster", query.pop("cluster", None), url)
            if scheme.endswith("+cluster") and flag is False:
                raise ConfigurationError(
                    f"{_redact(url)!r} names a cluster twice, differently: a "
                    "redis+cluster:// URL cannot say cluster=false"
                )
            cluster = scheme.endswith("+cluster") or bool(flag)
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
            ("cluster_retry_timeout", float),
            ("max_connections", int),
            ("max_payload_bytes", int),
            ("client_name", str),
            ("spin_wait", float),
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
        given_tls = sorted(
            n
            for n in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
            if n.replace("ssl_", "tls_") in kwargs
        )
        if given_tls and not tls:
            raise ConfigurationError(
                f"{_redact(url)!r} gives TLS options ({', '.join(given_tls)}) to a plain-text "
                "scheme: use rediss:// (or valkeys://, rediss+cluster://) to connect with TLS"
            )
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


def _flag(name: str, value: str | None, url: str) -> bool | None:
    """A yes/no URL option (None when absent); anything but a known word is refused."""
    if value is None:
        return None
    word = value.lower()
    if word in {"1", "true", "yes", "on"}:
        return True
    if word in {"0", "false", "no", "off"}:
        return False
    raise ConfigurationError(
        f"bad value {value!r} for {name} in {_redact(url)!r}: write true or false"
    )


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

_TRANSPORT_ERRORS = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    ProtocolError,
)


def map_error(exc: BaseException) -> BaseException:
    """Translate a server error reply (``hiredis.ReplyError``) or a transport exception into
    the respire_actors tree. Anything else is returned unchanged."""
    if isinstance(exc, RespireError):
        return exc
    if isinstance(exc, ReplyError):
        return _map_reply(str(exc))
    if isinstance(exc, TimeoutError):
        return CommandTimeout("Redis did not reply within the command timeout; it may have run")
    if isinstance(exc, _TRANSPORT_ERRORS):
        return RedisUnavailable(f"Redis connection failed: {exc!r}")
    return exc


_NON_LOCAL_KEY = "ttempted to access a non local key in a cluster node"
"""A script touched a key it did not declare whose slot this node is not serving now (Redis
7.0: "Script attempted ...", Valkey: "Attempted ..."): mid-migration, when the key is absent
on the migrating node. The keys a respire_actors script derives from its declared ones (flow and
batch state, metrics, the coordination marker) share their hash tag, so this is never a
cross-slot mistake."""

_CLUSTER_TRANSIENT = ("TRYAGAIN", "CLUSTERDOWN")
"""Cluster replies that mean "not now": the command did not run and may be repeated."""


def _cluster_transient(reply: Any) -> bool:
    return type(reply) is ReplyError and str(reply).startswith(_CLUSTER_TRANSIENT)


def _map_reply(message: str) -> RespireError:
    code = message.split(" ", 1)[0]
    if code == "LOADING":
        return ServerLoading(message)
    if code in _CLUSTER_TRANSIENT or code in ("MOVED", "ASK"):
        return ClusterReconfiguring(
            f"the cluster could not serve this command now ({message}); it did not run"
        )
    if code == "ERR" and _NON_LOCAL_KEY in message:
        return ClusterReconfiguring(
            f"the cluster could not serve a key of this script's slot now ({message}): the slot "
            "is being migrated and the key is not on this node. The script stopped at that key; "
            "respire_actors' scripts reach such keys before their first write (a completion of "
            "several jobs may have committed the ones before it, which report stale if "
            "repeated), so the call may be repeated as is. In a script of your own it usually "
            "means a key outside the declared ones' slot",
            ran=None,  # the script is not rolled back: what it wrote before that key stays
        )
    if code == "WRONGTYPE":
        return WrongKeyType(message)
    if code == "NOPERM" or (code == "ERR" and _script_acl_denial(message)):
        command = _denied_command(message)
        lowered = message.lower()
        if command and command not in lowered and command.replace("|", " ") not in lowered:
            message = f"{message} (the refused command is {command}: grant +{command})"
        return PermissionDenied(message, command)
    if code in ("WRONGPASS", "NOAUTH"):
        return CredentialsRefused(
            f"Redis refused the credentials: {message}. Check the user and password in the URL"
        )
    if code.startswith("RESPIRE_"):
        if code == "RESPIRE_WRONGTYPE":
            return WrongKeyType(message)
        if code == "RESPIRE_NOPERM":
            return PermissionDenied(message, _denied_command(message))
        if code == "RESPIRE_SCHEMA":
            return UnsupportedSchema(message)
        if code == "RESPIRE_FULL":
            return _queue_full(message)
        return ScriptError(message)
    return ServerError(message)


_FULL = re.compile(r"backlog (\d+) limit (\d+) adding (\d+)")


def _queue_full(message: str) -> QueueFull:
    """``RESPIRE_FULL backlog <n> limit <m> adding <k>`` (lib/backlog.lua) as a QueueFull."""
    found = _FULL.search(message)
    backlog, limit, adding = (int(x) for x in found.groups()) if found else (0, 0, 1)
    return QueueFull(
        f"the queue is full: {backlog} jobs accepted and not finished, the bound is {limit} "
        f"(adding {adding}); nothing was enqueued",
        backlog,
        limit,
        adding,
    )


# How a command refused by ACL inside a script is reported: Redis 7.0 ("ERR The user executing
# the script can't run this command or subcommand script: ...", naming no command), Valkey ("ERR
# ACL failure in script: User u has no permissions to run the 'set' command ..."), and newer
# servers that keep the NOPERM code inside an ERR text.
_SCRIPT_ACL_DENIALS = ("ERR The user executing the script can't", "ERR ACL failure in script")
_DENIED_COMMAND = re.compile(r"'([a-z0-9_|.-]+)' command|may not run ([A-Za-z0-9_|.-]+)")


def _script_acl_denial(message: str) -> bool:
    return message.startswith(_SCRIPT_ACL_DENIALS) or " NOPERM " in message[:80]


def _denied_command(message: str) -> str:
    """The command a permission error names (lower case), or "" when it names none. Redis
    7.0's text for a refusal inside a script names only the script and line: the command is
    then read off that line of the script (:mod:`.script_lines`)."""
    match = _DENIED_COMMAND.search(message)
    if match is None:
        if "can't run this command or subcommand" in message:
            return refused_in_script(message)
        return ""  # a refused key or channel names no command
    return (match.group(1) or match.group(2)).lower()


_REPEATABLE = frozenset({b"TIME", b"PING", b"ECHO", b"INFO", b"COMMAND", b"ROLE", b"LASTSAVE"})
_REPEATABLE_CLUSTER = frozenset({b"SLOTS", b"SHARDS", b"NODES", b"INFO", b"KEYSLOT", b"MYID"})


def _repeatable(args: Sequence[Arg]) -> bool:
    """Whether a keyless command only reads, so a cluster may ask another node when the first
    one's answer is lost (it is never sent twice otherwise)."""
    name = command_name(args[0])
    if name == b"CLUSTER":
        return len(args) > 1 and command_name(args[1]) in _REPEATABLE_CLUSTER
    return name in _REPEATABLE


def _mapped(reply: Any) -> Any:
    return _map_reply(str(reply)) if type(reply) is ReplyError else reply


_SCRIPT_CALLS = frozenset({b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"})


def _reply_error(reply: Any, args: Sequence[Arg]) -> RespireError:
    """The error of one command's error reply; a plain ``WRONGTYPE`` (which names no key)
    gets the command's keys added, so the message says which key is in the way."""
    error = _map_reply(str(reply))
    if isinstance(error, WrongKeyType) and error.code == "WRONGTYPE":
        name = command_name(args[0])
        rest = args[1:]
        indices = [] if name in _SCRIPT_CALLS else key_indices(name, rest)
        if indices:
            keys = ", ".join(repr(_text(rest[i])) for i in indices)
            error = WrongKeyType(
                f"{error} ({name.decode()} on {keys}: another application, or another kind of "
                "respire_actors object, uses that key; give the queue a name or key prefix of "
                "its own)"
            )
    return error


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


def _describe_hello(
    hello: dict[Any, Any],
) -> tuple[Literal["redis", "valkey"], tuple[int, int, int], str, str]:
    """(flavor, version, mode, role) from a ``HELLO 3`` reply map."""
    fields = {_text(k): v for k, v in hello.items()}
    flavor: Literal["redis", "valkey"] = (
        "valkey" if _text(fields.get("server", "")).lower() == "valkey" else "redis"
    )
    return (
        flavor,
        _parse_version(_text(fields.get("version", "0"))),
        _text(fields.get("mode") or "standalone"),
        _text(fields.get("role") or "master"),
    )


# --------------------------------------------------------------------------------------------
# the client

# Pub/sub and MONITOR turn a connection into a stream of pushes that no call of this client reads.
_PUBSUB = frozenset(
    b"SUBSCRIBE PSUBSCRIBE SSUBSCRIBE UNSUBSCRIBE PUNSUBSCRIBE SUNSUBSCRIBE MONITOR".split()
)


def _refuse_pubsub(name: bytes) -> None:
    if name in _PUBSUB:
        raise ValidationError(
            f"{name.decode()} is not supported by this client: its replies are a stream of "
            "pushes that no call here reads (respire_actors needs no pub/sub); use a pub/sub "
            "client such as redis-py for it"
        )


# Command names that need a look before they may use the shared connection.
_SPECIAL = frozenset(
    b"""BLPOP BRPOP BRPOPLPUSH BLMOVE BLMPOP BZPOPMIN BZPOPMAX BZMPOP WAIT WAITAOF XREAD
    XREADGROUP CLIENT AUTH HELLO SELECT MULTI EXEC DISCARD WATCH UNWATCH SUBSCRIBE PSUBSCRIBE
    SSUBSCRIBE UNSUBSCRIBE PUNSUBSCRIBE SUNSUBSCRIBE MONITOR RESET QUIT SYNC PSYNC READONLY
    READWRITE ASKING""".split()
)


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """A snapshot of a client's connections (:meth:`RedisClient.statistics`)."""

    entered: bool
    """The client is entered (between ``__aenter__`` and ``aclose``)."""
    connections_opened: int
    """Sockets opened so far (shared, dedicated and blocking; reconnects included)."""
    shared_connected: int
    """Shared (multiplexed) connections currently open: one per server or cluster node."""
    in_flight: int
    """Requests written to shared connections and not answered yet (abandoned ones too)."""
    dedicated_in_use: int
    dedicated_idle: int
    dedicated_waiting: int
    """Tasks waiting for a dedicated connection (the pool is full)."""
    push_frames: int
    """RESP3 push frames received on shared connections (ignored: never a reply)."""
    moved: int
    """Cluster MOVED redirections followed."""
    asked: int
    """Cluster ASK redirections followed."""
    cluster_retries: int = 0
    """Commands repeated after TRYAGAIN / CLUSTERDOWN (a slot migrating, a failover)."""
    spin_hits: int = 0
    """Replies read by busy-polling the socket (``spin_wait``) instead of parking."""
    spin_misses: int = 0
    """Busy-polls that found no reply within ``spin_wait`` and parked."""


class RedisClient:
    """A Redis (or Redis Cluster) client that is safe under cancellation. Use :func:`connect`.

    Enter it once (``async with``) in a long-lived task; share the entered client freely
    between tasks. Commands take and return raw RESP3 values (``bytes``, ``int``, lists,
    dicts for maps).
    """

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        self._tg: anyio.abc.TaskGroup | None = None
        self._was_closed = False
        self._stats = Statistics()
        self._main: Multiplexed | None = None
        self._pool: DedicatedPool | None = None
        self._router: ClusterRouter | None = None
        self._endpoint: Endpoint | None = None
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

    def node_of(self, key: str) -> str | None:
        """The ``host:port`` of the cluster node serving ``key`` now (the client's key prefix
        applied), or None on a single server."""
        router = self._router
        if router is None:
            return None
        host, port = router.address_for(self._slot_of(("GET", key)))
        return f"{host}:{port}"

    def _build_endpoint(self) -> Endpoint:
        s = self.settings
        return Endpoint(
            address=None if s.unix_socket_path else (s.host, s.port),
            unix_socket_path=s.unix_socket_path,
            ssl_context=_ssl_context(s),
            username=s.username,
            password=s.password,
            credential_provider=s.credential_provider,
            db=s.db,
            client_name=s.client_name,
            connect_timeout=s.connect_timeout,
            command_timeout=s.command_timeout,
            statistics=self._stats,
            spin_wait=s.spin_wait,
        )

    def _spawn(self, task: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._tg is None:
            raise RedisUnavailable("the Redis client is closed", ran=False)
        self._tg.start_soon(task)

    async def __aenter__(self) -> RedisClient:
        if self._tg is not None:
            raise RuntimeError("this RedisClient is already entered; enter it once")
        endpoint = self._build_endpoint()
        tg = anyio.create_task_group()
        # The connections' reader tasks live in this task group: no cancel scope opened
        # after entering may be left before the client is closed.
        await tg.__aenter__()
        self._tg, self._endpoint = tg, endpoint
        s = self.settings
        if s.cluster:
            seeds = list(s.cluster_nodes) or [(s.host, s.port)]
            self._router = ClusterRouter(seeds, endpoint, self._spawn, s.max_connections)
        else:
            self._main = Multiplexed(endpoint, self._spawn)
            self._pool = DedicatedPool(endpoint, s.max_connections)
        try:
            if self._router is not None:
                await self._router.refresh(force=True)
            await self.server_info(refresh=True)
        except CredentialsRefused:
            await self.aclose()
            raise
        except RedisUnavailable as exc:
            await self.aclose()
            text = str(exc)
            if "like a Redis server" in text or self.settings.describe() in text:
                raise  # already says where and what
            raise RedisUnavailable(
                f"cannot reach Redis at {self.settings.describe()} ({exc}): start the server "
                "or check the URL",
                ran=exc.ran,
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
        """Close every connection; requests still in flight fail with RedisUnavailable."""
        tg, self._tg = self._tg, None
        if tg is None:
            return
        self._was_closed = True
        main, pool, router = self._main, self._pool, self._router
        self._main = self._pool = self._router = None
        try:
            with anyio.CancelScope(shield=True):
                if main is not None:
                    main.close()
                if pool is not None:
                    await pool.aclose()
                if router is not None:
                    router.close()
                    await router.aclose_pools()
        finally:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    def statistics(self) -> ConnectionStatistics:
        """Connection counters, for tests and monitoring."""
        shared: list[Multiplexed] = []
        if self._main is not None:
            shared.append(self._main)
        if self._router is not None:
            shared += self._router.nodes()
        s = self._stats
        return ConnectionStatistics(
            entered=self._tg is not None,
            connections_opened=s.opened,
            shared_connected=sum(1 for m in shared if m.connected),
            in_flight=sum(m.in_flight for m in shared),
            dedicated_in_use=s.dedicated_in_use,
            dedicated_idle=s.dedicated_idle,
            dedicated_waiting=s.dedicated_waiting,
            push_frames=s.push_frames,
            moved=s.moved,
            asked=s.asked,
            cluster_retries=s.cluster_retries,
            spin_hits=s.spin_hits,
            spin_misses=s.spin_misses,
        )

    def _require(self) -> None:
        if self._tg is None:
            if self._was_closed:
                raise RuntimeError(
                    "this RedisClient was closed (its async with block ended): use the client "
                    "inside the block, or enter a new one"
                )
            raise RuntimeError("enter the RedisClient (async with) before sending commands")

    # -- routing --------------------------------------------------------------------------
    def _slot_of(self, args: Sequence[Arg]) -> int | None:
        rest = args[1:]
        indices = key_indices(command_name(args[0]), rest)
        return key_slot(rest[indices[0]]) if indices else None

    async def _keyless(
        self, payload: bytes, count: int, shielded: bool, repeatable: bool = False
    ) -> Any:
        """A command with no key on a cluster: any node can answer it, so a node that cannot
        be reached (nothing was sent) is passed over for the next; a command that may have run
        on one node (a timeout, a connection lost after the write) is sent to another only if
        it is ``repeatable`` (read-only: TIME, PING, INFO, COMMAND, cluster topology)."""
        router = self._router
        assert router is not None
        await router.route(None)  # reload a stale map first
        failure: RedisUnavailable | None = None
        for address in router.keyless_candidates():
            try:
                return await router.node(address).request(payload, count, shielded=shielded)
            except RedisUnavailable as exc:
                router.keyless_failed(address)
                if exc.ran is not False and not repeatable:
                    raise  # it may have run there: never sent to a second node
                failure = failure or exc
        assert failure is not None
        raise failure

    async def _shared(self, slot: int | None, payload: bytes, count: int, shielded: bool) -> Any:
        """Send on the shared connection (of the slot's node); follow cluster redirections
        for a single command (``count == 1``)."""
        router = self._router
        if router is None:
            assert self._main is not None
            replies = await self._main.request(payload, count, shielded=shielded)
            return replies
        if slot is None:
            return await self._keyless(payload, count, shielded)
        address = await router.route(slot)
        deadline: float | None = None
        backoff = 0.005
        moves = 0
        while True:
            try:
                replies = await router.node(address).request(payload, count, shielded=shielded)
            except RedisUnavailable:
                router.unreachable(address)
                raise
            if count != 1:
                return replies
            redirect = router.redirection(replies[0], address)
            if redirect is not None and redirect[0] == "MOVED" and moves < MAX_REDIRECTS:
                moves += 1
                address = redirect[1]
                await router.refresh()
                continue
            if redirect is not None and redirect[0] == "ASK":
                target = redirect[1]
                asked = await router.node(target).request(ASKING + payload, 2, shielded=shielded)
                replies = asked[1:]
                if (
                    not _cluster_transient(replies[0])
                    and router.redirection(replies[0], target) is None
                ):
                    return replies
            elif redirect is None and not _cluster_transient(replies[0]):
                return replies
            # TRYAGAIN or CLUSTERDOWN (the command did not run), or redirections that keep
            # moving: wait and repeat within the cluster retry budget, then give the reply back
            # (the caller maps it to ClusterReconfiguring)
            now = anyio.current_time()
            if deadline is None:
                deadline = now + self.settings.cluster_retry_timeout
            if now >= deadline:
                return replies
            self._stats.cluster_retries += 1
            await anyio.sleep(min(backoff, deadline - now))
            backoff = min(backoff * 2, 0.1)
            moves = 0
            if str(replies[0]).startswith("CLUSTERDOWN"):
                await router.refresh()
            address = router.address_for(slot)

    async def _dedicated_call(self, args: Sequence[Arg], timeout: float | None) -> Any:
        """Run one command on a pooled dedicated connection (blocking commands)."""
        payload = encode(args)
        router = self._router
        address = await router.route(self._slot_of(args)) if router is not None else None
        asking = False  # an ASK redirection: ASKING precedes the command on the target
        for _ in range(MAX_REDIRECTS):
            pool = router.pool(address) if router is not None and address else self._pool
            assert pool is not None
            try:
                conn = await pool.acquire()
                try:
                    request, count = (ASKING + payload, 2) if asking else (payload, 1)
                    if timeout is None:
                        reply = (await conn.call(request, count))[-1]
                    else:
                        with anyio.fail_after(timeout):
                            reply = (await conn.call(request, count))[-1]
                finally:
                    await pool.release(conn)
            except (RedisUnavailable, TimeoutError):
                if router is not None and address is not None:
                    router.unreachable(address)
                raise
            if router is None or address is None:
                return reply
            redirect = router.redirection(reply, address)
            if redirect is None:
                return reply
            kind, address = redirect
            asking = kind == "ASK"
            if not asking:
                await router.refresh()
        return reply

    # -- commands -------------------------------------------------------------------------
    async def execute(self, *args: Arg) -> Any:
        """Send one command and return its raw reply.

        Raises a :class:`~respire_actors.errors.RespireError`. If cancelled after the command
        was queued for sending, it may still run on the server; its reply is discarded.
        Blocking commands (BLPOP, ``XREAD BLOCK``...) run on a pooled dedicated connection
        with the command timeout added to their own; commands that change connection state
        (SELECT, MULTI, WATCH, SUBSCRIBE...) are refused: use :meth:`transaction` or
        :meth:`open_blocking`.
        """
        if self._tg is None:
            self._require()
        self.round_trips += 1
        name = command_name(args[0])
        try:
            if name in _SPECIAL:
                rest = args[1:]
                _refuse_pubsub(name)
                if is_stateful(name, rest):
                    raise ValidationError(
                        f"{name.decode()} changes the state of its connection and cannot run "
                        "on the shared one: use transaction() or open_blocking()"
                    )
                if is_blocking(name, rest):
                    block = _block_seconds(name, rest)
                    timeout = None if block is None else block + self.settings.command_timeout
                    reply = await self._dedicated_call(args, timeout)
                    if type(reply) is ReplyError:
                        raise _map_reply(str(reply))
                    return reply
            if self._router is None:
                assert self._main is not None
                (reply,) = await self._main.request(encode(args), 1)
            else:
                slot = self._slot_of(args)
                if slot is None:
                    (reply,) = await self._keyless(encode(args), 1, False, _repeatable(args))
                else:
                    (reply,) = await self._shared(slot, encode(args), 1, False)
        except Exception as exc:
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        if type(reply) is ReplyError:
            raise _reply_error(reply, args)
        return reply

    async def pipeline(
        self,
        commands: Sequence[Sequence[Arg]],
        *,
        transaction: bool = False,
        give_up_after: float | None = None,
        per_node_errors: bool = False,
    ) -> list[Any]:
        """Send many commands in one write; return each reply or its mapped exception.

        With ``transaction=True`` they run in MULTI/EXEC on a dedicated connection (MULTI alone
        first: see :class:`Transaction`). The replies are awaited
        even if the caller is cancelled (bounded by the command timeout): the pipeline runs
        exactly once either way (even if the caller was cancelled before calling). If no reply
        arrives in time every result is a :class:`CommandTimeout`; a lost connection raises
        :class:`RedisUnavailable`. ``give_up_after`` (read-only commands only, no transaction)
        stops waiting for a node's replies after that many seconds: its commands report
        :class:`CommandTimeout` (they may still run; their replies are discarded).
        ``per_node_errors`` (a cluster): a node that cannot be reached fails only its own
        commands (each result is that :class:`RedisUnavailable`), and the other nodes' replies
        are returned, instead of raising for the whole pipeline.
        """
        if give_up_after is not None and transaction:
            raise ValidationError("give_up_after does not apply to a transaction")
        if not commands:
            return []
        self._require()
        self.round_trips += 1
        for command in commands:
            name = command_name(command[0])
            if name in _SPECIAL and (
                is_stateful(name, command[1:]) or is_blocking(name, command[1:])
            ):
                raise ValidationError(
                    f"{name.decode()} cannot be pipelined: it blocks or changes connection state"
                )
        try:
            # Shielded from the start: a pipeline always runs exactly once, so its caller
            # knows what happened even when cancelled (bounded by the timeouts).
            with anyio.CancelScope(shield=True):
                results = await self._pipeline(
                    commands, transaction, give_up_after, per_node_errors
                )
        except Exception as exc:
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        return results

    async def _pipeline(
        self,
        commands: Sequence[Sequence[Arg]],
        transaction: bool,
        give_up: float | None = None,
        per_node_errors: bool = False,
    ) -> list[Any]:
        if transaction:
            return await self._multi_exec(commands)
        if self._router is not None:
            return await self._cluster_pipeline(commands, give_up, per_node_errors)
        assert self._main is not None
        replies: list[Any] | None = None
        try:
            with anyio.move_on_after(math.inf if give_up is None else give_up):
                replies = await self._main.request(
                    encode_many(commands), len(commands), shielded=give_up is None
                )
        except CommandTimeout as exc:
            return [exc] * len(commands)
        if replies is None:
            return [_gave_up(give_up)] * len(commands)
        return [
            _reply_error(r, c) if type(r) is ReplyError else r
            for r, c in zip(replies, commands, strict=True)
        ]

    async def _cluster_pipeline(
        self,
        commands: Sequence[Sequence[Arg]],
        give_up: float | None = None,
        per_node_errors: bool = False,
    ) -> list[Any]:
        router = self._router
        assert router is not None
        slots: list[int] = []
        for command in commands:
            slot = self._slot_of(command)
            if slot is None:
                raise ValidationError(
                    "commands without keys cannot be pipelined on a cluster: "
                    f"{command_name(command[0]).decode()}"
                )
            slots.append(slot)
        groups: dict[Address, list[int]] = {}
        await router.route(None)  # reload a stale map first
        for i, slot in enumerate(slots):
            groups.setdefault(router.address_for(slot), []).append(i)
        results: list[Any] = [None] * len(commands)
        redirected: list[int] = []

        async def send(address: Address, indices: list[int]) -> None:
            payload = encode_many(commands[i] for i in indices)
            replies: list[Any] | None = None
            try:
                with anyio.move_on_after(math.inf if give_up is None else give_up):
                    replies = await router.node(address).request(
                        payload, len(indices), shielded=give_up is None
                    )
            except RedisUnavailable as exc:
                router.unreachable(address)
                for i in indices:
                    results[i] = exc
                return
            if replies is None:  # gave up waiting on this node
                for i in indices:
                    results[i] = _gave_up(give_up)
                return
            for i, reply in zip(indices, replies, strict=True):
                if router.redirection(reply, address) is not None:
                    redirected.append(i)  # not run: send again on its own
                results[i] = reply

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for address, indices in groups.items():
                    tg.start_soon(send, address, indices)
            for i in redirected:
                (results[i],) = await self._shared(slots[i], encode(commands[i]), 1, True)
        if not per_node_errors:
            for result in results:
                if isinstance(result, RedisUnavailable) and not isinstance(result, CommandTimeout):
                    if len(groups) > 1 and any(
                        not isinstance(r, RedisUnavailable) or r.ran is not False for r in results
                    ):
                        # other nodes ran their part: the pipeline as a whole may have run
                        partial = RedisUnavailable(
                            f"{result} (the pipeline's commands for other nodes were sent: "
                            "each command's outcome is in partial_results)",
                            ran=None,
                        )
                        partial.partial_results = [_mapped(r) for r in results]
                        raise partial from result
                    raise result
        return [
            _reply_error(r, c) if type(r) is ReplyError else r
            for r, c in zip(results, commands, strict=True)
        ]

    async def _acquire_bounded(self, pool: DedicatedPool) -> Dedicated:
        """A pooled connection for a transaction, waiting at most the command timeout for one
        to come free (a transaction runs shielded: its wait must end on its own)."""
        timeout = self.settings.command_timeout
        with anyio.move_on_after(timeout):
            return await pool.acquire()
        raise RedisUnavailable(
            f"no pooled connection came free within {timeout} s (blocking commands and "
            "transactions hold them all): raise max_connections or hold fewer",
            ran=False,
        )

    async def _multi_exec(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """MULTI, then the commands and EXEC, on a dedicated connection of the commands' node
        (see :func:`_run_multi` for why MULTI goes alone)."""
        slot = None
        if self._router is not None:
            for command in commands:
                slot = self._slot_of(command)
                if slot is not None:
                    break
        for attempt in range(2):
            if self._router is not None:
                address = await self._router.route(slot)
                pool = self._router.pool(address)
            else:
                assert self._pool is not None
                pool = self._pool
            conn = await self._acquire_bounded(pool)
            try:
                replies = await _run_multi(conn, commands, self.settings.command_timeout)
            except RedisUnavailable:
                if self._router is not None:
                    self._router.unreachable(address)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await pool.release(conn)
            outcome = _exec_outcome(replies)
            if outcome == "moved" and attempt == 0 and self._router is not None:
                await self._router.refresh(force=True)  # nothing ran: send it to the new owner
                continue
            if isinstance(outcome, str):  # "moved" again, or "ask"
                raise TransactionAborted(
                    "the transaction's slot is being migrated; nothing ran, retry it"
                )
            if outcome is None:
                raise TransactionAborted()
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        raise TransactionAborted("the transaction's slot moved twice; nothing ran, retry it")

    def transaction(self, *watch: str) -> Transaction:
        """Open a MULTI/EXEC transaction, optionally WATCHing keys. See :class:`Transaction`."""
        return Transaction(self, tuple(watch))

    @asynccontextmanager
    async def open_blocking(self) -> AsyncIterator[BlockingConnection]:
        """A dedicated connection for blocking reads, never shared with other commands.

        Cancelling a blocking read closes only this connection; it reconnects on next use.
        """
        self._require()
        conn = BlockingConnection(self)
        try:
            yield conn
        finally:
            await conn.aclose()

    # -- capabilities ---------------------------------------------------------------------
    async def server_info(self, *, refresh: bool = False) -> ServerInfo:
        """Detect the server (Redis or Valkey), its version and optional commands.

        Flavor, version, mode and role come from the connection handshake's ``HELLO`` reply,
        which every ACL user may receive, so detection needs neither ``INFO`` nor ``ROLE``; the
        optional commands come from ``COMMAND INFO`` (a denied discovery counts as absent).
        Raises :class:`UnsupportedServer` if the server is older than Redis 7.0.
        """
        if self._info is not None and not refresh:
            return self._info
        self._require()
        if self._main is not None:
            await self._main.ensure_connected()
        hello = self._stats.last_hello
        if hello is None and self._router is not None:
            await self._router.refresh(force=True)
            hello = self._stats.last_hello
        if hello is None:
            raise RedisUnavailable("no connection handshake has completed yet", ran=False)
        flavor, version, mode, role = _describe_hello(hello)
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
        self._info = ServerInfo(
            flavor=flavor, version=version, mode=mode, role=role, commands=frozenset(commands)
        )
        return self._info

    async def time_ms(self) -> int:
        """The server's clock in milliseconds (``TIME``)."""
        seconds, micros = await self.execute("TIME")
        return int(seconds) * 1000 + int(micros) // 1000


async def _run_multi(conn: Dedicated, commands: Sequence[Sequence[Arg]], timeout: float) -> Any:
    """MULTI alone, then (once it was accepted) the commands and EXEC in one write; returns
    every reply (MULTI's, each command's, EXEC's).

    MULTI is not pipelined with the commands: a server that refuses MULTI (an ACL user
    without ``+multi``) runs each following command at once, outside any transaction, so
    the commands are sent only after MULTI's ``OK``. A refused MULTI raises its mapped error
    (nothing ran). A connection lost after MULTI discards the transaction on the server.
    """
    try:
        with anyio.fail_after(timeout):
            (multi,) = await conn.call(encode(("MULTI",)), 1)
    except RedisUnavailable as exc:
        raise RedisUnavailable(
            f"the connection was lost before the transaction began (at MULTI): nothing ran; "
            f"retry it ({exc})",
            ran=False,
        ) from exc
    if type(multi) is ReplyError:
        await conn.aclose()  # it may still WATCH keys: the pool must not hand it out again
        raise _map_reply(str(multi))
    with anyio.fail_after(timeout * 2):
        rest = await conn.call(encode_many(commands) + encode(("EXEC",)), len(commands) + 1)
    return [multi, *rest]


def _exec_outcome(replies: list[Any]) -> list[Any] | BaseException | str | None:
    """EXEC's result: the mapped replies, None (WATCH aborted), "moved"/"ask" (a queued
    command was redirected, nothing ran), or the error that aborted the transaction."""
    exec_reply = replies[-1]
    if type(exec_reply) is ReplyError:
        # A command refused while queueing aborts EXEC (EXECABORT); on a cluster EXEC itself
        # may be redirected when a key left the slot in the meantime. Nothing ran either way.
        for reply in (*replies[:-1], exec_reply):
            if type(reply) is ReplyError:
                text = str(reply)
                if text.startswith("MOVED "):
                    return "moved"
                if text.startswith("ASK "):
                    return "ask"
                cause = text.partition("EXECABORT Transaction discarded because of: ")[2]
                if cause.startswith("NOPERM"):  # EXEC itself refused: a PermissionDenied
                    return _map_reply(cause)
                return _map_reply(text)
    if exec_reply is None:
        return None
    return [_mapped(r) for r in exec_reply]


def _block_seconds(name: bytes, args: Sequence[Arg]) -> float | None:
    """How long a blocking command may block (seconds); None for "forever"."""
    try:
        if name in (b"XREAD", b"XREADGROUP"):
            for i, arg in enumerate(args):
                if isinstance(arg, str | bytes) and command_name(arg) == b"BLOCK":
                    ms = float(args[i + 1])
                    return None if ms == 0 else ms / 1000
            return 0.0
        if name in (b"WAIT", b"WAITAOF"):
            ms = float(args[-1])
            return None if ms == 0 else ms / 1000
        seconds = float(args[0] if name in (b"BLMPOP", b"BZMPOP") else args[-1])
    except (IndexError, ValueError, TypeError):
        return 0.0  # malformed: the server refuses it at once
    return None if seconds == 0 else seconds


def _ssl_context(s: ConnectionSettings) -> ssl.SSLContext | None:
    if s.tls_context is not None:
        return s.tls_context
    if not s.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=s.tls_ca_certs)
        if s.tls_certfile:
            context.load_cert_chain(s.tls_certfile, s.tls_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load the TLS certificates: {exc}") from exc
    if s.tls_cert_reqs == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif s.tls_cert_reqs == "optional":
        # a server always presents a certificate: it is verified, host name included
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


class BlockingConnection:
    """A connection reserved for blocking reads; see :meth:`RedisClient.open_blocking`.

    On a cluster it holds one connection per node it has read from.
    """

    def __init__(self, owner: RedisClient) -> None:
        self._owner = owner
        self._conns: dict[Address | None, Dedicated] = {}

    async def _conn(self, address: Address | None) -> Dedicated:
        conn = self._conns.get(address)
        if conn is not None and not conn.broken and _closed_by_server(conn.stream):
            # a server restart, CLIENT KILL or its idle timeout while unused: reconnect now
            # rather than fail the next command with "may have run"
            await conn.aclose()
            conn = None
        if conn is None or conn.broken:
            endpoint = self._owner._endpoint
            if endpoint is None:
                raise RuntimeError("the RedisClient is not entered")
            if address is not None:
                endpoint = endpoint.at(address)
            conn = await endpoint.open()
            self._conns[address] = conn
        return conn

    async def execute(self, *args: Arg) -> Any:
        """Send one (typically blocking) command. Cancelling it closes this connection only.

        Bounded by the command's own block time plus the command timeout.
        """
        owner = self._owner
        name = command_name(args[0])
        _refuse_pubsub(name)
        owner.round_trips += 1
        block = _block_seconds(name, args[1:]) if is_blocking(name, args[1:]) else 0.0
        timeout = None if block is None else block + owner.settings.command_timeout
        payload = encode(args)
        router = owner._router
        address = await router.route(owner._slot_of(args)) if router is not None else None
        asking = False  # an ASK redirection: the next send is preceded by ASKING
        try:
            for _ in range(MAX_REDIRECTS):
                conn = await self._conn(address)
                sent, count = (ASKING + payload, 2) if asking else (payload, 1)
                if timeout is None:
                    replies = await conn.call(sent, count)
                else:
                    with anyio.fail_after(timeout):
                        replies = await conn.call(sent, count)
                reply = replies[-1]
                redirect = None
                if router is not None and address is not None:
                    redirect = router.redirection(reply, address)
                if redirect is None:
                    break
                address = redirect[1]
                asking = redirect[0] == "ASK"
                if not asking:
                    await router.refresh()  # type: ignore[union-attr]
        except Exception as exc:
            if (
                router is not None
                and address is not None
                and isinstance(exc, (RedisUnavailable, TimeoutError, OSError))
            ):
                router.unreachable(address)
            mapped = map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        if type(reply) is ReplyError:
            raise _map_reply(str(reply))
        return reply

    async def aclose(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.aclose()


class Pending(Generic[T]):
    """The result of a command queued in a :class:`Transaction`, readable after commit."""

    __slots__ = ("_convert", "_done", "_error", "_on_done", "_value")

    def __init__(
        self,
        convert: Callable[[Any], T] | None = None,
        on_done: Callable[[Pending[T]], None] | None = None,
    ) -> None:
        self._convert = convert
        self._on_done = on_done
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def _set(self, value: Any) -> None:
        self._done = True
        if isinstance(value, BaseException):
            self._error = value
        else:
            try:
                self._value = self._convert(value) if self._convert else value
            except Exception as exc:
                self._error = map_error(exc)
        self._notify()

    def _abort(self, error: BaseException) -> None:
        self._done = True
        self._error = error
        self._notify()

    def _notify(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            # an observer (a span, a log line) never changes the result
            with contextlib.suppress(Exception):
                on_done(self)

    @property
    def error(self) -> BaseException | None:
        """The command's error once the transaction ended (None: it succeeded, or not yet)."""
        return self._error

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


def _gave_up(seconds: float | None) -> CommandTimeout:
    return CommandTimeout(f"no reply within {seconds} s; gave up waiting (it may still run)")


def _key_text(key: Arg) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)


class Transaction(AbstractAsyncContextManager["Transaction"]):
    """MULTI/EXEC, with optional WATCH.

    ::

        async with client.transaction("{shop}:order:42") as tx:
            status = await tx.read("GET", "{shop}:order:42")   # before MULTI, watched
            saved = tx.queue("SET", "{shop}:order:42", "paid")
            job = queue.enqueue_in(tx, "receipt:42", payload)
            committed = await tx.commit()                       # False if WATCH aborted
        saved.result(); job.result()

    Nothing queued is sent before :meth:`commit`, which sends MULTI alone and, once the server
    accepted it, the commands and EXEC in one write (a refused MULTI is a
    :class:`PermissionDenied` and nothing ran), on a pooled dedicated connection: with WATCH
    keys the transaction holds it from :meth:`__aenter__` to the end. Leaving the
    block without committing discards everything. Redis does not roll back a command that
    fails at run time inside EXEC: inspect every :class:`Pending` result. All keys must hash
    to one cluster slot.
    """

    def __init__(self, client: RedisClient, watch: tuple[str, ...]) -> None:
        self._client = client
        self._watch = watch
        self._commands: list[tuple[tuple[Arg, ...], Pending[Any]]] = []
        self._conn: Dedicated | None = None
        self._pool: DedicatedPool | None = None
        self._open = False
        self._finished = False
        self._slot: int | None = None  # cluster clients: the one slot every key must hash to
        self._slot_key: Arg = ""

    @property
    def client(self) -> RedisClient:
        return self._client

    async def __aenter__(self) -> Transaction:
        client = self._client
        client._require()
        if self._watch:
            router = client._router
            if router is not None:
                pool = router.pool(router.address_for(key_slot(self._watch[0])))
            else:
                assert client._pool is not None
                pool = client._pool
            conn = await client._acquire_bounded(pool)
            self._pool, self._conn = pool, conn
            try:
                with anyio.fail_after(client.settings.command_timeout):
                    (reply,) = await conn.call(encode(("WATCH", *self._watch)), 1)
                if type(reply) is ReplyError:
                    raise _map_reply(str(reply))
            except BaseException as exc:
                await self._release()
                if isinstance(exc, Exception):
                    mapped = map_error(exc)
                    if mapped is not exc:
                        raise mapped from exc
                raise
        self._open = True
        return self

    async def _release(self) -> None:
        pool, conn = self._pool, self._conn
        self._pool = self._conn = None
        if pool is not None and conn is not None:
            with anyio.CancelScope(shield=True):
                await pool.release(conn)

    async def read(self, *args: Arg) -> Any:
        """Run a read command now, on the watched connection (only valid with WATCH keys)."""
        if not self._watch:
            raise RuntimeError("read() needs a transaction opened with keys to WATCH")
        if self._commands:
            raise RuntimeError("read() must come before the first queued command")
        if self._conn is None or self._finished:
            raise RuntimeError("the transaction is not open")
        try:
            with anyio.fail_after(self._client.settings.command_timeout):
                (reply,) = await self._conn.call(encode(args), 1)
        except Exception as exc:
            raise map_error(exc) from exc
        if type(reply) is ReplyError:
            raise _map_reply(str(reply))
        return reply

    def queue(
        self,
        *args: Arg,
        convert: Callable[[Any], T] | None = None,
        on_done: Callable[[Pending[T]], None] | None = None,
    ) -> Pending[T]:
        """Queue a command for EXEC; returns its :class:`Pending` result (``on_done`` is called
        with it once the transaction ended: committed, refused or discarded).

        On a cluster client, a command with a key outside the slot of the transaction's
        earlier keys (watched or queued) raises :class:`ValidationError` here, before anything
        is sent: the server would refuse the whole transaction."""
        if self._finished or not self._open:
            raise RuntimeError("the transaction is not open")
        if self._client._router is not None:
            self._check_slot(args)
        pending: Pending[T] = Pending(convert, on_done)
        self._commands.append((tuple(args), pending))
        return pending

    def _check_slot(self, args: Sequence[Arg]) -> None:
        keys: list[Arg] = [*self._watch]
        if args:
            rest = args[1:]
            keys += [rest[i] for i in key_indices(command_name(args[0]), rest)]
        for key in keys:
            slot = key_slot(key)
            if self._slot is None:
                self._slot, self._slot_key = slot, key
            elif slot != self._slot:
                raise ValidationError(
                    f"a cluster transaction keeps every key in one hash slot: {_key_text(key)!r} "
                    f"hashes to slot {slot}, {_key_text(self._slot_key)!r} to slot {self._slot} "
                    "(give the keys one hash tag, or use one transaction per queue)"
                )

    async def commit(self) -> bool:
        """Send MULTI, the queued commands and EXEC. Returns False if a WATCHed key changed
        (every pending result then raises :class:`TransactionAborted`).

        Shielded from cancellation once started; bounded by twice the command timeout. A lost
        reply leaves the outcome unknown: retry with the same job IDs (they deduplicate).
        """
        if self._finished or not self._open:
            raise RuntimeError("the transaction is not open")
        self._finished = True
        client = self._client
        commands = [args for args, _ in self._commands]
        client.round_trips += 1
        try:
            with anyio.CancelScope(shield=True):
                if self._conn is None:
                    if not commands:
                        return True
                    outcome: Any = await client._multi_exec(commands)
                else:
                    try:
                        replies = await _run_multi(
                            self._conn, commands, client.settings.command_timeout
                        )
                    finally:
                        await self._release()
                    outcome = _exec_outcome(replies)
                    if outcome == "moved" or outcome == "ask":
                        raise TransactionAborted(
                            "the watched slot moved to another node; nothing ran, retry it"
                        )
                    if isinstance(outcome, BaseException):
                        raise outcome
        except Exception as exc:
            mapped = map_error(exc)
            for _, pending in self._commands:
                pending._abort(mapped)
            if isinstance(mapped, TransactionAborted):
                return False
            if mapped is exc:
                raise
            raise mapped from exc
        if outcome is None:
            for _, pending in self._commands:
                pending._abort(TransactionAborted())
            return False
        for reply, (_, pending) in zip(outcome, self._commands, strict=True):
            pending._set(reply)
        return True

    async def discard(self) -> None:
        """Drop everything queued; nothing is sent (a WATCH is released)."""
        if self._finished:
            await self._release()
            return
        self._finished = True
        for _, pending in self._commands:
            pending._abort(TransactionAborted("the transaction was discarded"))
        conn = self._conn
        if conn is not None and not conn.broken:
            with anyio.CancelScope(shield=True):
                try:
                    with anyio.fail_after(self._client.settings.command_timeout):
                        await conn.call(encode(("UNWATCH",)), 1)
                except (RespireError, TimeoutError):
                    await conn.aclose()  # the pool drops it
        await self._release()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.discard()


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
    "ConnectionStatistics",
    "Pending",
    "RedisClient",
    "ServerInfo",
    "Transaction",
    "connect",
    "map_error",
    "with_settings",
]
