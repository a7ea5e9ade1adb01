"""The dashboard's settings: who may use it, what it may change and show, how much it reads.

Everything is validated when the settings are built, before a server starts.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import ValidationError
from ..keys import validate_name

MAX_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class TokenAuth:
    """A shared secret token: sent as ``Authorization: Bearer <token>`` by scripts, or typed
    once into the login form by a browser (which then holds a session cookie derived from it;
    changing the token ends every session). At least 16 characters."""

    token: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.token, str) or len(self.token) < 16:
            raise ValidationError("the dashboard token must be a str of at least 16 characters")


@dataclass(frozen=True, slots=True)
class BasicAuth:
    """HTTP basic authentication with one user name and password (use it over TLS only)."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.username, str) or not self.username or ":" in self.username:
            raise ValidationError("the basic auth user name must be a nonblank str without ':'")
        if not isinstance(self.password, str) or len(self.password) < 8:
            raise ValidationError("the basic auth password must be a str of at least 8 characters")


Auth = TokenAuth | BasicAuth


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """How a :class:`~respire_actors.dashboard.Dashboard` behaves.

    auth:            None (the default) serves only clients on a loopback address and refuses
                     every other client with 403; a :class:`TokenAuth` or :class:`BasicAuth`
                     is required for anything else
    queues:          the queues to show; None shows every queue in the queue registry
    read_only:       hide every action and refuse every mutating request (403)
    show_payloads:   show job payloads (they may hold personal data; off by default)
    page_size:       rows per page of every list (1-500)
    metrics_minutes: minutes of completed/failed history charted (1-1440)
    live_interval:   seconds between live count updates (server-sent events, 0.2-60)
    secret:          the key that signs CSRF tokens and session cookies; default a random key
                     per process (sessions end at restart: set it when several processes serve
                     the same dashboard)
    dead_streams:    queue name -> the dead-letter stream suffix its workers use
                     (``WorkerOptions(dead_letter_stream=...)``), for queues that override it:
                     their dead letters are shown, counted, retried and deleted there
    """

    auth: Auth | None = None
    queues: tuple[str, ...] | None = None
    read_only: bool = False
    show_payloads: bool = False
    page_size: int = 50
    metrics_minutes: int = 60
    live_interval: float = 2.0
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    dead_streams: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.auth is not None and not isinstance(self.auth, TokenAuth | BasicAuth):
            raise ValidationError("auth must be None, a TokenAuth or a BasicAuth")
        if self.queues is not None:
            if isinstance(self.queues, str) or not isinstance(self.queues, tuple):
                raise ValidationError("queues must be None or a tuple of queue names")
            for name in self.queues:
                validate_name(name)
        for flag in ("read_only", "show_payloads"):
            if not isinstance(getattr(self, flag), bool):
                raise ValidationError(f"{flag} must be a bool")
        _int_in(self.page_size, "page_size", 1, MAX_PAGE_SIZE)
        _int_in(self.metrics_minutes, "metrics_minutes", 1, 1440)
        if (
            isinstance(self.live_interval, bool)
            or not isinstance(self.live_interval, int | float)
            or not 0.2 <= self.live_interval <= 60
        ):
            raise ValidationError("live_interval must be a number of seconds from 0.2 to 60")
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise ValidationError("secret must be bytes, at least 16 of them")
        if not isinstance(self.dead_streams, Mapping):
            raise ValidationError("dead_streams must map queue names to dead-letter suffixes")
        for queue, suffix in self.dead_streams.items():
            validate_name(queue)
            validate_name(suffix, what="dead-letter stream suffix")
        object.__setattr__(self, "dead_streams", MappingProxyType(dict(self.dead_streams)))

    def dead_stream(self, queue: str) -> str | None:
        """The dead-letter stream suffix of ``queue`` (None: the default one)."""
        return self.dead_streams.get(queue)


def _int_in(value: object, what: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{what} must be an integer from {low} to {high}, got {value!r}")


__all__ = ["Auth", "BasicAuth", "DashboardConfig", "TokenAuth"]
