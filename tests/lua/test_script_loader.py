"""The Lua loader: include resolution, cycle detection, naming, EVALSHA with NOSCRIPT fallback."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.keyspace import new_name

from respire_actors.errors import ScriptError
from respire_actors.redis import scripts
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import Script, run_many


def fake_files(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    def read(path: str) -> str:
        try:
            return files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    monkeypatch.setattr(scripts, "_read", read)


def test_include_is_replaced_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(
        monkeypatch,
        {
            "main-1.lua": "-- main\n--!include lib/a.lua\nreturn helper_a()\n",
            "lib/a.lua": "--!include lib/b.lua\nlocal function helper_a() return helper_b() end\n",
            "lib/b.lua": "local function helper_b() return 1 end\n",
        },
    )
    source = scripts._resolve("main-1.lua", ())
    assert source == (
        "-- main\n"
        "local function helper_b() return 1 end\n"
        "local function helper_a() return helper_b() end\n"
        "return helper_a()\n"
    )


def test_include_directive_must_be_a_whole_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(monkeypatch, {"m-0.lua": "local s = '--!include lib/a.lua'\n"})
    assert scripts._resolve("m-0.lua", ()) == "local s = '--!include lib/a.lua'\n"


def test_diamond_includes_are_not_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(
        monkeypatch,
        {
            "m-0.lua": "--!include lib/a.lua\n--!include lib/b.lua\n",
            "lib/a.lua": "--!include lib/common.lua\n",
            "lib/b.lua": "--!include lib/common.lua\n",
            "lib/common.lua": "local common = 1\n",
        },
    )
    assert scripts._resolve("m-0.lua", ()).count("local common = 1") == 2


def test_include_cycle_is_reported_with_its_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(
        monkeypatch,
        {
            "m-0.lua": "--!include lib/a.lua\n",
            "lib/a.lua": "--!include lib/b.lua\n",
            "lib/b.lua": "--!include lib/a.lua\n",
        },
    )
    chain = re.escape("m-0.lua -> lib/a.lua -> lib/b.lua -> lib/a.lua")
    with pytest.raises(RuntimeError, match=chain):
        scripts._resolve("m-0.lua", ())


def test_self_include_is_a_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(monkeypatch, {"lib/a.lua": "--!include lib/a.lua\n"})
    with pytest.raises(RuntimeError, match="cycle"):
        scripts._resolve("lib/a.lua", ())


def test_missing_include_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_files(monkeypatch, {"m-0.lua": "--!include lib/nope.lua\n"})
    with pytest.raises(FileNotFoundError, match=re.escape("lib/nope.lua")):
        scripts._resolve("m-0.lua", ())


def test_real_reader_reads_package_files() -> None:
    with pytest.raises(FileNotFoundError):
        scripts._read("lib/does-not-exist.lua")


@pytest.fixture
def package_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in ``respire_actors`` package whose ``scripts/`` the loader reads."""
    scripts_dir = tmp_path / "scripts"
    (scripts_dir / "lib").mkdir(parents=True)
    monkeypatch.setattr(scripts, "resources", SimpleNamespace(files=lambda _package: tmp_path))
    scripts.load.cache_clear()
    scripts._files.cache_clear()
    try:
        yield scripts_dir
    finally:
        scripts.load.cache_clear()
        scripts._files.cache_clear()


def test_load_from_a_package_dir(package_dir: Path) -> None:
    (package_dir / "lib" / "double.lua").write_text("local function double(x) return 2 * x end\n")
    (package_dir / "twice-1.lua").write_text(
        "-- twice: doubles\n--!include lib/double.lua\n"
        "return double(tonumber(redis.call('GET', KEYS[1])))\n"
    )
    (package_dir / "README.txt").write_text("not a script")
    (package_dir / "Bad-Name.lua").write_text("return 1")
    script = scripts.load("twice")
    assert (script.name, script.numkeys) == ("twice", 1)
    assert "local function double" in script.source
    assert "--!include" not in script.source
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
    assert scripts.load("twice") is script  # cached
    assert [s.name for s in scripts.all_scripts()] == ["twice"]
    with pytest.raises(LookupError, match="no Lua script named 'missing'"):
        scripts.load("missing")


