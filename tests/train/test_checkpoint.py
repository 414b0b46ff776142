"""Checkpoint files: model weights come back under the model's own keys, whenever written."""

from __future__ import annotations

import torch

from ctrcal.train.checkpoint import load_checkpoint, save_checkpoint


def test_only_an_unmarked_fully_prefixed_state_loses_the_adapter_prefix(tmp_path):
    w, b = torch.randn(3), torch.randn(1)
    # written through the old user-model adapter: every key prefixed, no mark
    torch.save(
        {"model": {"model.net.weight": w, "model.model.bias": b}, "epoch": 2},
        tmp_path / "adapter.pt",
    )
    old = load_checkpoint(tmp_path / "adapter.pt")
    assert list(old["model"]) == ["net.weight", "model.bias"] and old["epoch"] == 2
    assert torch.equal(old["model"]["net.weight"], w)
    # a built-in model's unmarked checkpoint: no prefix to take off
    torch.save({"model": {"embedding.table.weight": w, "model.bias": b}}, tmp_path / "own.pt")
    assert list(load_checkpoint(tmp_path / "own.pt")["model"]) == [
        "embedding.table.weight",
        "model.bias",
    ]
    # written now: a user model keeping everything under its own `self.model` is left alone
    save_checkpoint(tmp_path / "new.pt", {"model": {"model.weight": w}})
    assert list(load_checkpoint(tmp_path / "new.pt")["model"]) == ["model.weight"]


def test_the_adapter_prefix_leaves_the_module_versions_too(tmp_path):
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(2))
    state = net.state_dict()
    prefixed = type(state)((f"model.{k}", v) for k, v in state.items())
    prefixed._metadata = type(state._metadata)(
        [("", {"version": 1})]
        + [(f"model.{k}" if k else "model", v) for k, v in state._metadata.items()]
    )
    torch.save({"model": prefixed}, tmp_path / "adapter.pt")
    loaded = load_checkpoint(tmp_path / "adapter.pt")["model"]
    assert list(loaded) == list(state) and loaded._metadata == state._metadata
    net.load_state_dict(loaded)  # strict: every key matches
