"""The ctrcal command: help, validate, one-line errors and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ctrcal.cli import build_parser, main

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
SUBCOMMANDS = ["synth", "prepare", "train", "evaluate", "shift-report", "run", "validate"]


def test_top_level_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    # `run` is another name of `shift-report`: one command, one usage
    assert "usage: ctrcal " + {"run": "shift-report"}.get(name, name) in capsys.readouterr().out


def test_validate_typo_exit_2_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  batch_sise: 10\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "train.batch_sise" in err and "batch_size" in err
    assert "Traceback" not in err


def test_debug_shows_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  batch_sise: 10\n")
    assert main(["validate", "--debug", str(bad)]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_missing_config_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_parser_knows_every_subcommand():
    parser = build_parser()
    actions = [a for a in parser._actions if a.dest == "command"]
    assert set(SUBCOMMANDS) <= set(actions[0].choices)


@pytest.mark.slow
def test_module_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "ctrcal", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "shift-report" in proc.stdout


def test_overrides_after_options_are_kept(tmp_path, capsys):
    cfg = CONFIGS[0]
    assert main(["validate", str(cfg), "train.epochs=3", "--debug", "train.lr=0.5"]) == 0
    args, _ = build_parser().parse_known_args(["train", str(cfg), "--out", "x", "train.lr=0.5"])
    assert args.overrides == []  # argparse alone drops it: main() must collect it
    assert main(["validate", str(cfg), "--debug", "train.lrr=0.5"]) == 2
    assert "train.lrr" in capsys.readouterr().err


def test_unknown_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["validate", str(CONFIGS[0]), "--no-such-flag"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Faults: a full disk during the report, reproducible MC evaluation

REPORT = """
model: {embedding_dim: 4, hidden_units: [8]}
train: {epochs: 1, batch_size: 4096, eval_batch_size: 8192, progress: false, num_threads: 1}
report:
  seeds: 1
  figures: false
  shifts:
    - {name: gaussian_numeric, intensities: [0.5]}
  variants:
    - {name: layernorm, net_norm: layernorm}
"""


@pytest.mark.slow
@pytest.mark.parametrize("target", [".last.pt.", ".results.csv."], ids=["training", "report"])
def test_a_full_disk_during_the_report_is_one_line_and_the_rerun_finishes(
    target, prepared_dir, tmp_path, monkeypatch, capsys
):
    import torch

    cfg = tmp_path / "report.yaml"
    cfg.write_text(REPORT)
    argv = ["shift-report", str(cfg), "--data", str(prepared_dir), "--out", str(tmp_path / "out")]
    real_save, real_write = torch.save, Path.write_text

    def save(payload, f, *args, **kwargs):  # the kernel's own ENOSPC, from /dev/full
        if target in getattr(f, "name", ""):
            with open("/dev/full", "wb") as disk:
                return real_save(payload, disk, *args, **kwargs)
        return real_save(payload, f, *args, **kwargs)

    def write_text(self, text, *args, **kwargs):
        if self.name.startswith(target):
            with open("/dev/full", "w") as disk:
                disk.write(text)
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(Path, "write_text", write_text)
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "no space left on the device" in lines[-1], err
    assert target.strip(".") in lines[-1]
    monkeypatch.setattr(torch, "save", real_save)
    monkeypatch.setattr(Path, "write_text", real_write)
    assert main(argv) == 0
    assert (tmp_path / "out" / "results.csv").is_file()


@pytest.mark.slow
def test_evaluate_with_mc_samples_is_reproducible(prepared_dir, tmp_path, capsys):
    import torch

    from ctrcal.train.evaluate import evaluate_run

    cfg = tmp_path / "mc.yaml"
    cfg.write_text(
        "model: {embedding_dim: 4, hidden_units: [8], net_norm: {name: mclayernorm, "
        "fraction: 0.5}}\ntrain: {epochs: 1, batch_size: 4096, progress: false, num_threads: 1}\n"
    )
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--data", str(prepared_dir), "--out", str(run)]) == 0
    state = torch.get_rng_state()
    first = evaluate_run(run, "valid", mc_samples=4)
    assert evaluate_run(run, "valid", mc_samples=4) == first  # bit for bit
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left alone
    assert evaluate_run(run, "valid", mc_samples=4, seed=1) != first
    capsys.readouterr()
    outs = []
    for seed in ([], [], ["--seed", "0"]):
        assert main(["evaluate", str(run), "--split", "valid", "--mc-samples", "4", *seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and "seed 0" in outs[0]


def test_an_unwrapped_write_failure_is_still_one_line(monkeypatch, capsys):
    import errno
    import os

    from ctrcal import cli

    def read_only(args):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/out/train.txt")

    monkeypatch.setattr(cli, "cmd_synth", read_only)
    assert main(["synth", "/ro/out/train.txt"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "ctrcal synth: error: /ro/out/train.txt: cannot use: read-only file system"
    )

    def broken(args):  # not a condition of the file system: a bug keeps its traceback
        raise OSError(errno.EBADF, os.strerror(errno.EBADF), "/x")

    monkeypatch.setattr(cli, "cmd_synth", broken)
    with pytest.raises(OSError, match="Bad file descriptor"):
        main(["synth", "/x"])
