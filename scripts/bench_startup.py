"""Start-up cost of the ``ctrcal`` commands that should answer at once.

Goal: ``ctrcal --help``, ``ctrcal validate CONFIG`` and ``ctrcal evaluate``'s start-up (the
imports before any data is read) each under 1 s.

For each command this prints the wall time of the whole process (``python -m ctrcal ...``,
interpreter start-up included; the minimum of ``--repeats`` runs, the least disturbed by other
processes), the time ``python -X importtime`` attributes to imports (also the minimum of
``--repeats`` runs), and the heavy packages the command imported (torch, polars, pandas, ...).
A bare ``python -c pass`` is the floor.

``evaluate`` runs on a tiny run trained here first (a few thousand synthetic rows, one epoch:
a few seconds); its import time is what every evaluation pays before it reads data, and the
list shows whether it loaded anything the evaluation does not use. ``import torch`` alone is
printed beside it: the floor of any command that runs a model.

The CPU model (``lscpu``, with family and model numbers) and the load average are printed
with the figures.

Usage::

    python scripts/bench_startup.py                 # --help, validate every shipped config,
                                                    # evaluate on a tiny run
    python scripts/bench_startup.py --repeats 5 --configs configs/demo.yaml
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
HEAVY = ("torch", "triton", "numpy", "pyarrow", "polars", "pandas", "sklearn", "scipy",
         "matplotlib", "yaml")  # fmt: skip

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
        res = subprocess.run([sys.executable, *argv], env=_env(), cwd=ROOT,
                             capture_output=True, text=True)  # fmt: skip
        best = min(best, time.perf_counter() - start)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {res.returncode}:\n{res.stderr}")
    return best


def import_profile(argv: list[str], repeats: int) -> tuple[float, list[str]]:
    """Seconds ``-X importtime`` attributes to imports (the smallest of ``repeats`` runs), and
    the heavy packages imported."""
    best, loaded = float("inf"), set()
    for _ in range(repeats):
        res = subprocess.run([sys.executable, "-X", "importtime", *argv], env=_env(), cwd=ROOT,
                             capture_output=True, text=True)  # fmt: skip
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
        env=_env(), cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"training the tiny run failed:\n{res.stderr}")
    return run_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3, help="runs per command (the minimum counts)")
    ap.add_argument("--configs", nargs="*", type=Path, default=None,
                    help="configs to validate (default: every configs/*.yaml)")  # fmt: skip
    ap.add_argument("--no-evaluate", action="store_true", help="skip evaluate (no training)")
    args = ap.parse_args()
    configs = args.configs
    if configs is None:
        configs = [c.relative_to(ROOT) for c in sorted((ROOT / "configs").glob("*.yaml"))]

    print(f"CPU: {cpu_model_name()}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f} (before)")  # fmt: skip
    print(f"python {sys.version.split()[0]}; wall = min of {args.repeats} runs of the whole "
          f"process; imports = what -X importtime attributes to them (min of {args.repeats})")
    commands = [("python -c pass", ["-c", "pass"]), ("ctrcal --help", ["-m", "ctrcal", "--help"])]
    for config in configs:
        commands.append((f"ctrcal validate {config}", ["-m", "ctrcal", "validate", str(config)]))
    with tempfile.TemporaryDirectory(prefix="ctrcal-bench-startup-") as tmp:
        if not args.no_evaluate:
            run_dir = tiny_run(Path(tmp))
            argv = ["-m", "ctrcal", "evaluate", str(run_dir), "--split", "valid"]
            # the floor of any command that runs a model
            commands.append(("python -c 'import torch'", ["-c", "import torch"]))
            commands.append(("ctrcal evaluate (tiny run)", argv))
        width = max(len(name) for name, _ in commands)
        print(f"{'command':<{width}}  {'wall s':>7}  {'imports s':>9}  heavy packages imported")
        for name, argv in commands:
            wall = wall_time(argv, args.repeats)
            imports, heavy = import_profile(argv, args.repeats)
            print(f"{name:<{width}}  {wall:7.3f}  {imports:9.3f}  {', '.join(heavy) or '-'}",
                  flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
