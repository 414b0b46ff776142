"""The run directory: its file names, which config keys define a run, and the data it used.

The trainer, the sweep, the report and the command line all ask this module; none of them
restates a rule written here. A run directory holds::

    RUN/config.yaml              the resolved config (load_config reads it back)
    RUN/feature_map.json         copy of the data's feature map (the model's input contract)
    RUN/data.json                where the data was, its identity and its splits
    RUN/metrics.jsonl            one JSON line per finished epoch
    RUN/checkpoints/last.pt      everything to resume: weights, optimizer, RNG, schedule, best
    RUN/checkpoints/best.pt      the best epoch's weights
    RUN/result.json              the outcome; present = the run is finished

Rules owned here:

* :data:`RUNTIME_KEYS` / :func:`is_runtime_key`: the config keys that change how fast, where
  or how visibly a run goes, never what it learns. Everything else is the run's
  :func:`run_signature`: a finished run is reused and an interrupted run resumed only under
  an equal signature, and only on the same data: the data identity the run recorded in
  ``data.json`` (:mod:`ctrcal.data.identity`) must be the data's (:func:`check_same_data`);
  evaluating on other data or fine-tuning from the run needs the same feature identity
  (:func:`check_same_features`).
* :func:`prepared_data_dir`: the prepared directory a command works on (``--data``, else
  ``data.prepared_dir``, else the config's data prepared into ``OUT/data``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrcal.core.errors import ConfigError, CtrcalError, DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE
from ctrcal.data.identity import data_identity, feature_identity, short

if TYPE_CHECKING:
    from ctrcal.config import Config

__all__ = [
    "BEST",
    "CONFIG_FILE",
    "DATA_FILE",
    "LAST",
    "METRICS_FILE",
    "RESULT_FILE",
    "RUNTIME_KEYS",
    "check_resumable",
    "check_same_data",
    "check_same_features",
    "is_runtime_key",
    "load_run_config",
    "prepared_data_dir",
    "recorded_identity",
    "run_data",
    "run_data_dir",
    "run_progress",
    "run_signature",
    "run_state",
    "same_data",
    "saved_config",
    "signature_diff",
    "write_run_files",
]

CONFIG_FILE = "config.yaml"
DATA_FILE = "data.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
CHECKPOINTS = "checkpoints"
BEST = f"{CHECKPOINTS}/best.pt"
LAST = f"{CHECKPOINTS}/last.pt"
BEST_PREV = f"{CHECKPOINTS}/best.prev.pt"  # the previous best while a new one is uncommitted
DATA_SUBDIR = "data"  # where a command prepares the config's data under its output directory

# Keys that change how fast, where or how visibly a run goes, not what it learns. A key ending
# in "." covers its whole section. Compiled graphs, oneDNN GEMMs and device placement compute
# the same model up to float rounding, as a different thread count does.
RUNTIME_KEYS: tuple[str, ...] = (
    "out_dir",
    "data.prepared_dir",  # where the data lives; the data itself is checked by identity
    "data.engine",  # who prepares the data: both engines write the same bytes
    "data.ray_address",
    "train.progress",
    "train.device",
    "train.num_threads",
    "train.data_mode",
    "train.compile",
    "train.eval_batch_size",
    "train.cpu_matmul",
    "train.max_embedding_gib",  # a limit checked before training, never what is learnt
    "train.loggers",  # run tracking: where the numbers are also sent
    "train.log_every",
    "train.tracking_uri",
    "train.experiment",
    "report.",  # the report's protocol (seeds, intensities, workers) never changes a run
)


def is_runtime_key(key: str) -> bool:
    """Whether dotted ``key`` is free to differ between runs that are the same run."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RUNTIME_KEYS)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def run_signature(cfg: Config | dict[str, Any]) -> dict[str, Any]:
    """Dotted key -> value for every key that defines what a run learns."""
    from ctrcal.config import config_to_dict

    d = cfg if isinstance(cfg, dict) else config_to_dict(cfg)
    return {k: v for k, v in _flatten(d).items() if not is_runtime_key(k)}