def test_load_reports_cycles(package_dir: Path) -> None:
    (package_dir / "lib" / "a.lua").write_text("--!include lib/b.lua\n")
    (package_dir / "lib" / "b.lua").write_text("--!include lib/a.lua\n")
    (package_dir / "loop-0.lua").write_text("--!include lib/a.lua\nreturn 1\n")
    loop = scripts.load("loop")  # the file is read on first use
    with pytest.raises(RuntimeError, match="cycle"):
        assert loop.source


def test_script_checks_key_count() -> None:
    script = Script("s", 2, "return 1", hashlib.sha1(b"return 1").hexdigest())
    with pytest.raises(TypeError, match="takes 2 keys, got 1"):
        script.evalsha_args(["a"], [])
    assert script.evalsha_args(["a", "b"], [1]) == ("EVALSHA", script.sha, 2, "a", "b", 1)
    assert script.eval_args(["a", "b"], []) == ("EVAL", "return 1", 2, "a", "b")


def fresh_script(body: str) -> Script:
    source = f"-- {new_name('nonce')}\n{body}"
    return Script("fresh", 1, source, hashlib.sha1(source.encode()).hexdigest())


@pytest.mark.anyio
async def test_evalsha_falls_back_to_eval_on_noscript(
    client: RedisClient, unique_name: str
) -> None:
    script = fresh_script("return redis.call('INCR', KEYS[1])")
    key = f"{unique_name}:n"
    assert await client.execute("SCRIPT", "EXISTS", script.sha) == [0]
    assert await script(client, [key], []) == 1  # NOSCRIPT: ran once, by EVAL
    assert await client.execute("SCRIPT", "EXISTS", script.sha) == [1]
    assert await script(client, [key], []) == 2  # EVALSHA
    assert await client.execute("GET", key) == b"2"


@pytest.mark.anyio
async def test_script_errors_are_mapped(client: RedisClient, unique_name: str) -> None:
    script = fresh_script("return redis.error_reply('RESPIRE_DEMO ' .. KEYS[1])")
    with pytest.raises(ScriptError) as info:
        await script(client, [unique_name], [])
    assert info.value.code == "RESPIRE_DEMO"


@pytest.mark.anyio
async def test_run_many_resends_only_noscript_calls(client: RedisClient, unique_name: str) -> None:
    counter = fresh_script("return redis.call('INCR', KEYS[1])")
    failing = fresh_script("return redis.error_reply('RESPIRE_NO ' .. KEYS[1])")
    known = fresh_script("return redis.call('INCRBY', KEYS[1], 10)")
    await client.execute("SCRIPT", "LOAD", known.source)
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    replies = await run_many(
        client, [(counter, [a], []), (failing, [a], []), (known, [b], []), (counter, [a], [])]
    )
    assert replies[0] == 1 and replies[3] == 2  # NOSCRIPT calls re-sent once each, in order
    assert isinstance(replies[1], ScriptError)
    assert replies[2] == 10  # ran by EVALSHA, not re-sent
    assert await client.execute("MGET", a, b) == [b"2", b"10"]


@pytest.mark.anyio
async def test_a_lost_script_is_loaded_once_per_page_not_sent_with_every_call(
    spawn_valkey: Any, unique_name: str
) -> None:
    """Found while checking a memory bound: a page of 500 calls of a script the server did
    not know was re-sent as 500 full EVALs, the source 500 times over (a 13 MB peak instead
    of 3.5 MB for an operator's retry of 10,000 dead letters). Now the first call loads it
    and the others follow as EVALSHA."""
    from respire_actors.redis.client import connect

    server = spawn_valkey()
    counter = fresh_script("return redis.call('INCR', KEYS[1])")
    async with connect(server.url) as client:
        key = f"{unique_name}:n"
        replies = await run_many(client, [(counter, [key], [])] * 50)
        assert replies == list(range(1, 51))  # each ran once, in order
        stats = await client.execute("INFO", "commandstats")
    text = stats.decode() if isinstance(stats, bytes) else str(stats)
    calls = {
        line.split(":")[0]: int(line.split("calls=")[1].split(",")[0])
        for line in text.splitlines()
        if line.startswith("cmdstat_")
    }
    assert calls["cmdstat_eval"] == 1
    assert calls["cmdstat_evalsha"] == 50 + 49  # the first round, then the others again
