"""data.engine: ray in Ray's local mode (2 CPUs, one session for the module): the local
engine's bytes, a killed worker retried or one clear line, an unreachable address named fast,
and the local engine never importing Ray."""

from __future__ import annotations

import filecmp
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctrcal.config import Config, DataConfig, FeaturesConfig
from ctrcal.core.errors import ConfigError, DataError
from ctrcal.data.identity import data_identity
from ctrcal.preparation import engines, ray_engine, write
from ctrcal.preparation.prepare import prepare
from ctrcal.preparation.splits import SPLITS
from ctrcal.preparation.synthetic import generate

# one worker of `make test` runs them all (--dist loadgroup): one Ray for the module
pytestmark = pytest.mark.xdist_group("ray")

PART = 3000  # rows per part here, so that parts straddle the small files
FEATURES = FeaturesConfig(min_count=2)


def _setup_worker() -> None:
    """Run in every Ray worker: the small parts, and a worker that dies once after reading
    its file while the marker file exists (the retry test creates it)."""

    from ctrcal.preparation import ray_engine, write

    write.PART_ROWS, write.ROW_GROUP_ROWS = PART, PART // 2
    real = ray_engine.read_source

    def read_source(*args, **kwargs):
        real(*args, **kwargs)
        try:
            os.unlink(os.environ["CTRCAL_TEST_KILL_MARKER"])
        except FileNotFoundError:
            return
        os._exit(1)  # as a kill -9 mid-task: its file's blocks half written

    ray_engine.read_source = read_source


# one Ray for the module, shut down after it: the group's tests run one after another on one
# worker, and an idle Ray's nine processes take about 7 % of a core for as long as they live
@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="the ray engine's tests need ray (ctrcal[ray])")
    marker = tmp_path_factory.mktemp("kill") / "marker"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": _setup_worker,
            "env_vars": {"CTRCAL_TEST_KILL_MARKER": str(marker)},
        },
    )
    yield marker
    ray.shutdown()


# files only, kept for the session: made once even where the module's tests are not run
# together (a run without xdist takes the slow tests first)
@pytest.fixture(scope="session")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("days")
    files = []
    # Criteo 1TB's shape at a tiny size: one generated stream cut into 24 day files of
    # different lengths (one click model, drawn once)
    generate(root / "stream.tsv", sum(300 + 60 * d for d in range(24)), seed=0)
    lines = (root / "stream.tsv").read_bytes().splitlines(keepends=True)
    start = 0
    for d in range(24):
        files.append(root / f"day_{d}.tsv")
        files[-1].write_bytes(b"".join(lines[start : start + 300 + 60 * d]))
        start += 300 + 60 * d
    return files


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(write, "PART_ROWS", PART)
    monkeypatch.setattr(write, "ROW_GROUP_ROWS", PART // 2)


@pytest.fixture(scope="session")
def local_output(days, tmp_path_factory):
    """``local_output(**data)`` -> what the local engine prepares from the day files in small
    parts with ``DataConfig(**data)`` (its ``out_dir`` read-only), prepared once per session
    for each ``data``: the ray engine's tests of its bytes and of a retried worker compare with
    the same one."""
    done = {}

    def local_output(**data):
        key = json.dumps(data, sort_keys=True)
        if key not in done:
            out = tmp_path_factory.mktemp("local") / "local"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(write, "PART_ROWS", PART)
                patch.setattr(write, "ROW_GROUP_ROWS", PART // 2)
                done[key] = _prepare(days, out, "local", **data)
        return done[key]

    return local_output


def _prepare(files, out, engine, **data):
    cfg = DataConfig(engine=engine, **data)
    return prepare(files, out, cfg, FEATURES, force=True, chunk_bytes=1 << 17)


def _assert_same_directory(a: Path, b: Path) -> None:
    for split in SPLITS:
        names = sorted(p.name for p in (a / split).iterdir())
        assert names == sorted(p.name for p in (b / split).iterdir())
        same, differ, _ = filecmp.cmpfiles(a / split, b / split, names, shallow=False)
        assert same == names, differ
    assert filecmp.cmp(a / "vocab.parquet", b / "vocab.parquet", shallow=False)
    fa, fb = (json.loads((d / "feature_map.json").read_text()) for d in (a, b))
    assert fa == fb
    assert data_identity(a) == data_identity(b)


@pytest.mark.slow
@pytest.mark.parametrize(
    "data", [{}, {"split_order": "time", "split": [22, 1, 1]}], ids=["random", "days"]
)
def test_ray_writes_the_local_engines_bytes(
    ray_session, days, small_parts, local_output, tmp_path, data
):
    local = local_output(**data)
    ray = _prepare(days, tmp_path / "ray", "ray", **data)
    assert ray.rows == local.rows and len(list((tmp_path / "ray/train").iterdir())) > 3
    _assert_same_directory(local.out_dir, tmp_path / "ray")


@pytest.mark.slow
def test_a_killed_worker_is_retried_or_fails_in_one_line(
    ray_session, days, small_parts, local_output, tmp_path, monkeypatch
):
    marker = ray_session
    marker.write_text("die once")
    _prepare(days, tmp_path / "ray", "ray")
    assert not marker.exists()  # a worker died, and its task ran again
    _assert_same_directory(local_output().out_dir, tmp_path / "ray")

    monkeypatch.setattr(ray_engine, "TASK_RETRIES", 0)
    marker.write_text("die once")
    with pytest.raises(DataError) as err:
        _prepare(days, tmp_path / "failed", "ray")
    message = str(err.value)
    assert "\n" not in message and "ray worker preparing it died" in message
    assert not (tmp_path / "failed").exists()  # nothing half-written is published
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".failed.")]


