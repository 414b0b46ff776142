"""Benchmark: ctrcal vs FuxiCTR training throughput, side by side on the same data and machine.

Usage::

    python scripts/bench_fuxictr.py --fuxictr-python /path/to/fuxienv/bin/python \\
        --model-zoo /path/to/FuxiCTR/model_zoo [--models masknet masknet_parallel dcnv2 dnn] \\
        [--batch-size 10000] [--rounds 5] [--steps 3] [--threads N] [--vocab 1000000]

FuxiCTR (2.3.10) is not a dependency of ctrcal: install it in an environment of its own
(``pip install fuxictr==2.3.10 'polars<2'`` next to the same CPU torch) and point
``--fuxictr-python`` at that environment's interpreter; its model sources (``MaskNet``,
``DCNv2``, ``DNN``) are not in the wheel but in the ``model_zoo`` folder of its source
repository, which ``--model-zoo`` names.

What runs: synthetic Criteo-format rows are generated and prepared once by ctrcal (encoded
parquet: int ids, float numerics); two worker processes, one per library, read the same rows
from those files, build the same model (the BARS Criteo x1 setting of each model, ctrcal's
from its shipped ``configs/<model>_criteo_x1.yaml``), and take training steps on the same
batches when told to. A step is each library's own: forward, loss with its embedding
regulariser, backward, gradient clipping at norm 10, Adam. Batches are built before timing in
both workers (FuxiCTR's per-row collate loader would only slow FuxiCTR down, so leaving data
loading out is the comparison most favourable to it). Embedding tables are widened to
``--vocab`` rows in total (as many as Criteo x1 has), because the whole-table optimizer and
regulariser passes are part of a step's cost.

The machine may be shared: only one worker computes at a time, the two alternate within every
round (in reversed order every other round), and the reported figures are medians over rounds,
both of wall time and of the worker's CPU time (``process_time``, which other processes' load
barely changes; with several threads it includes the threads' spin-waits). The ratio is
ctrcal's rows/s over FuxiCTR's, the median of the per-round ratios. The CPU model
(``lscpu``) and the load average before and after are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The worker roles run in FuxiCTR's interpreter too: nothing of ctrcal is imported at the top.

REPO = Path(__file__).resolve().parent.parent

# One entry per model: ctrcal's config (model + train sections are used, with any overrides)
# and FuxiCTR's model class and keyword arguments for the same BARS setting.
MODELS: dict[str, dict[str, Any]] = {
    "masknet": {
        "config": "configs/criteo_x1.yaml",
        "fuxictr_dir": "MaskNet",
        "fuxictr_class": "MaskNet",
        "fuxictr_kwargs": {
            "embedding_dim": 10,
            "dnn_hidden_units": [400, 400, 400],
            "dnn_hidden_activations": "ReLU",
            "model_type": "SerialMaskNet",
            "reduction_ratio": 0.2,
            "emb_layernorm": False,
            "net_layernorm": True,
            "net_dropout": 0.2,
            "embedding_regularizer": 1e-5,
            "net_regularizer": 0,
        },
    },
    "masknet_parallel": {
        # the BARS x4 MaskNet (parallel, 2 blocks of 500, MLP [1000 x 5], dropout 0.3) on the
        # same x1-style rows: numerics embedded as x * v on both sides (x4 buckets them)
        "config": "configs/criteo_x4.yaml",
        "overrides": ["model.numeric_embedding=scaled"],
        "fuxictr_dir": "MaskNet",
        "fuxictr_class": "MaskNet",
        "fuxictr_kwargs": {
            "embedding_dim": 16,
            "dnn_hidden_units": [1000, 1000, 1000, 1000, 1000],
            "dnn_hidden_activations": "ReLU",
            "model_type": "ParallelMaskNet",
            "parallel_num_blocks": 2,
            "parallel_block_dim": 500,
            "reduction_ratio": 0.1,
            "emb_layernorm": False,
            "net_layernorm": False,
            "net_dropout": 0.3,
            "embedding_regularizer": 1e-5,
            "net_regularizer": 0,
        },
    },
    "dcnv2": {
        "config": "configs/dcnv2_criteo_x1.yaml",
        "fuxictr_dir": "DCNv2",
        "fuxictr_class": "DCNv2",
        "fuxictr_kwargs": {
            "embedding_dim": 10,
            "model_structure": "parallel",
            "use_low_rank_mixture": False,
            "num_cross_layers": 3,
            "parallel_dnn_hidden_units": [500, 500, 500],
            "dnn_activations": "ReLU",
            "net_dropout": 0.1,
            "batch_norm": False,
            "embedding_regularizer": 1e-5,
            "net_regularizer": 0,
        },
    },
    "dnn": {
        "config": "configs/dnn_criteo_x1.yaml",
        "fuxictr_dir": "DNN/DNN_torch",
        "fuxictr_class": "DNN",
        "fuxictr_kwargs": {
            "embedding_dim": 10,
            "hidden_units": [400, 400, 400],
            "hidden_activations": "ReLU",
            "net_dropout": 0.1,
            "batch_norm": False,
            "embedding_regularizer": 1e-5,
            "net_regularizer": 0,
        },
    },
}


def _fail(message: str) -> None:
    print(f"bench_fuxictr: {message}", file=sys.stderr)
    sys.exit(2)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


# ---------------------------------------------------------------------------------------------
# Workers: read the spec, build the batches and the model, then answer "steps N" lines with
# one JSON line of timings each.


def _read_rows(spec: dict[str, Any]):
    """The first ``batches * batch_size`` training rows: (int64 ids [N, Fc], float32 [N, Fn],
    float32 labels [N]), read from the prepared parquet files with pyarrow."""
    import numpy as np
    import pyarrow.parquet as pq

    need = spec["batches"] * spec["batch_size"]
    files = sorted(Path(spec["data_dir"], "train").glob("*.parquet"))
    cat_cols, num_cols = spec["categorical_fields"], spec["numeric_fields"]
    tables, have = [], 0
    for f in files:
        t = pq.read_table(f, columns=["label", *cat_cols, *num_cols])
        tables.append(t)
        have += t.num_rows
        if have >= need:
            break
    if have < need:
        raise SystemExit(f"only {have} training rows, need {need}")

    def column(name: str, dtype) -> np.ndarray:
        return np.concatenate([t.column(name).to_numpy() for t in tables])[:need].astype(dtype)

    cat = np.stack([column(c, np.int64) for c in cat_cols], 1)
    num = np.stack([column(c, np.float32) for c in num_cols], 1)
    return cat, num, column("label", np.float32)


def _worker_loop(step, batches: list[Any]) -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n = int(cmd[1])
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            loss = step(batches[i % len(batches)])
        final = float(loss.detach())  # CPU eager is synchronous; this only reads the value
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"wall": wall / n, "cpu": cpu / n, "loss": final}), flush=True)


def ctrcal_worker(spec: dict[str, Any]) -> None:
    """The ctrcal side: the trainer's own step (:func:`ctrcal.train.step.train_step`)."""
    import types

    import torch

    from ctrcal.core.batch import Batch
    from ctrcal.train import step as train_step_lib
    from ctrcal.train.cpu_matmul import cpu_matmul
    from ctrcal.validate import load_config

    torch.set_num_threads(spec["threads"])
    overrides = [*spec.get("overrides", []), f"train.batch_size={spec['batch_size']}"]
    cfg = load_config(REPO / spec["config"], overrides)
    fmap = types.SimpleNamespace(
        vocab_sizes=spec["vocab_sizes"],
        numeric_fields=spec["numeric_fields"],
        categorical_fields=spec["categorical_fields"],
        bucket_boundaries=None,
    )
    torch.manual_seed(spec["seed"])
    try:
        from ctrcal.models.build import create_model
    except ImportError:  # an older checkout
        from ctrcal.models.registry import create_model
    model = create_model(cfg.model, fmap)
    model.train()
    opt = train_step_lib.make_optimizer(model, cfg.train)
    ctx = train_step_lib.make_step_context(model, opt, cfg.train, torch.device("cpu"), None)
    cat, num, label = (torch.from_numpy(a) for a in _read_rows(spec))
    b = spec["batch_size"]
    batches = [
        Batch(
            cat[i : i + b].contiguous(), num[i : i + b].contiguous(), label[i : i + b].contiguous()
        )
        for i in range(0, len(label), b)
    ]
    with cpu_matmul(cfg.train.cpu_matmul) as backend:
        print(json.dumps({"info": f"fp32 matmuls: {backend}"}), flush=True)
        _worker_loop(lambda batch: train_step_lib.train_step(ctx, batch), batches)


