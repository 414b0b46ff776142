"""Per-row cost of ``ctrcal evaluate --mc-samples 10`` against a one-shot evaluation.

Goal: with MC-LayerNorm in the MaskBlocks, 10 MC passes cost at most 6x a one-shot
evaluation per row; with MC-LayerNorm in the blocks and the field norms (the whole network
stochastic), no worse than before.

Two runs of a serial MaskNet shaped like ``configs/criteo_x1.yaml`` (embedding 10, blocks of
400, reduction ratio 0.2, dropout 0.2) are trained on a small synthetic train split: one with
MC-LayerNorm in the blocks (``emb_norm: none``), one with MC-LayerNorm in the blocks and per
field (``emb_norm: mclayernorm``). Each tree (this checkout, and with ``--before DIR`` an older
checkout of ctrcal, e.g. a ``git worktree`` of the previous release) evaluates both runs in
its own process through the public ``ctrcal.evaluate`` on the valid and the test split, one-shot
and with 10 MC passes. The per-row cost is the slope between the two splits,
``(t_test - t_valid) / (n_test - n_valid)``: loading the run and the data and every other
fixed cost cancels. Rounds alternate between the trees; each figure is the minimum over
``--repeats`` rounds (the least disturbed by other processes). The CPU model and the load
average are printed with the figures.

``--demo DIR`` (the output of ``make demo``: its ``runs/`` and ``data/``) times instead, in each
tree, the predictions the demo's report makes on its test split: one-shot (LayerNorm run),
10 MC-LayerNorm passes and 10 MC-Dropout passes, through each tree's prediction loop.

Usage::

    git worktree add /tmp/ctrcal-before bb4af84
    python scripts/bench_mc.py --before /tmp/ctrcal-before
    python scripts/bench_mc.py --rows 60000 --repeats 2      # this checkout only
    python scripts/bench_mc.py --before /tmp/ctrcal-before --demo outputs/demo
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ctrcal.core.utils import cpu_model_name

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 10
SETTINGS = {  # name: emb_norm (net_norm is MC-LayerNorm in both)
    "MC-LN in the MaskBlocks": "none",
    "MC-LN in the blocks + field norms": "{name: mclayernorm, fraction: 0.8}",
}
CONFIG = """\
data: {{synthetic: {{rows: {rows}, seed: 0}}, split: [0.05, 0.15, 0.8]}}
features: {{min_count: 5}}
model:
  variant: serial
  embedding_dim: 10
  hidden_units: [400, 400, 400]
  reduction_ratio: 0.2
  dropout: 0.2
  emb_norm: {emb_norm}
  net_norm: {{name: mclayernorm, fraction: 0.8}}
train: {{epochs: 1, batch_size: 4096, eval_batch_size: {batch}, device: cpu, progress: false}}
"""

# one measuring round in a tree's own process: seconds per (run, split, passes)
ROUND = """\
import json, sys, time
import torch
import ctrcal
runs, samples = json.loads(sys.argv[1]), int(sys.argv[2])
if int(sys.argv[3]):
    torch.set_num_threads(int(sys.argv[3]))
clock = time.process_time if sys.argv[4] == "cpu" else time.perf_counter
out = {}
for run in runs:
    ctrcal.evaluate(run, "valid")  # warm: kernels built, pages cached
    for split in ("valid", "test"):
        for mc in (0, samples):
            start = clock()
            ctrcal.evaluate(run, split, mc_samples=mc)
            out[f"{run}|{split}|{mc}"] = clock() - start
print(json.dumps(out))
"""


# the demo's report predictions in a tree's own process: seconds per variant
DEMO_ROUND = """\
import json, sys, time
import torch
import ctrcal
from ctrcal.data.loader import ParquetCTRData
try:
    from ctrcal.train.predict import predict_split
except ImportError:  # the layout before the one prediction loop
    from ctrcal.eval.predictive import predict_split
demo = sys.argv[1]
if int(sys.argv[2]):
    torch.set_num_threads(int(sys.argv[2]))
clock = time.process_time if sys.argv[3] == "cpu" else time.perf_counter
ln, mc = (ctrcal.load_run(f"{demo}/runs/{v}/seed0") for v in ("layernorm", "mclayernorm"))
test = ParquetCTRData(f"{demo}/data", "test")
batch = ln.config.train.eval_batch_size
out = {}
for name, run, passes, dropout in (("one-shot", ln, 0, False), ("MC-LN", mc, 10, False),
                                   ("MC-Dropout", ln, 10, True)):
    kw = dict(batch_size=batch, device="cpu", mc_samples=passes, mc_dropout_on=dropout)
    predict_split([run.model], test, **kw)  # warm
    torch.manual_seed(0)
    start = clock()
    predict_split([run.model], test, **kw)
    out[name] = clock() - start
print(json.dumps(out))
"""


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def train_run(workdir: Path, name: str, emb_norm: str, rows: int, batch: int) -> Path:
    """A run trained with this checkout on the synthetic train split (seconds)."""
    config = workdir / f"{name}.yaml"
    config.write_text(CONFIG.format(rows=rows, emb_norm=emb_norm, batch=batch))
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "ctrcal", "train", str(config), "--out", str(run_dir)]
    res = subprocess.run(cmd, env=_env(ROOT), cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"training {name} failed:\n{res.stderr}")
    return run_dir


def split_rows(run_dir: Path) -> dict[str, int]:
    """Rows of the valid and test splits of the run's prepared data."""
    import ctrcal

    fm = ctrcal.load_run(run_dir).feature_map
    return {s: int(fm.splits[s]["rows"]) for s in ("valid", "test")}


