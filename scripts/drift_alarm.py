"""Does the multivariate drift alarm fire on 10k rows with 6.25 % Gaussian noise?

The reference is a prepared directory's train split (cut into 10 chunks for the threshold),
the analysis its test split, clean and with Gaussian noise of 6.25 % of each numeric feature's
std in the original space (the shift report's ``gaussian_numeric``, ``space: original``), as one
chunk. Prints the domain classifier's AUC against its threshold and how many features alarm.

Usage::

    python -m ctrcal run configs/demo.yaml --out outputs/demo   # prepares outputs/demo/data
    python scripts/drift_alarm.py outputs/demo/data
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ctrcal.data.feature_map import FeatureMap
from ctrcal.metrics import DriftMonitor
from ctrcal.shifts.registry import create_shift
from ctrcal.train.splits import open_split


def features(data_dir: str, split: str, names: list[str], shift=None) -> dict[str, np.ndarray]:
    """name -> [n] values of a split (model-space numerics, categorical ids), shifted."""
    data = open_split(data_dir, split, "memory", torch.device("cpu"))
    num, cat = [], []
    for b in data.batches(8192, shuffle=False):
        if shift is not None:
            b, _ = shift.apply(b)
        num.append(b.numeric.double().numpy())
        cat.append(b.categorical.numpy().astype(np.int64))
    x = np.concatenate(num)
    c = np.concatenate(cat)
    cols = [x[:, j] for j in range(x.shape[1])] + [c[:, j] for j in range(c.shape[1])]
    return dict(zip(names, cols, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--intensity", type=float, default=0.0625)
    args = ap.parse_args()
    fmap = FeatureMap.load(args.data_dir)
    names = [*fmap.numeric_fields, *fmap.categorical_fields]
    ref = features(args.data_dir, "train", names)
    rows = len(next(iter(ref.values())))
    monitor = DriftMonitor(rows // 10).fit(ref)
    print(f"reference: the train split, {rows:,} rows in chunks of {rows // 10:,}")
    spec = {"name": "gaussian_numeric", "space": "original"}
    for s in (0.0, args.intensity):
        shift = None if s == 0 else create_shift(spec, fmap, intensity=s, seed=0)
        for c in monitor.transform(features(args.data_dir, "test", names, shift)):
            mv = next(x for x in c.scores if x.method == "domain_classifier")
            alarmed = sum(x.alarm for x in c.scores if x.feature is not None)
            print(
                f"noise {s:g}: {c.stop - c.start:,} rows: domain AUC {mv.value:.4f} "
                f"(threshold {mv.threshold:.4f}), alarm {mv.alarm}; {alarmed} features alarmed"
            )


if __name__ == "__main__":
    main()
