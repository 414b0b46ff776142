"""Building a registered model: ``create_model`` and the contract check of its output.

:mod:`ctrcal.models.registry` names, resolves and checks models; this module builds them and
runs the user-model contract's probe: one forward pass on two rows (see
:func:`check_model_output`). It imports no config: a model is built from a name and keyword
arguments (a config's ``model`` section is one such pair).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError
from ctrcal.core.norm_spec import NormSpec, parse_norm_spec
from ctrcal.layers.context import bind_contexts
from ctrcal.layers.registry import replace_norms
from ctrcal.models.registry import resolve_model

__all__ = ["check_model_output", "create_model"]


def create_model(
    spec: Any,
    feature_map: Any,
    *,
    check: bool = True,
    **kwargs: Any,
) -> nn.Module:
    """Build a model for ``feature_map``: ``model(batch) -> logits [B]``.

    Args:
        spec: a registered name, an import path ``pkg.mod:Class``, a class / factory
            following the user-model contract, or anything with ``.name`` and ``.kwargs``
            (a config's ``model`` section) standing for that name and those arguments.
        feature_map: the data's :class:`~ctrcal.data.feature_map.FeatureMap`.
        check: run the contract check (one forward pass on two rows, see
            :func:`check_model_output`).
        **kwargs: the model's keyword arguments (override the section's).

    Returns:
        The model as its factory built it (built-in or user model alike), on the CPU, with
        every context norm bound to its field (:func:`~ctrcal.layers.context.bind_contexts`).

    Raises:
        ConfigError: unknown model, bad arguments, or a model that breaks the contract.
    """
    if isinstance(getattr(spec, "name", None), str) and isinstance(
        getattr(spec, "kwargs", None), dict
    ):
        kwargs = {**spec.kwargs, **kwargs}
        spec = spec.name
    entry = resolve_model(spec)
    params = entry.parameters()
    replace = None
    if "net_norm" in kwargs and "net_norm" not in params and not entry.accepts_any():
        replace = kwargs.pop("net_norm")
    label = f"model: {entry.name}"
    factory = entry.factory
    try:
        if entry.data_args is not None:
            model = factory(**entry.data_args(feature_map), **kwargs)
        else:
            model = factory(feature_map, **kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{label}: constructing it returned a {type(model).__name__}, not a torch.nn.Module"
        )
    if replace is not None:
        if isinstance(replace, (str, dict)):
            replace = parse_norm_spec(replace)
        keep = isinstance(replace, NormSpec) and (
            replace.name.lower() == "layernorm" and not replace.kwargs
        )
        if not keep and replace_norms(model, replace) == 0:
            shown = replace.name if isinstance(replace, NormSpec) else replace
            raise ConfigError(
                f"{label}: net_norm {shown!r} was given but the model has no nn.LayerNorm to "
                "replace (and no net_norm argument)"
            )
    bind_contexts(model, getattr(feature_map, "categorical_fields", None))
    if check:
        check_model_output(model, feature_map, label)
    return model


def _probe_batch(feature_map: Any, rows: int = 2) -> Batch:
    fc = len(getattr(feature_map, "vocab_sizes", []))
    fn = len(getattr(feature_map, "numeric_fields", []))
    categorical = torch.zeros(rows, fc, dtype=torch.int64)
    numeric = torch.zeros(rows, fn, dtype=torch.float32)
    if fn:
        numeric[1] = 1.0
    return Batch(categorical, numeric, None)


def check_model_output(model: nn.Module, feature_map: Any, label: str = "model") -> None:
    """One evaluation-mode forward pass on two rows: logits must be a float tensor ``[2]``.

    Runs without gradients, with the RNG state restored afterwards (the probe changes nothing
    a training run would compute) and the module's training flag restored.

    Raises:
        ConfigError: the forward pass fails or returns the wrong type, shape or dtype.
    """
    batch = _probe_batch(feature_map)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = model(batch.to(device))
    except ConfigError:
        raise
    except Exception as exc:  # the user's forward: report it as a contract failure
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{label}: forward on a 2-row probe batch failed ({type(exc).__name__}: {first}); "
            "a model's forward(batch) must accept batch.categorical int64 [B, Fc] and "
            "batch.numeric float32 [B, Fn]"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"{label}: forward returned a {type(out).__name__}; expected a tensor of logits [B]"
        )
    if tuple(out.shape) != (2,):
        raise ConfigError(
            f"{label}: forward returned shape {list(out.shape)} for a batch of 2 rows; "
            "expected logits of shape [B] = [2] (squeeze a trailing 1)"
        )
    if not out.is_floating_point():
        raise ConfigError(
            f"{label}: forward returned dtype {out.dtype}; expected floating-point logits"
        )
