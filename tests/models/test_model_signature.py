"""Model signatures read from source: the same as the imported constructor's, without torch."""

from __future__ import annotations

import hashlib
import inspect
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from ctrcal.models import registry
from ctrcal.models.registry import (
    FEATURE_DATA_ARGS,
    _EmptyFeatureMap,
    available_models,
    check_model_kwargs,
    model_defaults,
    register_model,
    resolve_model,
)
from ctrcal.models.signature import SourceSignatureError, read_source_signature

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = ("masknet", "dcnv2", "dnn")


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_signature_read_from_source_is_the_constructors(name):
    entry = resolve_model(name)
    assert isinstance(entry.target, str), "built-in models are registered by import path"
    found = read_source_signature(entry.target)
    cls = entry.factory  # imports the model
    real = inspect.signature(cls)
    # names, kinds, defaults and annotations (as source text), in order
    assert found.signature == real
    assert [p.default for p in found.signature.parameters.values()] == [
        p.default for p in real.parameters.values()
    ]
    hints = {k: v for k, v in typing.get_type_hints(cls.__init__).items() if k != "return"}
    assert found.hints == hints, "every annotation of a built-in model must be checkable"
    # the data arguments the registry fills in are real parameters
    assert set(FEATURE_DATA_ARGS(_EmptyFeatureMap())) <= set(real.parameters)


def test_every_registered_builtin_is_read_without_importing_it():
    assert set(BUILTINS) <= set(available_models())
    code = (
        "import sys\nfrom ctrcal.models.registry import resolve_model, model_defaults\n"
        f"for name in {BUILTINS!r}:\n"
        "    entry = resolve_model(name)\n"
        "    assert entry.parameters() and entry.hints() and model_defaults(name), name\n"
        "loaded = {'torch', 'ctrcal.models.masknet', 'ctrcal.models.dnn', 'ctrcal.models.dcnv2'}"
        " & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _module(tmp_path: Path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_signature_reader_follows_the_source(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "sig_plain", """
        from __future__ import annotations
        import collections.abc
        from typing import Any, Literal as L, Optional
        WIDTHS = (8, 4)

        class Model:
            def __init__(self, feature_map, /, width: int = 3, *rest: Any,
                         mode: L["a", "b"] = "a", units: collections.abc.Sequence[int] = WIDTHS,
                         scale: Optional[float] = None, other: SomethingElse = -1,
                         **extra: Any) -> None:
                pass

        def build(feature_map, hidden: list[int] | None = None):
            pass
    """)
    found = read_source_signature(f"{mod}:Model")
    params = found.signature.parameters
    assert list(params) == ["feature_map", "width", "rest", "mode", "units", "scale", "other",
                            "extra"]  # fmt: skip
    assert params["feature_map"].kind is inspect.Parameter.POSITIONAL_ONLY
    assert params["rest"].kind is inspect.Parameter.VAR_POSITIONAL
    assert params["mode"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["extra"].kind is inspect.Parameter.VAR_KEYWORD
    assert params["units"].default == (8, 4) and params["other"].default == -1
    assert found.hints["mode"] == typing.Literal["a", "b"]
    assert found.hints["scale"] == typing.Optional[float]  # noqa: UP045 - as written there
    assert "other" not in found.hints  # a name the source does not import: not checked
    import importlib

    real = importlib.import_module(mod)
    assert found.signature == inspect.signature(real.Model)
    func = read_source_signature(f"{mod}:build")
    assert func.signature == inspect.signature(real.build)
    assert func.hints == {"hidden": list[int] | None}


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("def make(): return 3\nclass M:\n    def __init__(self, x=make()):\n        pass\n",
         "not a literal"),
        ("class Base:\n    def __init__(self, x=1):\n        pass\nclass M(Base):\n    pass\n",
         "no __init__ of its own"),
        ("import functools\nclass M:\n    @functools.wraps(print)\n"
         "    def __init__(self, x=1):\n        pass\n", "decorated"),
        ("class M:\n    pass\nM = dict\n", "no top-level class"),
    ],
)
def test_signatures_only_running_the_module_tells_are_refused(tmp_path, monkeypatch, source,
                                                              match):  # fmt: skip
    name = "sig_refused_" + hashlib.sha1(source.encode()).hexdigest()[:8]
    mod = _module(tmp_path, monkeypatch, name, source)
    with pytest.raises(SourceSignatureError, match=match):
        read_source_signature(f"{mod}:M")


def test_a_model_registered_by_import_path_is_checked_before_it_is_imported(
    tmp_path, monkeypatch
):
    mod = _module(tmp_path, monkeypatch, "sig_lazy_user_model", """
        import torch
        from torch import nn

        class Lazy(nn.Module):
            def __init__(self, feature_map, hidden: int = 8):
                super().__init__()
                self.out = nn.Linear(len(feature_map.numeric_fields), 1)

            def forward(self, batch):
                return self.out(torch.nan_to_num(batch.numeric)).squeeze(-1)
    """)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # restored afterwards
    register_model("sig_lazy", f"{mod}:Lazy")
    assert model_defaults("sig_lazy") == {"hidden": 8}
    assert mod not in sys.modules  # validated from the source

    def where(key: str) -> str:
        return f"c.yaml: model.{key}"

    from ctrcal.errors import ConfigError

    with pytest.raises(ConfigError, match=r"c.yaml: model.hiden.*did you mean 'hidden'"):
        check_model_kwargs("sig_lazy", {"hiden": 4}, where)
    with pytest.raises(ConfigError, match=r"c.yaml: model.hidden.*integer"):
        check_model_kwargs("sig_lazy", {"hidden": "four"}, where)
    assert mod not in sys.modules
    from types import SimpleNamespace

    from ctrcal.models.build import create_model

    fm = SimpleNamespace(vocab_sizes=[3], categorical_fields=["C1"], numeric_fields=["I1", "I2"])
    model = create_model("sig_lazy", fm, hidden=4)
    assert type(model.model).__name__ == "Lazy"
    assert resolve_model(type(model.model)).name == "siglazy"  # the class finds its entry


def test_a_builtin_named_by_import_path_is_the_builtin():
    assert resolve_model("ctrcal.models.dnn:DNN").name == "dnn"
    from ctrcal.models.dnn import DNN

    assert resolve_model(DNN).name == "dnn"


def test_an_edited_source_is_read_again(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "sig_edited", "def build(feature_map, a=1):\n    pass\n")
    assert list(read_source_signature(f"{mod}:build").signature.parameters) == ["feature_map", "a"]
    path = tmp_path / f"{mod}.py"
    path.write_text("def build(feature_map, a=1, b=2):\n    pass\n")
    stat = path.stat()
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later modification
    params = read_source_signature(f"{mod}:build").signature.parameters
    assert list(params) == ["feature_map", "a", "b"]