def fuxictr_worker(spec: dict[str, Any]) -> None:
    """The FuxiCTR side: its model class from model_zoo and its own ``train_step``."""
    import importlib

    import numpy as np
    import torch
    from fuxictr.features import FeatureMap

    torch.set_num_threads(spec["threads"])
    work = Path(spec["work_dir"])
    features = [{c: {"source": "", "type": "numeric"}} for c in spec["numeric_fields"]]
    # FuxiCTR reserves id 0 for padding: ids are shifted by one, the tables one row longer
    features += [
        {c: {"source": "", "type": "categorical", "vocab_size": v + 1, "padding_idx": 0}}
        for c, v in zip(spec["categorical_fields"], spec["vocab_sizes"], strict=True)
    ]
    fmap_json = work / "fuxictr_feature_map.json"
    fmap_json.write_text(
        json.dumps({"dataset_id": "bench", "labels": ["label"], "features": features})
    )
    feature_map = FeatureMap("bench", str(work))
    feature_map.load(str(fmap_json), {"embedding_dim": spec["fuxictr_kwargs"]["embedding_dim"]})

    sys.path.insert(0, str(Path(spec["model_zoo"]) / spec["fuxictr_dir"]))
    module = importlib.import_module("src")
    cls = getattr(module, spec["fuxictr_class"])
    torch.manual_seed(spec["seed"])
    model = cls(
        feature_map,
        model_id="bench",
        gpu=-1,
        learning_rate=1e-3,
        optimizer="adam",
        loss="binary_crossentropy",
        metrics=["logloss", "AUC"],
        verbose=0,
        model_root=str(work / "fuxictr_checkpoints"),
        **spec["fuxictr_kwargs"],
    )
    model._max_gradient_norm = 10.0  # what fit() sets
    model.train()

    cat, num, label = _read_rows(spec)
    num = np.nan_to_num(num, nan=0.0)  # FuxiCTR fills missing numerics when it prepares data
    b = spec["batch_size"]
    batches = []
    for i in range(0, len(label), b):
        batch = {
            c: torch.from_numpy(num[i : i + b, j].copy())
            for j, c in enumerate(spec["numeric_fields"])
        }
        batch.update(
            {
                c: torch.from_numpy(cat[i : i + b, j] + 1)
                for j, c in enumerate(spec["categorical_fields"])
            }
        )
        batch["label"] = torch.from_numpy(label[i : i + b].copy())
        batches.append(batch)
    _worker_loop(model.train_step, batches)


