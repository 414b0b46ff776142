"""Run tracking: what a training run (and a shift report) sends to TensorBoard and MLflow.

``train.loggers: [tensorboard, mlflow]`` (default: none; the console and ``result.json`` stay
as they are). Each logger records

* every ``train.log_every`` steps: ``train/loss`` (the epoch's running mean, read from the
  device at that interval only, never per step), ``train/lr`` and ``train/rows_per_s``;
* after every epoch: ``valid/auc``, ``valid/logloss``, ``valid/ece``, ``valid/pcoc`` (the
  numbers of ``metrics.jsonl`` and ``result.json``) and ``train/epoch_loss``;
* the config as parameters (dotted keys), and at the end the checkpoint's path.

TensorBoard writes event files into ``RUN/tensorboard/``. MLflow logs to
``train.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a local file store in
``RUN/mlruns/`` (MLflow 3 keeps its file backend in maintenance mode and asks for an opt-in,
``MLFLOW_ALLOW_FILE_STORE``, which ctrcal gives for that default store only), in the
experiment ``train.experiment``. A shift report opens one parent MLflow run and every
variant's seed trains as its child (:func:`report_tracking`); the report's tables and figures
are the parent's artifacts. Under torchrun only rank 0 logs.

The packages are optional extras (``ctrcal[tensorboard]``, ``ctrcal[mlflow]``);
:func:`missing_logger_extras` names the missing ones for ``validate``.

What ``validate`` cannot know is checked when the run opens its loggers, before training:
TensorBoard's folder must take a file, and an ``http(s)`` tracking URI must answer within
:data:`PROBE_TIMEOUT_S` seconds (MLflow's own client retries for minutes). Either failure is
one line naming the folder or the URI. Tracking is a copy of what the run writes itself: a
logger that fails during or at the end of training is dropped with a warning, and the
checkpoint and ``result.json`` are written as without it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LOGGERS",
    "RunLoggers",
    "missing_logger_extras",
    "open_loggers",
    "report_tracking",
]

LOGGERS = ("tensorboard", "mlflow")
# logger -> (the module it imports, the extra that installs it)
_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
PARENT_ENV = "CTRCAL_MLFLOW_PARENT_RUN"
"""Set by a shift report: the MLflow run its training runs are children of."""
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
PROBE_TIMEOUT_S = 5.0
"""How long an http(s) tracking server has to answer before the run refuses to start."""


def missing_logger_extras(names: Sequence[str]) -> list[str]:
    """``"name (pip install 'ctrcal[extra]')"`` for each logger whose package is missing."""
    out = []
    for name in names:
        module, extra = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            out.append(f"{name} needs the {module} package: pip install 'ctrcal[{extra}]'")
    return out


def tracking_uri(configured: str | None, run_dir: Path) -> str:
    """The MLflow tracking URI: the config's, the environment's, or ``RUN/mlruns``."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    os.environ.setdefault(_ALLOW_FILE_STORE, "true")  # the default store is a local folder
    return (Path(run_dir) / "mlruns").resolve().as_uri()


def check_tracking_server(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`~ctrcal.core.errors.OutputError` naming ``uri`` when an http(s) tracking
    server does not answer within ``timeout`` seconds. Any HTTP answer, an error status
    included, counts: the server is there. Other schemes (a file store, databricks) pass."""
    from ctrcal.core.errors import OutputError

    if not uri.lower().startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        cause = str(reason).strip().splitlines()[0] if str(reason).strip() else type(exc).__name__
        raise OutputError(
            f"train.tracking_uri: the MLflow tracking server {uri} did not answer within "
            f"{timeout:g} s ({cause}); start it, or give a reachable URI"
        ) from None


def _check_folder(folder: Path) -> None:
    """Raise :class:`~ctrcal.core.errors.OutputError` naming ``folder`` unless a file can be
    created in it (TensorBoard's writer thread would fail later, with a traceback)."""
    from ctrcal.core.errors import OutputError
    from ctrcal.core.utils import describe_os_error

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OutputError(
            "train.loggers: tensorboard: " + describe_os_error(folder, exc, "write into")
        ) from None


def _flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(obj, Mapping):
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: str(obj)[:500]}


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(run_dir) / "tensorboard"
        _check_folder(folder)
        self.writer = SummaryWriter(log_dir=str(folder))

    def params(self, params: dict[str, str]) -> None:
        text = "\n".join(f"    {k}: {v}" for k, v in sorted(params.items()))
        self.writer.add_text("config", text)

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, checkpoint: Path | None, status: str) -> None:
        if checkpoint is not None:
            self.writer.add_text("checkpoint", str(checkpoint))
        self.writer.close()


class _MLflow:
    name = "mlflow"

    def __init__(self, run_dir: Path, uri: str | None, experiment: str, name: str) -> None:
        from mlflow.tracking import MlflowClient

        resolved = tracking_uri(uri, run_dir)
        check_tracking_server(resolved)
        self.client = MlflowClient(resolved)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {"ctrcal.run_dir": str(Path(run_dir).resolve())}
        parent = os.environ.get(PARENT_ENV)
        if parent:
            tags["mlflow.parentRunId"] = parent
        self.run_id = self.client.create_run(exp_id, run_name=name, tags=tags).info.run_id

    def params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(k.replace("/", "_"), float(v), now, step)
            for k, v in values.items()
            if math.isfinite(v)
        ]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def finish(self, checkpoint: Path | None, status: str) -> None:
        if checkpoint is not None:
            self.client.set_tag(self.run_id, "checkpoint", str(checkpoint))
        self.client.set_terminated(self.run_id, status)


