"""Pruning the included helpers a script never calls (respire_actors/redis/lua_prune.py)."""

from __future__ import annotations

import re

import pytest

from respire_actors.redis.client import RedisClient
from respire_actors.redis.lua_prune import prune
from respire_actors.redis.scripts import all_scripts, load

DEFINED = re.compile(r"^local function (\w+)", re.M)


def test_unreachable_helpers_go_and_reachable_ones_stay_byte_for_byte() -> None:
    source = (
        "local function leaf(x) return x + 1 end\n"
        "local function unused(x)\n  return leaf(x)\nend\n"
        "local function middle(x)\n"
        "  if x > 0 then\n    for i = 1, 2 do x = leaf(x) end\n  else\n"
        "    repeat x = x + 1 until x > 0\n  end\n"
        "  local inner = function(y) return y end\n"
        "  return inner(x)\nend\n"
        "local function also_unused() return middle(1) end\n"
        "return middle(tonumber(ARGV[1]))\n"
    )
    pruned = prune(source)
    assert DEFINED.findall(pruned) == ["leaf", "middle"]
    assert "local function leaf(x) return x + 1 end\n" in pruned
    middle = source[source.index("local function middle") : source.index("local function also")]
    assert middle in pruned  # kept text is the included text, unchanged
    assert pruned.endswith("return middle(tonumber(ARGV[1]))\n")


def test_comments_and_strings_do_not_confuse_the_block_structure() -> None:
    source = (
        "local function tricky()\n"
        "  -- end end end\n"
        "  local s = 'end' .. \"if do\" .. [[end\nfunction]] .. [==[ ]] end ]==]\n"
        "  --[[ if\n do ]]\n"
        "  return s\nend\n"
        "local function dropped() return 'tricky' end\n"
        "return tricky()\n"
    )
    pruned = prune(source)
    assert DEFINED.findall(pruned) == ["tricky"]
    assert "return s\nend\n" in pruned


def test_any_identifier_in_code_keeps_a_helper_but_comments_and_strings_do_not() -> None:
    source = (
        "local function in_comment() end\n"
        "local function in_string() end\n"
        "local function in_table() end\n"
        "local function as_field() end\n"
        "-- see in_comment\n"
        "local t = {f = in_table, 'in_string'}\n"
        "return t.as_field\n"
    )
    assert DEFINED.findall(prune(source)) == ["in_table", "as_field"]


def test_a_helper_defined_twice_keeps_what_either_definition_calls() -> None:
    source = (
        "local function a() return 1 end\n"
        "local function b() return 2 end\n"
        "local function twice() return a() end\n"
        "local function twice() return b() end\n"
        "return twice()\n"
    )
    assert DEFINED.findall(prune(source)) == ["a", "b", "twice", "twice"]


def test_a_function_without_its_end_is_an_error() -> None:
    with pytest.raises(ValueError, match="'broken' has no closing 'end'"):
        prune("local function broken()\n  if x then return 1\nend\nreturn 2\n")


@pytest.mark.parametrize("script", all_scripts(), ids=lambda s: s.name)
def test_every_shipped_script_keeps_only_helpers_it_reaches(script: object) -> None:
    source = load(script.name).source  # type: ignore[attr-defined]
    assert prune(source) == source  # pruning is already done, and idempotent
    for name in DEFINED.findall(source):
        # every helper left is named somewhere besides its own definition
        assert len(re.findall(rf"\b{name}\b", source)) >= 2, name


def test_the_completion_script_sheds_most_of_its_prologue() -> None:
    """job_complete includes 75 helpers (flows, batches, groups, metrics) and calls 44."""
    assert 40 <= len(DEFINED.findall(load("job_complete").source)) <= 50


@pytest.mark.anyio
async def test_pruned_scripts_compile_on_the_server(client: RedisClient) -> None:
    for script in all_scripts():
        sha = await client.execute("SCRIPT", "LOAD", script.source)
        assert (sha.decode() if isinstance(sha, bytes) else sha) == script.sha
