"""The dashboard over HTTP (the ASGI app itself, no browser) against real servers on trio and
asyncio: what each page shows of real state, and the security rules: loopback-only without
auth, token and basic auth, CSRF and origin checks on every mutation, read-only mode, hidden
payloads, the queue allow-list, and the mutation log."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import anyio
import pytest
from dashboard_helpers import csrf_of, http, worker_running
from helpers.acl import acl_denials, acl_user
from helpers.servers import ValkeyProcess
from jobs_helpers import fast_options, running_worker, wait_until, wait_until_async

from respire_actors.acl import acl_rules
from respire_actors.admin import QueueAdmin, register_queue
from respire_actors.codecs import StrCodec
from respire_actors.dashboard import BasicAuth, DashboardConfig, TokenAuth
from respire_actors.dashboard.formatting import counts
from respire_actors.dashboard.security import CSRF_COOKIE, csrf_token
from respire_actors.errors import ValidationError
from respire_actors.jobs import DeadLetter, FlowNode, Job, JobEnqueueOptions, JobQueue, Outcome
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio

TOKEN = "test-token-0123456789"
DASHBOARD_EXTRA = ("+xread",)
"""What the dashboard needs beyond the operator role: live events."""
READ_ONLY_WITHHELD = tuple(
    f"-{c}"
    for c in ("set", "del", "hset", "hdel", "zadd", "zrem", "xadd", "xdel", "xtrim", "sadd", "srem")
)
"""The operator role's write commands, withheld from a read-only dashboard's user."""


async def _dead_letter_one(client: RedisClient, name: str, job_id: str, payload: str) -> None:
    """Run a worker that dead-letters ``job_id`` (so the queue has one dead letter)."""
    queue = JobQueue(client, name, StrCodec())

    async def handler(job: Job[str]) -> Outcome:
        await job.log(f"giving up on {job.payload}")
        return DeadLetter(detail="bad address")

    admin = QueueAdmin(client, name)
    before = (await admin.summary()).dead_letters
    async with worker_running(client, name, handler):
        await queue.enqueue(job_id, payload)
        await wait_until_async(lambda: _dead_count(admin, before + 1))


async def _dead_count(admin: QueueAdmin, n: int) -> bool:
    return (await admin.summary()).dead_letters == n


async def test_pages_show_the_queue_state(prefixed: RedisClient, unique_name: str) -> None:
    client, name = prefixed, unique_name
    await _dead_letter_one(client, name, "dead-1", "secret-payload-1")
    queue = JobQueue(client, name, StrCodec())
    for i in range(3):
        await queue.enqueue(f"ready-{i}", f"body-{i}")
    await queue.enqueue_scheduled("later-1", "later", JobEnqueueOptions(delay=timedelta(hours=1)))
    await register_queue(client, name)
    async with http(client, DashboardConfig()) as h:
        overview = await h.get("/")
        assert overview.status_code == 200
        assert f'data-queue="{name}"' in overview.text
        detail = await h.get("/queue", params={"queue": name})
        assert detail.status_code == 200
        assert "later-1" in detail.text  # scheduled
        shown = dict(re.findall(r'data-field="(\w+)"[^>]*>(?:<a [^>]*>)?([^<]*)<', detail.text))
        assert shown == counts(await QueueAdmin(client, name).summary())
        assert shown["scheduled"] == "1" and shown["dead"] == "1"
        assert "Pause queue" in detail.text
        dead = await h.get("/dead", params={"queue": name})
        assert dead.status_code == 200
        assert "dead-1" in dead.text and "bad address" in dead.text
        assert "secret-payload-1" not in dead.text and "hidden (16 bytes)" in dead.text
        entry = (await queue.enqueue("ready-0", "dup")).entry_id
        job = await h.get("/job", params={"queue": name, "entry": entry})
        assert job.status_code == 200 and "ready-0" in job.text
        assert "body-0" not in job.text and "hidden (6 bytes)" in job.text
        assert (await h.get("/job", params={"queue": name, "entry": "1-1"})).status_code == 404
        groups = await h.get("/groups", params={"queue": name})
        assert groups.status_code == 200 and "Not used" in groups.text
        batches = await h.get("/batches", params={"queue": name})
        assert batches.status_code == 200 and "look one up by its id" in batches.text
        unknown = await h.get("/batches", params={"queue": name, "kind": "flow", "id": "nope"})
        assert "No flow nope" in unknown.text
        missing = await h.get("/batches", params={"queue": name, "kind": "batch", "id": "b"})
        assert missing.status_code == 200 and "No batch b" in missing.text
        batch_id = await queue.create_batch(batch_id="nightly")
        await queue.add_to_batch(batch_id, "nightly-1", "n")
        await queue.seal_batch(batch_id)
        found = await h.get("/batches", params={"queue": name, "kind": "batch", "id": batch_id})
        rows = dict(re.findall(r"<tr><th>(\w+)</th><td>([^<]*)</td></tr>", found.text))
        assert rows["batch_id"] == "nightly" and rows["pending"] == "1"
        assert rows["members"] == "1" and rows["sealed"] == "True"
        assert (await h.get("/batches", params={"queue": name, "kind": "x"})).status_code == 400
        filtered = await h.get("/dead", params={"queue": name, "reason": "nack"})
        assert "dead-1" not in filtered.text and "No dead letters" in filtered.text
        assert (await h.get("/queue", params={"queue": "a{b}"})).status_code == 400
        assert (await h.get("/queue")).status_code == 400
        assert (await h.get("/nowhere")).status_code == 404
    async with http(client, DashboardConfig(show_payloads=True)) as h:
        dead = await h.get("/dead", params={"queue": name})
        assert "secret-payload-1" in dead.text
        job = await h.get("/job", params={"queue": name, "entry": entry})
        assert "body-0" in job.text


async def test_without_auth_only_loopback_clients(client: RedisClient, unique_name: str) -> None:
    async with http(client, DashboardConfig(), host="192.0.2.10") as h:
        for path in ("/", f"/queue?queue={unique_name}", f"/queue/live?queue={unique_name}"):
            assert (await h.get(path)).status_code == 403
        assert (await h.post("/queue/pause", data={"queue": unique_name})).status_code == 403
    async with http(client, DashboardConfig(), host="::1") as h:
        assert (await h.get("/")).status_code == 200


async def test_without_auth_a_rebound_host_name_is_refused(
    client: RedisClient, unique_name: str
) -> None:
    """DNS rebinding: a page on attacker.example, its DNS answer switched to 127.0.0.1, sends
    the user's browser to the dashboard with its own name as Host (and Origin). It used to be
    served, and its forms passed the CSRF and Origin checks."""
    await register_queue(client, unique_name)
    queue = JobQueue(client, unique_name, StrCodec())
    rebound = {"host": "rebind.attacker.example:8080"}
    async with http(client, DashboardConfig()) as h:
        page = await h.get("/queue", params={"queue": unique_name}, headers=rebound)
        assert page.status_code == 403
        token = csrf_of((await h.get("/queue", params={"queue": unique_name})).text)
        response = await h.post(
            "/queue/pause",
            data={"queue": unique_name, "csrf": token},
            headers={**rebound, "origin": "http://rebind.attacker.example:8080"},
        )
        assert response.status_code == 403
    assert not (await queue.get_state()).paused


async def test_token_auth(client: RedisClient, unique_name: str) -> None:
    config = DashboardConfig(auth=TokenAuth(TOKEN))
    async with http(client, config, host="192.0.2.10") as h:
        refused = await h.get("/", headers={"accept": "text/html"})
        assert refused.status_code == 401 and 'name="token"' in refused.text
        for header in ("Bearer wrong-token-0123456789", f"Basic {TOKEN}", f"Bearer {TOKEN}0"):
            assert (await h.get("/", headers={"authorization": header})).status_code == 401
        assert (await h.get("/", headers={"authorization": f"Bearer {TOKEN}"})).status_code == 200
        # the login form: a wrong token is refused, the right one sets the session cookie
        form = await h.get("/login")
        bad = await h.post("/login", data={"csrf": csrf_of(form.text), "token": "nope" * 5})
        assert bad.status_code == 401 and "not valid" in bad.text
        assert (await h.get("/")).status_code == 401
        good = await h.post(
            "/login", data={"csrf": csrf_of(form.text), "token": TOKEN, "next": "//evil.example"}
        )
        assert good.status_code == 303 and good.headers["location"] == "/"
        assert TOKEN not in good.headers["set-cookie"]
        # targets a browser reads as another host never pass: a backslash, a tab
        for target in ("/\\evil.example/x", "/\t/evil.example", "/\\/evil.example"):
            sent = {"csrf": csrf_of(form.text), "token": TOKEN, "next": target}
            again = await h.post("/login", data=sent)
            assert again.status_code == 303 and again.headers["location"] == "/", target
        page = await h.get("/")
        assert page.status_code == 200
        session = h.cookies.get("respire_dashboard_session")
        assert session
        # logging out needs the page's CSRF token: another site cannot log a user out
        assert (await h.post("/logout")).status_code == 403
        assert (await h.get("/")).status_code == 200
        assert (await h.post("/logout", data={"csrf": csrf_of(page.text)})).status_code == 303
        assert (await h.get("/")).status_code == 401
        # the logged-out session cookie, replayed, logs nobody in (found by review: logout
        # only deleted it in the browser)
        replayed = await h.get("/", headers={"cookie": f"respire_dashboard_session={session}"})
        assert replayed.status_code == 401


async def test_basic_auth(client: RedisClient, unique_name: str) -> None:
    config = DashboardConfig(auth=BasicAuth("ops", "correct horse"))
    good = "Basic " + base64.b64encode(b"ops:correct horse").decode()
    wrong = "Basic " + base64.b64encode(b"ops:wrong horse").decode()
    async with http(client, config, host="192.0.2.10") as h:
        refused = await h.get("/")
        assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert (await h.get("/", headers={"authorization": wrong})).status_code == 401
        assert (await h.get("/", headers={"authorization": good})).status_code == 200


async def test_mutations_need_the_csrf_token_and_the_own_origin(
    prefixed: RedisClient, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = prefixed
    await register_queue(client, unique_name)
    queue = JobQueue(client, unique_name, StrCodec())
    caplog.set_level(logging.INFO, logger="respire_actors.dashboard")
    async with http(client, DashboardConfig()) as h:
        page = await h.get("/queue", params={"queue": unique_name})
        token = csrf_of(page.text)
        forged = [
            ({"queue": unique_name}, {}),  # no token
            ({"queue": unique_name, "csrf": "0" * 64}, {}),  # a wrong token
            ({"queue": unique_name, "csrf": token}, {"origin": "http://evil.example"}),
        ]
        for data, headers in forged:
            response = await h.post("/queue/pause", data=data, headers=headers)
            assert response.status_code == 403, (data, headers)
        assert not (await queue.get_state()).paused
        # the token of another browser (another CSRF cookie) is refused too
        async with http(client, DashboardConfig()) as other:
            theirs = csrf_of((await other.get("/queue", params={"queue": unique_name})).text)
        assert (
            await h.post("/queue/pause", data={"queue": unique_name, "csrf": theirs})
        ).status_code == 403
        assert not (await queue.get_state()).paused
        ok = await h.post(
            "/queue/pause",
            data={"queue": unique_name, "csrf": token},
            headers={"origin": "http://127.0.0.1:8080"},
        )
        assert ok.status_code == 303
        assert (await queue.get_state()).paused
        assert (
            await h.post("/queue/resume", data={"queue": unique_name, "csrf": token})
        ).status_code == 303
        assert not (await queue.get_state()).paused
    logged = [r.getMessage() for r in caplog.records if r.name == "respire_actors.dashboard"]
    assert any(f"dashboard pause on queue {unique_name!r} by loopback" in m for m in logged)
    assert any(f"dashboard resume on queue {unique_name!r}" in m for m in logged)
    assert sum("CSRF check failed" in m for m in logged) == 4


async def test_read_only_hides_and_refuses_every_action(
    client: RedisClient, unique_name: str
) -> None:
    name = unique_name
    await _dead_letter_one(client, name, "dead-1", "p")
    admin = QueueAdmin(client, name)
    dead_id = (await admin.dead_letters()).rows[0].dead_id
    config = DashboardConfig(read_only=True)
    async with http(client, config) as h:
        detail = await h.get("/queue", params={"queue": name})
        dead = await h.get("/dead", params={"queue": name})
        assert "read-only" in detail.text
        for text in (detail.text, dead.text):
            assert 'method="post"' not in text
        # a valid token for this browser, as a page with forms would carry it
        token = csrf_token(config.secret, h.cookies[CSRF_COOKIE])
        for path, data in (
            ("/queue/pause", {"queue": name}),
            ("/dead/retry", {"queue": name, "id": dead_id}),
            ("/dead/delete", {"queue": name, "id": dead_id}),
            ("/groups/pause", {"queue": name, "group": "g"}),
        ):
            response = await h.post(path, data={**data, "csrf": token})
            assert response.status_code == 403, path
    assert (await admin.summary()).dead_letters == 1
    assert not (await admin.queue.get_state()).paused


async def test_dead_letter_retry_and_delete(client: RedisClient, unique_name: str) -> None:
    name = unique_name
    await _dead_letter_one(client, name, "dead-1", "p1")
    await _dead_letter_one(client, name, "dead-2", "p2")
    admin = QueueAdmin(client, name)
    rows = {r.job_id: r.dead_id for r in (await admin.dead_letters()).rows}
    async with http(client, DashboardConfig()) as h:
        token = csrf_of((await h.get("/dead", params={"queue": name})).text)
        retried = await h.post("/dead/retry", data={"queue": name, "id": rows["dead-1"],
                                                    "csrf": token})  # fmt: skip
        assert retried.status_code == 303 and "retried=1&of=1" in retried.headers["location"]
        deleted = await h.post("/dead/delete", data={"queue": name, "id": rows["dead-2"],
                                                     "csrf": token})  # fmt: skip
        assert deleted.status_code == 303
        assert (await h.post("/dead/retry", data={"queue": name, "csrf": token})).status_code == 400
    assert (await admin.summary()).dead_letters == 0
    seen: list[tuple[str, str]] = []

    async def handler(job: Job[str]) -> None:
        seen.append((job.id, job.payload))

    async with worker_running(client, name, handler):
        await wait_until(lambda: len(seen) == 1)
        await anyio.sleep(0.3)  # time for a wrongly retried dead-2 to show up as well
    assert seen == [("dead-1", "p1")]


async def test_a_dead_letter_stream_override_is_shown_and_retried(
    client: RedisClient, unique_name: str
) -> None:
    """Dead letters in a stream the workers override were invisible (and so never retried):
    the dashboard always used the default stream."""
    name = unique_name
    queue = JobQueue(client, name, StrCodec())
    await register_queue(client, name)

    async def dead(job: Job[str]) -> Outcome:
        return DeadLetter(detail="poison")

    options = fast_options(dead_letter_stream="poison")
    async with running_worker(client, name, dead, options=options) as worker:
        await queue.enqueue("p-1", "x")
        await wait_until(lambda: worker.statistics(name).dead_lettered == 1)
    admin = QueueAdmin(client, name, dead_stream="poison")
    [row] = (await admin.dead_letters()).rows
    config = DashboardConfig(dead_streams={name: "poison"})
    async with http(client, config) as h:
        page = await h.get("/dead", params={"queue": name})
        assert page.status_code == 200 and row.dead_id in page.text
        token = csrf_of(page.text)
        retried = await h.post(
            "/dead/retry", data={"queue": name, "id": row.dead_id, "csrf": token}
        )
        assert "retried=1&of=1" in retried.headers["location"]
    assert (await admin.summary()).dead_letters == 0
    with pytest.raises(ValidationError):
        DashboardConfig(dead_streams={name: "bad{suffix}"})


async def test_queue_allow_list(client: RedisClient, unique_name: str) -> None:
    config = DashboardConfig(queues=(unique_name,))
    async with http(client, config) as h:
        overview = await h.get("/")
        assert f'data-queue="{unique_name}"' in overview.text
        assert overview.text.count("data-queue=") == 1
        other = await h.get("/queue", params={"queue": unique_name + "-other"})
        assert other.status_code == 400
        token = csrf_of((await h.get("/queue", params={"queue": unique_name})).text)
        refused = await h.post("/queue/pause", data={"queue": unique_name + "-x", "csrf": token})
        assert refused.status_code == 400


async def test_a_lost_server_gives_an_error_page(
    spawn_valkey: Callable[..., ValkeyProcess], unique_name: str
) -> None:
    server = spawn_valkey()
    async with connect(server.url) as client, http(client, DashboardConfig()) as h:
        assert (await h.get("/dead", params={"queue": unique_name})).status_code == 200
        server.stop()
        for path in ("/", f"/queue?queue={unique_name}", f"/dead?queue={unique_name}"):
            response = await h.get(path)
            assert response.status_code == 502, path
            assert "Redis error" in response.text and "RedisUnavailable" in response.text


async def listen_live(url: str, queue: str, first: anyio.Event, ended: anyio.Event) -> None:
    """Read a live page's stream: ``first`` is set at its first counts event, ``ended`` when
    the response was completed (a cut response raises instead)."""
    import httpx

    async with (
        httpx.AsyncClient(timeout=10) as web,
        web.stream("GET", f"{url}/live?queue={queue}") as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("event: counts"):
                first.set()
    ended.set()


async def test_a_live_stream_ends_when_the_server_is_lost(
    spawn_valkey: Callable[..., ValkeyProcess], unique_name: str
) -> None:
    """Found by review of the per-queue error rows: the live counts swallowed the lost
    server as per-queue errors, so the stream sent empty counts for ever (and a warning per
    queue per tick) instead of ending for the page to retry."""
    from dashboard_helpers import served

    server = spawn_valkey()
    first, ended = anyio.Event(), anyio.Event()
    async with connect(server.url) as client:
        await register_queue(client, unique_name)
        async with (
            served(client, DashboardConfig(live_interval=0.2)) as url,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(listen_live, url, unique_name, first, ended)
            with anyio.fail_after(10):
                await first.wait()
            server.stop()
            with anyio.fail_after(10):
                await ended.wait()


async def test_a_queue_that_does_not_exist_is_not_created(
    client: RedisClient, unique_name: str
) -> None:
    """A typo in a link: neither registered nor holding anything, so 404, and an action on it
    changes nothing (the rule of the operator commands)."""
    name = unique_name + "-typo"
    async with http(client, DashboardConfig()) as h:
        for path in ("/queue", "/groups"):
            response = await h.get(path, params={"queue": name})
            assert response.status_code == 404 and "no job queue named" in response.text
        nonce = h.cookies[CSRF_COOKIE]
    async with http(client, DashboardConfig(secret=b"k" * 32)) as h:
        h.cookies.set(CSRF_COOKIE, nonce)
        token = csrf_token(b"k" * 32, nonce)
        for path, extra in (("/queue/pause", {}), ("/groups/pause", {"group": "g"})):
            response = await h.post(path, data={"queue": name, "csrf": token, **extra})
            assert response.status_code == 404, path
    keys = JobQueueKeys(name, client.key_prefix)
    assert await client.execute("EXISTS", keys.control, keys.group_policy, keys.events) == 0


async def test_every_page_and_action_works_as_the_operator_role(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """The dashboard needs nothing beyond the operator role of docs/security.md (plus XREAD
    for the live events): every page and action, logged in as such a user, and no denial in
    the ACL log."""
    name = unique_name
    await _dead_letter_one(client, name, "dead-1", "p")
    queue = JobQueue(client, name, StrCodec())
    await queue.enqueue_scheduled("g-1", "g", JobEnqueueOptions(delay=3600, group="tenant-a"))
    await queue.enqueue_flow("flow-1", FlowNode("root", "r", [FlowNode("leaf", "l")]))
    await queue.create_batch(batch_id="batch-1")
    entry = (await queue.enqueue("ready-1", "r")).entry_id
    pages = (
        ("/", {}),
        ("/queue", {"queue": name}),
        ("/job", {"queue": name, "entry": entry}),
        ("/dead", {"queue": name}),
        ("/groups", {"queue": name}),
        ("/batches", {"queue": name, "kind": "flow", "id": "flow-1"}),
        ("/batches", {"queue": name, "kind": "batch", "id": "batch-1"}),
    )
    config = DashboardConfig(queues=(name,), live_interval=0.2)
    # a read-only dashboard's user: the operator role without its write commands
    reader = f"dash-ro-{unique_name}"
    rules = [*acl_rules("operator", (name,)), *DASHBOARD_EXTRA, *READ_ONLY_WITHHELD]
    async with (
        acl_user(client, server_url, reader, rules) as read_only,
        http(read_only, replace(config, read_only=True)) as h,
    ):
        for path, params in pages:
            response = await h.get(path, params=params)
            assert response.status_code == 200, (path, response.text[-600:])
    assert await acl_denials(client, reader) == []
    user = f"dash-{unique_name}"
    rules = [*acl_rules("operator", (name,)), *DASHBOARD_EXTRA]
    async with acl_user(client, server_url, user, rules) as operator:
        async with http(operator, config) as h:
            for path, params in pages:
                response = await h.get(path, params=params)
                assert response.status_code == 200, (path, response.text[-600:])
            token = csrf_of((await h.get("/dead", params={"queue": name})).text)
            dead_id = (await QueueAdmin(client, name).dead_letters()).rows[0].dead_id
            for path, data in (
                ("/queue/pause", {}),
                ("/queue/resume", {}),
                ("/groups/pause", {"group": "tenant-a"}),
                ("/groups/resume", {"group": "tenant-a"}),
                ("/dead/retry", {"id": dead_id}),
            ):
                response = await h.post(path, data={"queue": name, "csrf": token, **data})
                assert response.status_code == 303, (path, response.text[-600:])
        # the live events reader (a blocking XREAD on its own connection)
        events = JobQueue(operator, name, StrCodec())
        async with events.read_events("$", block=timedelta(milliseconds=100)) as reader:
            await queue.pause()
            with anyio.fail_after(10):
                assert (await reader.__anext__()).kind == "paused"
        assert await acl_denials(client, user) == []


async def test_one_unreadable_queue_does_not_fail_the_overview(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: a queue whose summary failed (a key of the wrong type, a dropped
    connection) turned the overview of every queue into a bare 500: the error escaped the
    page's handler inside the task group's exception group. Its row now says what failed."""
    good, bad = f"{unique_name}-good", f"{unique_name}-bad"
    await JobQueue(client, good, StrCodec()).enqueue("j", "x")
    await client.execute("SET", JobQueueKeys(bad).ready, "not a stream")
    try:
        async with http(client, DashboardConfig(queues=(good, bad))) as web:
            page = await web.get("/")
            assert page.status_code == 200, page.text
            assert f'data-queue="{bad}" class="error"' in page.text
            assert "WrongKeyType" in page.text
            assert f'data-queue="{good}"' in page.text
            one = await web.get("/queue", params={"queue": bad})
            assert one.status_code == 502 and "WrongKeyType" in one.text
    finally:
        await client.execute("DEL", JobQueueKeys(bad).ready)