# ---------------------------------------------------------------------------------------------
# The driver


class Worker:
    """A worker process speaking the line protocol of :func:`_worker_loop`."""

    def __init__(self, name: str, python: str, spec_path: Path, env: dict[str, str]) -> None:
        self.name = name
        role = "ctrcal" if name == "ctrcal" else "fuxictr"
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--worker", role, "--spec", str(spec_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.info: list[str] = []
        while True:
            msg = self._read()
            if "info" in msg:
                self.info.append(msg["info"])
            if msg.get("ready"):
                break

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        code = self.proc.wait()
        raise RuntimeError(f"the {self.name} worker exited with status {code} (see above)")

    def steps(self, n: int) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"steps {n}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def _prepare_data(rows: int, out: Path) -> Path:
    from ctrcal.api import prepare
    from ctrcal.validate import load_config

    cfg = load_config(
        None, [f"data.synthetic.rows={rows}", "data.synthetic.seed=0", "features.min_count=1"]
    )
    return prepare(None, out / "data", cfg).out_dir


def _widen(vocab: list[int], total: int) -> list[int]:
    """Per-field vocabulary sizes scaled up to about ``total`` rows (never below the data's)."""
    have = sum(vocab)
    if total <= have:
        return list(vocab)
    return [max(v, round(v * total / have)) for v in vocab]


