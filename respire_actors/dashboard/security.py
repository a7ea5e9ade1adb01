"""Who may use the dashboard, and whether a mutating request really comes from its own pages.

Pure decisions (no I/O), so tests exercise them without a server:

* :func:`authenticate` - loopback-only without auth; a bearer token, the session cookie the
  login form sets, or HTTP basic credentials with auth. Secrets are compared in constant time.
* CSRF: a random per-browser cookie (``HttpOnly``, ``SameSite=Strict``) and, in every form, an
  HMAC of that cookie under the dashboard's secret (the "signed double submit" pattern). A
  forged post from another site has neither; a post whose ``Origin`` names another site is
  refused even with both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from .config import BasicAuth, DashboardConfig, TokenAuth

SESSION_COOKIE = "respire_dashboard_session"
CSRF_COOKIE = "respire_dashboard_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who made a request, for the mutation log: ``loopback``, ``token`` or a user name."""

    name: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: ``login`` (show the token form, 401), ``challenge`` (basic
    auth, 401 with ``WWW-Authenticate``) or ``forbidden`` (a remote client without auth
    configured, 403)."""

    kind: Literal["login", "challenge", "forbidden"]


def is_loopback(host: str | None) -> bool:
    """True for a loopback client address (127.0.0.0/8, ::1, an IPv4-mapped loopback)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_loopback_name(host_header: str | None) -> bool:
    """True for a ``Host`` header naming this machine by a loopback name or address
    (``localhost``, ``*.localhost``, 127.0.0.0/8, ``[::1]``), with or without a port. Without
    authentication only these are served: a page on another name whose DNS answer was switched
    to 127.0.0.1 (DNS rebinding) must not reach the dashboard with the user's browser."""
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return False
        return is_loopback(name)
    name, _, port = host.partition(":")
    if port and not port.isdigit():
        return False
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    return is_loopback(name)


SESSION_MAX_AGE = 12 * 3600
"""Seconds a login session lasts; then the user logs in again."""


def session_value(secret: bytes, token: str) -> str:
    """An HMAC of ``token`` (a login compares the token given with the configured one through
    it, in constant time, whatever their lengths)."""
    return hmac.new(secret, b"session\0" + token.encode(), hashlib.sha256).hexdigest()


def _session_mac(secret: bytes, token: str, issued: str, sid: str) -> str:
    message = b"\0".join((b"session", token.encode(), issued.encode(), sid.encode()))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def new_session(secret: bytes, token: str, now: float | None = None) -> str:
    """A session cookie for one login: ``<issued unix s>.<random id>.<HMAC>``. The HMAC covers
    the token, so changing the token ends every session; each login gets its own id, so a
    logout can end one session; the issue time bounds its life (:data:`SESSION_MAX_AGE`)."""
    issued = str(int(time.time() if now is None else now))
    sid = secrets.token_hex(16)
    return f"{issued}.{sid}.{_session_mac(secret, token, issued, sid)}"


class RevokedSessions:
    """The ids of sessions ended by a logout, each kept until it would have expired anyway
    (in memory: a restart forgets them; with a fixed ``secret`` a logged-out cookie then works
    again until it expires, so rotate the token to end every session)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def revoke(self, cookie: str | None) -> None:
        parsed = _parse_session(cookie)
        if parsed is not None:
            issued, sid, _ = parsed
            now = time.time()
            self._until = {k: t for k, t in self._until.items() if t > now}
            self._until[sid] = int(issued) + SESSION_MAX_AGE

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, str) and self._until.get(sid, 0) > time.time()


def _parse_session(cookie: str | None) -> tuple[str, str, str] | None:
    parts = (cookie or "").split(".")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return parts[0], parts[1], parts[2]


def session_valid(
    secret: bytes,
    token: str,
    cookie: str | None,
    revoked: RevokedSessions | None = None,
    now: float | None = None,
) -> bool:
    """Whether ``cookie`` is a session this dashboard issued for ``token``, not expired and
    not ended by a logout."""
    parsed = _parse_session(cookie)
    if parsed is None:
        return False
    issued, sid, mac = parsed
    if not _equal(mac, _session_mac(secret, token, issued, sid)):
        return False
    age = (time.time() if now is None else now) - int(issued)
    if not -60 <= age <= SESSION_MAX_AGE:
        return False
    return revoked is None or sid not in revoked


def authenticate(
    config: DashboardConfig,
    *,
    client_host: str | None,
    authorization: str | None,
    session_cookie: str | None,
    host_header: str | None = None,
    revoked: RevokedSessions | None = None,
) -> Identity | Refusal:
    auth = config.auth
    if auth is None:
        if is_loopback(client_host) and is_loopback_name(host_header):
            return Identity("loopback")
        return Refusal("forbidden")
    if isinstance(auth, TokenAuth):
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and _equal(value.strip(), auth.token):
            return Identity("token")
        if session_valid(config.secret, auth.token, session_cookie, revoked):
            return Identity("token")
        return Refusal("login")
    return _basic(auth, authorization)


def _basic(auth: BasicAuth, authorization: str | None) -> Identity | Refusal:
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return Refusal("challenge")
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return Refusal("challenge")
    user, sep, password = decoded.partition(":")
    # evaluate both comparisons: no early exit that tells which part was wrong
    user_ok = _equal(user, auth.username)
    password_ok = _equal(password, auth.password)
    if sep and user_ok and password_ok:
        return Identity(auth.username)
    return Refusal("challenge")


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def new_csrf_nonce() -> str:
    return secrets.token_hex(16)


def csrf_token(secret: bytes, nonce: str) -> str:
    """The form token that matches the browser's CSRF cookie ``nonce``."""
    return hmac.new(secret, b"csrf\0" + nonce.encode(), hashlib.sha256).hexdigest()


def csrf_valid(
    secret: bytes,
    *,
    nonce: str | None,
    submitted: str | None,
    origin: str | None,
    own_origin: str,
) -> bool:
    """True when a mutating request carries the token of its own CSRF cookie and, if the
    browser sent an ``Origin``, comes from the dashboard's own origin."""
    if not nonce or not submitted:
        return False
    if origin is not None and not same_origin(origin, own_origin):
        return False
    return _equal(submitted, csrf_token(secret, nonce))


def same_origin(origin: str, own_origin: str) -> bool:
    a, b = urlsplit(origin.strip().lower()), urlsplit(own_origin.lower())
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "SESSION_COOKIE",
    "Identity",
    "Refusal",
    "authenticate",
    "csrf_token",
    "csrf_valid",
    "is_loopback",
    "new_csrf_nonce",
    "same_origin",
    "session_value",
]
