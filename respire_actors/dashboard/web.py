"""Request plumbing shared by the pages and the actions: authentication, CSRF cookies and
fields, links under the mount point, templates, and error pages."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import wraps
from importlib import resources
from typing import Any, Protocol
from urllib.parse import urlencode

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from ..errors import RespireError, ValidationError
from ..keys import validate_name
from ..redis.client import RedisClient
from . import formatting, security
from .config import DashboardConfig

log = logging.getLogger("respire_actors.dashboard")

Endpoint = Callable[[Request], Awaitable[Response]]

_TEMPLATES = Environment(
    loader=FileSystemLoader(str(resources.files(__package__) / "templates")),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.globals.update(
    counts=formatting.counts,
    duration=formatting.duration,
    event_row=formatting.event_row,
    rate_limit=formatting.rate_limit,
    when=formatting.when,
)


class NotFound(ValidationError):
    """What the request names does not exist (shown as 404)."""


class Hosting(Protocol):
    """What a request sees of the :class:`~.app.Dashboard` serving it."""

    config: DashboardConfig
    revoked_sessions: security.RevokedSessions

    @property
    def client(self) -> RedisClient: ...

    def closing(self) -> anyio.Event: ...


def dashboard_of(request: Request) -> Hosting:
    dashboard: Hosting = request.scope["respire.dashboard"]
    return dashboard


def link(request: Request, path: str, **params: Any) -> str:
    """``path`` under the dashboard's mount point, with the non-None query ``params``."""
    base = request.scope.get("root_path", "").rstrip("/")
    query = urlencode(
        [
            (k, item)
            for k, v in params.items()
            if v is not None
            for item in (v if isinstance(v, list | tuple) else [v])
        ]
    )
    return f"{base}{path}" + (f"?{query}" if query else "")


def own_origin(request: Request) -> str:
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"


def _nonce(request: Request) -> tuple[str, bool]:
    """The browser's CSRF nonce, and whether it is new (to be set as a cookie)."""
    nonce = request.cookies.get(security.CSRF_COOKIE)
    if nonce and len(nonce) == 32 and all(c in "0123456789abcdef" for c in nonce):
        return nonce, False
    return security.new_csrf_nonce(), True


