"""Contract of every shipped Lua script: file name, header, key count, and that it loads.

Each ``respire_actors/scripts/<name>-<n>.lua`` must open with a header comment block::

    -- <name>: what it does
    --
    -- KEYS[1]  ...            (exactly KEYS[1] .. KEYS[n], n from the file name)
    -- ARGV[1]  ...            (every ARGV[j] the script reads; ARGV[k..] covers the rest)
    --
    -- Returns ...

The checker is tested on synthetic scripts below, so the contract is enforced even while the
scripts directory is empty.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from respire_actors.redis import scripts
from respire_actors.redis.client import RedisClient

SCRIPTS_DIR = Path(str(resources.files("respire_actors").joinpath("scripts")))
SCRIPT_FILES = sorted(p.name for p in SCRIPTS_DIR.glob("*.lua"))
LIB_FILES = sorted(p.name for p in (SCRIPTS_DIR / "lib").glob("*.lua"))

_FILE = re.compile(r"^(?P<name>[a-z0-9_]+)-(?P<keys>\d+)\.lua$")
_KEYS_DOC = re.compile(r"^--\s+KEYS\[(\d+)\]")
_ARGV_DOC = re.compile(r"^--\s+ARGV\[(\d+)(?:\s*\.\.\s*(\d*))?\]")
_RETURNS_DOC = re.compile(r"^--\s+Returns?\b", re.IGNORECASE)
_KEYS_USE = re.compile(r"\bKEYS\[(\d+)\]")
_ARGV_USE = re.compile(r"\bARGV\[(\d+)\]")
_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.MULTILINE)


def split_header(text: str) -> tuple[list[str], list[str]]:
    """The leading ``--`` comment block (directives excluded) and the remaining lines."""
    lines = text.splitlines()
    header: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("--") and not line.startswith("--!"):
            header.append(line)
            continue
        return header, lines[i:]
    return header, []


def code_only(lines: list[str]) -> str:
    """The body without comments (good enough for finding KEYS[i] / ARGV[i] uses)."""
    return "\n".join(line.split("--", 1)[0] for line in lines)


def header_problems(filename: str, text: str, scripts_dir: Path = SCRIPTS_DIR) -> list[str]:
    """Everything wrong with one script's name and header; empty when it is fine."""
    match = _FILE.match(filename)
    if not match:
        return [f"{filename}: name must be <name>-<number of keys>.lua (the loader skips it)"]
    name, numkeys = match["name"], int(match["keys"])
    header, body = split_header(text)
    problems: list[str] = []
    if not header:
        return [f"{filename}: no header comment block at the top"]
    if not re.match(rf"^--\s+{re.escape(name)}:\s+\S", header[0]):
        problems.append(f"{filename}: header must start with '-- {name}: <what it does>'")
    documented_keys = [int(m[1]) for line in header if (m := _KEYS_DOC.match(line))]
    if sorted(set(documented_keys)) != list(range(1, numkeys + 1)):
        problems.append(
            f"{filename}: header documents KEYS {sorted(set(documented_keys))}, "
            f"the file name promises {numkeys} (KEYS[1]..KEYS[{numkeys}])"
        )
    code = code_only(body)
    used_keys = sorted({int(k) for k in _KEYS_USE.findall(code)})
    if used_keys and used_keys[-1] > numkeys:
        problems.append(f"{filename}: uses KEYS[{used_keys[-1]}] but takes {numkeys} keys")
    singles: set[int] = set()
    open_from: int | None = None
    for line in header:
        if m := _ARGV_DOC.match(line):
            start = int(m[1])
            if m[2] is not None and m[2] == "":
                open_from = start if open_from is None else min(open_from, start)
            elif m[2]:
                singles.update(range(start, int(m[2]) + 1))
            else:
                singles.add(start)
    for j in sorted({int(a) for a in _ARGV_USE.findall(code)}):
        if j not in singles and (open_from is None or j < open_from):
            problems.append(f"{filename}: reads ARGV[{j}] but the header does not document it")
    uses_all_argv = re.search(r"#ARGV|unpack\(ARGV|ipairs\(ARGV", code)
    if uses_all_argv and not (singles or open_from):
        problems.append(f"{filename}: reads ARGV but the header documents no ARGV")
    if not any(_RETURNS_DOC.match(line) for line in header):
        problems.append(f"{filename}: header must say what it returns ('-- Returns ...')")
    for include in _INCLUDE.findall(text):
        if not (scripts_dir / include).is_file():
            problems.append(f"{filename}: includes {include}, which does not exist")
    return problems