class RunLoggers:
    """The loggers of one run (none: every call does nothing).

    Args:
        names: a subset of :data:`LOGGERS`.
        run_dir: the run directory (TensorBoard's folder, MLflow's default store).
        uri: ``train.tracking_uri``.
        experiment: the MLflow experiment.
        name: the run's name in MLflow.
    """

    def __init__(
        self,
        names: Sequence[str],
        run_dir: Path,
        uri: str | None = None,
        experiment: str = "ctrcal",
        name: str | None = None,
    ) -> None:
        from ctrcal.core.errors import NotAvailableError

        missing = missing_logger_extras(names)
        if missing:
            raise NotAvailableError(f"train.loggers: {'; '.join(missing)}")
        self.sinks: list[Any] = []
        try:
            for logger in names:
                if logger == "tensorboard":
                    self.sinks.append(_TensorBoard(run_dir))
                else:
                    self.sinks.append(_MLflow(run_dir, uri, experiment, name or run_dir.name))
        except BaseException:
            self.finish(None, "FAILED")  # a logger opened before the one that failed
            raise

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def _each(self, call: str, *args: Any) -> None:
        """``sink.call(*args)`` on every sink; a sink that fails is dropped with a warning (a
        tracking server that goes away must not cost the run its checkpoint)."""
        for sink in list(self.sinks):
            try:
                getattr(sink, call)(*args)
            except Exception as exc:  # any failure of a tracking library
                self.sinks.remove(sink)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                warnings.warn(
                    f"train.loggers: {sink.name} failed ({type(exc).__name__}: {first}); "
                    "it logs nothing more for this run, the checkpoint and result.json are "
                    "written as without it",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def params(self, config: Mapping[str, Any]) -> None:
        self._each("params", _flatten(config))

    def step(self, step: int, loss: float, lr: float, rows_per_s: float) -> None:
        values = {"train/loss": loss, "train/lr": lr, "train/rows_per_s": rows_per_s}
        self._each("metrics", values, step)

    def epoch(self, epoch: int, train_loss: float, valid: Mapping[str, float]) -> None:
        values = {"train/epoch_loss": train_loss, **{f"valid/{k}": v for k, v in valid.items()}}
        self._each("metrics", values, epoch)

    def finish(self, checkpoint: Path | None, status: str = "FINISHED") -> None:
        self._each("finish", checkpoint, status)
        self.sinks = []


def open_loggers(tcfg: Any, run_dir: Path, config: Mapping[str, Any], main: bool) -> RunLoggers:
    """The run's loggers (none off rank 0), the config logged as parameters."""
    loggers = RunLoggers(
        tcfg.loggers if main else (),
        run_dir,
        tcfg.tracking_uri,
        tcfg.experiment,
        _run_name(run_dir),
    )
    loggers.params(config)
    return loggers


def _run_name(run_dir: Path) -> str:
    """``variant/seedK`` for a report's run (``runs/<variant>/seed<K>``), else the folder."""
    run_dir = Path(run_dir)
    if run_dir.name.startswith("seed") and run_dir.parent.name:
        return f"{run_dir.parent.name}/{run_dir.name}"
    return run_dir.name


@contextlib.contextmanager
def report_tracking(
    tcfg: Any, out_dir: Path, config: Mapping[str, Any], name: str
) -> Iterator[Any]:
    """A shift report's parent MLflow run (when ``train.loggers`` has mlflow): its training
    runs are created as children (through :data:`PARENT_ENV`, which the sweep's worker
    processes inherit) in the same store (the report's ``mlruns/`` unless a URI is given).
    Yields a function ``artifact(path)`` that logs a file or folder to the parent run."""
    if "mlflow" not in tcfg.loggers:
        yield lambda path: None
        return
    from ctrcal.core.errors import NotAvailableError

    missing = missing_logger_extras(["mlflow"])
    if missing:
        raise NotAvailableError(f"train.loggers: {missing[0]}")
    saved = {k: os.environ.get(k) for k in (PARENT_ENV, "MLFLOW_TRACKING_URI")}
    parent = _MLflow(Path(out_dir), tcfg.tracking_uri, tcfg.experiment, name)
    parent.params(_flatten(config))
    os.environ[PARENT_ENV] = parent.run_id
    os.environ["MLFLOW_TRACKING_URI"] = parent.client.tracking_uri

    def artifact(path: Path) -> None:
        path = Path(path)
        if path.is_dir():
            parent.client.log_artifacts(parent.run_id, str(path), path.name)
        elif path.exists():
            parent.client.log_artifact(parent.run_id, str(path))

    status = "FAILED"
    try:
        yield artifact
        status = "FINISHED"
    finally:
        parent.finish(None, status)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
