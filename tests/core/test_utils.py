"""Atomic writes, the clean-up of what a killed writer left, failed writes, strict JSON and
directory locks."""

from __future__ import annotations

import errno
import os

import pytest

from ctrcal.core.errors import OutputError
from ctrcal.core.utils import (
    atomic_path,
    describe_os_error,
    directory_lock,
    make_dirs,
    remove_stale_temporaries,
    write_failure_cause,
    write_json_atomic,
    write_text_atomic,
    writing,
)
from ctrcal.reports.shift.render import REPORT_OUTPUTS


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


# ---------------------------------------------------------------------------------------------
# Failed writes: one line naming the path and the cause


@pytest.mark.parametrize(
    "code, cause",
    [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EDQUOT, "disk quota exceeded"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
        (errno.EIO, os.strerror(errno.EIO)),
    ],
)
def test_an_os_error_names_its_cause(code, cause, tmp_path):
    exc = OSError(code, os.strerror(code))
    assert write_failure_cause(tmp_path / "x", exc) == cause
    line = describe_os_error(tmp_path / "x", exc)
    assert line.startswith(f"{tmp_path / 'x'}: cannot write: {cause}")


def test_an_errno_in_a_rust_or_cpp_writers_message_is_read(tmp_path):
    import polars as pl

    exc = pl.exceptions.ComputeError("failed to write: No space left on device (os error 28)")
    assert write_failure_cause(tmp_path / "x.parquet", exc) == "no space left on the device"
    with pytest.raises(OutputError, match="x.parquet: cannot write: read-only file system"):
        with writing(tmp_path / "x.parquet"):
            raise OSError(f"Read-only file system (os error {errno.EROFS})")
    with pytest.raises(ValueError, match="a bug"), writing(tmp_path / "x.parquet"):
        raise ValueError("a bug")


def test_torchs_errno_less_runtime_error_is_explained_by_the_file_system(tmp_path, monkeypatch):
    exc = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert write_failure_cause(tmp_path / "last.pt", exc) is None  # space left: a bug
    real = os.statvfs(tmp_path)

    def statvfs(path, full=True, read_only=False):
        fields = {name: getattr(real, name) for name in dir(real) if name.startswith("f_")}
        if full:
            fields.update(f_bavail=0, f_bfree=0)
        if read_only:
            fields["f_flag"] = real.f_flag | os.ST_RDONLY
        return type("Stat", (), fields)()

    monkeypatch.setattr(os, "statvfs", statvfs)
    assert write_failure_cause(tmp_path / "a" / "last.pt", exc) == "no space left on the device"
    monkeypatch.setattr(os, "statvfs", lambda p: statvfs(p, full=False, read_only=True))
    assert write_failure_cause(tmp_path / "last.pt", exc) == "read-only file system"
    # any other RuntimeError inside a write keeps its traceback
    monkeypatch.setattr(os, "statvfs", lambda p: statvfs(p, full=False))
    with pytest.raises(RuntimeError, match="unexpected pos"), atomic_path(tmp_path / "y") as tmp:
        tmp.write_text("half")
        raise exc


def test_a_full_disk_keeps_the_old_file_and_says_so_in_one_line(tmp_path, monkeypatch):
    from pathlib import Path

    target = tmp_path / "results.csv"
    write_text_atomic(target, "old\n")
    real = Path.write_text

    def full_disk(self, text, *args, **kwargs):  # the kernel's own ENOSPC, from /dev/full
        with open("/dev/full", "w") as disk:
            disk.write(text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OutputError) as failed:
        write_text_atomic(target, "new\n")
    assert str(failed.value) == (
        f"{target}: cannot write: no space left on the device; free some space and run the "
        "command again"
    )
    monkeypatch.undo()
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_a_read_only_directory_is_named(tmp_path, monkeypatch):
    from pathlib import Path

    real = Path.mkdir
    ro = tmp_path / "ro"

    def mkdir(self, *args, **kwargs):
        if self == ro:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(OutputError, match=f"{ro}: cannot write: read-only file system"):
        write_text_atomic(ro / "report.md", "x")
    with pytest.raises(OutputError, match="read-only file system"):
        make_dirs(ro / "runs")


def test_json_is_written_strictly_undefined_numbers_as_null(tmp_path):
    import json
    import math

    path = tmp_path / "result.json"
    write_json_atomic(path, {"auc": math.nan, "ece": 0.25, "rows": [1.0, math.inf, -math.inf]})

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "auc": None,
        "ece": 0.25,
        "rows": [1.0, None, None],
    }
    # numpy values (the reports' arrays and scalars), paths and non-string keys as plain JSON
    import numpy as np

    values = {"a": np.array([0.5, np.nan]), "n": np.int64(3), "f": np.float32(2)}
    values |= {"ok": np.bool_(True), "dir": tmp_path, ("x", 1): 1, 2: "two"}
    write_json_atomic(path, values)
    expected = {"a": [0.5, None], "n": 3, "f": 2.0, "ok": True, "dir": str(tmp_path)}
    expected |= {"('x', 1)": 1, "2": "two"}
    assert json.loads(path.read_text(), parse_constant=refuse) == expected


# ---------------------------------------------------------------------------------------------
# Directory locks


@pytest.mark.slow
def test_a_held_lock_refuses_or_waits_and_names_its_holder(tmp_path):
    import subprocess
    import sys

    from interrupt import child_env

    from ctrcal.core.errors import CtrcalError

    target = tmp_path / "run"
    code = (
        "import sys\nfrom ctrcal.core.utils import directory_lock\n"
        f"with directory_lock({str(target)!r}, 'test'):\n"
        "    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        env=child_env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        named = f"another test is writing it \\(pid {holder.pid} on "
        with pytest.raises(CtrcalError, match=named), directory_lock(target, "test", wait=False):
            pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with directory_lock(target, "test", wait=False):  # released with its holder
        assert (tmp_path / ".run.lock").exists()
    assert not (tmp_path / ".run.lock").exists()