def measure(tree: Path, runs: list[Path], threads: int, clock: str) -> dict[str, float]:
    """One round in ``tree``'s own process."""
    args = [json.dumps([str(r) for r in runs]), str(SAMPLES), str(threads), clock]
    cmd = [sys.executable, "-c", ROUND, *args]
    res = subprocess.run(cmd, env=_env(tree), cwd=tree, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"evaluating in {tree} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def demo(trees: dict[str, Path], demo_dir: Path, repeats: int, threads: int, clock: str) -> None:
    """The demo's report predictions, one-shot and MC, in every tree."""
    best: dict[str, dict[str, float]] = {tree: {} for tree in trees}
    for _ in range(repeats):
        for tree, path in trees.items():
            cmd = [sys.executable, "-c", DEMO_ROUND, str(demo_dir.resolve()), str(threads), clock]
            res = subprocess.run(cmd, env=_env(path), cwd=path, capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"predicting in {path} failed:\n{res.stderr}")
            for key, sec in json.loads(res.stdout.strip().splitlines()[-1]).items():
                best[tree][key] = min(sec, best[tree].get(key, float("inf")))
    print(f"the demo's test split ({demo_dir}), {clock} seconds, min of {repeats} rounds")
    print(f"{'tree':<7} {'one-shot':>9} {'MC-LN x10':>10} {'MC-Dropout x10':>15} {'MC total':>9}")
    for tree, t in best.items():
        total = t["MC-LN"] + t["MC-Dropout"]
        print(
            f"{tree:<7} {t['one-shot']:9.2f} {t['MC-LN']:10.2f} {t['MC-Dropout']:15.2f} "
            f"{total:9.2f}"
        )
    if "before" in best:
        b, a = best["before"], best["after"]
        ratio = (a["MC-LN"] + a["MC-Dropout"]) / (b["MC-LN"] + b["MC-Dropout"])
        print(f"MC variants after / before: {ratio:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        help="an older checkout of ctrcal to measure beside this one",
    )
    ap.add_argument("--rows", type=int, default=100_000, help="synthetic rows (80%% test)")
    ap.add_argument("--batch", type=int, default=16384, help="train.eval_batch_size")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per tree (the minimum counts)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or the process's CPU time (steadier on a shared machine; with "
        "--threads 1 it is the work itself)",
    )
    ap.add_argument(
        "--demo",
        type=Path,
        default=None,
        help="a demo output (runs/, data/): time its report's predictions",
    )
    args = ap.parse_args()
    trees = {"after": ROOT}
    if args.before is not None:
        if not (args.before / "ctrcal" / "__init__.py").is_file():
            raise SystemExit(f"--before {args.before}: not a ctrcal checkout")
        trees = {"before": args.before.resolve(), **trees}
    print(
        f"CPU: {cpu_model_name()}; {os.cpu_count()} CPUs; torch threads: "
        f"{args.threads or 'default'}; clock: {args.clock}; "
        f"load average {os.getloadavg()[0]:.2f} (before)"
    )
    if args.demo is not None:
        demo(trees, args.demo, args.repeats, args.threads, args.clock)
        print(f"load average {os.getloadavg()[0]:.2f} (after)")
        return 0
    with tempfile.TemporaryDirectory(prefix="ctrcal-bench-mc-") as tmp:
        runs = {
            name: train_run(Path(tmp), f"run{i}", emb, args.rows, args.batch)
            for i, (name, emb) in enumerate(SETTINGS.items())
        }
        rows = split_rows(next(iter(runs.values())))
        best: dict[str, dict[str, float]] = {tree: {} for tree in trees}
        for _ in range(args.repeats):
            for tree, path in trees.items():
                for key, sec in measure(
                    path, list(runs.values()), args.threads, args.clock
                ).items():
                    best[tree][key] = min(sec, best[tree].get(key, float("inf")))
        span = rows["test"] - rows["valid"]
        print(
            f"rows: valid {rows['valid']}, test {rows['test']}; eval batch {args.batch}; "
            f"{SAMPLES} MC passes; per-row cost = slope between the splits, "
            f"min of {args.repeats} rounds"
        )
        print(f"{'setting':<36} {'tree':<7} {'one-shot us/row':>16} {'MC us/row':>10} {'ratio':>6}")
        for name, run in runs.items():
            for tree in trees:
                t = best[tree]
                cost = {
                    mc: (t[f"{run}|test|{mc}"] - t[f"{run}|valid|{mc}"]) / span
                    for mc in (0, SAMPLES)
                }
                print(
                    f"{name:<36} {tree:<7} {cost[0] * 1e6:16.2f} {cost[SAMPLES] * 1e6:10.2f} "
                    f"{cost[SAMPLES] / cost[0]:5.1f}x"
                )
    print(f"load average {os.getloadavg()[0]:.2f} (after)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
