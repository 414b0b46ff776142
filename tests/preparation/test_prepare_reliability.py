"""kill -9 at any moment of prepare, then the same command again, gives the uninterrupted
output; two prepares into one directory at once both end cleanly with one valid output."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from forked_cli import ForkedCommand
from interrupt import child_env, kill_9, snapshot

from ctrcal.preparation.publish import is_prepared
from ctrcal.preparation.synthetic import generate_frame, write_criteo


def _prepare(args: list[str]) -> int:
    """The child: prepare ``raw`` into ``out`` in small chunks, saying when it starts."""
    from ctrcal.api import prepare
    from ctrcal.config import Config

    raw, out, flag = args
    cfg = Config()
    cfg.features.min_count = 2
    Path(flag).write_text("started")
    prepare([raw], out, cfg, chunk_bytes=1 << 15)
    return 0


def _start(raw, out, flag) -> ForkedCommand:
    # forked from the server that imported ctrcal once (see forked_cli.py): the kills land
    # in the preparing, not in the imports
    return ForkedCommand([str(raw), str(out), str(flag)], child_env(), main=_prepare)


def _run(raw, out, flag):
    proc = _start(raw, out, flag)
    assert proc.wait(timeout=120) == 0, proc.output()[1]


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# both tests compare with one uninterrupted prepare, made once: the module runs on one worker
# (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("prepare_reliability")


@pytest.fixture(scope="session")
def raw(tmp_path_factory):
    # seed 0: the click model of conftest's criteo_frame, likely calibrated in this process
    # already (calibrating another seed costs about 0.5 s)
    frame, _ = generate_frame(6_000, seed=0)
    return write_criteo(frame, tmp_path_factory.mktemp("kill") / "train.txt")


@pytest.fixture(scope="session")
def uninterrupted(raw, tmp_path_factory):
    """What an uninterrupted prepare of ``raw`` writes, the reference of both tests ->
    ``(snapshot, seconds from the end of the imports to the end)``."""
    root = tmp_path_factory.mktemp("reference")
    out, flag = root / "out", root / "flag"
    proc = _start(raw, out, flag)
    while not flag.exists() and proc.poll() is None:
        time.sleep(0.002)
    start = time.perf_counter()
    assert proc.wait(timeout=120) == 0, proc.output()[1]
    return snapshot(out), time.perf_counter() - start


@pytest.mark.slow
def test_kill_9_at_any_moment_then_again_gives_the_uninterrupted_output(
    raw, uninterrupted, tmp_path
):
    expected, work = uninterrupted
    flag = tmp_path / "flag"
    out = tmp_path / "out"
    # kills spread over the work, each leaving its state to the next run
    for fraction in (0.02, 0.3, 0.6, 0.85, 0.98):
        flag.unlink(missing_ok=True)
        proc = _start(raw, out, flag)
        while not flag.exists() and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(work * fraction)
        kill_9(proc)
        assert not out.exists() or is_prepared(out)  # never a half-written directory
    _run(raw, out, flag)
    assert snapshot(out) == expected
    assert _leftovers(out) == []


@pytest.mark.slow
def test_two_prepares_at_once_end_cleanly_with_one_valid_output(raw, uninterrupted, tmp_path):
    out = tmp_path / "out"
    procs = [_start(raw, out, tmp_path / f"f{i}") for i in (1, 2)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0], [p.output()[1] for p in procs]
    assert is_prepared(out)
    assert snapshot(out) == uninterrupted[0]
    assert _leftovers(out) == []


def test_a_temporary_killed_before_its_owner_record_is_cleaned_by_its_name(tmp_path, monkeypatch):
    import subprocess
    import sys

    from ctrcal.preparation import publish

    out = tmp_path / "out"
    mine = publish.owned_temp_dir(out)
    (mine / publish.OWNER_FILE).unlink()  # as a kill between mkdtemp and the record
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setattr(publish.os, "getpid", lambda: dead.pid)
    orphan = publish.owned_temp_dir(out)
    (orphan / publish.OWNER_FILE).unlink()
    monkeypatch.undo()
    removed = publish.clean_stale_temporaries(out)
    assert removed == [orphan] and mine.exists()  # a live owner's is left alone
