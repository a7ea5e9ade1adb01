"""Naming the command on a line of a loaded script (Redis 7.0's script ACL refusals)."""

from __future__ import annotations

from respire_actors.redis import scripts
from respire_actors.redis.script_lines import command_at, refused_in_script


def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.split("\n"), 1) if text in line)


def test_the_line_a_refusal_names_gives_its_command() -> None:
    script = scripts.load("job_complete")
    line = _line_of(script.source, "redis.call('XPENDING'")
    message = (
        "ERR The user executing the script can't run this command or subcommand "
        f"script: {script.sha}, on @user_script:{line}."
    )
    assert refused_in_script(message) == "xpending"


def test_a_subcommand_is_named_with_its_container() -> None:
    script = scripts.load("job_group")
    line = _line_of(script.source, "redis.call('XGROUP', 'CREATE'")
    assert command_at(script.sha, line) == "xgroup|create"


def test_unknown_scripts_lines_and_texts_name_nothing() -> None:
    script = scripts.load("job_complete")
    assert command_at("0" * 40, 1) == ""
    assert command_at(script.sha, 0) == ""
    assert command_at(script.sha, 10**6) == ""
    assert command_at(script.sha, 1) == ""  # a comment
    assert refused_in_script("ERR something else") == ""


def test_a_line_calling_two_commands_names_neither() -> None:
    from respire_actors.redis.script_lines import register

    source = "local a = redis.call('GET', KEYS[1]) or redis.call('HGET', KEYS[2], 'f')"
    register("f" * 40, source)
    assert command_at("f" * 40, 1) == ""
    register("e" * 40, "return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])")
    assert command_at("e" * 40, 1) == "get"


def test_a_key_refused_inside_a_script_names_no_command() -> None:
    """Redis 7.0's text for a key outside the user's patterns, refused inside a script, also
    points at a line; the line's command was not refused, so none is named."""
    from respire_actors.errors import PermissionDenied
    from respire_actors.redis.client import _map_reply

    script = scripts.load("job_complete")
    line = _line_of(script.source, "redis.call('XPENDING'")
    error = _map_reply(
        "ERR The user executing the script can't access at least one of the keys mentioned in "
        f"the command script: {script.sha}, on @user_script:{line}."
    )
    assert isinstance(error, PermissionDenied) and error.command == ""
    assert "grant" not in str(error)
