"""Can the prepared data take the shifts a config trains under? One rule, asked by
``ctrcal validate --data`` (every training shift of the config) and by ``train`` before
anything is built (its own ``train.train_shift``): a shift needs a feature of the kind it
perturbs, and Gaussian noise in original space needs the data's original-space statistics.
Imports no torch until an original-space shift is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctrcal.core.errors import DataError

__all__ = ["check_original_space", "check_shifts_apply", "check_training_data", "training_shifts"]


def training_shifts(cfg: Any, report: bool = True) -> list[tuple[str, Any]]:
    """``(config key, TrainShiftConfig)`` of every shift a config trains under:
    ``train.train_shift`` and, with ``report``, each report variant's."""
    found = [("train.train_shift", cfg.train.train_shift)]
    if report:
        found += [
            (f"report.variants[{i}].train_shift", v.train_shift)
            for i, v in enumerate(cfg.report.variants)
        ]
    return [(key, spec) for key, spec in found if spec is not None]


def check_shifts_apply(
    shifts: list[tuple[str, Any]], feature_map: Any, data_dir: Path, cfg: Any
) -> None:
    """Refuse a shift whose feature kind the data lacks (Gaussian noise without numerics).

    Args:
        shifts: ``(config key, ShiftKind)`` pairs.
        feature_map: the prepared data's feature map.
        data_dir: where it lives, for the message.
        cfg: the config (:meth:`~ctrcal.config.Config.where` names the file that set a key).

    Raises:
        DataError: naming the key, the shift and the data.
    """
    have = {"numeric": feature_map.num_numeric, "categorical": feature_map.num_categorical}
    for key, kind in shifts:
        if kind.acts_on is not None and have.get(kind.acts_on, 0) == 0:
            raise DataError(
                f"{cfg.where(key)}: the shift {kind.name} perturbs {kind.acts_on} features, and "
                f"the data in {data_dir} has none; drop it or choose a shift of the "
                f"{'categorical' if kind.acts_on == 'numeric' else 'numeric'} features"
            )


def check_original_space(key: str, feature_map: Any, data_dir: Path, cfg: Any) -> None:
    """Refuse an original-space shift (at ``key``) on data without original-space statistics,
    naming the key."""
    from ctrcal.shifts.builtin import original_space_codec

    try:
        original_space_codec(feature_map, str(Path(data_dir) / "feature_map.json"))
    except DataError as exc:
        raise DataError(f"{exc} [{cfg.where(key)}]") from None


def check_training_data(cfg: Any, feature_map: Any, data_dir: Path, report: bool = True) -> None:
    """The training shifts of ``cfg`` (see :func:`training_shifts`) against the data: each
    needs a feature of its kind, and an original-space one the original-space statistics.

    Raises:
        DataError: one line naming the config key, the shift and the data.
    """
    from ctrcal.shifts.registry import get_shift

    shifts = [(key, spec, get_shift(spec.name)) for key, spec in training_shifts(cfg, report)]
    check_shifts_apply([(key, kind) for key, _, kind in shifts], feature_map, data_dir, cfg)
    for key, spec, kind in shifts:
        space = spec.space if spec.space is not None else kind.options.get("space", (None,))[0]
        if space == "original":
            check_original_space(f"{key}.space", feature_map, data_dir, cfg)
