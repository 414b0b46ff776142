"""Fine-tuning: start a run from another run's best weights, with its norms swapped.

``train.finetune_from`` names a finished run of the same model. The model is built from this
config (its norm specs at every ``*_norm`` position included) and initialised from the source
run's weights: every module the two share is copied exactly; a norm this config swaps (the
same place in the model, another class: LayerNorm -> MC-LayerNorm, say) takes over the
source's ``weight``/``bias`` where the shapes agree. It works for every registered model
because it compares the two module trees by path instead of knowing where a model keeps
its norms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrcal.config import Config
from ctrcal.core.errors import ConfigError
from ctrcal.models.build import create_model

__all__ = ["finetune_model"]


def finetune_model(cfg: Config, feature_map: Any, data_dir: str | Path) -> nn.Module:
    """A model for ``cfg`` on ``data_dir`` initialised from ``cfg.train.finetune_from``'s best
    weights.

    Raises:
        DataError: ``data_dir`` is encoded with another feature map (vocabularies, transforms,
            schema) than the source run's data: its ids would mean other values.
        ConfigError: the source is another model, or differs from ``cfg.model`` beyond the
            classes of its norm layers (a norm cannot be added or removed: it would have no
            trained weights to start from).
    """
    from ctrcal.train.results import load_run
    from ctrcal.train.runs import check_same_features

    src_dir = Path(cfg.train.finetune_from)  # type: ignore[arg-type]
    src_model, src_cfg, _ = load_run(src_dir)
    if src_cfg.model.name != cfg.model.name:
        raise ConfigError(
            f"train.finetune_from: {src_dir} is a {src_cfg.model.name!r} run and this config "
            f"trains {cfg.model.name!r}; fine-tuning swaps norms within one model"
        )
    check_same_features(src_dir, data_dir, "train.finetune_from")
    model = create_model(cfg.model, feature_map)
    swapped = _swapped_modules(src_model, model, src_dir)
    _load_weights(src_model, model, swapped, src_dir)
    return model


def _swapped_modules(src: nn.Module, dst: nn.Module, src_dir: Path) -> set[str]:
    """Paths of the modules whose class differs; raises unless the trees match otherwise."""
    src_mods, dst_mods = dict(src.named_modules()), dict(dst.named_modules())
    common = src_mods.keys() & dst_mods.keys()
    swapped = {p for p in common if type(src_mods[p]) is not type(dst_mods[p])}
    inside = lambda path: any(path.startswith(f"{s}.") for s in swapped)  # noqa: E731
    added = sorted(p for p in dst_mods.keys() - src_mods.keys() if not inside(p))
    removed = sorted(p for p in src_mods.keys() - dst_mods.keys() if not inside(p))
    if added or removed:
        what = (
            f"adds {added[0]!r} ({type(dst_mods[added[0]]).__name__})"
            if added
            else f"drops {removed[0]!r} ({type(src_mods[removed[0]]).__name__})"
        )
        raise ConfigError(
            f"train.finetune_from: this config {what} relative to {src_dir}'s model; "
            "fine-tuning can swap a norm for another but not add or remove one, and the "
            "architecture must otherwise be the same (model: ... beyond the *_norm keys)"
        )
    return swapped


def _load_weights(src: nn.Module, dst: nn.Module, swapped: set[str], src_dir: Path) -> None:
    """Copy every tensor of ``src`` into ``dst``; swapped norms keep what fits."""
    src_state, dst_state = src.state_dict(), dst.state_dict()

    def owner(key: str) -> str | None:
        return next((s for s in swapped if key.startswith(f"{s}.")), None)

    for key, value in dst_state.items():
        theirs = src_state.get(key)
        if owner(key) is not None:
            # a swapped norm: carry the affine over (same meaning in every LayerNorm family
            # member); its own extra state keeps the new layer's initialisation
            if theirs is not None and theirs.shape == value.shape:
                with torch.no_grad():
                    value.copy_(theirs)
            continue
        if theirs is None or theirs.shape != value.shape:
            got = "missing" if theirs is None else f"shape {tuple(theirs.shape)}"
            raise ConfigError(
                f"train.finetune_from: {src_dir}'s architecture differs from model: ... beyond "
                f"the norms ({key}: {got} in the source run, {tuple(value.shape)} here)"
            )
        with torch.no_grad():  # state_dict tensors share storage with the parameters
            value.copy_(theirs)
    extra = [k for k in src_state if k not in dst_state and owner(k) is None]
    if extra:
        raise ConfigError(
            f"train.finetune_from: {src_dir}'s architecture differs from model: ... beyond "
            f"the norms ({extra[0]} exists only in the source run)"
        )
