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
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ctrcal"


def parse(path: Path) -> ast.Module:
    """The syntax tree of the file ``path``. Read only: a tree is parsed once per text, and the
    checks below read ctrcal's files many times over (about a second per reading)."""
    return _parse_text(path.read_text(), str(path))


@functools.cache
def _parse_text(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


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


def _imports(tree: ast.AST, module: str, is_package: bool, functions: bool = True) -> set[str]:
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
        if not functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(
    root: Path = PACKAGE, external: bool = False, top_only: frozenset[str] = frozenset()
) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``external``: and the top-level names of the
    other packages it imports, ``torch`` for ``torch.nn``; ``top_only``: modules whose imports
    inside functions are left out). The package's own graphs are read once per test session;
    each caller gets its own copy."""
    if root == PACKAGE:
        return {k: set(v) for k, v in _package_import_graph(external, top_only).items()}
    return _read_import_graph(root, external, top_only)


@functools.cache
def _package_import_graph(external: bool, top_only: frozenset[str]) -> dict[str, set[str]]:
    return _read_import_graph(PACKAGE, external, top_only)


def _read_import_graph(root: Path, external: bool, top_only: frozenset[str]) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = parse(path)
        found = _imports(tree, name, path.name == "__init__.py", name not in top_only)
        edges = {m for m in found if m in files}
        if external:
            own = (root.name, f"{root.name}.")
            edges |= {m.split(".")[0] for m in found if m and not m.startswith(own)}
        edges.discard(name)
        graph[name] = edges
    return graph


def reached(graph: dict[str, set[str]], starts: set[str]) -> dict[str, str]:
    """Every name reachable from ``starts`` -> the module that first imports it on the way."""
    seen = {s: s for s in starts}
    todo = sorted(starts)
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in seen:
                seen[w] = v
                todo.append(w)
    return seen


def function_imports(
    path: Path,
    module: str,
    entries: set[str],
    skip: tuple[str, ...] = (),
    runs: dict[str, set[str]] | None = None,
) -> tuple[set[str], dict[str, set[str]]]:
    """What the module-level functions ``entries`` of ``module`` (the file ``path``) import in
    their bodies, and the functions of the same file they call, followed (but ``skip``; a
    function in ``runs`` also reaches the functions it names there, which it calls by other
    means than their names). Returns the modules imported and, per module, the names imported
    from it (the functions a next module's path starts at)."""
    tree = parse(path)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found: set[str] = set()
    names: dict[str, set[str]] = {}
    todo, done = sorted(entries), set()
    while todo:
        name = todo.pop()
        if name in done or name in skip or name not in functions:
            continue
        done.add(name)
        fn = functions[name]
        found |= _imports(fn, module, False)
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                todo.append(node.func.id)
        todo += sorted((runs or {}).get(name, ()))
    return found, names


def command_imports(command: str, root: Path = PACKAGE, skip: tuple[str, ...] = ()) -> set[str]:
    """What the CLI's handler ``cmd_<command>`` imports in its body and in the CLI's helpers it
    calls (but ``skip``), and the CLI's own top."""
    tree = parse(root / "cli.py")
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    top = ast.Module(body=imports, type_ignores=[])
    found, _ = function_imports(root / "cli.py", "ctrcal.cli", {f"cmd_{command}"}, skip)
    return found | _imports(top, "ctrcal.cli", False)


@functools.cache
def _package_graph() -> dict[str, set[str]]:
    """The import graph of ctrcal itself, from the files read once per test session."""
    modules = _modules()
    graph = {}
    for name, tree in modules.trees.items():
        edges = {m for m in _imports(tree, name, name in modules.packages) if m in modules.trees}
        graph[name] = edges - {name}
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
    cycles = [c for c in find_cycles(_package_graph()) if c not in KNOWN]
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


# the units of the layer contract in pyproject.toml: ctrcal.<package> or ctrcal.<module>, and these
UNITS = ("ctrcal.reports.shift", "ctrcal.reports.calibration")


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
    cycles = find_cycles(package_graph(_package_graph()))
    assert not cycles, "package circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_config_loading_imports_no_checks_models_or_torch():
    graph = _package_graph()
    for module, edges in graph.items():
        if module.startswith("ctrcal.config"):
            bad = {e for e in edges if not e.startswith(("ctrcal.config", "ctrcal.core"))}
            assert not bad, (module, bad)


def test_models_import_neither_config_nor_data():
    graph = _package_graph()
    for module, edges in graph.items():
        if module.startswith("ctrcal.models"):
            bad = {
                e
                for e in edges
                if e.startswith(("ctrcal.config", "ctrcal.data", "ctrcal.preparation"))
            }
            assert not bad, (module, bad)


def test_data_imports_neither_config_nor_models():
    graph = _package_graph()
    for module, edges in graph.items():
        if module.startswith(("ctrcal.data", "ctrcal.preparation")):
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


# ---------------------------------------------------------------------------------------------
# What the data commands import. Preparing, generating, checking a data-only config and
# reporting on a predictions file need neither torch nor pandas, whose imports cost more than
# preparing a small file. Read from the source: every import, in any function, of every module
# the command's handler can reach counts. In the rule book (ctrcal.validate, where each check
# imports what it checks) the functions the command's path calls count, followed call by call,
# and the checks that run on a data-only config (not those of its MODEL_SECTIONS). Names
# imported by a string (a registry's built-ins) are not seen here; the subprocess smoke test
# in tests/preparation/test_pipeline.py runs `prepare` for real.

HEAVY = ("torch", "pandas")
# command -> the CLI helpers left out of its path: `validate` of a config with a model section
# (or with --data) is no data command, and goes on in _validate_full
DATA_COMMANDS = {
    "prepare": (),
    "synth": (),
    "calibration_report": (),
    "validate": ("_validate_full",),
}
RULE_BOOK = "ctrcal.validate"
# the rule book's dispatcher: it runs the registered checks, which it calls by no name
DISPATCH = "check_config"
# Paths to a heavy package still open: (command, module that imports it, package). None may
# be added; each must go when its import does (the test fails both ways).
PENDING: set[tuple[str, str, str]] = {
    # prepared data's feature map carries the numeric codec, whose tensor methods (shifts in
    # model space) import torch when called, never while preparing
    ("prepare", "ctrcal.data.numeric", "torch"),
}


def _module_constant(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{RULE_BOOK} defines no {name}: update this test")


def data_only_checks(root: Path = PACKAGE) -> set[str]:
    """The rule book's checks that run on data only: the built-in checks (registered in one
    loop over the functions ``check_<section>``) but those of ``MODEL_SECTIONS``."""
    tree = parse(root / "validate.py")
    skipped = set(_module_constant(tree, "MODEL_SECTIONS"))
    for node in tree.body:
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            checks = [n.id for n in node.iter.elts if isinstance(n, ast.Name)]
            if checks and all(c.startswith("check_") for c in checks):
                return {c for c in checks if c.removeprefix("check_") not in skipped}
    raise AssertionError(f"{RULE_BOOK}'s built-in checks are no longer one loop: update this test")


def data_command_imports(command: str, root: Path = PACKAGE) -> set[str]:
    """What a data command imports: its CLI path (:func:`command_imports`) and, in the rule
    book, the functions that path calls, followed, with the checks that run on data only."""
    skip = DATA_COMMANDS[command]
    found = command_imports(command, root, skip)
    _, names = function_imports(root / "cli.py", "ctrcal.cli", {f"cmd_{command}"}, skip)
    rules, _ = function_imports(
        root / "validate.py",
        RULE_BOOK,
        names.get(RULE_BOOK, set()),
        runs={DISPATCH: data_only_checks(root)},
    )
    return found | rules


@functools.cache
def _external_graph(root: Path) -> dict[str, set[str]]:
    """:func:`import_graph` with the other packages, the rule book's top only (read once)."""
    return import_graph(root, external=True, top_only=frozenset({RULE_BOOK}))


def heavy_paths(command: str, root: Path = PACKAGE) -> dict[tuple[str, str, str], str]:
    """(command, module, package) for every module the command reaches that imports a heavy
    package itself -> the chain of imports that leads there. The rule book's functions count
    where the command's path runs them (:func:`data_command_imports`), its top always."""
    graph = _external_graph(root)
    found = data_command_imports(command, root)
    starts = {m for m in found if m in graph}
    seen = reached(graph, starts)
    out = {}
    for heavy in HEAVY:
        if heavy in found:  # imported on the path itself (the CLI's or the rule book's)
            out[(command, RULE_BOOK, heavy)] = f"{command}: a function on its path -> {heavy}"
    for module in seen:
        for heavy in HEAVY:
            if heavy in graph.get(module, ()):
                chain = _chain(graph, starts, module)
                out[(command, module, heavy)] = f"{command}: {chain} -> {heavy}"
    return out


def _chain(graph: dict[str, set[str]], starts: set[str], target: str) -> str:
    seen = reached(graph, starts)
    path = [target]
    while seen[path[-1]] != path[-1]:
        path.append(seen[path[-1]])
    return " -> ".join(reversed(path))


def test_data_commands_import_neither_torch_nor_pandas():
    found = {}
    for command in DATA_COMMANDS:
        found.update(heavy_paths(command))
    new = sorted(chain for path, chain in found.items() if path not in PENDING)
    gone = sorted(PENDING - set(found))
    assert not new, "heavy imports: " + "; ".join(new)
    assert not gone, f"no longer imported, remove from PENDING: {gone}"
    # --help runs the CLI module's own imports only
    graph = _external_graph(PACKAGE)
    top = {
        m
        for m in command_imports("synth")
        if not m.startswith(("ctrcal.data", "ctrcal.preparation"))
    }
    assert not {"torch", "pandas", "numpy", "polars"} & set(reached(graph, top & set(graph)))


def test_the_data_paths_reach_what_they_run():
    # the paths are what runs: validate's data-only path runs the data and features checks
    # and stops before the model's; calibration-report reads with the predictions reader
    validate = data_command_imports("validate")
    assert {"ctrcal.preparation.splits", "ctrcal.data.feature_bounds"} <= validate
    assert not {"ctrcal.models.registry", "ctrcal.train.runs"} & validate
    full = (
        command_imports("validate")
        | function_imports(PACKAGE / "validate.py", RULE_BOOK, {"load_config", "check_model"})[0]
    )
    assert "torch" in full and "ctrcal.models.registry" in full  # the full path: the model
    report = data_command_imports("calibration_report")
    assert "ctrcal.reports.calibration.predictions_file" in report
    assert data_only_checks() == {"check_data", "check_features"}


def test_the_data_path_check_fails_on_a_heavy_import(tmp_path):
    # a copy of the package with pandas imported by the predictions reader and torch where a
    # data-only config's features are checked: both found, on the commands that run them
    pkg = tmp_path / "ctrcal"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    reader = pkg / "reports" / "calibration" / "predictions_file.py"
    text = reader.read_text()
    reader.write_text(text.replace("import numpy as np\n", "import numpy as np\nimport pandas\n"))
    rules = pkg / "validate.py"
    text = rules.read_text()
    marker = "    from ctrcal.data.feature_bounds import FEATURE_PARAMETER_CONSTRAINTS\n"
    assert marker in text
    rules.write_text(text.replace(marker, marker + "    import torch\n"))
    found = {path: chain for c in DATA_COMMANDS for path, chain in heavy_paths(c, pkg).items()}
    assert set(found) - PENDING == {
        ("calibration_report", "ctrcal.reports.calibration.predictions_file", "pandas"),
        ("prepare", RULE_BOOK, "torch"),
        ("validate", RULE_BOOK, "torch"),
    }
    assert found[("validate", RULE_BOOK, "torch")] == "validate: a function on its path -> torch"


SMOKE = """
import sys
from ctrcal.cli import main
from ctrcal.serving.encoding import RawRowEncoder
out = sys.argv[1]
assert main(["synth", out + "/s.txt", "--rows", "2000"]) == 0
with open(out + "/data.yaml", "w") as fh:
    fh.write("data: {synthetic: {rows: 2000}}\\nfeatures: {min_count: 2}\\n")
assert main(["validate", out + "/data.yaml"]) == 0
assert main(["prepare", "--config", out + "/data.yaml", "--out", out + "/p"]) == 0
RawRowEncoder(out + "/p")
with open(out + "/preds.csv", "w") as fh:
    fh.write("prob,label,seg,time\\n")
    fh.writelines(f"{(k % 9 + 1) / 10},{k % 2},{k % 3},{k // 100}\\n" for k in range(600))
argv = ["calibration-report", out + "/preds.csv", "--prob", "prob", "--label", "label"]
argv += ["--segments", "seg"]
assert main([*argv, "--time", "time", "--out", out + "/r"]) == 0
print(sorted({"torch", "pandas"} & set(sys.modules)))
"""


@pytest.mark.slow
def test_the_data_commands_load_neither_torch_nor_pandas_when_they_run(tmp_path):
    # the one smoke test of the static check above, which cannot see an import a library
    # makes by name at run time (pyarrow's to_numpy imports pandas)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", SMOKE, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_reader_sees_imports_in_functions_and_not_under_type_checking(tmp_path):
    pkg = tmp_path / "ctrcal"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import numpy\ndef f():\n    from ctrcal import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    import pandas\ndef g():\n    import torch.nn as nn\n"
    )
    graph = import_graph(pkg, external=True)
    assert graph["ctrcal.a"] == {"numpy", "ctrcal", "ctrcal.b"}
    assert "pandas" not in graph["ctrcal.b"]
    seen = reached(graph, {"ctrcal.a"})
    assert seen["torch"] == "ctrcal.b" and "pandas" not in seen


# One import path per name: a name is imported from the module that defines it. The top-level
# ``ctrcal`` is the documented exception (its API names what lives below), and a package may
# be the public face of its private submodules (``ctrcal.metrics`` over ``_metrics``, ...).


def _top_level(tree: ast.Module, package: str) -> tuple[set[str], dict[str, tuple[str, str]]]:
    """(names a module defines, alias -> (module, name) it imports), at module level."""
    defined: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(
                    n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
                )
                if isinstance(node, ast.For):
                    visit(node.body)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(
                        [*parts[: len(parts) - (node.level - 1)], *([base] if base else [])]
                    )
                for alias in node.names:
                    imported[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imported[alias.asname or alias.name.split(".")[0]] = (alias.name, "")
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return defined, imported


class Modules:
    """Every module of a package tree: what each defines, imports and lists in ``__all__``."""

    def __init__(self, root: Path = PACKAGE) -> None:
        self.trees: dict[str, ast.Module] = {}
        self.defined: dict[str, set[str]] = {}
        self.imported: dict[str, dict[str, tuple[str, str]]] = {}
        self.packages: set[str] = set()
        for path in root.rglob("*.py"):
            name = _module_name(path, root)
            tree = parse(path)
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            if path.name == "__init__.py":
                self.packages.add(name)
            self.trees[name] = tree
            self.defined[name], self.imported[name] = _top_level(tree, package)

    def owner(self, module: str, name: str) -> str | None:
        """The module that defines ``name`` as reached through ``module`` (None: unknown)."""
        seen: set[tuple[str, str]] = set()
        while (module, name) not in seen:
            seen.add((module, name))
            if f"{module}.{name}" in self.trees or name in self.defined.get(module, ()):
                return module
            source = self.imported.get(module, {}).get(name)
            if source is None or not source[1]:
                return None
            module, name = source
        return None

    def is_home(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` takes ``name`` from its one import path."""
        if module == "ctrcal" or f"{module}.{name}" in self.trees:
            return True
        owner = self.owner(module, name)
        if owner == module:
            return True
        inside = owner is not None and owner.startswith(module + ".")
        return inside and owner[len(module) + 1 :].split(".")[0].startswith("_")

    def exported(self, module: str) -> list[str]:
        """The names of a module's literal ``__all__`` (``["?"]`` for one that is not)."""
        for node in self.trees[module].body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                try:
                    return list(ast.literal_eval(node.value))
                except ValueError:
                    return ["?"]
        return []


@functools.cache
def _modules() -> Modules:
    """ctrcal's modules, read once per test session."""
    return Modules()


def re_exports(modules: Modules) -> list[str]:
    """Every name a module's ``__all__`` lists without defining it, and every lazy facade
    (a module-level ``__getattr__``), outside the top-level ``ctrcal``."""
    found = []
    for module in sorted(modules.trees):
        if module == "ctrcal":
            continue
        if "__getattr__" in modules.defined[module]:
            found.append(f"{module}: a module-level __getattr__ (a facade)")
        for name in modules.exported(module):
            if name == "?" or not modules.is_home(module, name):
                found.append(f"{module}.__all__ lists {name!r}, defined elsewhere")
    return found


def imports_off_home(modules: Modules, files: list[Path]) -> list[str]:
    """Every ``from ctrcal.x import name`` in ``files`` that takes ``name`` from a module that
    only imports it."""
    found = []
    for path in files:
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in modules.trees:
                for alias in node.names:
                    if not modules.is_home(node.module, alias.name):
                        owner = modules.owner(node.module, alias.name) or "?"
                        found.append(
                            f"{path}:{node.lineno}: {alias.name} from {node.module} (its home: "
                            f"{owner})"
                        )
    return found


def attributes_off_home(modules: Modules, files: list[Path]) -> list[str]:
    """Every ``mod.name`` read in ``files``, where ``mod`` is a ctrcal module bound by an
    import and ``name`` is one it only imports: a second import path in attribute form."""
    found = []
    for path in files:
        tree = parse(path)
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules.trees:
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules.trees:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                module = bound[node.value.id]
                owner = modules.owner(module, node.attr)
                if owner is not None and not modules.is_home(module, node.attr):
                    found.append(
                        f"{path}:{node.lineno}: {node.value.id}.{node.attr} (its home: {owner})"
                    )
    return found


def test_no_module_re_exports_a_name():
    found = re_exports(_modules())
    assert not found, "re-exports:\n" + "\n".join(found)


def test_every_name_is_imported_from_the_module_that_defines_it():
    # scripts/ are left out: a benchmark may also run against an older checkout's layout
    root = PACKAGE.parent
    files = [p for d in ("ctrcal", "tests") for p in (root / d).rglob("*.py")]
    found = imports_off_home(_modules(), files)
    assert not found, "names imported off their home:\n" + "\n".join(found)


def test_the_package_reads_no_name_through_a_module_that_only_imports_it():
    # tests may: a monkeypatch replaces a name where it is looked up, not where it is defined
    found = attributes_off_home(_modules(), sorted(PACKAGE.rglob("*.py")))
    assert not found, "names read off their home:\n" + "\n".join(found)


def test_the_top_level_api_names_each_name_s_home():
    modules = _modules()
    tree = modules.trees["ctrcal"]
    exports = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_EXPORTS"
    )
    wrong = []
    for public, target in exports.items():
        module, name = target if isinstance(target, tuple) else (target, public)
        if not modules.is_home(module, name):
            wrong.append(
                f"ctrcal.{public} -> {module}.{name} (home: {modules.owner(module, name)})"
            )
    assert not wrong, "\n".join(wrong)


def test_the_re_export_finders_see_a_re_export_and_a_facade(tmp_path):
    pkg = tmp_path / "ctrcal"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ctrcal.a import f\n__all__ = ['f']\n")  # the API
    (pkg / "a.py").write_text("def f():\n    pass\n")
    (pkg / "b.py").write_text("from ctrcal.a import f\n__all__ = ['f', 'g']\ndef g():\n    f()\n")
    (pkg / "c.py").write_text("from ctrcal.b import f, g\nfrom ctrcal.sub import h, _k\n")
    (pkg / "sub" / "__init__.py").write_text(
        "from ctrcal.sub._impl import h\n__all__ = ['h']\ndef __getattr__(name):\n    pass\n"
    )
    (pkg / "sub" / "_impl.py").write_text("def h():\n    pass\n")
    modules = Modules(pkg)
    assert re_exports(modules) == [
        "ctrcal.b.__all__ lists 'f', defined elsewhere",
        "ctrcal.sub: a module-level __getattr__ (a facade)",  # h from a private module: fine
    ]
    found = imports_off_home(modules, [pkg / "c.py"])
    assert len(found) == 2 and "f from ctrcal.b (its home: ctrcal.a)" in found[0]
    assert "_k from ctrcal.sub (its home: ?)" in found[1]  # a name nobody defines
    (pkg / "d.py").write_text("from ctrcal import b\nimport ctrcal.a as a\nb.f()\nb.g()\na.f()\n")
    modules = Modules(pkg)
    found = attributes_off_home(modules, [pkg / "d.py"])
    assert found == [f"{pkg / 'd.py'}:3: b.f (its home: ctrcal.a)"]


def subpackage_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Package -> the packages its own modules import: each module counts as the package that
    holds it (``ctrcal.layers.embedding`` as ``ctrcal.layers``, the kernels as
    ``ctrcal.layers.kernels``); a module at the top is its own unit."""

    def unit(module: str) -> str:
        if module in packages:
            return module
        parent = module.rpartition(".")[0]
        return module if parent == "ctrcal" else parent

    out: dict[str, set[str]] = {}
    for module, edges in graph.items():
        src = unit(module)
        out.setdefault(src, set()).update(unit(e) for e in edges if e != "ctrcal")
        out[src].discard(src)
    for edges in list(out.values()):
        for e in edges:
            out.setdefault(e, set())
    return out


def test_no_circle_between_a_package_and_its_subpackages():
    # e.g. ctrcal.layers (embedding) imports ctrcal.layers.mc_layernorm, so MC-LayerNorm's
    # modules take their kernels from ctrcal.layers.kernels, never from ctrcal.layers
    graph = subpackage_graph(_package_graph(), _modules().packages)
    cycles = find_cycles(graph)
    assert not cycles, "subpackage circles: " + "; ".join(" <-> ".join(c) for c in cycles)
