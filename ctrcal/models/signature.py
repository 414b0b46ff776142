"""A model constructor's signature read from its source file, without importing the module.

``ctrcal validate`` binds a config's ``model:`` keys against the model's constructor. For the
built-in models that constructor lives in a module that imports torch (over a second of start
-up); parsing the module's source with :mod:`ast` gives the same signature in milliseconds.
The constructor stays the one owner of its argument list: nothing is declared twice, and a
test compares what is read here with :func:`inspect.signature` of the imported class.

What is read:

* names and kinds of the parameters (``self`` of a class's ``__init__`` dropped);
* defaults written as literals (``16``, ``"serial"``, ``(400, 400)``, ``None``) or as a module
  constant assigned a literal;
* annotations as :func:`inspect.signature` shows them under ``from __future__ import
  annotations`` (the source text), and resolved into types where they only use builtins and
  names imported from :mod:`typing` / :mod:`collections.abc` (``Sequence[int]``,
  ``Literal["a", "b"]``, ``X | None``); other annotations are left unresolved (not
  type-checked), as when :func:`typing.get_type_hints` fails.

Anything else (a class without its own ``__init__``, a default computed by a call, a
decorated constructor) raises :class:`SourceSignatureError`; callers then import the module.
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import functools
import importlib.util
import inspect
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["SourceSignature", "SourceSignatureError", "read_source_signature"]

# modules whose names an annotation may use and still be resolved without imports
_TYPE_MODULES = {"typing": typing, "collections.abc": collections.abc}
_BUILTIN_TYPES = {
    name: getattr(builtins, name)
    for name in ("int", "float", "bool", "str", "bytes", "list", "dict", "tuple", "set",
                 "frozenset", "type", "object")
}  # fmt: skip
_KINDS = inspect.Parameter


class SourceSignatureError(ValueError):
    """The source does not state the signature in a form read without importing it."""


class _Unresolved(Exception):
    pass


@dataclass(frozen=True)
class SourceSignature:
    """A callable's parameters as its source states them.

    Attributes:
        signature: what :func:`inspect.signature` of the imported callable returns
            (annotations as source text).
        hints: parameter name -> resolved annotation, for the annotations this module can
            resolve (what :func:`typing.get_type_hints` returns for them).
    """

    signature: inspect.Signature
    hints: dict[str, Any] = field(default_factory=dict)


def read_source_signature(path: str) -> SourceSignature:
    """The signature of ``package.module:Name`` (a class's ``__init__`` or a function).

    Imports nothing but the parent packages of the module (to locate its file).

    Raises:
        SourceSignatureError: the module has no source file, the name is not a class or
            function defined at its top level, or its signature uses what cannot be read
            without running the module (see the module docstring).
    """
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname or "." in qualname:
        raise SourceSignatureError(f"{path!r}: expected 'package.module:Name'")
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise SourceSignatureError(f"{path!r}: cannot locate {module_name!r} ({exc})") from None
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or not origin.endswith(".py"):
        raise SourceSignatureError(f"{path!r}: {module_name!r} has no Python source file")
    try:
        mtime = os.stat(origin).st_mtime_ns  # an edited file is read again
    except OSError as exc:
        raise SourceSignatureError(f"{path!r}: cannot read {origin} ({exc})") from None
    return _read(origin, mtime, qualname)


@functools.lru_cache(maxsize=64)
def _read(filename: str, mtime: int, name: str) -> SourceSignature:
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename)
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise SourceSignatureError(f"{filename}: cannot parse ({exc})") from None
    namespace, constants = _module_names(tree)
    node = _find(tree, name, filename)
    func = node
    if isinstance(node, ast.ClassDef):
        if node.keywords or any(
            isinstance(n, (ast.FunctionDef, ast.Assign)) and _name_of(n) in _CALL_HOOKS
            for n in node.body
        ):
            raise SourceSignatureError(
                f"{filename}: class {name} has a metaclass, __new__ or __signature__"
            )
        func = next(
            (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
            None,
        )
        if func is None:
            raise SourceSignatureError(f"{filename}: class {name} defines no __init__ of its own")
    if func.decorator_list:
        raise SourceSignatureError(f"{filename}: {name}'s constructor is decorated")
    params, hints = _parameters(func.args, namespace, constants, filename, name)
    if isinstance(node, ast.ClassDef):
        if not params or params[0].kind not in (_KINDS.POSITIONAL_ONLY,
                                                _KINDS.POSITIONAL_OR_KEYWORD):  # fmt: skip
            raise SourceSignatureError(f"{filename}: {name}.__init__ takes no self")
        hints.pop(params[0].name, None)
        params = params[1:]
    returns = ast.unparse(func.returns) if func.returns is not None else _KINDS.empty
    return SourceSignature(inspect.Signature(params, return_annotation=returns), hints)


# what makes calling a class differ from calling its __init__
_CALL_HOOKS = {"__new__", "__signature__"}


def _name_of(node: ast.FunctionDef | ast.Assign) -> str | None:
    if isinstance(node, ast.FunctionDef):
        return node.name
    target = node.targets[0] if len(node.targets) == 1 else None
    return target.id if isinstance(target, ast.Name) else None


def _bound_names(node: ast.stmt) -> list[str]:
    """Top-level names a statement binds (other than by ``def`` / ``class``)."""
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.AsyncFunctionDef):
        return [node.name]
    return []


def _find(tree: ast.Module, name: str, filename: str) -> ast.ClassDef | ast.FunctionDef:
    found = None
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            found = node  # the last definition wins, as when the module runs
        elif name in _bound_names(node):
            found = None  # rebound otherwise: only running the module tells what it is
    if found is None:
        raise SourceSignatureError(f"{filename}: no top-level class or function {name!r}")
    if isinstance(found, ast.ClassDef) and found.decorator_list:
        raise SourceSignatureError(f"{filename}: class {name} is decorated")
    return found


def _module_names(tree: ast.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    """Names usable in annotations (builtins, imports from typing / collections.abc) and the
    module's constants assigned a literal, as they stand after the module's top level ran."""
    namespace: dict[str, Any] = dict(_BUILTIN_TYPES)
    constants: dict[str, Any] = {}
    for node in tree.body:
        for bound in _bound_names(node):  # whatever is rebound is no longer what we knew
            namespace.pop(bound, None)
            constants.pop(bound, None)
        if isinstance(node, ast.ImportFrom) and node.module in _TYPE_MODULES and not node.level:
            module = _TYPE_MODULES[node.module]
            for alias in node.names:
                if hasattr(module, alias.name):
                    namespace[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _TYPE_MODULES:
                    top = alias.name.split(".")[0]
                    namespace[alias.asname or top] = (
                        _TYPE_MODULES[alias.name] if alias.asname else importlib.import_module(top)
                    )
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                try:
                    constants[targets[0].id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return namespace, constants


def _parameters(
    args: ast.arguments, namespace: dict[str, Any], constants: dict[str, Any], filename: str,
    name: str,
) -> tuple[list[inspect.Parameter], dict[str, Any]]:  # fmt: skip
    positional = [*args.posonlyargs, *args.args]
    defaults: list[Any] = [_KINDS.empty] * (len(positional) - len(args.defaults))
    defaults += [_default(d, constants, filename, name) for d in args.defaults]
    kinds = [_KINDS.POSITIONAL_ONLY] * len(args.posonlyargs)
    kinds += [_KINDS.POSITIONAL_OR_KEYWORD] * len(args.args)
    entries: list[tuple[ast.arg, Any, Any]] = list(zip(positional, kinds, defaults, strict=True))
    if args.vararg is not None:
        entries.append((args.vararg, _KINDS.VAR_POSITIONAL, _KINDS.empty))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = _KINDS.empty if default is None else _default(default, constants, filename, name)
        entries.append((arg, _KINDS.KEYWORD_ONLY, value))
    if args.kwarg is not None:
        entries.append((args.kwarg, _KINDS.VAR_KEYWORD, _KINDS.empty))
    params, hints = [], {}
    for arg, kind, default in entries:
        annotation = _KINDS.empty
        if arg.annotation is not None:
            annotation = ast.unparse(arg.annotation)
            try:
                hints[arg.arg] = _resolve(arg.annotation, namespace)
            except _Unresolved:
                pass
        params.append(inspect.Parameter(arg.arg, kind, default=default, annotation=annotation))
    return params, hints


def _default(node: ast.expr, constants: dict[str, Any], filename: str, name: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    raise SourceSignatureError(
        f"{filename}: a default of {name} is not a literal ({ast.unparse(node)})"
    )


def _resolve(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """An annotation's type, built from the names in ``namespace`` only."""
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Name):
        if node.id in namespace:
            return namespace[node.id]
        raise _Unresolved
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, namespace)
        if not isinstance(base, ModuleType) or not hasattr(base, node.attr):
            raise _Unresolved
        return getattr(base, node.attr)
    if isinstance(node, ast.Subscript):
        base = _resolve(node.value, namespace)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base is typing.Literal:
            args: Any = tuple(_literal_value(e) for e in items)
        else:
            args = tuple(_resolve(e, namespace) for e in items)
        try:
            return base[args if len(args) > 1 else args[0]]
        except TypeError:
            raise _Unresolved from None
    if isinstance(node, ast.List):  # Callable[[int, str], float]
        return [_resolve(e, namespace) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        try:
            return _resolve(node.left, namespace) | _resolve(node.right, namespace)
        except TypeError:
            raise _Unresolved from None
    raise _Unresolved  # a string forward reference, a call, ...


def _literal_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, bool, bytes)):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = node.operand
        if isinstance(operand, ast.Constant) and type(operand.value) is int:
            return -operand.value
    raise _Unresolved