def signature_diff(
    saved: Config | dict[str, Any], now: Config | dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for every signature key that differs."""
    a, b = run_signature(saved), run_signature(now)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def recorded_identity(run_dir: str | Path, kind: str = "data") -> str | None:
    """The data (``kind="data"``) or feature identity (``"feature"``) a run recorded in
    ``data.json`` when it started (:mod:`ctrcal.data.identity`); None when unrecorded."""
    try:
        value = json.loads((Path(run_dir) / DATA_FILE).read_text()).get(f"{kind}_identity")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


_UNRECORDED = (
    "{run_dir}: records no identity of the data it was trained on (no data.json, or one "
    "written by an earlier ctrcal), so no data can be checked against it; train it again"
)


def same_data(run_dir: str | Path, data_dir: str | Path) -> bool:
    """Whether ``data_dir`` holds the rows and encoding ``run_dir`` was trained on."""
    recorded = recorded_identity(run_dir)
    return recorded is not None and recorded == data_identity(data_dir)


def check_same_data(run_dir: str | Path, data_dir: str | Path, action: str) -> None:
    """Raise unless ``data_dir`` is the data ``run_dir`` was trained on (resume, reuse).

    Raises:
        DataError: another data identity (both are named).
    """
    if recorded_identity(run_dir) is None:
        raise DataError(_UNRECORDED.format(run_dir=run_dir))
    if not same_data(run_dir, data_dir):
        raise DataError(
            f"{run_dir}: cannot {action} on {data_dir}: it is not the data the run was trained "
            f"on (data identity {short(data_identity(data_dir))}, the run's "
            f"{short(recorded_identity(run_dir))}, prepared at "
            f"{run_data_dir(run_dir, missing_ok=True) or 'see data.json'}); {action} on that "
            "data or train into a new --out"
        )


def check_same_features(run_dir: str | Path, data_dir: str | Path, what: str) -> None:
    """Raise unless ``data_dir``'s ids and numbers mean what they meant to ``run_dir``'s model
    (same feature identity: schema, transforms, vocabularies): ``evaluate --data``,
    fine-tuning.

    Raises:
        DataError: another feature identity (both are named).
    """
    recorded = recorded_identity(run_dir, "feature")
    if recorded is None:
        raise DataError(f"{what}: " + _UNRECORDED.format(run_dir=run_dir))
    current = feature_identity(data_dir)
    if recorded != current:
        raise DataError(
            f"{what}: {data_dir} is encoded with another feature map than {run_dir} was trained "
            f"on (feature identity {short(current)}, the run's {short(recorded)}): its ids "
            "would mean other values to the model; use data prepared with that run's "
            f"vocabularies ({run_data_dir(run_dir, missing_ok=True) or 'see data.json'})"
        )


def run_progress(run_dir: str | Path) -> str:
    """``"finished"`` (result.json), ``"started"`` (a resumable last.pt) or ``"none"``."""
    run_dir = Path(run_dir)
    if (run_dir / RESULT_FILE).exists():
        return "finished"
    if (run_dir / LAST).exists():
        return "started"
    return "none"


def require_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` as a Path once it is a run directory with trained weights.

    Cheap (no torch), so commands check it before their heavy imports.

    Raises:
        CtrcalError: no such directory, not a run directory, or no best checkpoint yet.
    """
    path = Path(run_dir)
    if not path.exists():
        raise CtrcalError(f"{run_dir}: no such run directory")
    if not path.is_dir():
        raise CtrcalError(f"{run_dir}: not a directory (expected a run directory)")
    if not (path / CONFIG_FILE).exists():
        raise CtrcalError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); `ctrcal train` writes one"
        )
    if not ((path / BEST).exists() or (path / BEST_PREV).exists()):
        raise CtrcalError(
            f"{run_dir}: no trained weights yet (no {BEST}); finish the run with "
            "`ctrcal train ... --resume`"
        )
    return path


# checks a run's own config snapshot skips: the report it was trained for is not part of it
SNAPSHOT_SKIPS = ("report",)


def load_run_config(run_dir: str | Path) -> Config:
    """The config a run was written with (``config.yaml``), with the model's defaults.

    Raises:
        ConfigError: missing, unreadable or no longer valid.
    """
    from ctrcal.config.load import read_config

    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise CtrcalError(f"{run_dir}: not a run directory (no {CONFIG_FILE})")
    # through the dataclasses, so defaults added since the run was written compare equal; the
    # snapshot passed every check when the run was written (a model that no longer builds
    # says so when it is built)
    return with_model_defaults(read_config(path))


def with_model_defaults(cfg: Config) -> Config:
    """Fill the model's defaults into ``cfg.model`` (in place; returns ``cfg``).

    A config means the same run whether or not its checks ran: a run's identity is its whole
    config, model defaults included. An unknown model is left as it is (the model check of
    :mod:`ctrcal.validate` names it).
    """
    from ctrcal.models.registry import with_defaults

    try:
        cfg.model = cfg.model.with_arguments(with_defaults(cfg.model.name, cfg.model.kwargs))
    except ConfigError:
        pass
    return cfg


def saved_config(run_dir: str | Path) -> Config | None:
    """:func:`load_run_config`, or None when missing or no longer valid."""
    try:
        return load_run_config(run_dir)
    except (OSError, CtrcalError, TypeError):
        return None


def run_state(cfg: Config, data_dir: str | Path, run_dir: str | Path) -> str:
    """What ``run_dir`` holds for ``cfg`` on ``data_dir``.

    Returns:
        ``"finished"`` (reusable as it is), ``"started"`` (same run, resumable), ``"stale"``
        (a run of another config or other data) or ``"none"``.
    """
    progress = run_progress(run_dir)
    if progress == "none":
        return "none"
    saved = saved_config(run_dir)
    same = saved is not None and not signature_diff(saved, cfg) and same_data(run_dir, data_dir)
    return progress if same else "stale"


