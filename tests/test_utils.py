"""Atomic writes and the clean-up of what a killed writer left."""

from __future__ import annotations

import pytest

from ctrcal.eval.render import REPORT_OUTPUTS
from ctrcal.utils import atomic_path, remove_stale_temporaries, write_text_atomic


def test_atomic_write_leaves_the_old_file_when_the_body_fails(tmp_path):
    target = tmp_path / "results.csv"
    write_text_atomic(target, "old\n")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_stale_temporaries_of_named_targets_only(tmp_path):
    mine = [".results.csv.a1.tmp", ".summary.json.b2.tmp", ".fig_gauss_auc.png.c3.tmp"]
    others = [".data.d4.tmp", ".report.md.lock", "results.csv", ".results.csv.tmpx"]
    for name in mine + others:
        (tmp_path / name).write_text("x")
    (tmp_path / ".runs.e5.tmp").mkdir()  # a directory temporary of another owner
    removed = remove_stale_temporaries(tmp_path, REPORT_OUTPUTS)
    assert sorted(p.name for p in removed) == sorted(mine)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*others, ".runs.e5.tmp"])
    # without targets every temporary goes, directories included (a run directory's own)
    assert {p.name for p in remove_stale_temporaries(tmp_path)} == {".data.d4.tmp", ".runs.e5.tmp"}
    assert remove_stale_temporaries(tmp_path / "missing") == []
