"""The chunked (bounded-memory) prepare path: same output as in memory, memory cap, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from ctrcal.config import Config
from ctrcal.data import encode as encode_mod
from ctrcal.data import publish as publish_mod
from ctrcal.data.prepare import SPLITS, clean_stale_temporaries, prepare
from ctrcal.data.synthetic import generate, prob_path, write_criteo
from ctrcal.errors import DataError

REPO = Path(__file__).resolve().parents[2]


def _cfg(min_count=2, buckets=0):
    cfg = Config()
    cfg.features.min_count = min_count
    cfg.features.numeric_buckets = buckets
    return cfg


def assert_same_prepared(a: Path, b: Path) -> None:
    """Feature map, vocabulary and every split's rows (in order) are identical."""
    assert json.loads((a / "feature_map.json").read_text()) == json.loads(
        (b / "feature_map.json").read_text()
    )
    assert pl.read_parquet(a / "vocab.parquet").equals(pl.read_parquet(b / "vocab.parquet"))
    for split in SPLITS:
        x, y = pl.read_parquet(a / split), pl.read_parquet(b / split)
        assert x.schema == y.schema, split
        assert x.equals(y), split


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Three generated dac files (with true probabilities) of 3,000 rows each."""
    root = tmp_path_factory.mktemp("chunked_src")
    whole = generate(root / "whole.txt", 9_000, seed=10)  # one generator start-up, cut in 3
    lines = whole.path.read_bytes().splitlines(keepends=True)
    probs = pl.read_parquet(whole.prob_path)
    paths = []
    for i in range(3):
        path = root / f"day_{i}.txt"
        path.write_bytes(b"".join(lines[3_000 * i : 3_000 * (i + 1)]))
        probs.slice(3_000 * i, 3_000).write_parquet(prob_path(path))
        paths.append(path)
    return paths


def test_chunked_equals_memory_random_split(generated, tmp_path):
    cfg = _cfg(min_count=3, buckets=6)
    mem = prepare(generated, tmp_path / "mem", cfg)
    # ~64 KiB chunks: about 100 chunks over three files
    chk = prepare(generated, tmp_path / "chk", cfg, in_memory_bytes=0, chunk_bytes=1 << 16)
    assert mem.summary["path"] == "memory" and chk.summary["path"] == "chunked"
    assert chk.summary["chunks"] > 20
    assert mem.rows == chk.rows and mem.positive_rate == chk.positive_rate
    assert "oracle" in chk.summary  # true probabilities followed the rows through the chunks
    assert_same_prepared(tmp_path / "mem", tmp_path / "chk")
    assert not list((tmp_path / "chk").glob("_*"))  # no work files or owner record published


def test_chunked_equals_memory_explicit_mixed_layouts(criteo_frame, criteo_files, tmp_path):
    # header CSV, gzip streamed without a copy, an unlabelled test file; one malformed row
    lines = criteo_files["dac"].read_text().splitlines()
    fields = lines[700].split("\t")
    fields[5] = "n/a"
    lines[700] = "\t".join(fields)
    bad = tmp_path / "train_bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    inputs = {
        "train": [bad, criteo_files["dac_gz"]],
        "valid": [criteo_files["x4"]],
        "test": [criteo_files["dac_test"]],
    }
    cfg = _cfg(min_count=1)
    mem = prepare(inputs, tmp_path / "mem", cfg, on_bad_row="skip")
    chk = prepare(inputs, tmp_path / "chk", cfg, on_bad_row="skip", in_memory_bytes=0,
                          chunk_bytes=20_000)  # fmt: skip
    assert mem.bad_rows == chk.bad_rows == 1
    assert chk.rows == {"train": 1_999, "valid": 1_000, "test": 1_000}
    assert_same_prepared(tmp_path / "mem", tmp_path / "chk")


def test_chunked_bad_row_names_file_and_line(generated, tmp_path):
    lines = generated[1].read_text().splitlines()
    fields = lines[2_500].split("\t")
    fields[20] = "zz0049e6"  # C7
    lines[2_500] = "\t".join(fields)
    bad = tmp_path / "day_1.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{bad}: line 2501: malformed row: C7 is not a hex"):
        prepare([generated[0], bad], tmp_path / "p", _cfg(), in_memory_bytes=0,
                        chunk_bytes=1 << 16)  # fmt: skip
    assert not (tmp_path / "p").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".p.")]


def test_environment_selects_path_and_row_groups_are_uniform(generated, tmp_path, monkeypatch):
    monkeypatch.setenv("CTRCAL_PREPARE_IN_MEMORY_BYTES", "0")
    monkeypatch.setenv("CTRCAL_PREPARE_CHUNK_BYTES", str(1 << 16))
    monkeypatch.setattr(encode_mod, "ROW_GROUP_ROWS", 500)
    monkeypatch.setattr(encode_mod, "PART_ROWS", 2_000)
    res = prepare(generated, tmp_path / "p", _cfg())
    assert res.summary["path"] == "chunked"
    parts = sorted((tmp_path / "p" / "train").glob("*.parquet"))
    assert [p.name for p in parts[:2]] == ["part-00000.parquet", "part-00001.parquet"]
    sizes = [pq.ParquetFile(p).metadata.row_group(g).num_rows
             for p in parts for g in range(pq.ParquetFile(p).num_row_groups)]  # fmt: skip
    assert sum(sizes) == res.rows["train"]
    assert set(sizes[:-1]) == {500} and 0 < sizes[-1] <= 500
    assert all(pq.ParquetFile(p).metadata.num_rows <= 2_000 for p in parts)
    monkeypatch.setenv("CTRCAL_PREPARE_CHUNK_BYTES", "lots")
    with pytest.raises(DataError, match="CTRCAL_PREPARE_CHUNK_BYTES"):
        prepare(generated, tmp_path / "q", _cfg())


# ---------------------------------------------------------------------------------------------
# Bounded memory

CHILD = r"""
import json, resource, sys
from pathlib import Path
from ctrcal.config import Config
from ctrcal.data.prepare import prepare

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("VmSize", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out

src, out = Path(sys.argv[1]), Path(sys.argv[2])
in_memory, budget = int(sys.argv[3]), int(sys.argv[4])
files = sorted(src.glob("day_*.txt"))
cfg = Config()
cfg.features.min_count = 2
# warm up the same code paths on one small file first: thread pools and allocator arenas
# reserve their address space once, and that is not what the cap is about
prepare([src / "warm.txt"], out / "warm", cfg, in_memory_bytes=in_memory,
                chunk_bytes=1 << 16)
before = status()
cap = (before["VmSize"] + budget) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
prepare(files, out / "data", cfg, in_memory_bytes=in_memory, chunk_bytes=2 << 20)
after = status()
print(json.dumps({"vm_growth": after["VmSize"] - before["VmSize"],
                  "rss_growth": after["VmHWM"] - before["VmHWM"]}))
"""

CAP_FILES = 8
CAP_COPIES = 40  # x 1,000 rows per file: 320k rows, ~78 MB of text in all
CAP_BUDGET_MIB = 150
"""Address space the run may add after warm-up. Measured here with 2 polars threads: the
chunked path (2 MiB chunks) adds ~70 MiB (peak RSS ~60 MiB) whatever the number of rows; the
in-memory path adds ~240 MiB (peak RSS ~215 MiB) for these 320k rows -- the typed frame and
the encoded splits, ~0.7 KiB per row -- and is killed under the cap."""


def _run_capped(src: Path, out: Path, in_memory: int) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "POLARS_MAX_THREADS": "2",  # the same reservations on any machine
        "MALLOC_ARENA_MAX": "2",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out), str(in_memory), str(CAP_BUDGET_MIB)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc/self/status: Linux")
def test_chunked_prepare_under_memory_cap(criteo_frame, tmp_path):
    frame, _ = criteo_frame
    src = tmp_path / "src"
    src.mkdir()
    one = write_criteo(frame, src / "warm.txt")
    text = one.read_bytes() * CAP_COPIES
    for i in range(CAP_FILES):
        (src / f"day_{i}.txt").write_bytes(text)

    chunked = _run_capped(src, tmp_path / "chunked", in_memory=0)
    assert chunked.returncode == 0, chunked.stderr[-2000:]
    growth = json.loads(chunked.stdout.strip().splitlines()[-1])
    # the in-memory path cannot do the same work under the same cap: the cap binds
    memory = _run_capped(src, tmp_path / "memory", in_memory=1 << 40)
    assert memory.returncode != 0, f"in-memory path fit under the cap; chunked grew {growth}"

    files = sorted(src.glob("day_*.txt"))
    prepare(files, tmp_path / "reference", _cfg(min_count=2))
    assert_same_prepared(tmp_path / "reference", tmp_path / "chunked" / "data")


# ---------------------------------------------------------------------------------------------
# Temporary directories left by killed runs

LEAVE_TEMP = r"""
import os, sys
from pathlib import Path
from ctrcal.data.publish import owned_temp_dir
tmp = owned_temp_dir(Path(sys.argv[1]))
(tmp / "_work").mkdir()
(tmp / "_work" / "typed-00000-0000000.parquet").write_bytes(b"x" * 1000)
print(tmp)
os._exit(0)  # as if killed: nothing cleaned up
"""


def test_stale_temporaries_cleaned_live_ones_kept(generated, tmp_path):
    out = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", LEAVE_TEMP, str(out)], capture_output=True,
                          text=True, env=env, check=True)  # fmt: skip
    dead = Path(proc.stdout.strip())
    assert dead.is_dir()
    live = publish_mod.owned_temp_dir(out)  # this process: alive, a concurrent run
    unknown_old = tmp_path / ".data.abcd1234.tmp"  # no owner record, untouched for hours
    (unknown_old / "train").mkdir(parents=True)
    unknown_new = tmp_path / ".data.efgh5678.tmp"  # no owner record, recent
    unknown_new.mkdir()
    gone = json.loads((dead / publish_mod.OWNER_FILE).read_text())["pid"]
    old_aside = tmp_path / f".data.old-{gone}-{time.time_ns()}"
    old_aside.mkdir()  # a previous result moved aside by a process that is gone
    other = tmp_path / ".other.wxyz.tmp"  # another output's temporary: not ours to judge
    other.mkdir()
    hours_ago = time.time() - 3 * publish_mod.STALE_SECONDS
    for path in (unknown_old / "train", unknown_old, other):
        os.utime(path, (hours_ago, hours_ago))

    removed = set(clean_stale_temporaries(out))
    assert removed == {dead, unknown_old, old_aside}
    assert live.is_dir() and unknown_new.is_dir() and other.is_dir()

    # and a real run cleans up by itself before starting
    dead_again = Path(subprocess.run([sys.executable, "-c", LEAVE_TEMP, str(out)], env=env,
                                     capture_output=True, text=True, check=True).stdout.strip())
    prepare(generated[:1], out, _cfg())
    assert not dead_again.exists() and live.is_dir()
