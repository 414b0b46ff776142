"""ctrcal export: parity of the exported graphs with the eager model over a grid that pairs
every model, numeric embedding and norm and carries every foldable calibrator, in ONNX Runtime
and as a ``torch.export`` program (whose grid also has every other norm), and ids outside a
vocabulary in every member of that grid (on the same export); an AOTInductor package."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.data.feature_map import FeatureMap
from ctrcal.data.loader import ParquetCTRData
from ctrcal.layers.registry import available_norms
from ctrcal.models.build import create_model
from ctrcal.serving.export import (
    CalibrationHead,
    ServedModel,
    example_inputs,
    export_model,
    export_module,
)
from ctrcal.serving.formats import cxx_compiler

ROWS = 512
TOL = 1e-5
BUCKETS = 6
MODELS = {
    "masknet_serial": ["model.name=masknet", "model.variant=serial", "model.hidden_units=[8,8]"],
    "masknet_parallel": [
        "model.name=masknet",
        "model.variant=parallel",
        "model.num_blocks=2",
        "model.block_dim=8",
        "model.mlp_hidden_units=[8]",
    ],
    "dcnv2": ["model.name=dcnv2", "model.parallel_dnn_hidden_units=[8]"],
    "dnn": ["model.name=dnn", "model.hidden_units=[8]"],
}
EMBEDDINGS = ("linear", "bucket")
NORMS = ("layernorm", "mclayernorm")
# every model with every numeric embedding and every norm (on the embeddings and in the
# network), by name
CONFIGS = {
    f"{m}_{e}_{n}": [
        *overrides,
        f"model.numeric_embedding={e}",
        f"model.emb_norm={n}",
        f"model.net_norm={n}",
    ]
    for m, overrides in MODELS.items()
    for e in EMBEDDINGS
    for n in NORMS
}
# The exported grid covers every pair of levels: each model with each numeric embedding,
# each model with each norm, each embedding with each norm (8 of the 16 combinations; a
# model, an embedding and a norm are separate parts of the graph, so a failure needs one
# part or the meeting of two). Models alternate which embedding meets which norm.
GRID = {
    f"{m}_{e}_{n}": CONFIGS[f"{m}_{e}_{n}"]
    for i, m in enumerate(MODELS)
    for e, n in zip(EMBEDDINGS, NORMS if i % 2 else NORMS[::-1], strict=True)
}
# The temperature and Platt heads sit on grid members (a head's ops read the logits only, so
# any model under it will do, and the grid's other members keep the sigmoid); the isotonic
# head needs a model of its own (_calibrated says why).
HEADS = {"temperature": "dcnv2_linear_mclayernorm", "platt": "dnn_bucket_mclayernorm"}


@pytest.fixture(scope="module")
def data(prepared_dir):
    """(feature map with bucket boundaries, categorical [ROWS, Fc], numeric [ROWS, Fn]).

    The boundaries are values the rows hold, so many rows sit exactly on a boundary (a tie
    at a bucket's edge); the rows include missing numerics."""
    batch = ParquetCTRData(prepared_dir, "train").all()
    cat, num = batch.categorical[:ROWS], batch.numeric[:ROWS].clone()
    bounds = []
    for j in range(num.shape[1]):
        seen = num[:, j][~torch.isnan(num[:, j])].unique()
        pick = seen[torch.linspace(0, len(seen) - 1, BUCKETS - 1).long()].unique()
        bounds.append([float(v) for v in pick])
    num[::7, 0] = float("nan")
    fmap = dataclasses.replace(FeatureMap.load(prepared_dir), bucket_boundaries=bounds)
    return fmap, cat, num


def _model(fmap, overrides):
    from ctrcal.validate import load_config

    cfg = load_config(
        None, ["model.embedding_dim=4", f"features.numeric_buckets={BUCKETS}", *overrides]
    )
    torch.manual_seed(0)
    model = create_model(cfg.model, fmap)
    # trained-looking weights: the initial ones leave some layers at exactly zero
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


class _Linear(nn.Module):
    """A model whose exported logits equal the eager ones bit for bit in every engine (one
    product per row, no sum whose order an engine chooses)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(1.5))

    def forward(self, batch: Batch) -> torch.Tensor:
        return torch.nan_to_num(batch.numeric[:, 1]) * self.weight


class _Grid(nn.Module):
    """Many served models as one graph: ``[B, M]``, one column per model (one export)."""

    def __init__(self, members: dict[str, nn.Module]) -> None:
        super().__init__()
        self.names = list(members)
        self.members = nn.ModuleList(members.values())

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(categorical, numeric) for m in self.members], dim=1)


def _calibrated(name, model, fmap, cat, num):
    """``model`` served with the calibrator ``name`` fitted on its logits and folded in."""
    from ctrcal.calibration.base import create_calibrator

    with torch.no_grad():
        logits = model(Batch(cat, num, None)).double().numpy()
    labels = (np.random.default_rng(0).random(len(logits)) < 1 / (1 + np.exp(-logits))) * 1.0
    fitted = create_calibrator(name).fit(logits, labels)
    head = CalibrationHead(fitted)
    # the head computes the calibrator's own map
    with torch.no_grad():
        got = head(torch.from_numpy(logits).float()).double().numpy()
    assert np.abs(got - np.asarray(fitted.predict_proba(logits))).max() <= 1e-6
    if name == "isotonic":  # serving.json ships the table itself
        assert head.params()["x_thresholds"] == fitted.x_thresholds_.tolist()
    return ServedModel(model, fmap, head)


def _load(path, fmt):
    """``run(cat, num) -> numpy`` of an exported file, loaded as a server loads it."""
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        assert names == ["categorical", "numeric"]
        assert [i.type for i in session.get_inputs()] == ["tensor(int64)", "tensor(float)"]
        return lambda cat, num: session.run(None, {names[0]: cat.numpy(), names[1]: num.numpy()})[0]
    if fmt == "pt2":
        module = torch.export.load(str(path)).module()
    else:
        module = torch._inductor.aoti_load_package(str(path))

    def run(cat, num):
        with torch.no_grad():
            return module(cat, num).numpy()

    return run


def _export(module, fmap, fmt, tmp_path):
    path = tmp_path / f"model.{'onnx' if fmt == 'onnx' else 'pt2'}"
    export_module(
        module,
        example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2),
        path,
        fmt,
        input_names=["categorical", "numeric"],
    )
    return _load(path, fmt)


def _max_delta(run, module, cat, num):
    """Per output column, max |Δp| of ``run`` vs eager at batch 1 (16 rows) and 256."""
    worst = 0.0
    for size, stop in ((1, 16), (256, len(cat))):
        for i in range(0, stop, size):
            with torch.no_grad():
                ref = module(cat[i : i + size], num[i : i + size]).numpy()
            got = run(cat[i : i + size], num[i : i + size])
            assert got.shape == ref.shape and np.isfinite(ref).all()
            worst = np.maximum(worst, np.abs(got - ref).reshape(len(ref), -1).max(axis=0))
    return worst


def _members(fmt, fmap, cat, num):
    """The grid's members for ``fmt``: ``{name: ServedModel}``."""
    members = {}
    for name, overrides in GRID.items():
        model = _model(fmap, overrides)
        head = next((h for h, on in HEADS.items() if on == name), None)
        if head is None:
            members[name] = ServedModel(model, fmap)
        else:
            members[f"{name}+{head}"] = _calibrated(head, model, fmap, cat, num)
    # an isotonic table is a step function: a last-bit difference between the eager and the
    # exported logits can cross a step, so it sits on a model whose logits the export
    # reproduces exactly
    members["isotonic"] = _calibrated("isotonic", _Linear(), fmap, cat, num)
    if fmt == "pt2":
        # every other registered norm in the serial MaskNet's network (the grid has that
        # model with LayerNorm and with MC-LayerNorm there), in the torch.export program that
        # every format starts from; in the same export as the grid's, not one of its own
        specs = {
            "contextnorm": "{name: contextnorm, field: C14}",
            "groupnorm": "{name: groupnorm, num_groups: 2}",
        }
        for n in available_norms():
            if n not in NORMS:
                overrides = [*MODELS["masknet_serial"], f"model.net_norm={specs.get(n, n)}"]
                members[f"masknet_serial_{n}"] = ServedModel(_model(fmap, overrides), fmap)
    return members


def _check_unknown_ids(grid, run, fmap, cat, num):
    """An id outside its field's vocabulary is served as the field's OOV id, in every member
    of ``grid``, exported (``run``) and eager."""
    sizes = torch.tensor(fmap.vocab_sizes)
    oov = torch.tensor(fmap.oov_ids)

    def model_probs(ids, num):
        """Each member's model and head on ``ids`` as they are: the served graph without its
        clamp (``[B, M]``)."""
        cols = []
        with torch.no_grad():
            for served in grid.members:
                logits = served.model(Batch(ids, num, None)).reshape(-1).float()
                cols.append(torch.sigmoid(logits) if served.head is None else served.head(logits))
        return torch.stack(cols, dim=1).numpy()

    # each field's last id is its own; its size (the next field's first row in the shared
    # table), -1 and a huge id are its OOV id, in every field at once and in the first alone
    edges = {"last": sizes - 1, "size": sizes, "minus_one": -1, "huge": 1 << 40}
    cases = {"in range": cat}
    for name, value in edges.items():
        every = torch.as_tensor(value).expand_as(cat).clone()
        first = cat.clone()
        first[:, 0] = every[:, 0]
        cases[f"{name}, every field"], cases[f"{name}, first field"] = every, first
    # all the cases as one batch of 8 rows each: one pass of the grid, exported and eager
    ids, nums = torch.cat(list(cases.values())), num.repeat(len(cases), 1)
    known = (ids >= 0) & (ids < sizes)
    want = model_probs(torch.where(known, ids, oov), nums)
    got = run(ids, nums)
    with torch.no_grad():
        eager = grid(ids, nums).numpy()
    for k, name in enumerate(cases):
        rows = slice(k * len(cat), (k + 1) * len(cat))
        assert np.abs(got[rows] - want[rows]).max() <= TOL, name
        assert np.abs(eager[rows] - want[rows]).max() <= TOL, name
    # the OOV row is not the next field's first row: the clamp changes what is served
    shifted = cat.clone()
    shifted[:, 0] = sizes[0]
    clamped = cat.clone()
    clamped[:, 0] = oov[0]
    unclamped = shifted.clamp(max=int(sizes.sum()) - 1)
    assert np.abs(model_probs(clamped, num) - model_probs(unclamped, num)).max() > 0


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_the_grid_exports_with_parity_and_serves_unknown_ids_as_oov(fmt, data, tmp_path):
    """Parity of every member, then ids outside a vocabulary in every member
    (``_check_unknown_ids``), on one export: the export is most of this test's time, and both
    checks read the same file."""
    fmap, cat, num = data
    grid = _Grid(_members(fmt, fmap, cat, num)).eval()
    run = _export(grid, fmap, fmt, tmp_path)
    delta = _max_delta(run, grid, cat, num)
    bad = {n: float(d) for n, d in zip(grid.names, delta, strict=True) if d > TOL}
    assert not bad, bad
    _check_unknown_ids(grid, run, fmap, cat[:8], num[:8])


@pytest.mark.slow
def test_an_aoti_package_loads_from_python(data, tmp_path):
    """AOTInductor compiles C++ (a minute or more): one tiny model, the bucketized MaskNet
    with MC-LayerNorm and a folded Platt head."""
    if cxx_compiler() is None:
        pytest.skip("AOTInductor needs a C++ compiler (g++, clang++ or c++) on PATH")
    fmap, cat, num = data
    model = _model(fmap, CONFIGS["masknet_serial_bucket_mclayernorm"])
    served = _calibrated("platt", model, fmap, cat, num).eval()
    path = tmp_path / "model.pt2"
    export_model(served, path, "aoti", example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2))
    assert (_max_delta(_load(path, "aoti"), served, cat, num) <= TOL).all()


