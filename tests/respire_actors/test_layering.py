"""The package's import arrows run one way: jobs/ and streams/ build on actors/, never the
reverse, and no two modules import each other (not even for type checking)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "respire_actors"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every respire_actors module ``path`` imports, at any depth (TYPE_CHECKING included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("respire_actors"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("respire_actors"):
                found.add(target)
                # "from .x import y" may import the submodule y
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists():
                        found.add(candidate)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_actors_never_import_jobs_or_streams() -> None:
    bad = {
        module: sorted(
            t
            for t in targets
            if t.startswith(
                ("respire_actors.jobs", "respire_actors.streams", "respire_actors.reliable")
            )
        )
        for module, targets in _graph().items()
        if module.startswith("respire_actors.actors")
    }
    assert {m: t for m, t in bad.items() if t} == {}


def test_no_import_cycles_between_modules() -> None:
    graph = _graph()
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str], on_stack: set[str], done: set[str]) -> None:
        on_stack.add(node)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in graph or target == node:
                continue
            # a package's __init__ re-exporting its own modules is not a cycle
            if node.startswith(target + "."):
                continue
            if target in on_stack:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in done:
                visit(target, stack, on_stack, done)
        stack.pop()
        on_stack.discard(node)
        done.add(node)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [], set(), done)
    assert cycles == []