def bench_model(
    name: str, args: argparse.Namespace, data_dir: Path, work: Path, fmap: Any
) -> dict[str, Any]:
    entry = MODELS[name]
    spec = {
        "config": entry["config"],
        "overrides": entry.get("overrides", []),
        "fuxictr_dir": entry["fuxictr_dir"],
        "fuxictr_class": entry["fuxictr_class"],
        "fuxictr_kwargs": entry["fuxictr_kwargs"],
        "model_zoo": str(args.model_zoo),
        "data_dir": str(data_dir),
        "work_dir": str(work),
        "categorical_fields": list(fmap.categorical_fields),
        "numeric_fields": list(fmap.numeric_fields),
        "vocab_sizes": _widen(list(fmap.vocab_sizes), args.vocab),
        "batch_size": args.batch_size,
        "batches": args.batches,
        "threads": args.threads,
        "seed": 2021,
    }
    spec_path = work / f"spec-{name}.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    fux_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    workers = [
        Worker("ctrcal", sys.executable, spec_path, env),
        Worker("FuxiCTR", str(args.fuxictr_python), spec_path, fux_env),
    ]
    try:
        for w in workers:  # warm-up: allocator, kernels, optimizer state
            w.steps(args.warmup)
        times: dict[str, list[dict[str, float]]] = {w.name: [] for w in workers}
        for r in range(args.rounds):
            for w in workers if r % 2 == 0 else workers[::-1]:
                times[w.name].append(w.steps(args.steps))
    finally:
        for w in workers:
            w.close()
    b = args.batch_size
    out: dict[str, Any] = {"vocab_total": sum(spec["vocab_sizes"]), "info": workers[0].info}
    for key, t in times.items():
        out[key] = {
            "rows_per_s_wall": b / statistics.median(x["wall"] for x in t),
            "rows_per_cpu_s": b / statistics.median(x["cpu"] for x in t),
            "loss": t[-1]["loss"],
        }
    pairs = list(zip(times["ctrcal"], times["FuxiCTR"], strict=True))
    out["ratio_wall"] = statistics.median(f["wall"] / c["wall"] for c, f in pairs)
    out["ratio_cpu"] = statistics.median(f["cpu"] / c["cpu"] for c, f in pairs)
    out["ratio_wall_range"] = [
        min(f["wall"] / c["wall"] for c, f in pairs),
        max(f["wall"] / c["wall"] for c, f in pairs),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuxictr-python", type=Path, help="python of the FuxiCTR environment")
    ap.add_argument("--model-zoo", type=Path, help="FuxiCTR source repository's model_zoo")
    ap.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        help="default: every model whose config is in this checkout",
    )
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=3, help="distinct batches cycled through")
    ap.add_argument("--rows", type=int, default=50_000, help="synthetic rows generated")
    ap.add_argument("--vocab", type=int, default=1_000_000, help="total embedding rows")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per worker per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--worker", choices=["ctrcal", "fuxictr"], help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        spec = json.loads(args.spec.read_text())
        (ctrcal_worker if args.worker == "ctrcal" else fuxictr_worker)(spec)
        return 0

    if args.fuxictr_python is None or args.model_zoo is None:
        _fail("--fuxictr-python and --model-zoo are required (see the module docstring)")
    if not (args.fuxictr_python.is_file() and os.access(args.fuxictr_python, os.X_OK)):
        _fail(f"--fuxictr-python {args.fuxictr_python}: not an executable file")
    if not args.model_zoo.is_dir():
        _fail(f"--model-zoo {args.model_zoo}: not a directory")
    probe = subprocess.run(
        [str(args.fuxictr_python), "-c", "import fuxictr, torch; print(fuxictr.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "no output"
        _fail(f"--fuxictr-python {args.fuxictr_python}: cannot import fuxictr and torch ({why})")
    fuxictr_version = probe.stdout.strip()
    if not args.models:
        args.models = [m for m in MODELS if (REPO / MODELS[m]["config"]).is_file()]
    for name in args.models:
        if not (REPO / MODELS[name]["config"]).is_file():
            _fail(f"{MODELS[name]['config']}: missing from this checkout (model {name})")
        if not (args.model_zoo / MODELS[name]["fuxictr_dir"] / "src").is_dir():
            _fail(
                f"--model-zoo {args.model_zoo}: no {MODELS[name]['fuxictr_dir']}/src folder in "
                "it (the model_zoo folder of FuxiCTR's source repository)"
            )
    if args.batch_size < 1 or args.rounds < 1 or args.steps < 1 or args.batches < 1:
        _fail("--batch-size, --rounds, --steps and --batches must be >= 1")
    if args.rows * 0.8 < args.batches * args.batch_size:
        _fail(
            f"--rows {args.rows}: the training split (80 %) is smaller than --batches x "
            f"--batch-size = {args.batches * args.batch_size}"
        )
    args.threads = args.threads or os.cpu_count() or 1

    import torch

    from ctrcal.core.utils import cpu_model_name
    from ctrcal.data.feature_map import FeatureMap

    print(
        f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; torch {torch.__version__}, "
        f"{args.threads} threads per worker; FuxiCTR {fuxictr_version}"
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fuxictr-") as td:
        work = Path(td)
        data_dir = _prepare_data(args.rows, work)
        fmap = FeatureMap.load(data_dir)
        print(
            f"batch {args.batch_size}, {args.rounds} rounds x {args.steps} steps per worker, "
            "alternating; medians over rounds"
        )
        for name in args.models:
            print(f"load average before {name}: {load_average()}", flush=True)
            res = bench_model(name, args, data_dir, work, fmap)
            res["load_after"] = load_average()
            results[name] = res
            c, f = res["ctrcal"], res["FuxiCTR"]
            print(
                f"{name} (vocab {res['vocab_total']:,}; {', '.join(res['info'])}): "
                f"ctrcal {c['rows_per_s_wall']:,.0f} rows/s ({c['rows_per_cpu_s']:,.0f} per "
                f"CPU-s), FuxiCTR {f['rows_per_s_wall']:,.0f} rows/s "
                f"({f['rows_per_cpu_s']:,.0f} per CPU-s); ctrcal / FuxiCTR = "
                f"{res['ratio_wall']:.2f}x wall (rounds {res['ratio_wall_range'][0]:.2f}-"
                f"{res['ratio_wall_range'][1]:.2f}), {res['ratio_cpu']:.2f}x CPU time; "
                f"load after: {res['load_after']}",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_model_name(),
                    "threads": args.threads,
                    "batch_size": args.batch_size,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
