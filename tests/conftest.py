"""Shared fixtures: tiny generated Criteo files in every layout, a prepared directory and
the session's tiny shift report.

* ``criteo_frame``: 1,000 synthetic rows (dac columns as strings/ints) and their true probs.
* ``criteo_files``: that frame written once per layout (``dac``, ``dac_gz``, ``dac_test``,
  ``kaggle_csv``, ``x4``, ``x1``, ``torchrec``) -> ``{name: Path}``.
* ``prepared_dir``: a ~20k-row synthetic dataset prepared once per test run (the workers
  share it) -> its directory (``feature_map.json``, ``train/``, ``valid/``, ``test/``).
  Treat it as read-only.
* ``criteo_samples``: the shared directory of real Criteo sample rows (skips if absent).
* ``shift_report``: the tiny shift report of ``tests/shift_report.py`` (every variant kind),
  run once per test run, in a background process started when collection shows a test needs
  it -> ``(config_path, out_dir)``. Treat it as read-only. Its tests are marked ``slow``.
"""

from __future__ import annotations

import os

# The Triton kernels are tested on CPU tensors through Triton's interpreter, which must be
# chosen before triton is imported (kernels are wrapped when their module loads). Only those
# kernels run differently; set TRITON_INTERPRET=0 to keep triton compiled.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist (`make test` runs one worker per core) each worker keeps to one thread:
# two workers that each spin an OpenMP pool over both cores slow each other down tenfold.
# Tests that are about thread counts set them explicitly.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor trusts the CPU's flags (/proc/cpuinfo) for its vector instruction sets instead of
# compiling and loading a probe program per set: on an empty inductor cache (a fresh CI
# machine) the probes cost about 9 s in every process that compiles. The kernels themselves
# are compiled and checked against eager as before.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ctrcal.preparation.synthetic import generate_frame, write_criteo  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "criteo_samples"
LAYOUT_FILES = {
    "dac": ("dac", "train.txt"),
    "dac_gz": ("dac", "day_0.gz"),
    "dac_test": ("dac_test", "test.txt"),
    "kaggle_csv": ("kaggle_csv", "train.csv"),
    "x4": ("x4", "x4_train.csv"),
    "x1": ("x1", "x1_train.csv"),
    "torchrec": ("torchrec", "torchrec.csv"),
}
PREPARED_ROWS = 20_000


@pytest.fixture(autouse=True)
def _torch_seeded():
    """Every test starts from torch's seed 0 (where torch is loaded), so its unseeded draws do
    not depend on which tests ran before it on its worker."""
    import sys

    torch = sys.modules.get("torch")  # never imported here: some tests check it stays out
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture(scope="session")
def criteo_frame():
    """(frame, true_prob): 1,000 synthetic rows with dac columns, seed 0."""
    return generate_frame(1_000, seed=0)


@pytest.fixture(scope="session")
def criteo_files(criteo_frame, tmp_path_factory) -> dict[str, Path]:
    """The same 1,000 rows written in every supported layout: ``{name: path}``."""
    root = tmp_path_factory.mktemp("criteo_layouts")
    frame, _ = criteo_frame
    return {
        name: write_criteo(frame, root / filename, layout)
        for name, (layout, filename) in LAYOUT_FILES.items()
    }


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (~20k rows, seed 0, min_count 5), made once per test run:
    the first pytest-xdist worker that needs it prepares it, the others wait for it and read
    the same directory. Treat it as read-only."""
    from run_shared import run_shared_dir

    from ctrcal.api import prepare
    from ctrcal.config import Config

    with run_shared_dir(tmp_path_factory, "prepared") as root:
        out = root / "data"
        if not (out / "feature_map.json").exists():
            cfg = Config()
            cfg.data.synthetic.rows = PREPARED_ROWS
            cfg.data.synthetic.seed = 0
            cfg.features.min_count = 5
            prepare(None, out, cfg)
    return out


@pytest.fixture(scope="session")
def criteo_samples() -> Path:
    """The shared real Criteo sample files (see SOURCES.md there); skip when absent."""
    if not SAMPLES.is_dir():
        pytest.skip(f"real Criteo samples not found at {SAMPLES}")
    return SAMPLES.resolve()


def pytest_collection_modifyitems(config, items):
    """Mark every test of the session's shift report ``slow`` (the first one waits for it), so
    that ``make test-fast`` (``-m "not slow"``) never waits for it.

    Then the other slow tests (compiles, exports, child processes) move to the front, in their
    order: pytest-xdist hands tests out in collection order, and long tests handed out last
    leave one worker running them alone at the end. The shift report's tests stay where they
    are, since it is still training when the session starts."""
    waiting = {id(item) for item in items if "shift_report" in getattr(item, "fixturenames", ())}
    for item in items:
        if id(item) in waiting:
            item.add_marker(pytest.mark.slow)
    first = [i for i in items if i.get_closest_marker("slow") and id(i) not in waiting]
    chosen = {id(i) for i in first}
    items[:] = first + [i for i in items if id(i) not in chosen]
    if getattr(config.option, "loadgroup", False):  # set by --dist loadgroup
        _keep_xdist_groups_together(items)


def _keep_xdist_groups_together(items) -> None:
    """Give each test of an ``xdist_group`` the id suffix ``@<group>`` by which ``--dist
    loadgroup`` sends a group to one worker (the Ray tests share one Ray per worker).

    pytest-xdist writes that suffix into ``item._nodeid``, which pytest 9.2 no longer reads (a
    node's id now lives in ``item._id``): without this the group's tests are spread over the
    workers like any others, and each worker starts its own Ray."""
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        if names and "@" not in item.nodeid:  # an xdist that sets the id itself needs nothing
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(names))}")


def pytest_collection_finish(session):
    """Start the session's shift report in the background as soon as the selected tests are
    known to need it: it trains while other tests run, on the other core."""
    if any("shift_report" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_shift_report(session.config)


def _start_shift_report(config) -> Path:
    """Start ``ctrcal run`` of ``tests/shift_report.py`` once per test run, whichever worker
    asks first -> its directory (``tiny.yaml``, ``out/``; ``rc`` holds the exit status once
    it has ended, ``log`` what it printed)."""
    import subprocess
    import sys

    from interrupt import child_env
    from run_shared import run_shared_dir
    from shift_report import CONFIG

    with run_shared_dir(config._tmp_path_factory, "shift_report") as root:
        if not (root / "tiny.yaml").exists():
            (root / "tiny.yaml").write_text(CONFIG)
            command = (
                f'"{sys.executable}" -m ctrcal run tiny.yaml --out out > log 2>&1; '
                "echo $? > rc.tmp && mv rc.tmp rc"
            )
            subprocess.Popen(["sh", "-c", command], cwd=root, env=child_env())
    return root


@pytest.fixture(scope="session")
def shift_report(request):
    """The tiny shift report of ``tests/shift_report.py``, run once per test run (by every
    pytest-xdist worker together) through the CLI -> ``(config_path, out_dir)``. Read-only: a
    test that reruns or edits it works on a copy.
    """
    import time

    root = _start_shift_report(request.config)
    deadline = time.monotonic() + 900
    while not (root / "rc").exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the session's shift report did not end within 900 s: {root}")
        time.sleep(0.2)
    if (root / "rc").read_text().strip() != "0":
        pytest.fail(f"the session's shift report failed:\n{(root / 'log').read_text()[-4000:]}")
    return root / "tiny.yaml", root / "out"
