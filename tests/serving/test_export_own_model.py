"""``ctrcal.export`` of a model from outside ctrcal: a dict input, its LayerNorms swapped for
MC-LayerNorm by ``replace_norms``, into ONNX and pt2 with parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import ctrcal
from ctrcal.core.errors import ConfigError
from ctrcal.layers.mc_layernorm.module import MCLayerNorm, set_mc_mode
from ctrcal.serving.export import export_module

FIELDS = {"user": 11, "item": 7}


class DictModel(nn.Module):
    """FuxiCTR's shape: ``forward(inputs: dict)``, probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.ModuleDict({f: nn.Embedding(v, 4) for f, v in FIELDS.items()})
        self.dense = nn.Linear(3, 4)
        self.norm = nn.LayerNorm(12)
        self.mlp = nn.Sequential(nn.Linear(12, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.emb[f](inputs[f]) for f in FIELDS] + [self.dense(inputs["dense"])]
        return torch.sigmoid(self.mlp(self.norm(torch.cat(parts, dim=1)))).squeeze(-1)


def _inputs(rows, seed):
    gen = torch.Generator().manual_seed(seed)
    out = {f: torch.randint(0, v, (rows,), generator=gen) for f, v in FIELDS.items()}
    return {**out, "dense": torch.randn(rows, 3, generator=gen)}


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = DictModel()
    assert ctrcal.replace_norms(m, "mclayernorm") == 2
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.train()
    set_mc_mode(m, True)  # left sampling: the export uses the one-shot form all the same
    return m


def _one_shot(model, inputs):
    was = model.training
    model.eval()
    with ctrcal.mc_mode(model, enabled=False), torch.no_grad():
        out = model(inputs).numpy()
    model.train(was)
    return out


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_a_dict_input_model_with_mc_layernorm_exports_with_parity(fmt, model, tmp_path):
    path = tmp_path / f"model.{fmt}"
    assert ctrcal.export(model, _inputs(2, 0), path, format=fmt) == path
    # the caller's modes are as they were
    assert model.training and all(m.mc_sampling for m in model.modules() if type(m) is MCLayerNorm)
    for rows in (1, 300):
        inputs = _inputs(rows, rows)
        want = _one_shot(model, inputs)
        if fmt == "pt2":
            with torch.no_grad():
                got = torch.export.load(str(path)).module()(inputs).numpy()
        else:
            ort = pytest.importorskip("onnxruntime")
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            names = [i.name for i in session.get_inputs()]
            assert len(names) == 3
            # the graph's inputs are the dict's tensors, in the dict's order
            feed = dict(zip(names, (v.numpy() for v in inputs.values()), strict=True))
            got = session.run(None, feed)[0]
        assert got.shape == (rows,)
        assert np.abs(got - want).max() <= 1e-5


def test_several_tensor_inputs_and_bad_examples(tmp_path):
    class Two(nn.Module):
        def forward(self, a, b):
            return (a * b).sum(1)

    path = export_module(Two(), (torch.ones(2, 3), torch.ones(2, 3)), tmp_path / "m.pt2", "pt2")
    got = torch.export.load(str(path)).module()(torch.ones(5, 3), torch.full((5, 3), 2.0))
    assert got.tolist() == [6.0] * 5
    with pytest.raises(ConfigError, match="at least 2 rows in every tensor"):
        export_module(Two(), (torch.ones(1, 3), torch.ones(1, 3)), tmp_path / "m.pt2", "pt2")
    with pytest.raises(ConfigError, match="at least 2 rows .*found 2, 3"):
        export_module(Two(), (torch.ones(2, 3), torch.ones(3, 3)), tmp_path / "m.pt2", "pt2")
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        export_module(Two(), (torch.ones(2, 3),) * 2, tmp_path / "m", "tflite")
