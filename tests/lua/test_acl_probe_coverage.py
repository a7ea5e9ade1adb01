"""Every command a script calls is ACL-checked before its first write, or is known to run
before that write. Redis does not undo a script's writes when a later command is refused, so a
read the preflight never checked, called after a write, leaves a half-done transition (found by
review: job_select delivered jobs and then failed on GET and ZRANGE).

The check is static: each command named in a ``redis.call`` must appear in a probe table or an
``acl_check_cmd``/``respire_expect_perm`` call of the same script, unless it is listed in
READ_BEFORE_FIRST_WRITE with the reason it cannot come after a write. A new call after a write
must be probed (the test then passes); one before every write may be listed here instead.
"""

from __future__ import annotations

import re

import pytest

from respire_actors.redis.scripts import all_scripts

_CALLED = re.compile(r"(?:redis\.p?call\(\s*|pcall\(\s*redis\.call,\s*)'([A-Za-z]+)'")
_PROBED = re.compile(
    r"\{\s*'([A-Z]+)'\s*[,}]|acl_check_cmd,?\s*\(?\s*'([A-Z]+)'|respire_expect_perm\('([A-Z]+)'"
)

# TYPE: the preflight's own type check. The others run before the script's first write, so a
# refusal there writes nothing (and is reported as PermissionDenied naming the command).
READ_BEFORE_FIRST_WRITE: dict[str, set[str]] = {
    "*": {"TYPE"},
    # queue admission (HMGET; HINCRBY is the rate-limit denial's only write) and the idle
    # check before the claim or read; EXISTS of the stream / lease owners before the preflight
    "job_claim_pending": {"EXISTS", "HINCRBY", "HMGET"},
    "job_read": {"EXISTS", "HINCRBY", "HMGET", "XPENDING", "XREVRANGE", "XREADGROUP"},
    "job_select": {"HMGET"},
    "job_complete": {"EXISTS"},
    "job_finish": {"EXISTS"},
    # one fenced progress event: the fence and body read come before its only write
    "job_progress": {"XPENDING", "XRANGE"},
    # existing groups are inspected before XGROUP CREATE
    "job_group": {"EXISTS", "HEXISTS", "XINFO"},
    "consumer_cleanup": {"EXISTS"},
    "topic_subscribe": {"EXISTS"},
    "topic_unsubscribe": {"EXISTS"},
    "rq_receive": {"EXISTS", "TIME"},
    "rq_ack": {"TIME"},
    "rq_nack": {"TIME"},
    # the stream's length and the cutoff's clock before the trim
    "job_trim": {"TIME", "XLEN"},
    "topic_trim": {"EXISTS", "TIME"},
    # the schedule's definition and due score before the tick's XADD
    "recurring_tick": {"HGET", "ZSCORE"},
    # the read is XREADGROUP itself; XREVRANGE runs only when it delivered nothing
    "stream_read": {"XREADGROUP", "XREVRANGE"},
    # read-only
    "metrics_read": {"TIME"},
}


@pytest.mark.parametrize("script", all_scripts(), ids=lambda s: s.name)
def test_every_command_a_script_calls_is_probed_or_runs_before_its_first_write(
    script: object,
) -> None:
    source = script.source  # type: ignore[attr-defined]
    name = script.name  # type: ignore[attr-defined]
    called = {m.upper() for m in _CALLED.findall(source)}
    probed = {next(g for g in m if g) for m in _PROBED.findall(source)}
    allowed = READ_BEFORE_FIRST_WRITE["*"] | READ_BEFORE_FIRST_WRITE.get(name, set())
    unchecked = called - probed - allowed
    assert not unchecked, f"{name} calls {sorted(unchecked)} without an ACL probe"
    stale = READ_BEFORE_FIRST_WRITE.get(name, set()) - (called - probed)
    assert not stale, f"{name}: {sorted(stale)} listed but probed or no longer called"
