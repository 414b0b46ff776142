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


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_validate_shipped(path, capsys):
    assert main(["validate", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


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
