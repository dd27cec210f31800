"""The house keeps its shape: imports point down the layers of docs/ARCHITECTURE.md, no circles.

Every module's imports are read from its source (ast), lazy imports inside functions
included. An import of ``dlcomm.a.b`` (or ``from dlcomm.a import b`` where b is a module)
is an arrow to that module; the implicit import of the packages above it is not.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
DOC = REPO / "docs" / "ARCHITECTURE.md"


def module_names() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "dlcomm").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def imports_of(name: str, path: Path) -> set[str]:
    """The dlcomm modules that ``name`` imports (anywhere in its source)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def component(module: str) -> str:
    """The top-level piece a module belongs to: ``exchange`` for dlcomm.exchange.switch.spec,
    ``cli`` for dlcomm.cli, ``dlcomm`` for the package's own face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def documented_floors() -> list[list[str]]:
    """The floors of the layer block in docs/ARCHITECTURE.md, top floor first."""
    text = DOC.read_text()
    m = re.search(r"<!-- layers: top floor first[^>]*-->\s*```text\n(.*?)```", text, re.S)
    assert m, "docs/ARCHITECTURE.md has no layer block (<!-- layers: top floor first -->)"
    floors = []
    for line in m.group(1).splitlines():
        names = line.split("#")[0].replace(",", " ").split()
        if names:
            floors.append(names)
    return floors


def floor_of() -> dict[str, int]:
    floors = documented_floors()
    return {name: len(floors) - i for i, names in enumerate(floors) for name in names}


def test_every_component_has_a_floor():
    floors = floor_of()
    missing = sorted({component(m) for m in MODULES} - set(floors))
    assert not missing, f"not on any floor of docs/ARCHITECTURE.md: {missing}"
    unknown = sorted(set(floors) - {component(m) for m in MODULES})
    assert not unknown, f"floors name what does not exist: {unknown}"


def test_imports_point_down_the_layers():
    floors = floor_of()
    wrong = [f"{a} -> {b} ({component(a)} on floor {floors[component(a)]}, {component(b)} on "
             f"floor {floors[component(b)]})"
             for a, targets in GRAPH.items() for b in sorted(targets)
             if component(a) != component(b)
             and floors.get(component(a), 0) <= floors.get(component(b), 0)]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node, or a node importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1 or node in graph[node]:
                        out.append(sorted(group))
    return out


def test_no_import_cycle_between_modules():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _package_graph(depth: int) -> dict[str, set[str]]:
    """Arrows between packages at ``depth`` (1: dlcomm.exchange; 2: dlcomm.exchange.switch)
    from the modules inside them; a module directly in a package counts as its own node."""
    def node(module: str) -> str:
        return ".".join(module.split(".")[: depth + 1])

    graph: dict[str, set[str]] = defaultdict(set)
    for a, targets in GRAPH.items():
        graph[node(a)]
        for b in targets:
            if node(a) != node(b) and node(a).rpartition(".")[0] == node(b).rpartition(".")[0]:
                graph[node(a)].add(node(b))
    return dict(graph)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_no_import_cycle_between_packages(depth):
    cycles = _cycles(_package_graph(depth))
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_a_cycle_and_a_wrong_arrow():
    """The checks above can fail: a made-up graph with a circle is caught."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
