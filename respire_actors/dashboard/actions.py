"""The mutating endpoints (POST only): each is guarded by :func:`~.web.mutation` (auth,
read-only mode, CSRF and origin) and logs what it changed on ``respire_actors.dashboard``."""

from __future__ import annotations

import hmac
import re

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from ..codecs import BytesCodec
from ..errors import ValidationError
from ..jobs import JobQueue
from . import security
from .config import TokenAuth
from .pages import known_summary, queue_admin
from .web import (
    cookie_path,
    dashboard_of,
    error_page,
    form_csrf_valid,
    identify,
    link,
    log,
    log_mutation,
    mutation,
    queue_param,
    redirect,
    render,
    set_private_cookie,
)

MAX_SELECTED = 500  # dead letters one form may retry or delete (one page at most)


def _form_queue(request: Request, form: FormData) -> str:
    value = form.get("queue")
    return queue_param(request, value if isinstance(value, str) else "")


def _dead_ids(form: FormData) -> list[str]:
    ids = [i for i in form.getlist("id") if isinstance(i, str) and i]
    if not ids:
        raise ValidationError("select at least one dead letter")
    if len(ids) > MAX_SELECTED:
        raise ValidationError(f"at most {MAX_SELECTED} dead letters at once, got {len(ids)}")
    return ids


def _queue(request: Request, name: str) -> JobQueue[bytes]:
    return JobQueue(dashboard_of(request).client, name, BytesCodec())


@mutation
async def pause_queue(request: Request) -> Response:
    form = await request.form()
    name = _form_queue(request, form)
    await known_summary(request, name)
    changed = await _queue(request, name).pause()
    log_mutation(request, "pause", name, changed=changed)
    return redirect(request, "/queue", queue=name)


@mutation
async def resume_queue(request: Request) -> Response:
    form = await request.form()
    name = _form_queue(request, form)
    await known_summary(request, name)
    changed = await _queue(request, name).resume()
    log_mutation(request, "resume", name, changed=changed)
    return redirect(request, "/queue", queue=name)


@mutation
async def retry_dead(request: Request) -> Response:
    form = await request.form()
    name = _form_queue(request, form)
    ids = _dead_ids(form)
    retried = await queue_admin(request, name).retry_dead_letters(ids)
    log_mutation(request, "retry dead letters", name, ids=ids, retried=retried)
    return redirect(request, "/dead", queue=name, retried=retried, of=len(ids))


@mutation
async def delete_dead(request: Request) -> Response:
    form = await request.form()
    name = _form_queue(request, form)
    ids = _dead_ids(form)
    deleted = await queue_admin(request, name).delete_dead_letters(ids)
    log_mutation(request, "delete dead letters", name, ids=ids, deleted=deleted)
    return redirect(request, "/dead", queue=name, deleted=deleted, of=len(ids))


async def _group_action(request: Request, paused: bool) -> Response:
    form = await request.form()
    name = _form_queue(request, form)
    group = form.get("group")
    if not isinstance(group, str):
        raise ValidationError("the group field is missing")
    await known_summary(request, name)
    queue = _queue(request, name)
    changed = await (queue.pause_group(group) if paused else queue.resume_group(group))
    log_mutation(request, "pause group" if paused else "resume group", name, group=group,
                 changed=changed)  # fmt: skip
    return redirect(request, "/groups", queue=name)


@mutation
async def pause_group(request: Request) -> Response:
    return await _group_action(request, True)


@mutation
async def resume_group(request: Request) -> Response:
    return await _group_action(request, False)


async def login(request: Request) -> Response:
    """GET: the token form; POST: check the token (with the CSRF check of every form) and set
    the session cookie. Only for :class:`~.config.TokenAuth`."""
    dashboard = dashboard_of(request)
    auth = dashboard.config.auth
    if not isinstance(auth, TokenAuth):
        return redirect(request, "/")
    target = request.query_params.get("next") or ""
    if request.method == "GET":
        return render(request, "login.html", {"next": target, "failed": False})
    form = await request.form()
    token = form.get("token")
    next_value = form.get("next")
    target = next_value if isinstance(next_value, str) else ""
    base = link(request, "/")
    if not _own_path(target, base):
        target = base  # only paths of this dashboard: never an open redirect
    host = request.client.host if request.client else "?"
    if not form_csrf_valid(request, form):
        log.warning("dashboard: refused a login from %s: CSRF check failed", host)
        return render(request, "login.html", {"next": target, "failed": True}, status=403)
    expected = security.session_value(dashboard.config.secret, auth.token)
    if not isinstance(token, str) or not hmac.compare_digest(
        security.session_value(dashboard.config.secret, token), expected
    ):
        log.warning("dashboard: a login from %s gave a wrong token", host)
        return render(request, "login.html", {"next": target, "failed": True}, status=401)
    log.info("dashboard: login from %s", host)
    response = redirect(request, "/")
    response.headers["location"] = target
    session = security.new_session(dashboard.config.secret, auth.token)
    set_private_cookie(request, response, security.SESSION_COOKIE, session)
    return response


# A path of this dashboard, in plain URL characters: no backslash, whitespace or control
# character a browser might read as the start of another host ("/\\evil", "/\t/evil").
_PATH = re.compile(r"/[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*")


def _own_path(target: str, base: str) -> bool:
    """Whether ``target`` is safe to redirect to after a login: a path under ``base``."""
    return (
        _PATH.fullmatch(target) is not None
        and target.startswith(base.rstrip("/") + "/")
        and not target.startswith("//")
    )


async def logout(request: Request) -> Response:
    """End the session. A POST with the page's CSRF token (another site cannot log a user
    out); without it, 403 and the session stays."""
    if not form_csrf_valid(request, await request.form()):
        return error_page(
            request, 403, "Forbidden", "the form's CSRF token is missing or wrong: reload the "
            "page and try again",
        )  # fmt: skip
    who = identify(request)
    # the session ends on the server too: its cookie, replayed, no longer logs anyone in
    dashboard_of(request).revoked_sessions.revoke(request.cookies.get(security.SESSION_COOKIE))
    response = redirect(request, "/login")
    response.delete_cookie(security.SESSION_COOKIE, path=cookie_path(request))
    if isinstance(who, security.Identity):
        log.info("dashboard: logout of %s", who.name)
    return response


__all__ = [
    "delete_dead",
    "login",
    "logout",
    "pause_group",
    "pause_queue",
    "resume_group",
    "resume_queue",
    "retry_dead",
]
