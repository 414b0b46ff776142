"""Checkpoints of the built-in models keep their parameter names and shapes.

``state_dict_keys.json`` holds, per shipped config (and a few norm and structure variants),
the ``state_dict`` keys and shapes in order as the models wrote them when recorded; a model
whose keys change could no longer load the checkpoints of earlier runs. Models are built on a
feature map of the config's schema with two ids per field.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ctrcal.data.schema import CRITEO, resolve_schema
from ctrcal.models.build import create_model
from ctrcal.validate import load_config

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).with_name("state_dict_keys.json")).read_text())
VARIANTS = {
    "masknet_contextnorm": ["model.name=masknet", "model.net_norm={name: contextnorm, field: C14}"],
    "masknet_parallel_mclayernorm": [
        "model.name=masknet",
        "model.variant=parallel",
        "model.net_norm=mclayernorm",
        "model.emb_norm=layernorm",
    ],
    "dcnv2_stacked_parallel_mixture": [
        "model.name=dcnv2",
        "model.structure=stacked_parallel",
        "model.net_norm=mclayernorm",
        "model.low_rank=4",
        "model.num_experts=2",
    ],
    "dnn_contextnorm": [
        "model.name=dnn",
        "model.net_norm={name: contextnorm, field: C3}",
        "model.emb_norm=layernorm",
    ],
}


def _feature_map(cfg):
    schema = resolve_schema(cfg.data.schema, ROOT / "configs") or CRITEO
    numeric = list(schema.numeric)
    buckets = cfg.features.numeric_buckets
    return SimpleNamespace(
        vocab_sizes=[2] * len(schema.categorical_fields),
        categorical_fields=list(schema.categorical_fields),
        numeric_fields=numeric,
        bucket_boundaries=(
            [[float(b) for b in range(buckets - 1)] for _ in numeric] if buckets >= 2 else None
        ),
    )


def test_every_shipped_config_is_recorded():
    shipped = {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert shipped <= RECORDED.keys()


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_state_dict_keys_and_shapes_are_as_recorded(name):
    if name in VARIANTS:
        cfg = load_config(None, VARIANTS[name])
    else:
        # validated by tests/test_validate.py; the model's defaults are what matter here
        cfg = load_config(ROOT / "configs" / name, [], check_names=False)
    model = create_model(cfg.model, _feature_map(cfg), check=False)
    keys = [f"{k} {list(v.shape)}" for k, v in model.state_dict().items()]
    assert keys == RECORDED[name]
