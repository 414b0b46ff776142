"""Fine-tuning: start a run from another run's best weights, with its norms swapped.

``train.finetune_from`` names a finished run; its model is loaded, the norms at the
``emb_norm`` and ``net_norm`` positions are replaced with this config's (weights and biases
carried over, :func:`~ctrcal.layers.registry.replace_norms`), and the result is loaded into a
model built from this config, which must otherwise have the same architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ctrcal.config import Config
from ctrcal.errors import ConfigError
from ctrcal.layers.spec import NormSpec, is_no_norm, normalize_name
from ctrcal.models.registry import create_model

__all__ = ["finetune_model"]


def _norm_key(spec: NormSpec) -> tuple[str, tuple]:
    """What makes two specs the same layer: the name (every "no norm" alike) and arguments."""
    name = "none" if is_no_norm(spec) else normalize_name(spec.name)
    return name, tuple(sorted(spec.kwargs.items()))


def finetune_model(cfg: Config, feature_map: Any) -> nn.Module:
    """A model for ``cfg`` initialised from ``cfg.train.finetune_from``'s best weights.

    The source run's model is loaded, its norms at the ``emb_norm`` and ``net_norm`` positions
    are swapped with :func:`~ctrcal.layers.registry.replace_norms` for this config's (weights
    and biases carried over), and the result is loaded into a model built from ``cfg``, which
    must otherwise have the same architecture.
    """
    from ctrcal.layers.registry import replace_norms
    from ctrcal.train.results import load_run

    src_dir = Path(cfg.train.finetune_from)  # type: ignore[arg-type]
    src_model, src_cfg, src_fm = load_run(src_dir)
    if src_cfg.model.name != "masknet" or cfg.model.name != "masknet":
        raise ConfigError(
            "train.finetune_from: swapping norms into a trained run is implemented for masknet "
            f"runs only (source {src_cfg.model.name!r}, this config {cfg.model.name!r})"
        )
    if list(src_fm.vocab_sizes) != list(feature_map.vocab_sizes) or list(
        src_fm.numeric_fields
    ) != list(feature_map.numeric_fields):
        raise ConfigError(
            f"train.finetune_from: {src_dir} was trained on data with another feature map "
            "(vocabularies or numeric fields differ)"
        )
    positions = [("net_norm", src_model.blocks, [b.norm for b in src_model.blocks])]
    if src_model.emb_norm is not None:
        positions.append(("emb_norm", src_model.emb_norm, list(src_model.emb_norm.norms)))
    elif not is_no_norm(cfg.model.emb_norm):
        raise ConfigError(
            f"train.finetune_from: {src_dir} has no emb_norm; fine-tuning can swap a norm but "
            "not add one (set model.emb_norm: none)"
        )
    for key, container, current in positions:
        old: NormSpec = getattr(src_cfg.model, key)
        new: NormSpec = getattr(cfg.model, key)
        if _norm_key(old) == _norm_key(new):
            continue
        if is_no_norm(old):
            raise ConfigError(
                f"train.finetune_from: {src_dir} has no {key}; fine-tuning can swap a norm but "
                f"not add one (set model.{key}: none)"
            )
        replace_norms(container, new, target=tuple({type(m) for m in current}))
    model = create_model(cfg.model, feature_map)
    try:
        model.load_state_dict(src_model.state_dict(), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"train.finetune_from: {src_dir}'s architecture differs from model: ... beyond "
            f"the norms ({first})"
        ) from None
    return model