async def test_the_dead_letters_notice_is_built_from_numbers_not_from_the_link(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: the page showed any text passed in `done=`, so a crafted link could
    put a fake message ("session expired, log in at ...") on the trusted page."""
    await register_queue(client, unique_name)
    async with http(client, DashboardConfig()) as web:
        crafted = await web.get(
            "/dead", params={"queue": unique_name, "done": "Session expired: log in at evil"}
        )
        assert crafted.status_code == 200 and "evil" not in crafted.text
        made = await web.get("/dead", params={"queue": unique_name, "retried": "2", "of": "3"})
        assert '<p class="notice">retried 2 of 3</p>' in made.text
        odd = await web.get("/dead", params={"queue": unique_name, "retried": "x", "of": "3"})
        assert 'class="notice"' not in odd.text


async def test_open_live_streams_end_cleanly_when_the_server_shuts_down(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: on shutdown the live streams were left to Hypercorn's graceful
    deadline and then cut (asyncio logged an ERROR traceback per open page on a clean SIGTERM);
    they now end themselves, so the browser sees a complete response."""
    from dashboard_helpers import served

    await register_queue(client, unique_name)
    first, ended_cleanly = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        async with served(client, DashboardConfig(live_interval=0.2)) as url:
            tg.start_soon(listen_live, url, unique_name, first, ended_cleanly)
            with anyio.fail_after(10):
                await first.wait()
        with anyio.fail_after(5):
            await ended_cleanly.wait()  # no RemoteProtocolError: the body was completed