@pytest.mark.parametrize(("fmt", "precision"), [("pt2", "bf16"), ("onnx", "int8")])
def test_reduced_precision_exports_stay_close_and_leave_the_model_as_it_was(
    fmt, precision, data, tmp_path
):
    fmap, cat, num = data
    served = ServedModel(_model(fmap, CONFIGS["masknet_serial_bucket_layernorm"]), fmap).eval()
    before = {k: v.clone() for k, v in served.state_dict().items()}
    path = tmp_path / f"model.{fmt}"
    example = example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2)
    export_model(served, path, fmt, example, precision=precision)
    after = served.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    run = _load(path, fmt)
    with torch.no_grad():
        want = served(cat, num).numpy()
    got = run(cat, num)
    assert got.dtype == np.float32 and got.shape == want.shape
    # rounded weights and activations: close to float32, not equal (on a tiny model with
    # random weights; the AUC a trained model keeps is in docs/serving.md)
    assert 0 < np.abs(got - want).max() <= 0.1


def test_a_precision_the_format_cannot_hold_is_refused(data, tmp_path):
    from ctrcal.core.errors import ConfigError

    fmap, _, _ = data
    served = ServedModel(_model(fmap, MODELS["dnn"]), fmap)
    example = example_inputs(fmap.vocab_sizes, fmap.num_numeric, 2)
    with pytest.raises(ConfigError, match=r"--precision bf16: the onnx format cannot hold it"):
        export_model(served, tmp_path / "m.onnx", "onnx", example, precision="bf16")
    with pytest.raises(ConfigError, match=r"unknown precision 'fp8' \(valid: fp32, bf16, int8\)"):
        export_model(served, tmp_path / "m.pt2", "pt2", example, precision="fp8")