def check_resumable(run_dir: str | Path, cfg: Config, data_dir: str | Path) -> None:
    """Raise unless ``cfg`` on ``data_dir`` is the run already in ``run_dir``.

    Raises:
        ConfigError: the signatures differ (the first keys that do are named).
        DataError: the data differs from the data the run was trained on.
    """
    run_dir = Path(run_dir)
    saved = saved_config(run_dir)
    if saved is None:
        raise ConfigError(f"{run_dir / CONFIG_FILE}: missing or unreadable; cannot resume")
    diff = signature_diff(saved, cfg)
    if diff:
        shown = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:5])
        raise ConfigError(
            f"{run_dir}: cannot resume with a different config ({shown}); "
            "resume with the same config or train into a new --out"
        )
    check_same_data(run_dir, data_dir, "resume")


def write_run_files(run_dir: str | Path, cfg: Config, data_dir: str | Path) -> None:
    """Write a new run's ``config.yaml``, ``feature_map.json`` and ``data.json`` atomically."""
    from ctrcal.config import dump_config
    from ctrcal.core.utils import write_json_atomic, write_text_atomic

    run_dir, data_dir = Path(run_dir), Path(data_dir)
    fm_text = (data_dir / FEATURE_MAP_FILE).read_text()
    fm = json.loads(fm_text)
    write_text_atomic(run_dir / CONFIG_FILE, dump_config(cfg))
    write_text_atomic(run_dir / FEATURE_MAP_FILE, fm_text)
    write_json_atomic(
        run_dir / DATA_FILE,
        {
            "data_dir": str(data_dir.resolve()),
            "source_hash": fm.get("source_hash"),
            "data_identity": data_identity(data_dir),
            "feature_identity": feature_identity(data_dir),
            "splits": fm.get("splits", {}),
        },
    )


def run_data(run_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """The prepared directory to evaluate ``run_dir`` on: ``data_dir`` (``--data``), else the
    one the run was trained on (cheap: no torch).

    Raises:
        DataError: not a prepared directory; for the run's own data, one that has moved or
            gone (``--data`` is suggested).
    """
    if data_dir is not None:
        return require_prepared_dir(data_dir)
    recorded = run_data_dir(run_dir)
    if recorded is None or not (recorded / FEATURE_MAP_FILE).is_file():
        raise DataError(
            f"{run_dir}: the data it was trained on is no longer at {recorded} (moved or "
            "deleted?); pass its new location with --data DIR"
        )
    return recorded


def run_data_dir(run_dir: str | Path, missing_ok: bool = False) -> Path | None:
    """The prepared directory a run was trained on (from ``data.json``)."""
    path = Path(run_dir) / DATA_FILE
    try:
        return Path(json.loads(path.read_text())["data_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        if missing_ok:
            return None
        raise CtrcalError(f"{path}: missing; pass the data directory explicitly") from None


def prepared_data_dir(cfg: Config, out_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """The prepared directory a command works on; prepares it when needed.

    ``data_dir`` (``--data``) if given; else ``data.prepared_dir`` as it is when it holds
    prepared data, or with the config's data prepared into it when it does not exist yet;
    else the data the config names (raw files, or the synthetic default) prepared into
    ``OUT/data``, where ``OUT`` is the command's output directory (a run directory for
    ``train``, a report directory for ``shift-report``). An unchanged prepared directory is
    reused, not rebuilt.

    Raises:
        DataError: a given directory that is not a prepared one.
    """
    if data_dir is None and cfg.data.prepared_dir:
        data_dir = Path(cfg.data.prepared_dir)
        if not data_dir.exists():
            return _prepare(cfg, data_dir)
    if data_dir is None:
        return _prepare(cfg, Path(out_dir) / DATA_SUBDIR)
    return require_prepared_dir(data_dir)


def require_prepared_dir(data_dir: str | Path) -> Path:
    """``data_dir`` (``--data``) as a Path once it holds prepared data (cheap: no torch).

    Raises:
        DataError: no feature map there.
    """
    data_dir = Path(data_dir)
    if not (data_dir / FEATURE_MAP_FILE).is_file():
        raise DataError(
            f"{data_dir}: not a prepared data directory (no {FEATURE_MAP_FILE}); prepare it "
            "with 'ctrcal prepare' or leave out --data"
        )
    return data_dir


def _prepare(cfg: Config, target: Path) -> Path:
    import sys

    from ctrcal.preparation.prepare import prepare

    print(f"preparing data into {target}", file=sys.stderr, flush=True)
    return prepare(None, target, cfg.data, cfg.features).out_dir