def cookie_path(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/") or "/"


def render(
    request: Request, template: str, context: Mapping[str, Any], *, status: int = 200
) -> HTMLResponse:
    """Render a page with the dashboard's common context (links, CSRF token, settings)."""
    dashboard = dashboard_of(request)
    nonce, fresh = _nonce(request)
    body = _TEMPLATES.get_template(template).render(
        request=request,
        config=dashboard.config,
        identity=request.scope.get("respire.identity"),
        csrf_field=security.CSRF_FIELD,
        csrf_token=security.csrf_token(dashboard.config.secret, nonce),
        link=lambda path, **params: link(request, path, **params),
        can_mutate=not dashboard.config.read_only,
        **context,
    )
    response = HTMLResponse(body, status_code=status)
    response.headers["cache-control"] = "no-store"
    response.headers["x-frame-options"] = "DENY"
    response.headers["referrer-policy"] = "same-origin"
    response.headers["content-security-policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'; "
        "form-action 'self'"
    )
    if fresh:
        set_private_cookie(request, response, security.CSRF_COOKIE, nonce)
    return response


def set_private_cookie(request: Request, response: Response, name: str, value: str) -> None:
    """A cookie only this dashboard's pages get: HTTP-only, same-site strict, under the
    mount path, and secure over HTTPS."""
    response.set_cookie(
        name,
        value,
        path=cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    if "respire.dashboard" not in request.scope:
        return PlainTextResponse(message, status_code=status)
    return render(request, "error.html", {"title": title, "message": message}, status=status)


def _refuse(request: Request, refusal: security.Refusal) -> Response:
    if refusal.kind == "forbidden":
        return PlainTextResponse(
            "without auth the dashboard serves only loopback clients that name it by a "
            "loopback host (localhost, 127.0.0.1, [::1]); configure auth for anything else "
            "(DashboardConfig(auth=...); with the CLI, $RESPIRE_DASHBOARD_TOKEN, or --basic-user "
            "with $RESPIRE_DASHBOARD_PASSWORD)",
            status_code=403,
        )
    if refusal.kind == "challenge":
        return PlainTextResponse(
            "authentication required",
            status_code=401,
            headers={"www-authenticate": 'Basic realm="respire dashboard", charset="UTF-8"'},
        )
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response = render(request, "login.html", {"next": back, "failed": False}, status=401)
        return response
    return PlainTextResponse("authentication required", status_code=401)


def identify(request: Request) -> security.Identity | security.Refusal:
    dashboard = dashboard_of(request)
    return security.authenticate(
        dashboard.config,
        client_host=request.client.host if request.client else None,
        authorization=request.headers.get("authorization"),
        session_cookie=request.cookies.get(security.SESSION_COOKIE),
        host_header=request.headers.get("host"),
        revoked=dashboard.revoked_sessions,
    )


def page(endpoint: Endpoint) -> Endpoint:
    """A read-only endpoint: authenticate, then map bad input and Redis errors to pages."""

    @wraps(endpoint)
    async def guarded(request: Request) -> Response:
        who = identify(request)
        if isinstance(who, security.Refusal):
            return _refuse(request, who)
        request.scope["respire.identity"] = who
        try:
            return await endpoint(request)
        except NotFound as exc:
            return error_page(request, 404, "Not found", str(exc))
        except ValidationError as exc:
            return error_page(request, 400, "Bad request", str(exc))
        except RespireError as exc:
            return _redis_error(request, exc)
        except BaseExceptionGroup as group:  # a page that read Redis in a task group
            errors, rest = group.split(RespireError)
            if errors is None or rest is not None:
                raise
            first: BaseException = errors
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return _redis_error(request, first)

    return guarded


def _redis_error(request: Request, exc: BaseException) -> Response:
    log.warning("dashboard page %s failed: %r", request.url.path, exc)
    return error_page(request, 502, "Redis error", f"{type(exc).__name__}: {exc}")


def form_csrf_valid(request: Request, form: FormData) -> bool:
    """Whether a posted form carries this browser's CSRF token and comes from the dashboard's
    own origin (every POST: actions, login, logout)."""
    submitted = form.get(security.CSRF_FIELD)
    return security.csrf_valid(
        dashboard_of(request).config.secret,
        nonce=request.cookies.get(security.CSRF_COOKIE),
        submitted=submitted if isinstance(submitted, str) else None,
        origin=request.headers.get("origin"),
        own_origin=own_origin(request),
    )


def mutation(endpoint: Endpoint) -> Endpoint:
    """A mutating endpoint: authenticate, refuse in read-only mode, check the CSRF token and
    origin; the endpoint itself logs what it changed (see :func:`log_mutation`)."""

    @wraps(endpoint)
    async def guarded(request: Request) -> Response:
        dashboard = dashboard_of(request)
        who = identify(request)
        if isinstance(who, security.Refusal):
            return _refuse(request, who)
        request.scope["respire.identity"] = who
        if dashboard.config.read_only:
            log.warning("dashboard: refused %s by %s: read-only", request.url.path, who.name)
            return error_page(request, 403, "Read-only", "this dashboard is read-only")
        form = await request.form()
        if not form_csrf_valid(request, form):
            log.warning(
                "dashboard: refused %s by %s from %s: CSRF check failed",
                request.url.path,
                who.name,
                request.client.host if request.client else "?",
            )
            return error_page(
                request, 403, "Forbidden", "the form's CSRF token is missing or wrong: reload "
                "the page and try again",
            )  # fmt: skip
        try:
            return await endpoint(request)
        except NotFound as exc:
            return error_page(request, 404, "Not found", str(exc))
        except ValidationError as exc:
            return error_page(request, 400, "Bad request", str(exc))
        except RespireError as exc:
            log.warning("dashboard action %s failed: %r", request.url.path, exc)
            return error_page(request, 502, "Redis error", f"{type(exc).__name__}: {exc}")

    return guarded


def log_mutation(request: Request, action: str, queue: str, **details: Any) -> None:
    who = request.scope.get("respire.identity")
    log.info(
        "dashboard %s on queue %r by %s from %s: %s",
        action,
        queue,
        who.name if who else "?",
        request.client.host if request.client else "?",
        ", ".join(f"{k}={v!r}" for k, v in details.items()),
    )


def queue_param(request: Request, value: str | None = None) -> str:
    """The ``queue`` parameter: a valid name, and one of the configured queues if any."""
    name = value if value is not None else request.query_params.get("queue")
    if name is None:
        raise ValidationError("the queue parameter is missing")
    validate_name(name)
    allowed = dashboard_of(request).config.queues
    if allowed is not None and name not in allowed:
        raise ValidationError(f"queue {name!r} is not shown by this dashboard")
    return name


def redirect(request: Request, path: str, **params: Any) -> RedirectResponse:
    return RedirectResponse(link(request, path, **params), status_code=303)


def config_of(request: Request) -> DashboardConfig:
    return dashboard_of(request).config


__all__ = [
    "NotFound",
    "config_of",
    "dashboard_of",
    "error_page",
    "identify",
    "link",
    "log",
    "log_mutation",
    "mutation",
    "page",
    "queue_param",
    "redirect",
    "render",
]
