"""ctrcal export: parity of the exported graphs with the eager model, every model and norm,
calibrators folded in, user models, and the raw-row encoding a server uses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ctrcal.core.batch import Batch
from ctrcal.data.feature_map import FeatureMap
from ctrcal.data.loader import ParquetCTRData
from ctrcal.layers.registry import available_norms
from ctrcal.models.build import create_model
from ctrcal.serving.export import CalibrationHead, ServedModel, example_inputs, export_model

PARITY_ROWS = 10_000
TOL = 1e-5
# the configurations whose exports are checked against eager on 10k rows
SERIAL = ["model.name=masknet", "model.variant=serial", "model.hidden_units=[16,16]"]
PARALLEL = [
    "model.name=masknet",
    "model.variant=parallel",
    "model.block_dim=16",
    "model.mlp_hidden_units=[16]",
]
PARITY = {
    "masknet_serial_ln": SERIAL,
    "masknet_serial_mcln": [*SERIAL, "model.net_norm=mclayernorm"],
    "masknet_parallel_ln": PARALLEL,
    "masknet_parallel_mcln": [*PARALLEL, "model.net_norm=mclayernorm"],
    "dcnv2": ["model.name=dcnv2", "model.parallel_dnn_hidden_units=[16]"],
    "dnn": ["model.name=dnn", "model.hidden_units=[16]"],
}


def _model(prepared_dir, overrides):
    from ctrcal.validate import load_config

    cfg = load_config(None, ["model.embedding_dim=4", *overrides])
    torch.manual_seed(0)
    model = create_model(cfg.model, FeatureMap.load(prepared_dir))
    # trained-looking weights: the initial ones leave some layers at exactly zero
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def rows(prepared_dir):
    batch = ParquetCTRData(prepared_dir, "train").all()
    return batch.categorical[:PARITY_ROWS], batch.numeric[:PARITY_ROWS]


def _eager(served, cat, num):
    with torch.no_grad():
        return served(cat, num).numpy()


def _check_parity(run, served, rows):
    """max |Δp| of ``run(cat, num)`` vs eager, both at batch 1 and at 4,096 over 10k rows."""
    cat, num = rows
    for size, stop in ((1, 64), (4096, PARITY_ROWS)):
        starts = range(0, stop, size)
        ref = np.concatenate([_eager(served, cat[i : i + size], num[i : i + size]) for i in starts])
        got = np.concatenate([run(cat[i : i + size], num[i : i + size]) for i in starts])
        assert ref.shape == got.shape == (stop,) and np.isfinite(ref).all()
        assert np.abs(got - ref).max() <= TOL, size


def _torchscript(served, fmap, tmp_path):
    path = tmp_path / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_model(
            served, path, "torchscript", example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2)
        )
    loaded = torch.jit.load(str(path))

    def run(cat, num):
        # the profiling executor re-optimises per new shape: seconds that test nothing here
        with torch.no_grad(), torch.jit.optimized_execution(False):
            return loaded(cat, num).numpy()

    return run


def _onnx(served, fmap, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    export_model(served, path, "onnx", example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["categorical", "numeric"]
    assert session.get_inputs()[0].type == "tensor(int64)"
    assert session.get_inputs()[1].type == "tensor(float)"

    def run(cat, num):
        return session.run(None, {"categorical": cat.numpy(), "numeric": num.numpy()})[0]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARITY))
def test_torchscript_matches_eager(name, prepared_dir, rows, tmp_path):
    served = ServedModel(_model(prepared_dir, PARITY[name]), FeatureMap.load(prepared_dir))
    _check_parity(_torchscript(served, FeatureMap.load(prepared_dir), tmp_path), served, rows)


# ONNX exports are the slow ones: every structure (serial, parallel, DCNv2, DNN) and each
# norm's export (LayerNorm, MC-LayerNorm's one-shot form) once; torchscript checks all pairs
ONNX_PARITY = ["masknet_serial_mcln", "masknet_parallel_ln", "dcnv2", "dnn"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ONNX_PARITY)
def test_onnx_matches_eager(name, prepared_dir, rows, tmp_path):
    served = ServedModel(_model(prepared_dir, PARITY[name]), FeatureMap.load(prepared_dir))
    _check_parity(_onnx(served, FeatureMap.load(prepared_dir), tmp_path), served, rows)


@pytest.mark.parametrize("norm", available_norms())
def test_every_norm_exports(norm, prepared_dir, rows, tmp_path):
    spec = "{name: contextnorm, field: C14}" if norm == "contextnorm" else norm
    if norm == "groupnorm":
        spec = "{name: groupnorm, num_groups: 2}"
    fmap = FeatureMap.load(prepared_dir)
    served = ServedModel(_model(prepared_dir, [*SERIAL, f"model.net_norm={spec}"]), fmap)
    run = _torchscript(served, fmap, tmp_path)
    cat, num = rows
    ref = _eager(served, cat[:4096], num[:4096])
    assert np.abs(run(cat[:4096], num[:4096]) - ref).max() <= TOL
    assert np.abs(run(cat[:1], num[:1]) - ref[:1]).max() <= TOL


class _Linear(torch.nn.Module):
    """A model whose exported logits equal the eager ones bit for bit (one matrix product)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, width))

    def forward(self, batch: Batch) -> torch.Tensor:
        return torch.nan_to_num(batch.numeric) @ self.weight