# ------------------------------------------------------------------------------------------
# the shipped scripts


def test_scripts_directory_is_scanned() -> None:
    assert SCRIPTS_DIR.is_dir(), SCRIPTS_DIR
    named = sorted(f for f in SCRIPT_FILES if _FILE.match(f))
    assert [f"{s.name}-{s.numkeys}.lua" for s in scripts.all_scripts()] == named


@pytest.mark.parametrize("filename", SCRIPT_FILES)
def test_script_header(filename: str) -> None:
    assert header_problems(filename, (SCRIPTS_DIR / filename).read_text("utf-8")) == []


@pytest.mark.parametrize("filename", SCRIPT_FILES)
def test_script_loads_with_includes_resolved(filename: str) -> None:
    script = scripts.load(_FILE.match(filename)["name"])  # type: ignore[index]
    assert "--!include" not in script.source
    assert script.numkeys == int(_FILE.match(filename)["keys"])  # type: ignore[index]


@pytest.mark.parametrize("filename", LIB_FILES)
def test_lib_helper_has_a_comment(filename: str) -> None:
    text = (SCRIPTS_DIR / "lib" / filename).read_text("utf-8")
    assert text.startswith("--"), f"lib/{filename} should open with a comment saying what it offers"


@pytest.mark.anyio
async def test_every_script_loads_on_the_server(client: RedisClient) -> None:
    for script in scripts.all_scripts():
        sha = await client.execute("SCRIPT", "LOAD", script.source)
        assert sha.decode() == script.sha, script.name


# ------------------------------------------------------------------------------------------
# the checker itself (meaningful even with no scripts shipped)

GOOD = """\
-- demo: move a value between two keys.
--
-- KEYS[1]  source
-- KEYS[2]  destination
-- ARGV[1]  amount
-- ARGV[2..] labels
--
-- Returns the new destination value.
--!include lib/helper.lua
local n = tonumber(ARGV[1])
redis.call('DECRBY', KEYS[1], n) -- KEYS[9] in a comment is ignored
return redis.call('INCRBY', KEYS[2], n + #ARGV + tonumber(ARGV[3] or 0))
"""


@pytest.fixture
def fake_dir(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.lua").write_text("-- a helper\n")
    return tmp_path


def test_checker_accepts_a_good_script(fake_dir: Path) -> None:
    assert header_problems("demo-2.lua", GOOD, fake_dir) == []


@pytest.mark.parametrize(
    ("filename", "text", "complaint"),
    [
        ("Demo.lua", GOOD, "name must be"),
        ("demo-3.lua", GOOD, "promises 3"),
        ("demo-1.lua", GOOD, "promises 1"),
        ("demo-2.lua", GOOD.replace("-- KEYS[2]  destination\n", ""), "documents KEYS [1]"),
        ("demo-2.lua", GOOD.replace("-- demo:", "-- other:"), "'-- demo:"),
        ("demo-2.lua", GOOD.replace("-- Returns", "-- Gives"), "Returns"),
        ("demo-2.lua", GOOD.replace("-- ARGV[1]  amount\n", ""), "ARGV[1]"),
        ("demo-2.lua", GOOD.replace("-- ARGV[2..] labels\n", ""), "ARGV[3]"),
        ("demo-2.lua", GOOD.replace("KEYS[2], n", "KEYS[3], n"), "uses KEYS[3]"),
        ("demo-2.lua", GOOD.replace("lib/helper.lua", "lib/missing.lua"), "does not exist"),
        ("demo-2.lua", "local x = 1\n", "no header"),
    ],
)
def test_checker_rejects(filename: str, text: str, complaint: str, fake_dir: Path) -> None:
    problems = header_problems(filename, text, fake_dir)
    assert any(complaint in p for p in problems), problems


def test_checker_argv_ranges(fake_dir: Path) -> None:
    text = GOOD.replace("-- ARGV[2..] labels", "-- ARGV[2..3] labels")
    assert header_problems("demo-2.lua", text, fake_dir) == []
    text = GOOD.replace("-- ARGV[2..] labels", "-- ARGV[2..2] labels")
    assert any("ARGV[3]" in p for p in header_problems("demo-2.lua", text, fake_dir))
