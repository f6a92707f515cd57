"""The shape the architecture asks for (docs/architecture.md): modules of a few hundred lines
that say why they exist, functions short enough to read, and no import cycles between
modules or between the packages of one level. The layer contracts themselves are
import-linter's (tests/e2e/test_packaging.py runs them over the built wheel).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.harness import ROOT

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
_FOLDERS = {"goodlens": "goodlens", "collector": "goodlens.collector",
            "dashboard": "goodlens.dashboard", "detectors": "goodlens.detectors"}


def _modules() -> dict[str, Path]:
    """Every library module by its import name (the folders as installed)."""
    out = {}
    for folder, package in _FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def test_modules_are_short_and_say_why_they_exist() -> None:
    long, silent = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{name}: {len(text.splitlines())} lines")
        if not ast.get_docstring(ast.parse(text)) and path.name != "__main__.py":
            silent.append(name)
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
    assert not silent, f"modules without a docstring: {silent}"


def test_functions_are_under_a_hundred_lines() -> None:
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _imports() -> dict[str, set[str]]:
    """Module -> the goodlens modules it imports (anywhere in it, lazily or not)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_modules() -> None:
    # a package's __init__ re-exporting its own modules is not a cycle between modules
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in _imports().items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_import_cycles_between_sibling_packages() -> None:
    graph = _imports()
    packages = {m for m, p in _modules().items() if p.name == "__init__.py"}
    for parent in sorted(packages):
        children = {p for p in packages | set(graph) if p.rpartition(".")[0] == parent}

        def child_of(module: str, children: set[str] = children) -> str | None:
            return next((c for c in children if module == c or module.startswith(c + ".")),
                        None)
        collapsed: dict[str, set[str]] = {c: set() for c in children}
        for m, targets in graph.items():
            a = child_of(m)
            for t in targets:
                b = child_of(t)
                if a and b and a != b:
                    collapsed[a].add(b)
        found = _cycle(collapsed)
        assert found is None, f"inside {parent}: " + " -> ".join(found)
