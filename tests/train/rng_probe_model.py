"""A user model for the multi-process tests, defined only for them (not part of the package).

``RngProbe(feature_map, ...)`` follows the user-model contract and holds one ``nn.LayerNorm``
for ``model.net_norm`` to replace. While training, every forward pass appends one line to
``$RNG_PROBE_DIR/rank<RANK>-<pid>.txt``: a digest of torch's CPU random state at that moment,
which is the state the model's MC-LayerNorm draws its subsets from (no layer before it draws
random numbers). Equal digests mean equal subsets; different digests, independent ones.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn

RECORD_DIR = "RNG_PROBE_DIR"


def read_records(directory: Path) -> dict[tuple[int, int], list[str]]:
    """``{(rank, pid): [digest per training step]}``; a line cut short by a kill is dropped."""
    out = {}
    for path in sorted(directory.glob("rank*-*.txt")):
        rank, pid = path.stem[len("rank") :].split("-")
        lines = path.read_text().split("\n")
        out[int(rank), int(pid)] = [x for x in lines if len(x) == 16]
    return out


class RngProbe(nn.Module):
    def __init__(self, feature_map, dim: int = 4, hidden: int = 16) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(v, dim) for v in feature_map.vocab_sizes)
        width = dim * len(self.tables) + len(feature_map.numeric_fields)
        self.inner = nn.Linear(width, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, batch) -> torch.Tensor:
        directory = os.environ.get(RECORD_DIR)
        if self.training and directory:
            digest = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]
            name = f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.txt"
            with open(Path(directory) / name, "a") as f:
                f.write(digest + "\n")
        cats = [t(batch.categorical[:, j]) for j, t in enumerate(self.tables)]
        x = torch.cat([*cats, torch.nan_to_num(batch.numeric)], dim=1)
        return self.out(torch.relu(self.norm(self.inner(x)))).squeeze(-1)
