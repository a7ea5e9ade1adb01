"""Verdict tables: rich for the terminal, markdown and JSON for files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .model import Verdict

COLUMNS = ("scenario", "case", "accepted", "completed", "duplicates", "lost", "dead", "time s")


def _row(v: Verdict) -> list[str]:
    return [
        v.scenario,
        v.case,
        str(v.accepted),
        str(v.completed),
        str(v.duplicates),
        str(v.lost),
        str(v.dead_lettered),
        f"{v.seconds:.1f}",
    ]


SHORT = ("scenario", "case", "acc", "done", "dup", "lost", "dead", "s", "verdict")


def print_table(verdicts: Sequence[Verdict], console: Console | None = None) -> None:
    """The verdicts as a terminal table (short numeric headers so case names fit 80 columns)."""
    table = Table(
        title="failure contract",
        caption="acc accepted · done completed · dup re-executions · dead dead-lettered · s time",
    )
    for column in SHORT:
        text = column in {"scenario", "case"}
        table.add_column(
            column, justify="left" if text else "right", no_wrap=not text, overflow="fold"
        )
    for v in verdicts:
        table.add_row(*map(escape, _row(v)), "[green]pass[/]" if v.passed else "[red]FAIL[/]")
    out = console or Console()
    out.print(table)
    for v in verdicts:
        for violation in v.violations:
            out.print(f"[red]{escape(v.scenario)}/{escape(v.case)}[/]: {escape(violation)}")


def markdown(verdicts: Sequence[Verdict]) -> str:
    lines = [
        "| " + " | ".join((*COLUMNS, "verdict")) + " |",
        "|" + " --- |" * (len(COLUMNS) + 1),
    ]
    for v in verdicts:
        lines.append("| " + " | ".join((*_row(v), "pass" if v.passed else "FAIL")) + " |")
    notes = [f"- {v.scenario}/{v.case}: {x}" for v in verdicts for x in v.violations]
    details = [
        f"- {v.scenario}/{v.case}: " + ", ".join(f"{k} = {val}" for k, val in v.details.items())
        for v in verdicts
        if v.details
    ]
    if notes:
        lines += ["", "Violations:", "", *notes]
    if details:
        lines += ["", "Details:", "", *details]
    return "\n".join(lines) + "\n"


def write_results(verdicts: Sequence[Verdict], out_dir: Path) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.md`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(json.dumps([v.as_json() for v in verdicts], indent=2) + "\n")
    md_path.write_text(markdown(verdicts))
    return json_path, md_path
