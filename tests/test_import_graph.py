"""The package's import graph has no circles, imports inside functions included.

The graph is read from the source (``ast``), not from ``sys.modules``: an import inside a
function is an edge as much as one at the top of the file. ``from pkg import name`` is an edge
to ``pkg`` (its ``__init__`` runs) and, where ``name`` is a submodule, to it. A package
``__init__`` that imports its own submodules (a facade) is no circle by itself: the submodule
only closes one if it imports the package back. Imports under ``if TYPE_CHECKING:`` never run
and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ctrcal"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module ``module`` imports (absolute names), at any depth of the file."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            # `from pkg import sub` imports the submodule sub where there is one
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = {m for m in _imports(tree, name, path.name == "__init__.py") if m in files}
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


# Circles inside one subpackage that its owner is breaking up; none may grow, none may join.
KNOWN: list[list[str]] = []


def test_the_package_has_no_import_circle():
    cycles = [c for c in find_cycles(import_graph()) if c not in KNOWN]
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


# the units of the layer contract in pyproject.toml: ctrcal.<package> or ctrcal.<module>, and these
UNITS = ("ctrcal.reports.shift", "ctrcal.reports.calibration", "ctrcal.data.prepare")


def unit_of(module: str) -> str:
    """The layer unit that holds ``module`` (the ``ctrcal`` root ``__init__`` is its own)."""
    for unit in UNITS:
        if module == unit or module.startswith(unit + "."):
            return unit
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Unit -> the units its modules import (imports inside a unit left out)."""
    out: dict[str, set[str]] = {}
    for module, edges in graph.items():
        src = unit_of(module)
        out.setdefault(src, set()).update(unit_of(e) for e in edges)
        out[src].discard(src)
    for edges in list(out.values()):
        for e in edges:
            out.setdefault(e, set())
    return out


def test_no_package_level_circle():
    cycles = find_cycles(package_graph(import_graph()))
    assert not cycles, "package circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_config_loading_imports_no_checks_models_or_torch():
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith("ctrcal.config"):
            bad = {e for e in edges if not e.startswith(("ctrcal.config", "ctrcal.core"))}
            assert not bad, (module, bad)


def test_models_import_neither_config_nor_data():
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith("ctrcal.models"):
            bad = {e for e in edges if e.startswith(("ctrcal.config", "ctrcal.data"))}
            assert not bad, (module, bad)


def test_data_imports_neither_config_nor_models():
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith("ctrcal.data"):
            bad = {e for e in edges if e.startswith(("ctrcal.config", "ctrcal.models"))}
            assert not bad, (module, bad)


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "ctrcal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ctrcal.b import g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ctrcal import c\n"
        "def g():\n    from ctrcal import a\n"
    )
    (pkg / "c.py").write_text("import ctrcal.b\n")
    sub = pkg / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text("from ctrcal.sub.x import f\n")  # a facade: fine
    (sub / "x.py").write_text("def f():\n    from ctrcal.c import g\n")
    assert find_cycles(import_graph(pkg)) == [["ctrcal.a", "ctrcal.b"]]
    (sub / "x.py").write_text("from ctrcal.sub import f\n")  # back into its package: a circle
    assert ["ctrcal.sub", "ctrcal.sub.x"] in find_cycles(import_graph(pkg))
