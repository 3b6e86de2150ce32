"""The modules of planner/ import one another without cycles.

Every `import planner...` and `from planner... import ...` statement of a module counts,
wherever it sits: a function-level import that closes a cycle is still a cycle.
`from planner.x import y` is an import of planner.x.y when y is a submodule, else of planner.x.
A package's `__init__` is a module like the others, and importing planner.b.y also runs the
`__init__` of planner.b, so it counts as importing planner.b too, except from inside
planner.b (whose `__init__` has then already started): a package `__init__` may re-export
its own submodules as long as none of them imports the package itself back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "planner"


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module under planner/ (a package by its `__init__`)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The planner modules `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
    packages = {".".join(m.split(".")[:k]) for m in out for k in range(2, m.count(".") + 1)}
    inside = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 2)}
    return {m for m in out | (packages - inside) if m in modules and m != name}


def import_graph() -> nx.DiGraph:
    """Module -> the planner modules it imports."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in _imports(name, path, modules))
    return graph


def test_graph_sees_lazy_submodule_and_package_imports():
    graph = import_graph()
    assert graph.has_edge("planner.schedule.zb_ilp", "planner.milp")  # inside a function
    assert graph.has_edge("planner.schedule", "planner.schedule.simulate")  # a re-export
    assert graph.has_edge("planner.predict.step", "planner.cost")  # runs planner/cost/__init__.py
    assert not graph.has_edge("planner.schedule.simulate", "planner.schedule")


def test_no_import_cycles():
    cycles = sorted(" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(import_graph()))
    assert not cycles, f"{len(cycles)} import cycle(s) in planner/:\n" + "\n".join(cycles)
