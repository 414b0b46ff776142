"""MaskNet: serial/parallel structure, masks on the raw embedding, norms, init, create_model."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from batches import random_batch
from torch import nn

from ctrcal.config import ModelConfig
from ctrcal.core.batch import Batch
from ctrcal.core.criteo_schema import NUM_CATEGORICAL, NUM_NUMERIC
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec
from ctrcal.layers.mask_block import MaskBlock
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.layers.registry import replace_norms
from ctrcal.models.build import create_model
from ctrcal.models.masknet import MaskNet
from ctrcal.validate import load_config

VOCAB = [11, 5, 7]
FN = 4
D = 6
F = FN + len(VOCAB)


def _inputs(b: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB, FN, b, seed)


def _model(**kwargs) -> MaskNet:
    torch.manual_seed(0)
    args = {
        "vocab_sizes": VOCAB,
        "num_numeric": FN,
        "embedding_dim": D,
        "hidden_units": [16, 12],
        **kwargs,
    }
    return MaskNet(**args)


@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_logits_shape_and_grads(variant):
    model = _model(
        variant=variant,
        num_blocks=3,
        block_dim=10,
        mlp_hidden_units=[9, 7],
        emb_norm="layernorm",
        dropout=0.1,
    )
    cat, num = _inputs()
    out = model(Batch(cat, num, None))
    assert out.shape == (8,) and out.dtype == torch.float32
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_serial_structure():
    model = _model(hidden_units=[16, 12, 9], reduction_ratio=0.5)
    widths = [(b.input_dim, b.hidden_dim, b.output_dim) for b in model.blocks]
    assert widths == [(F * D, F * D, 16), (F * D, 16, 12), (F * D, 12, 9)]
    assert [b.mask_layer[0].out_features for b in model.blocks] == [F * D // 2, 8, 6]
    assert isinstance(model.head, nn.Linear) and model.head.in_features == 9


def test_parallel_structure():
    model = _model(
        variant="parallel", num_blocks=3, block_dim=10, mlp_hidden_units=[9, 7], dropout=0.2
    )
    assert [(b.hidden_dim, b.output_dim) for b in model.blocks] == [(F * D, 10)] * 3
    linears = [m for m in model.head if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(30, 9), (9, 7), (7, 1)]
    assert sum(isinstance(m, nn.Dropout) for m in model.head) == 2


def _capture_block_inputs(model: MaskNet) -> list[tuple[torch.Tensor, torch.Tensor]]:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda mod, args: seen.append(args))
    return seen


@pytest.mark.parametrize("variant", ["serial", "parallel"])
def test_every_mask_reads_the_raw_flattened_embedding(variant):
    model = _model(variant=variant, emb_norm="layernorm", num_blocks=2, block_dim=10).eval()
    for n in model.emb_norm.norms:  # make the normed embedding clearly differ from the raw one
        nn.init.normal_(n.bias)
    seen = _capture_block_inputs(model)
    cat, num = _inputs()
    model(Batch(cat, num, None))
    raw = model.embed(cat, num).flatten(1)
    normed = model.emb_norm(model.embed(cat, num)).flatten(1)
    assert len(seen) == len(model.blocks)
    for v_emb, _ in seen:
        torch.testing.assert_close(v_emb, raw)
    torch.testing.assert_close(seen[0][1], normed)  # the first block masks the normed input
    if variant == "serial":  # each next block masks the previous block's output
        assert seen[1][1].shape == (8, 16)
    else:  # every parallel block masks the same (normed) embedding
        torch.testing.assert_close(seen[1][1], normed)


def test_without_emb_norm_the_first_block_masks_the_raw_embedding():
    model = _model().eval()
    seen = _capture_block_inputs(model)
    cat, num = _inputs()
    model(Batch(cat, num, None))
    torch.testing.assert_close(seen[0][0], seen[0][1])


@pytest.mark.parametrize(
    "net_norm, cls",
    [
        ("layernorm", nn.LayerNorm),
        ("mclayernorm", MCLayerNorm),
        (NormSpec("mclayernorm", {"fraction": 0.5}), MCLayerNorm),
        ("none", nn.Identity),
    ],
)
def test_net_norm_in_every_block(net_norm, cls):
    model = _model(net_norm=net_norm, emb_norm="mclayernorm")
    assert all(type(b.norm) is cls for b in model.blocks)
    assert all(type(n) is MCLayerNorm for n in model.emb_norm.norms)
    assert len(model.emb_norm.norms) == F


def test_replace_norms_swaps_every_layernorm():
    model = _model(emb_norm="layernorm")
    assert replace_norms(model, "mclayernorm", fraction=0.5) == len(model.blocks) + F
    assert all(isinstance(b.norm, MCLayerNorm) for b in model.blocks)
    cat, num = _inputs()
    # FieldNorm falls back to per-field layers
    assert torch.isfinite(model(Batch(cat, num, None))).all()


def test_init_xavier_normal_and_small_embeddings():
    torch.manual_seed(0)
    model = MaskNet([100_000], 13, 16, hidden_units=[400, 400])
    for m in model.modules():
        if isinstance(m, nn.Linear):
            std = math.sqrt(2.0 / (m.in_features + m.out_features))
            assert abs(m.weight.std().item() / std - 1) < 0.1
            if m.bias is not None:
                assert torch.count_nonzero(m.bias) == 0
    assert model.embedding.table.weight.std().item() < 2e-4


def test_nan_numerics_give_finite_logits_and_grads():
    model = _model(emb_norm="layernorm")
    cat, num = _inputs()
    num[::2, :] = float("nan")
    out = model(Batch(cat, num, None))
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_numeric_shift_moves_predictions_behind_emb_norm():
    model = _model(emb_norm="layernorm").eval()
    cat, num = _inputs()
    base = model(Batch(cat, num, None))
    shifted = model(Batch(cat, num + 0.05, None))  # small: no sign flips
    assert (base - shifted).abs().max() > 0


def test_bf16_autocast_on_cpu():
    model = _model()
    cat, num = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(Batch(cat, num, None))
    assert out.shape == (8,) and torch.isfinite(out.float()).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"variant": "wide"}, "variant"),
        ({"hidden_units": []}, "hidden_units"),
        ({"variant": "parallel", "num_blocks": 0}, "num_blocks"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model(**kwargs)


def _feature_map(buckets=None) -> SimpleNamespace:
    return SimpleNamespace(
        vocab_sizes=[7] * NUM_CATEGORICAL,
        numeric_fields=[f"I{i}" for i in range(1, NUM_NUMERIC + 1)],
        bucket_boundaries=buckets,
    )


def test_create_model_from_config():
    cfg = ModelConfig(
        embedding_dim=4,
        hidden_units=[8, 8],
        reduction_ratio=0.5,
        net_norm=NormSpec("mclayernorm", {"fraction": 0.5}),
    )
    model = create_model(cfg, _feature_map())
    assert model.embedding.num_fields == NUM_CATEGORICAL + NUM_NUMERIC
    assert len(model.blocks) == 2 and isinstance(model.blocks[0].norm, MCLayerNorm)
    assert model.blocks[0].norm.fraction == 0.5
    cfg = ModelConfig(variant="parallel", num_blocks=2, block_dim=8, mlp_hidden_units=[8])
    assert isinstance(create_model(cfg, _feature_map()).blocks[1], MaskBlock)


def test_create_model_bucket_errors_name_the_key():
    cfg = ModelConfig(embedding_dim=4, hidden_units=[8], numeric_embedding="bucket")
    with pytest.raises(ConfigError, match="model:.*numeric_buckets"):
        create_model(cfg, _feature_map())
    model = create_model(cfg, _feature_map([[0.0, 1.0]] * NUM_NUMERIC))
    assert model.embedding.numeric_embedding == "bucket"


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_builds_a_model(path):
    cfg = load_config(path, check_names=False)  # validated by tests/test_validate.py
    model = create_model(cfg.model, _feature_map([[0.0, 1.0]] * NUM_NUMERIC))
    if cfg.model.name == "masknet":
        assert model.variant == cfg.model.variant
    else:
        assert type(model).__name__.lower() == cfg.model.name
    cat = torch.zeros(2, NUM_CATEGORICAL, dtype=torch.long)
    assert model(Batch(cat, torch.randn(2, NUM_NUMERIC), None)).shape == (2,)
