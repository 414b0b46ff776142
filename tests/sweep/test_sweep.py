"""Parallel sweeps: the shift report's training runs in spawned worker processes.

Top-level imports stay light: spawned workers of ``run_in_processes`` import this module to
find the task functions below.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from shift_report import CONFIG, without_temporal

from ctrcal.cli import main
from ctrcal.core.errors import ConfigError, CtrcalError, DataError
from ctrcal.sweep.processes import run_in_processes, threads_per_worker
from ctrcal.sweep.sweep import visible_gpus, worker_slots
from ctrcal.validate import load_config

# the session report's data, model and training (its runs of these two variants are this
# report's sequential runs), two trained variants
TINY = (
    without_temporal(CONFIG).split("report:\n")[0]
    + """report:
  seeds: 2
  intensities: [0.0, 0.5]
  figures: false
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}
"""
)


# ---------------------------------------------------------------------------------------------
# Device slots (no processes)


def _cfg(tmp_path: Path, *overrides: str):
    path = tmp_path / "c.yaml"
    path.write_text(TINY)
    return load_config(path, list(overrides))


def test_worker_slots(tmp_path):
    assert worker_slots(_cfg(tmp_path)) == ["auto"]  # one worker: trains in this process
    assert worker_slots(_cfg(tmp_path, "report.workers=3", "train.device=cpu")) == ["cpu"] * 3
    assert worker_slots(_cfg(tmp_path, "report.devices=[cpu, cpu]")) == ["cpu", "cpu"]
    assert worker_slots(_cfg(tmp_path, "report.devices=cpu", "report.workers=2")) == ["cpu"] * 2
    gpus = visible_gpus()
    assert worker_slots(_cfg(tmp_path, "report.devices=auto")) == (gpus or ["cpu"])
    auto2 = worker_slots(_cfg(tmp_path, "report.workers=2"))  # train.device auto
    assert auto2 == ([gpus[i % len(gpus)] for i in range(2)] if gpus else ["cpu", "cpu"])


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["report.workers=-1"], ["report.workers", "-1"]),
        (["report.devices=auto,cpu"], ["report.devices", "auto"]),
        (["report.devices=warp:0"], ["report.devices", "warp:0", "not a device"]),
        (["report.devices=cuda:63"], ["report.devices", "cuda:63", "not visible"]),
    ],
)
def test_worker_slots_errors_name_the_key(tmp_path, overrides, words):
    # checkable without a device: load_config itself refuses (naming the override)
    with pytest.raises(ConfigError) as err:
        worker_slots(_cfg(tmp_path, *overrides))
    assert all(w in str(err.value) for w in words)


def test_threads_per_worker_splits_the_cores():
    assert threads_per_worker(2, cores=16) == 8
    assert threads_per_worker(3, cores=2) == 1
    assert threads_per_worker(1, cores=2) == 2


# ---------------------------------------------------------------------------------------------
# The process pool on cheap tasks (workers import only this module, no torch)


@dataclass(frozen=True)
class _Task:
    name: str
    log_path: Path


def _task_body(task: _Task, device: str, threads: int) -> str:
    print(f"hello from {task.name}")
    if task.name == "bad-data":
        raise DataError("part-0.parquet: row 3 is malformed")
    if task.name == "crash":
        os._exit(3)  # dies without a word, like a process killed for memory
    if task.name == "slow":  # still running when bad-data fails
        other = task.log_path.with_name("bad-data.log")
        deadline = time.monotonic() + 60
        while "Traceback" not in (other.read_text() if other.exists() else ""):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.5)
    return f"{task.name} done on {device} with {threads} thread(s), pid {os.getpid()}"


@pytest.mark.slow
def test_tasks_run_in_two_worker_processes(tmp_path):
    tasks = [_Task(f"t{i}", tmp_path / f"t{i}.log") for i in range(4)]
    lines: list[str] = []
    done = run_in_processes(tasks, ["cpu", "cpu"], _task_body, threads=1, log=lines.append)
    assert sorted(t.name for t, *_ in done) == ["t0", "t1", "t2", "t3"]
    pids = {status.rsplit("pid ", 1)[1] for _, _, status, _ in done}
    assert len(pids) == 2 and str(os.getpid()) not in pids  # two workers, reused, not us
    assert all("with 1 thread(s)" in status for _, _, status, _ in done)
    for t in tasks:
        assert f"hello from {t.name}" in t.log_path.read_text()  # output went to the log
    assert sum("started on cpu" in line for line in lines) == 4


@pytest.mark.slow
def test_failures_name_the_run_and_stop_new_runs(tmp_path):
    tasks = [_Task(n, tmp_path / f"{n}.log") for n in ("bad-data", "slow", "never")]
    with pytest.raises(DataError) as err:  # the failure's own class
        run_in_processes(tasks, ["cpu", "cpu"], _task_body, threads=1)
    text = str(err.value)
    assert text.startswith("training run bad-data on cpu failed: part-0.parquet: row 3 is")
    assert str(tmp_path / "bad-data.log") in text and text.endswith("not started: never")
    assert "Traceback" in (tmp_path / "bad-data.log").read_text()
    assert "=== slow: slow done" in (tmp_path / "slow.log").read_text()  # waited for
    assert not (tmp_path / "never.log").exists()

    crash = [_Task("crash", tmp_path / "c.log"), _Task("ok", tmp_path / "ok2.log")]
    with pytest.raises(CtrcalError) as err:
        run_in_processes(crash, ["cpu", "cpu"], _task_body, threads=1)
    assert "crash on cpu failed: its process exited with status 3" in str(err.value)
    assert "ok" not in str(err.value).split("failed:")[1]  # the other one finished


# ---------------------------------------------------------------------------------------------
# The shift report: parallel == sequential


@pytest.fixture(scope="session")
def sweeps(shift_report, tmp_path_factory):
    """The same tiny report trained sequentially (the session report's runs, trained in this
    process) and by 2 worker processes (1 thread each) -> ``(root, data, seq_log, par_log)``.

    Made once per test run: its four tests may run on different pytest-xdist workers, so the
    first worker that needs it makes it in the directory the workers share (as conftest's
    shift report does) while the others wait, then read it. Read-only: a test that reruns or
    edits runs works on a copy.
    """
    from run_shared import run_shared_dir

    from ctrcal.reports.shift.report import run_shift_report

    _, shared = shift_report
    data = shared / "data"
    with run_shared_dir(tmp_path_factory, "sweep") as root:
        if not (root / "logs.json").exists():
            for half in ("seq", "par"):  # left by a worker that failed making them
                shutil.rmtree(root / half, ignore_errors=True)
            (root / "tiny.yaml").write_text(TINY)
            cfg = load_config(root / "tiny.yaml")
            for variant in ("layernorm", "mclayernorm"):
                for k in (0, 1):
                    run = Path("runs") / variant / f"seed{k}"
                    shutil.copytree(shared / run, root / "seq" / run)
            seq_log: list[str] = []
            run_shift_report(cfg, root / "seq", data, progress=False, log=seq_log.append)
            summary = json.loads((root / "seq" / "summary.json").read_text())
            assert summary["training"]["runs"] == {"reused": 4}
            par_log: list[str] = []
            run_shift_report(cfg, root / "par", data, workers=2, progress=False, log=par_log.append)
            (root / "logs.json").write_text(json.dumps([seq_log, par_log]))
    seq_log, par_log = json.loads((root / "logs.json").read_text())
    return root, data, seq_log, par_log


def test_parallel_report_equals_sequential(sweeps):
    root, _, seq_log, par_log = sweeps
    seq, par = root / "seq", root / "par"
    # same runs, same numbers: training is seeded per run and, at the same thread count,
    # does not depend on the process it runs in
    assert (par / "results.csv").read_text() == (seq / "results.csv").read_text()
    for variant in ("layernorm", "mclayernorm"):
        for k in (0, 1):
            a = json.loads((seq / "runs" / variant / f"seed{k}" / "result.json").read_text())
            b = json.loads((par / "runs" / variant / f"seed{k}" / "result.json").read_text())
            assert a["valid"] == b["valid"] and a["test"] == b["test"]
            log = (par / "runs" / variant / f"seed{k}.log").read_text()
            assert f"{variant} seed {k} on cpu" in log and "valid: AUC" in log
    assert not (seq / "runs" / "layernorm" / "seed0.log").exists()  # sequential: no logs
    assert sum("started on cpu" in line for line in par_log) == 4
    assert not any("started on" in line for line in seq_log)
    summary = json.loads((par / "summary.json").read_text())
    assert summary["training"] == {
        "workers": ["cpu", "cpu"],
        "threads_per_run": 1,
        "runs": {"trained": 4},
    }
    assert "training in 2 parallel processes" in (par / "report.md").read_text()


def test_parallel_rerun_reuses_and_retrains(sweeps, tmp_path, monkeypatch):
    from ctrcal.reports.shift.jobs import DataJob, train_jobs_for
    from ctrcal.reports.shift.plan import plan_variants
    from ctrcal.sweep import processes
    from ctrcal.sweep.sweep import train_jobs

    # pin the thread count a worker gets without train.num_threads to the one the runs were
    # trained with (2 cores over 2 workers: 1), whatever this machine has
    monkeypatch.setattr(processes, "cpu_cores", lambda: 2)

    root, data, _, _ = sweeps
    runs = tmp_path / "runs"
    shutil.copytree(root / "par" / "runs", runs)
    kept = runs / "mclayernorm" / "seed1" / "result.json"
    stamp = kept.stat().st_mtime_ns
    shutil.rmtree(runs / "layernorm" / "seed1")
    cfg = load_config(root / "tiny.yaml", ["train.num_threads=0"])  # runtime key: same runs
    lines: list[str] = []
    jobs = train_jobs_for([DataJob(cfg, data, runs)], plan_variants(cfg))
    outcomes = train_jobs(jobs, lines.append, slots=["cpu", "cpu"])
    assert outcomes == {"reused": 3, "trained": 1}
    assert kept.stat().st_mtime_ns == stamp
    assert [line for line in lines if "started on" in line] == [
        f"[layernorm seed 1] started on cpu (log: {runs / 'layernorm' / 'seed1.log'})"
    ]
    new = json.loads((runs / "layernorm" / "seed1" / "result.json").read_text())
    old = json.loads((root / "par" / "runs" / "layernorm" / "seed1" / "result.json").read_text())
    # a runtime key changed, the thread count did not: the retrained run is the same run
    assert new["valid"] == old["valid"] and new["test"] == old["test"]


def test_interrupted_run_resumes_whatever_the_report_section(sweeps, tmp_path):
    from ctrcal.reports.shift.plan import plan_variants, variant_train_config
    from ctrcal.sweep.sweep import ensure_run

    root, data, _, _ = sweeps
    run = tmp_path / "seed0"
    shutil.copytree(root / "seq" / "runs" / "layernorm" / "seed0", run)
    (run / "result.json").unlink()  # stopped after its last checkpoint
    cfg = load_config(root / "tiny.yaml", ["report.workers=2", "report.seeds=5"])
    vcfg = variant_train_config(cfg, plan_variants(cfg)[0], 0)
    assert ensure_run(vcfg, data, run) == "resumed"
    assert (run / "result.json").exists()


def test_worker_failure_is_one_error_naming_the_run(sweeps, tmp_path):
    from ctrcal.reports.shift.report import run_shift_report

    root, data, _, _ = sweeps
    cfg_path = tmp_path / "bad.yaml"
    cfg_path.write_text(
        TINY.replace("seeds: 2", "seeds: 1")
        + "    - {name: broken, net_norm: {name: layernorm, bogus: 1}}\n"
    )
    # `ctrcal validate` (and load_config) refuse this config before any work ...
    with pytest.raises(ConfigError, match="bogus"):
        load_config(cfg_path)
    # ... a config built past the checks fails in the worker, which names the run
    cfg = load_config(cfg_path, check_names=False)
    out = tmp_path / "out"
    for variant in ("layernorm", "mclayernorm"):  # finished: only the broken run is pending
        shutil.copytree(root / "par" / "runs" / variant / "seed0", out / "runs" / variant / "seed0")
    with pytest.raises(ConfigError) as err:  # the worker's ConfigError keeps its class
        run_shift_report(cfg, out, data, workers=2, progress=False, log=lambda msg: None)
    message = str(err.value)
    assert "\n" not in message
    assert "training run broken seed 0 on cpu failed" in message and "bogus" in message
    assert "broken/seed0.log" in message
    assert "Traceback" in (out / "runs" / "broken" / "seed0.log").read_text()
    assert not (out / "report.md").exists()


def test_cli_options(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY)
    with pytest.raises(SystemExit) as exit_:
        main(["shift-report", str(cfg), "--workers", "-2"])
    assert exit_.value.code == 2 and "--workers" in capsys.readouterr().err
    for command in ("shift-report", "run"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "--workers N" in text and "--devices LIST" in text
    assert (
        main(["shift-report", str(cfg), "--out", str(tmp_path / "o"), "--devices", "cuda:63"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report.devices" in err and "cuda:63" in err
    assert not (tmp_path / "o" / "data").exists()  # failed before preparing anything
