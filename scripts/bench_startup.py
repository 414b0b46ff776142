"""Start-up cost of the ``ctrcal`` commands: the data commands, ``--help``, ``validate``.

Goal: the data commands -- ``ctrcal prepare``, ``ctrcal calibration-report``, ``ctrcal synth``
and ``ctrcal validate`` of a data-only config -- import neither torch nor pandas, so that on a
small input they cost little more than the interpreter. Each runs on a small input made here
(a 2,000-row dac file, a 2,000-row predictions CSV), so the work itself is a small part.

For each command this prints the wall time of the whole process (``python -m ctrcal ...``,
interpreter start-up included; the minimum of ``--repeats`` runs, the least disturbed by other
processes), its ratio to a bare ``python -c pass`` (the floor), the time ``python -X
importtime`` attributes to imports (also the minimum of ``--repeats`` runs), and the heavy
packages the command imported (torch, polars, pandas, ...).

``--evaluate`` adds ``ctrcal evaluate`` on a tiny run trained here first (a few thousand
synthetic rows, one epoch: a few seconds) and ``import torch`` alone, the floor of any command
that runs a model; ``--configs`` validates those configs too (models included).

The CPU model (``lscpu``, with family and model numbers) and the load average are printed
with the figures.

Usage::

    nice python scripts/bench_startup.py                 # the data commands and --help
    python scripts/bench_startup.py --repeats 5 --evaluate --configs configs/demo.yaml
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctrcal.core.utils import cpu_model_name

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch",
    "triton",
    "numpy",
    "pyarrow",
    "polars",
    "pandas",
    "sklearn",
    "scipy",
    "matplotlib",
    "yaml",
)

TINY_CONFIG = """\
data: {synthetic: {rows: 3000, seed: 0}}
features: {min_count: 2}
model: {embedding_dim: 4, hidden_units: [16]}
train: {epochs: 1, batch_size: 256, device: cpu, progress: false}
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def wall_time(argv: list[str], repeats: int) -> float:
    """The smallest wall time of ``repeats`` runs of ``python argv`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        res = subprocess.run(
            [sys.executable, *argv], env=_env(), cwd=ROOT, capture_output=True, text=True
        )
        best = min(best, time.perf_counter() - start)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {res.returncode}:\n{res.stderr}")
    return best


def import_profile(argv: list[str], repeats: int) -> tuple[float, list[str]]:
    """Seconds ``-X importtime`` attributes to imports (the smallest of ``repeats`` runs), and
    the heavy packages imported."""
    best, loaded = float("inf"), set()
    for _ in range(repeats):
        res = subprocess.run(
            [sys.executable, "-X", "importtime", *argv],
            env=_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {res.returncode}:\n{res.stderr}")
        total_us = 0
        for line in res.stderr.splitlines():
            # "import time: <self us> | <cumulative us> | <2 spaces per level><module>"
            parts = line.split("|")
            if not line.startswith("import time:") or len(parts) != 3:
                continue
            if not parts[1].strip().isdigit():
                continue  # the header
            name = parts[2][1:]
            if not name.startswith(" "):  # top level: the cumulative times add up to the whole
                total_us += int(parts[1])
            if name.strip().split(".")[0] in HEAVY:
                loaded.add(name.strip().split(".")[0])
        best = min(best, total_us / 1e6)
    return best, sorted(loaded)


def tiny_run(workdir: Path) -> Path:
    """A trained run on a few thousand synthetic rows (seconds on a laptop CPU)."""
    config = workdir / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    run_dir = workdir / "run"
    res = subprocess.run(
        [sys.executable, "-m", "ctrcal", "train", str(config), "--out", str(run_dir)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"training the tiny run failed:\n{res.stderr}")
    return run_dir


DATA_ONLY_CONFIG = """\
data: {synthetic: {rows: 2000, seed: 0}}
features: {min_count: 2}
"""


def data_inputs(workdir: Path) -> dict[str, Path]:
    """A small dac file, a predictions CSV and a data-only config in ``workdir``."""
    import numpy as np

    from ctrcal.preparation.synthetic import generate

    dac = workdir / "small.txt"
    generate(dac, 2_000, seed=0)
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.6, 2_000)
    y = (rng.uniform(size=p.size) < p).astype(int)
    preds = workdir / "preds.csv"
    preds.write_text(
        "p,y,seg\n"
        + "".join(f"{a:.6f},{b},{i % 5}\n" for i, (a, b) in enumerate(zip(p, y, strict=True)))
    )
    config = workdir / "data_only.yaml"
    config.write_text(DATA_ONLY_CONFIG)
    return {"dac": dac, "preds": preds, "config": config}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs per command (the minimum counts)")
    ap.add_argument(
        "--configs",
        nargs="*",
        type=Path,
        default=[],
        help="configs to validate as well (models included)",
    )
    ap.add_argument("--evaluate", action="store_true", help="add evaluate on a tiny run")
    args = ap.parse_args()

    print(
        f"CPU: {cpu_model_name()}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.2f} (before)"
    )
    print(
        f"python {sys.version.split()[0]}; wall = min of {args.repeats} runs of the whole "
        f"process; imports = what -X importtime attributes to them (min of {args.repeats})"
    )
    with tempfile.TemporaryDirectory(prefix="ctrcal-bench-startup-") as tmp:
        work = Path(tmp)
        inputs = data_inputs(work)
        commands = [
            ("python -c pass", ["-c", "pass"]),
            ("ctrcal --help", ["-m", "ctrcal", "--help"]),
            (
                "ctrcal prepare (2k rows)",
                ["-m", "ctrcal", "prepare", str(inputs["dac"]), "--out", str(work / "prepared")],
            ),
            (
                "ctrcal calibration-report (2k rows)",
                [
                    "-m",
                    "ctrcal",
                    "calibration-report",
                    str(inputs["preds"]),
                    "--prob",
                    "p",
                    "--label",
                    "y",
                    "--segments",
                    "seg",
                    "--bootstrap",
                    "20",
                    "--out",
                    str(work / "report"),
                ],
            ),
            (
                "ctrcal synth (2k rows)",
                ["-m", "ctrcal", "synth", str(work / "synth.txt"), "--rows", "2000"],
            ),
            (
                "ctrcal validate (data-only config)",
                ["-m", "ctrcal", "validate", str(inputs["config"])],
            ),
        ]
        for config in args.configs:
            commands.append(
                (f"ctrcal validate {config}", ["-m", "ctrcal", "validate", str(config)])
            )
        if args.evaluate:
            run_dir = tiny_run(work)
            argv = ["-m", "ctrcal", "evaluate", str(run_dir), "--split", "valid"]
            # the floor of any command that runs a model
            commands.append(("python -c 'import torch'", ["-c", "import torch"]))
            commands.append(("ctrcal evaluate (tiny run)", argv))
        width = max(len(name) for name, _ in commands)
        print(
            f"{'command':<{width}}  {'wall s':>7}  {'x pass':>6}  {'imports s':>9}  "
            "heavy packages imported"
        )
        floor = None
        for name, argv in commands:
            wall = wall_time(argv, args.repeats)
            floor = floor or wall
            imports, heavy = import_profile(argv, args.repeats)
            print(
                f"{name:<{width}}  {wall:7.3f}  {wall / floor:6.1f}  {imports:9.3f}  "
                f"{', '.join(heavy) or '-'}",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