@pytest.mark.parametrize("name", ["temperature", "platt", "isotonic"])
def test_calibrators_fold_into_the_graph(name, prepared_dir, rows, tmp_path):
    from ctrcal.calibration.base import create_calibrator

    cat, num = rows
    fmap = FeatureMap.load(prepared_dir)
    # an isotonic table is a step function: a last-bit difference between the eager and the
    # exported logits (fused CPU kernels vs torch ops) can cross a step, so the table is
    # checked on a model whose logits the export reproduces exactly
    model = _Linear(fmap.num_numeric) if name == "isotonic" else _model(prepared_dir, SERIAL)
    with torch.no_grad():
        logits = model(Batch(cat, num, None)).double().numpy()
    labels = (np.random.default_rng(0).random(len(logits)) < 1 / (1 + np.exp(-logits))) * 1.0
    fitted = create_calibrator(name).fit(logits[:5000], labels[:5000])
    head = CalibrationHead(fitted)
    # the head computes the calibrator's own map ...
    with torch.no_grad():
        got = head(torch.from_numpy(logits).float()).double().numpy()
    assert np.abs(got - np.asarray(fitted.predict_proba(logits))).max() <= 1e-6
    # ... and the exported graph computes the head's
    served = ServedModel(model, fmap, head)
    _check_parity(_torchscript(served, fmap, tmp_path), served, rows)
    if name == "isotonic":  # serving.json ships the table itself
        assert head.params()["x_thresholds"] == fitted.x_thresholds_.tolist()


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_ids_outside_a_fields_vocabulary_are_served_as_its_oov_id(
    fmt, prepared_dir, rows, tmp_path
):
    fmap = FeatureMap.load(prepared_dir)
    model = _model(prepared_dir, PARITY["dnn"])
    served = ServedModel(model, fmap)
    run = (_torchscript if fmt == "torchscript" else _onnx)(served, fmap, tmp_path)
    cat, num = rows[0][:8], rows[1][:8]
    sizes = torch.tensor(fmap.vocab_sizes)
    oov = torch.tensor(fmap.oov_ids)

    def model_probs(ids):
        with torch.no_grad():
            return torch.sigmoid(model(Batch(ids, num, None))).numpy()

    # each field's last id is its own; its size (the next field's first row in the shared
    # table), -1 and a huge id are its OOV id, in every field at once and in the first alone
    edges = {"last": sizes - 1, "size": sizes, "minus_one": -1, "huge": 1 << 40}
    for name, value in edges.items():
        every = torch.as_tensor(value).expand_as(cat).clone()
        first = cat.clone()
        first[:, 0] = every[:, 0]
        for ids in (every, first):
            known = (ids >= 0) & (ids < sizes)
            want = model_probs(torch.where(known, ids, oov))
            got = run(ids, num)
            assert np.abs(got - want).max() <= TOL, name
            assert np.abs(_eager(served, ids, num) - want).max() <= TOL, name
    # the OOV row is not the next field's first row: the clamp changes what is served
    assert np.abs(model_probs(cat) - run(cat, num)).max() <= TOL
    shifted = cat.clone()
    shifted[:, 0] = sizes[0]
    clamped = cat.clone()
    clamped[:, 0] = oov[0]
    assert (
        np.abs(model_probs(clamped) - model_probs(shifted.clamp(max=int(sizes.sum()) - 1))).max()
        > 0
    )
