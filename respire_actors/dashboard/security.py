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


def session_value(secret: bytes, token: str) -> str:
    """The session cookie for ``token``: an HMAC of it, so the cookie never holds the token and
    changing the token ends every session."""
    return hmac.new(secret, b"session\0" + token.encode(), hashlib.sha256).hexdigest()


def authenticate(
    config: DashboardConfig,
    *,
    client_host: str | None,
    authorization: str | None,
    session_cookie: str | None,
    host_header: str | None = None,
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
        if session_cookie and _equal(session_cookie, session_value(config.secret, auth.token)):
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