def test_an_unreachable_address_is_named_fast(tmp_path):
    pytest.importorskip("ray", reason="the ray engine's tests need ray (ctrcal[ray])")
    config = tmp_path / "ray.yaml"
    config.write_text("data:\n  engine: ray\n  ray_address: 127.0.0.1:1\n")
    raw = tmp_path / "raw.tsv"
    generate(raw, 300, seed=0)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ctrcal", "prepare", str(raw), "--out", str(tmp_path / "out")]
        + ["--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'127.0.0.1:1'" in lines[0], done.stderr
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "out").exists()


def test_a_silent_address_waits_a_bounded_time(monkeypatch):
    monkeypatch.setattr(ray_engine, "CONNECT_TIMEOUT_S", 0.5)
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(DataError, match=f"'{address}': no Ray cluster answers there"):
            ray_engine._probe(address)
        assert time.perf_counter() - start < 5
    with pytest.raises(DataError, match="expected HOST:PORT"):
        ray_engine._probe("nowhere")


@pytest.mark.slow
def test_a_ray_head_passes_the_probe(ray_session):
    import ray

    ray_engine._probe(ray.get_runtime_context().gcs_address)


def test_prepare_on_the_local_engine_never_imports_ray(tmp_path):
    raw = tmp_path / "raw.tsv"
    generate(raw, 300, seed=0)
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        f"assert main(['prepare', {str(raw)!r}, '--out', {str(tmp_path / 'out')!r}]) == 0\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_validate_names_the_extra_and_a_stray_address(monkeypatch):
    from ctrcal.validate import MODEL_SECTIONS, validate_config

    monkeypatch.setattr(engines, "missing_package", lambda: "needs ... 'ctrcal[ray]'")
    cfg = Config()
    cfg.data.engine = "ray"
    with pytest.raises(ConfigError, match=r"data\.engine: .*ctrcal\[ray\]"):
        validate_config(cfg, skip=MODEL_SECTIONS)
    cfg = Config()
    cfg.data.ray_address = "head:6379"
    with pytest.raises(ConfigError, match=r"data\.ray_address: is used by data\.engine: ray"):
        validate_config(cfg, skip=MODEL_SECTIONS)


def test_engine_keys_do_not_change_what_trains():
    from ctrcal.train.runs import is_runtime_key

    assert is_runtime_key("data.engine") and is_runtime_key("data.ray_address")
