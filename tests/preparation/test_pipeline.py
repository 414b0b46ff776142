"""The one pipeline: chunk size never changes the output bytes; malformed rows named by file
and line in any chunk; uniform row groups; bounded memory; the column coder; cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.preparation import encode as encode_mod
from ctrcal.preparation import publish as publish_mod
from ctrcal.preparation import write as write_mod
from ctrcal.preparation.coder import Answers, ColumnCoder
from ctrcal.preparation.parse import CHUNK_BYTES
from ctrcal.preparation.publish import clean_stale_temporaries
from ctrcal.preparation.stages import MIN_CHUNK_BYTES, ahead, chunk_bytes_for
from ctrcal.preparation.synthetic import generate, prob_path, write_criteo

REPO = Path(__file__).resolve().parents[2]


def _cfg(min_count=2, buckets=0):
    cfg = Config()
    cfg.features.min_count = min_count
    cfg.features.numeric_buckets = buckets
    return cfg


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# session-scoped: under pytest-xdist a module-scoped fixture is made again each time a worker
# comes back to this module (its slow tests run first, the others later)
@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """Three generated dac files (with true probabilities) of 3,000 rows each. Read-only."""
    root = tmp_path_factory.mktemp("chunked_src")
    # one generator start-up, cut in 3; seed 0: the click model of conftest's criteo_frame,
    # likely calibrated in this process already (calibrating another seed costs about 0.5 s)
    whole = generate(root / "whole.txt", 9_000, seed=0)
    lines = whole.path.read_bytes().splitlines(keepends=True)
    probs = pl.read_parquet(whole.prob_path)
    paths = []
    for i in range(3):
        path = root / f"day_{i}.txt"
        path.write_bytes(b"".join(lines[3_000 * i : 3_000 * (i + 1)]))
        probs.slice(3_000 * i, 3_000).write_parquet(prob_path(path))
        paths.append(path)
    return paths


# hundreds of chunks, tens, one per file: the inputs here are under 1 MB a file, so the
# smallest chunk size prepare chooses itself is one chunk a file (a larger one only makes a
# larger read buffer to zero: 1 GiB took about 0.5 s a file)
CHUNK_SIZES = (1 << 12, 1 << 16, MIN_CHUNK_BYTES)
# every chunk size and every thread count once: one thread (no stage runs ahead), two, and
# more threads than cores; the first run (most chunks) is the one the others must equal
RUNS = ((CHUNK_SIZES[0], 2), (CHUNK_SIZES[1], 1), (CHUNK_SIZES[1], 5), (CHUNK_SIZES[2], 2))


def _same_bytes_for_every_chunk_size(inputs, tmp_path, cfg, **kw):
    outs = []
    for size, threads in RUNS:
        out = tmp_path / f"c{size}_t{threads}"
        res = prepare(inputs, out, cfg, chunk_bytes=size, threads=threads, **kw)
        outs.append((res, _files(out)))
    (first, want), *rest = outs
    for res, got in rest:
        assert got == want  # byte for byte: feature map, vocabulary, every part
        assert res.rows == first.rows and res.bad_rows == first.bad_rows
    assert outs[0][0].summary["chunks"] > 50 * outs[-1][0].summary["chunks"]
    return first


@pytest.mark.slow
@pytest.mark.parametrize("order", ["random", "time"])
def test_chunk_size_and_threads_never_change_the_output_bytes(generated, tmp_path, order):
    cfg = _cfg(min_count=3, buckets=6)
    cfg.data.split_order = order
    res = _same_bytes_for_every_chunk_size(generated[:2], tmp_path, cfg)
    assert "oracle" in res.summary  # true probabilities followed the rows through the chunks
    assert not list((tmp_path / f"c{CHUNK_SIZES[0]}_t2").glob("_*"))  # no work files published


POLARS_CHILD = r"""
import sys
from ctrcal.config import Config
from ctrcal.api import prepare
from ctrcal.preparation import write
write.ROW_GROUP_ROWS, write.PART_ROWS = 300, 900  # parts of several row groups
cfg = Config()
cfg.features.min_count, cfg.features.numeric_buckets = 3, 0  # _cfg(min_count=3)
prepare(sys.argv[1:-1], sys.argv[-1], cfg)
"""


@pytest.mark.slow
@pytest.mark.parametrize("polars_threads", ["1", "3"])
def test_polars_threads_never_change_the_output_bytes(
    generated, tmp_path, monkeypatch, polars_threads
):
    # polars encodes a part's columns on its own pool, whose size is fixed per process
    env = {**os.environ, "PYTHONPATH": str(REPO), "POLARS_MAX_THREADS": polars_threads}
    child = [sys.executable, "-c", POLARS_CHILD, *map(str, generated[:2])]
    subprocess.run([*child, str(tmp_path / "child")], env=env, check=True, timeout=120)
    monkeypatch.setattr(write_mod, "ROW_GROUP_ROWS", 300)
    monkeypatch.setattr(write_mod, "PART_ROWS", 900)
    prepare(generated[:2], tmp_path / "here", _cfg(min_count=3))
    assert len(list((tmp_path / "here" / "train").glob("*.parquet"))) > 3
    assert _files(tmp_path / "child") == _files(tmp_path / "here")


@pytest.mark.slow
def test_chunk_size_and_threads_never_change_mixed_layouts_and_skipped_rows(criteo_files, tmp_path):
    # header CSV, gzip streamed, an unlabelled test file; malformed rows parsed by polars
    # in chunks between chunks of the C reader
    lines = criteo_files["dac"].read_text().splitlines()
    for k in (100, 700):
        fields = lines[k].split("\t")
        fields[5] = "n/a"
        lines[k] = "\t".join(fields)
    bad = tmp_path / "train_bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    inputs = {
        "train": [bad, criteo_files["dac_gz"]],
        "valid": [criteo_files["x4"]],
        "test": [criteo_files["dac_test"]],
    }
    res = _same_bytes_for_every_chunk_size(inputs, tmp_path, _cfg(min_count=1), on_bad_row="skip")
    assert res.bad_rows == 2
    assert res.rows == {"train": 1_998, "valid": 1_000, "test": 1_000}


def test_chunked_bad_row_names_file_and_line(generated, tmp_path):
    lines = generated[1].read_text().splitlines()
    fields = lines[2_500].split("\t")
    fields[20] = "zz0049e6"  # C7
    lines[2_500] = "\t".join(fields)
    bad = tmp_path / "day_1.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{bad}: line 2501: malformed row: C7 is not a hex"):
        prepare([generated[0], bad], tmp_path / "p", _cfg(), chunk_bytes=1 << 16)
    assert not (tmp_path / "p").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".p.")]


def test_environment_sets_the_chunk_size_and_row_groups_are_uniform(
    generated, tmp_path, monkeypatch
):
    monkeypatch.setenv("CTRCAL_PREPARE_CHUNK_BYTES", str(1 << 16))
    monkeypatch.setattr(write_mod, "ROW_GROUP_ROWS", 500)
    monkeypatch.setattr(write_mod, "PART_ROWS", 2_000)
    res = prepare(generated, tmp_path / "p", _cfg())
    assert res.summary["chunks"] > 20
    parts = sorted((tmp_path / "p" / "train").glob("*.parquet"))
    assert [p.name for p in parts[:2]] == ["part-00000.parquet", "part-00001.parquet"]
    sizes = [
        pq.ParquetFile(p).metadata.row_group(g).num_rows
        for p in parts
        for g in range(pq.ParquetFile(p).num_row_groups)
    ]
    assert sum(sizes) == res.rows["train"]
    assert set(sizes[:-1]) == {500} and 0 < sizes[-1] <= 500
    assert all(pq.ParquetFile(p).metadata.num_rows <= 2_000 for p in parts)
    monkeypatch.setenv("CTRCAL_PREPARE_CHUNK_BYTES", "lots")
    with pytest.raises(DataError, match="CTRCAL_PREPARE_CHUNK_BYTES"):
        prepare(generated, tmp_path / "q", _cfg())
    monkeypatch.delenv("CTRCAL_PREPARE_CHUNK_BYTES")
    monkeypatch.setenv("CTRCAL_PREPARE_THREADS", "0")
    with pytest.raises(DataError, match="threads must be >= 1, got 0"):
        prepare(generated, tmp_path / "q", _cfg())


def test_blocks_grown_and_waiting_on_disk_give_the_same_bytes(generated, tmp_path, monkeypatch):
    monkeypatch.setattr(write_mod, "ROW_GROUP_ROWS", 300)
    monkeypatch.setattr(write_mod, "PART_ROWS", 900)
    cfg = _cfg(min_count=3, buckets=4)
    prepare(generated, tmp_path / "memory", cfg, chunk_bytes=1 << 16)
    spilled = []
    settle = encode_mod._Blocks.settle

    def spy(self):
        before = set(self.work.glob("*.bin"))
        settle(self)
        spilled.extend(p.stat().st_size for p in set(self.work.glob("*.bin")) - before)

    monkeypatch.setattr(encode_mod._Blocks, "settle", spy)
    monkeypatch.setattr(encode_mod, "MEMORY_BYTES", 0)  # every full block waits on disk
    # unforeseen splits: first blocks grow 50, 100, 200, ...
    monkeypatch.setattr(encode_mod, "FIRST_BLOCK_ROWS", 50)
    monkeypatch.setattr(encode_mod._Blocks, "expect", lambda self, k, rows: None)
    prepare(generated, tmp_path / "disk", cfg, chunk_bytes=1 << 14, threads=3)
    assert len(spilled) >= 6  # train's 7,200 rows: 8 parts, all but its last written out
    # each column's codes wait narrowed (a few hundred distinct values: uint8 or uint16)
    assert max(spilled) < 0.6 * (1 + 39) * 900 * 4
    assert _files(tmp_path / "disk") == _files(tmp_path / "memory")
    assert not list((tmp_path / "disk").rglob("*.bin"))


def test_a_block_waits_on_disk_in_narrow_codes_and_comes_back_the_same(tmp_path):
    rows = 1_000
    rng = np.random.default_rng(0)
    block = np.empty((5, rows), dtype=np.float32)
    block[0] = np.where(rng.random(rows) < 0.1, np.nan, rng.integers(0, 2, rows))
    codes = block[1:4].view(np.int32)
    codes[0] = rng.integers(0, 256, rows)  # uint8
    codes[1] = rng.integers(0, 65_536, rows)  # uint16
    codes[2] = rng.integers(0, 3_000_000, rows)  # int32
    codes[2, 7] = np.iinfo(np.int32).max
    block[4] = rng.random(rows, dtype=np.float32)  # true probabilities
    store = encode_mod._Blocks(tmp_path, columns=5, codes=3)
    waiting = store._write(block, tmp_path / "b.bin")
    assert [d.itemsize for d in waiting.dtypes] == [4, 1, 2, 4, 4]
    assert (tmp_path / "b.bin").stat().st_size == rows * (4 + 1 + 2 + 4 + 4)
    back = np.full_like(block, 7.0)
    store._read(waiting, back)
    assert back.tobytes() == block.tobytes()  # NaN labels and every code bit for bit
    (tmp_path / "b.bin").write_bytes(b"\0" * 100)
    with pytest.raises(OSError, match="shorter than the block"):
        store._read(waiting, back)


def test_the_chunk_size_follows_the_input_size_and_the_threads():
    mib = 1 << 20
    assert chunk_bytes_for(1_000, 2) == MIN_CHUNK_BYTES  # a small file: one chunk
    assert chunk_bytes_for(120 * mib, 2) == 15 * mib  # 4 chunks a thread
    assert chunk_bytes_for(120 * mib, 1) == 30 * mib
    assert chunk_bytes_for(11 << 30, 2) == CHUNK_BYTES  # memory stays a few chunks


def test_a_stage_run_ahead_hands_on_its_error_and_stops_with_its_consumer():
    made = []

    def items(fail_at=None):
        for k in range(100):
            if k == fail_at:
                raise DataError(f"item {k} is bad")
            made.append(k)
            yield k

    assert list(ahead(items(), depth=2)) == list(range(100))
    got = []
    with pytest.raises(DataError, match="item 7 is bad"):
        for k in ahead(items(fail_at=7)):
            got.append(k)
    assert got == list(range(7))  # every item before the bad one, in order
    made.clear()
    stream = ahead(items(), depth=1)
    assert next(stream) == 0
    stream.close()  # the consumer stops: the producer stops too (one queued, one in hand)
    assert len(made) <= 3 and made == list(range(len(made)))


# ---------------------------------------------------------------------------------------------
# Bounded memory

CHILD = r"""
import json, resource, sys
from pathlib import Path
from ctrcal.config import Config
from ctrcal.api import prepare

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("VmSize", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out

src, out = Path(sys.argv[1]), Path(sys.argv[2])
budget = int(sys.argv[3])
files = sorted(src.glob("day_*.txt"))
cfg = Config()
cfg.features.min_count = 2
# warm up the same code paths on one small file first: thread pools and allocator arenas
# reserve their address space once, and that is not what the cap is about
prepare([src / "warm.txt"], out / "warm", cfg, chunk_bytes=1 << 16)
before = status()
cap = (before["VmSize"] + budget) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
prepare(files, out / "data", cfg, chunk_bytes=2 << 20)
after = status()
print(json.dumps({"vm_growth": after["VmSize"] - before["VmSize"],
                  "rss_growth": after["VmHWM"] - before["VmHWM"]}))
"""

CAP_FILES = 8
CAP_COPIES = 40  # x 1,000 rows per file: 320k rows, ~78 MB of text in all
CAP_BUDGET_MIB = 150
"""Address space the run may add after warm-up: a few 2 MiB chunks, their codes (kept in
memory up to ``encode.MEMORY_BYTES``, here less than that) and the coders, not the input."""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc/self/status: Linux")
def test_prepare_under_memory_cap(criteo_frame, tmp_path, monkeypatch):
    frame, _ = criteo_frame
    src = tmp_path / "src"
    src.mkdir()
    one = write_criteo(frame, src / "warm.txt")
    text = one.read_bytes() * CAP_COPIES
    for i in range(CAP_FILES):
        (src / f"day_{i}.txt").write_bytes(text)
    env = {
        **os.environ,
        "POLARS_MAX_THREADS": "2",
        "MALLOC_ARENA_MAX": "2",
        "PYTHONPATH": str(REPO),
    }
    capped = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(tmp_path / "capped"), str(CAP_BUDGET_MIB)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert capped.returncode == 0, capped.stderr[-2000:]
    files = sorted(src.glob("day_*.txt"))
    prepare(files, tmp_path / "reference", _cfg(min_count=2))
    assert _files(tmp_path / "reference") == _files(tmp_path / "capped" / "data")


# ---------------------------------------------------------------------------------------------
# Temporary directories left by killed runs

LEAVE_TEMP = r"""
import os, sys
from pathlib import Path
from ctrcal.preparation.publish import owned_temp_dir
tmp = owned_temp_dir(Path(sys.argv[1]))
(tmp / "_work").mkdir()
(tmp / "_work" / "coded-0000000.bin").write_bytes(b"x" * 1000)
print(tmp)
os._exit(0)  # as if killed: nothing cleaned up
"""


@pytest.mark.slow
def test_stale_temporaries_cleaned_live_ones_kept(generated, tmp_path):
    out = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", LEAVE_TEMP, str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
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
    dead_again = Path(
        subprocess.run(
            [sys.executable, "-c", LEAVE_TEMP, str(out)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    prepare(generated[:1], out, _cfg())
    assert not dead_again.exists() and live.is_dir()


# ---------------------------------------------------------------------------------------------
# The column coder


@pytest.mark.parametrize("distinct", [1, 50, 30_000])  # 30k: the table grows several times
def test_coder_keeps_codes_and_train_counts_across_chunks(distinct):
    rng = np.random.default_rng(distinct)
    values = rng.integers(0, distinct, 100_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    valid = (rng.random(100_000) > 0.1).astype(np.uint8)
    train = (rng.random(100_000) > 0.3).astype(np.uint8)
    coder = ColumnCoder()
    codes = np.concatenate(
        [
            coder.code(values[a:b], valid[a:b], train[a:b])
            for a, b in ((0, 7), (7, 40_000), (40_000, 100_000))
        ]
    )
    seen, counts, missing = coder.state()
    # 32-bit counts folded into 64-bit totals every 1,000 rows (every 2^32 - 1 in use)
    folding = ColumnCoder(fold=1_000)
    refolded = np.concatenate(
        [
            folding.code(values[a:b], valid[a:b], train[a:b])
            for a, b in ((0, 2_500), (2_500, 100_000))
        ]
    )
    np.testing.assert_array_equal(refolded, codes)
    for got, want in zip(folding.state(), (seen, counts, missing), strict=True):
        np.testing.assert_array_equal(got, want)
    # codes number the distinct values in order of first appearance, 0 = missing
    first = {}
    for v in values[valid == 1].tolist():
        first.setdefault(v, len(first))
    assert seen.tolist() == list(first)
    want = np.array([first.get(v, -1) + 1 for v in values.tolist()]) * valid
    np.testing.assert_array_equal(codes, want)
    in_train = (valid == 1) & (train == 1)
    np.testing.assert_array_equal(counts, np.bincount(want[in_train] - 1, minlength=len(seen)))
    assert missing == int(((valid == 0) & (train == 1)).sum())
    ids = np.arange(len(seen) + 1, dtype=np.int32) * 3 - 1
    values = np.linspace(-1, 1, len(seen) + 1, dtype=np.float32)
    block = np.stack([codes, codes[::-1]])[:, 5:-7]  # rows of a wider array, as chunks hold
    out = np.empty((3, len(codes)), np.float32)[1:, 3:-9]  # rows of a part's block
    Answers([ids, values]).gather(block, out)
    np.testing.assert_array_equal(out[0].view(np.int32), ids[block[0]])
    np.testing.assert_array_equal(out[1], values[block[1]])
