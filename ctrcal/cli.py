"""The ``ctrcal`` command line.

Subcommands::

    ctrcal synth OUT --rows N --seed S         synthetic Criteo (dac layout) + true click probs
    ctrcal prepare INPUT... --out DIR          raw Criteo -> feature_map.json + parquet splits
    ctrcal train CONFIG [--data DIR] [--out RUN_DIR] [--resume] [k=v ...]
    ctrcal evaluate RUN_DIR [--split test] [--data DIR] [--mc-samples N [--seed S]]
    ctrcal predict RUN_DIR (--split NAME | --data DIR | RAW_FILE ...) --out FILE.parquet
                        [--mc-samples N [--seed S]] [--engine torch|onnxruntime|aoti]
                        [--precision fp32|bf16|int8]
                                               a run's click probabilities, streamed to parquet
    ctrcal export RUN_DIR --format onnx|pt2|aoti --out FILE [--calibrator NAME] [--precision P]
                                               the model for serving + its raw-row encoding
    ctrcal shift-report CONFIG [--data DIR] [--out DIR] [--seeds N] [--workers N]
                        [--devices cuda:0,cuda:1|auto] [k=v ...]
                                               prepare (unless --data) + train every variant
                                               + shift report; ``ctrcal run`` is an alias
    ctrcal validate CONFIG [--data DIR] [k=v ...]
                                               check a config (and its data) without running
    ctrcal calibration-report FILE --prob COL --label COL [--segments COLS] [--time COL
                        [--windows N]] [--compare COL2 [--gate SPEC [--gate-segments]]]
                        [--std COL] [--out DIR]  calibration report of any predictions file
                                               (--no-labels: label-free estimates alone;
                                               --reference REF: drift and estimates with
                                               trust flags per chunk, labels in REF only)

User errors print one line on stderr and exit non-zero (2 for configs and usage);
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ctrcal.core.errors import CtrcalError


def _load(args: argparse.Namespace):
    from ctrcal.validate import load_config

    return load_config(args.config, args.overrides)


# ---------------------------------------------------------------------------------------------
# Handlers: each returns the exit status.


def cmd_validate(args: argparse.Namespace) -> int:
    """Load the config with every check: the model is built on the ``meta`` device, so its
    constructor (and each norm's) decides; each problem is one line naming file and key. A
    data-only config (no model, train or report section) has its data and features checked,
    what ``prepare --config`` checks, and loads no model (:func:`ctrcal.validate.is_data_only`)."""
    if args.data is None:
        from ctrcal.config.load import read_config
        from ctrcal.validate import is_data_only

        cfg = read_config(args.config, args.overrides)
        if is_data_only(cfg):
            return _validate_data_only(args, cfg)
    return _validate_full(args)


def _validate_data_only(args: argparse.Namespace, cfg: Any) -> int:
    from ctrcal.core.errors import ConfigProblems
    from ctrcal.validate import MODEL_SECTIONS, validate_config

    try:
        validate_config(cfg, skip=MODEL_SECTIONS)
    except ConfigProblems as exc:
        return _print_problems(exc)
    print(
        f"{args.config}: OK (data only: its data and features checked; no model, train or report)"
    )
    return 0


def _print_problems(exc: Any) -> int:
    for problem in exc.problems:  # every problem, one per line
        print(f"ctrcal validate: error: {problem}", file=sys.stderr)
    return exc.exit_code


def _validate_full(args: argparse.Namespace) -> int:
    from ctrcal.core.errors import ConfigProblems

    try:
        cfg = _load(args)
    except ConfigProblems as exc:
        return _print_problems(exc)
    if args.data is not None:
        from ctrcal.validate import validate_data

        validate_data(cfg, args.data)
    from ctrcal.serving.formats import EXPORT_EXTRA, missing_export_packages

    missing = missing_export_packages()
    if missing:  # not the config's concern: a note, so a later `ctrcal export` is no surprise
        print(
            f"note: `ctrcal export --format onnx` needs {', '.join(missing)}: "
            f"pip install 'ctrcal[{EXPORT_EXTRA}]'",
            file=sys.stderr,
        )
    print(
        f"{args.config}: OK (model {cfg.model.describe()}, "
        f"net_norm {getattr(cfg.model.get('net_norm'), 'name', 'as built')}, "
        f"{len(cfg.report.variants)} report variants)"
    )
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from ctrcal.preparation.synthetic import generate

    res = generate(args.out, args.rows, args.seed, drift=args.drift)
    print(
        f"wrote {res.rows:,} rows (dac layout) to {res.path} in {res.seconds:.1f} s "
        f"({res.rows / max(res.seconds, 1e-9):,.0f} rows/s); true probabilities: {res.prob_path}"
    )
    print(
        f"positive rate {100 * res.positive_rate:.2f}%; oracle (true probabilities): "
        f"AUC {res.oracle_auc:.4f}, logloss {res.oracle_logloss:.4f}"
    )
    return 0


@contextlib.contextmanager
def _loading() -> Iterator[None]:
    """A command's imports with the cyclic garbage collector paused and their objects frozen
    after: the collector would walk the hundreds of thousands of objects that numpy and polars
    create, several times over, for garbage they do not make (a tenth of a second of CPU)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def cmd_prepare(args: argparse.Namespace) -> int:
    with _loading():
        from ctrcal.config.load import read_config
        from ctrcal.core.errors import ConfigError
        from ctrcal.preparation.prepare import prepare
        from ctrcal.validate import MODEL_SECTIONS, validate_config

    # preparing needs the data and features sections: only their checks run (no model, no
    # report plan, no torch)
    cfg = read_config(args.config)
    validate_config(cfg, skip=MODEL_SECTIONS)
    explicit = {"train": args.train, "valid": args.valid, "test": args.test}
    named = cfg.data.inputs or cfg.data.train or cfg.data.valid or cfg.data.test
    inputs: list[Path] | dict[str, list[Path]] | None = None
    if any(explicit.values()):
        if args.inputs:
            raise ConfigError(
                "give input files either to split (INPUT ...) or as "
                "--train/--valid/--test, not both"
            )
        missing = [f"--{k}" for k, v in explicit.items() if not v]
        if missing:
            raise ConfigError(
                f"explicit splits need --train, --valid and --test; missing {', '.join(missing)}"
            )
        inputs = explicit
    elif args.inputs:
        inputs = list(args.inputs)
    elif args.config is None:
        raise ConfigError(
            "nothing to prepare: give raw files (INPUT ... or --train/--valid/"
            "--test) or a --config whose data section names them"
        )
    if inputs is not None and named:
        raise ConfigError(
            f"{args.config}: data names input files and so does the command line; keep one of them"
        )
    res = prepare(inputs, args.out, cfg.data, cfg.features, args.on_bad_row, resplit=args.resplit)
    print(res.describe(_embedding_dim(cfg)))
    return 0


def _embedding_dim(cfg: Any) -> int | None:
    """The model's embedding dimension as configured; None when the config leaves it to the
    model's default, which is known only by importing the model, and torch with it (seconds,
    more than preparing a small file): the summary then gives the memory per unit of
    dimension."""
    dim = cfg.model.get("embedding_dim")
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def cmd_train(args: argparse.Namespace) -> int:
    from ctrcal.train.runs import prepared_data_dir

    cfg = _load(args)
    run_dir = args.out if args.out is not None else Path(cfg.out_dir)
    data_dir = prepared_data_dir(cfg, run_dir, args.data)
    if args.nproc > 1:
        from ctrcal.train.distributed import check_global_batch, env_world_size, launch

        if env_world_size() > 1:
            raise CtrcalError("--nproc cannot be used inside torchrun; drop it or torchrun")
        check_global_batch(cfg.train.batch_size, args.nproc)
        # data is prepared once, here, before the processes start
        argv = ["train", str(args.config), "--data", str(data_dir), "--out", str(run_dir)]
        argv += ["--resume"] * args.resume + ["--debug"] * args.debug + list(args.overrides)
        return launch(args.nproc, argv)
    # imported only now (torch): a wrong config or data directory answers at once
    from ctrcal.train.trainer import train

    res = train(cfg, data_dir, run_dir, resume=args.resume)
    print(res.describe())
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ctrcal.train.runs import require_run_dir, run_data

    # a mistyped run or a moved data directory answers before torch is imported
    require_run_dir(args.run_dir)
    run_data(args.run_dir, args.data)
    from ctrcal.train.evaluate import evaluate_run

    metrics = evaluate_run(
        args.run_dir, args.split, args.data, mc_samples=args.mc_samples, seed=args.seed
    )
    mc = f", MC average of {args.mc_samples} passes (seed {args.seed})" if args.mc_samples else ""
    print(f"{args.run_dir} on {args.split}{mc}:")
    print(
        f"AUC {metrics['auc']:.4f}  logloss {metrics['logloss']:.4f}  ECE {metrics['ece']:.4f}"
        + "".join(
            f"  {k} {v:.4f}" for k, v in metrics.items() if k not in ("auc", "logloss", "ece")
        )
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from ctrcal.train.runs import require_run_dir, run_data

    # a mistyped run or a moved data directory answers before torch is imported
    require_run_dir(args.run_dir)
    run_data(args.run_dir, args.data)
    from ctrcal.serving.predict import predict_run

    res = predict_run(
        args.run_dir,
        args.out,
        split=args.split,
        data_dir=args.data,
        raw_files=args.raw,
        mc_samples=args.mc_samples,
        seed=args.seed,
        on_bad_row=args.on_bad_row,
        with_features=args.with_features,
        engine=args.engine,
        precision=args.precision,
    )
    print(res.describe())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ctrcal.serving.formats import check_format, check_precision
    from ctrcal.train.runs import require_run_dir

    require_run_dir(args.run_dir)
    check_format(args.format)
    check_precision(args.format, args.precision)
    from ctrcal.serving.export import export_run

    res = export_run(
        args.run_dir,
        args.out,
        args.format,
        calibrator=args.calibrator,
        data_dir=args.data,
        precision=args.precision,
    )
    print(res.describe())
    return 0


def cmd_shift_report(args: argparse.Namespace) -> int:
    import time

    from ctrcal.train.runs import require_prepared_dir

    start = time.perf_counter()
    cfg = _load(args)
    if args.data is not None:
        require_prepared_dir(args.data)
    # imported only now (torch): a wrong config or data directory answers at once
    from ctrcal.reports.shift.render import finish_message
    from ctrcal.reports.shift.report import run_shift_report

    out = args.out if args.out is not None else Path(cfg.out_dir)
    paths = run_shift_report(
        cfg,
        out,
        args.data,
        seeds=args.seeds,
        workers=args.workers,
        devices=args.devices,
        progress=cfg.train.progress,
    )
    print(finish_message(paths, time.perf_counter() - start))
    return 0


def _monitoring(args: argparse.Namespace, segments: list[str]) -> tuple[dict | None, str | None]:
    """``--reference``: the monitor's arguments (the reference read with its features), and
    the analysis' label column (None where the analysis has none: labels are needed in the
    reference only)."""
    import dataclasses

    from ctrcal.core.errors import ConfigError, DataError
    from ctrcal.reports.calibration.predictions_file import column_names, read_predictions

    if args.reference is None:
        for flag, given in (("--chunk-rows", args.chunk_rows), ("--features", args.features)):
            if given:
                raise ConfigError(f"{flag}: needs --reference REF")
        return None, args.label
    if args.label is None:
        raise ConfigError("--reference: needs --label COL (the reference's clicks)")
    features = [c.strip() for part in args.features for c in part.split(",") if c.strip()]
    roles = [args.prob, args.label, args.time, args.compare, args.std, *segments]
    if args.label not in column_names(args.reference):
        raise DataError(
            f"{args.reference}: no label column {args.label!r}: the reference needs labels"
        )
    reference = read_predictions(args.reference, args.prob, args.label, features=True)
    drop = {c for c in roles if c}
    reference = dataclasses.replace(
        reference, features={c: v for c, v in reference.features.items() if c not in drop}
    )
    label = args.label if args.label in column_names(args.file) else None
    monitoring = {
        "reference": reference,
        "chunk_rows": args.chunk_rows,
        "alarm_rate": args.alarm_rate,
        "features": features or None,
    }
    return monitoring, label


def cmd_calibration_report(args: argparse.Namespace) -> int:
    """Exit 0, or with ``--gate`` 0 on pass and 1 on fail; bad input exits 2 (a pipeline must
    not read a malformed file as a failed gate)."""
    from ctrcal.core.errors import ConfigError, DataError
    from ctrcal.reports.calibration.predictions_file import read_predictions
    from ctrcal.reports.calibration.report import calibration_report, label_free_report

    segments = [s.strip() for part in args.segments for s in part.split(",") if s.strip()]
    pairs = [tuple(p.split(":")) for part in args.segment_pairs for p in part.split(",") if p]
    for pair in pairs:
        if len(pair) != 2 or not all(pair):
            raise ConfigError(f"--segment-pairs: expected COL:COL, got {':'.join(pair)!r}")
    if args.no_labels:
        given = {
            "--label": args.label,
            "--compare": args.compare,
            "--time": args.time,
            "--std": args.std,
            "--gate": args.gate,
            "--segments": segments,
        }
        bad = [k for k, v in given.items() if v]
        if bad:
            raise ConfigError(f"--no-labels: {bad[0]} needs clicks; leave it out")
    elif args.label is None:
        raise ConfigError("--label COL is required (or --no-labels for label-free estimates)")
    out = args.out if args.out is not None else args.file.with_name(args.file.name + ".calibration")
    try:
        monitoring, label = _monitoring(args, segments)
        preds = read_predictions(
            args.file,
            args.prob,
            label,
            segments=segments,
            time=args.time,
            compare=args.compare,
            std=args.std,
            features=monitoring is not None,
        )
        if args.no_labels or label is None:
            paths = label_free_report(preds, out, monitoring)
        else:
            paths = calibration_report(
                preds,
                out,
                windows=args.windows,
                calibrator=args.calibrator,
                bootstrap=args.bootstrap,
                seed=args.seed,
                min_count=args.min_count,
                segment_pairs=pairs,
                gate=args.gate,
                gate_segments=args.gate_segments,
                monitoring=monitoring,
            )
    except DataError as exc:
        exc.exit_code = 2
        raise
    print(f"wrote {paths.markdown} ({preds.rows:,} rows), metrics.json and figures in {out}")
    if paths.gate is not None:
        print("\n".join(paths.gate.lines()))
        return 0 if paths.gate.passed else 1
    return 0


# ---------------------------------------------------------------------------------------------
# Parser


_DEBUG_HELP = "show tracebacks on errors"


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="YAML config file")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="overrides, e.g. train.lr=1e-4"
    )


def _add_command(
    sub: argparse._SubParsersAction,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    help_: str,
    aliases: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """A subcommand whose one-line help is also its description, run by ``handler``."""
    p = sub.add_parser(name, help=help_, description=help_, aliases=aliases)
    # SUPPRESS: no default of its own, so `ctrcal --debug CMD` keeps the top-level flag
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    p.set_defaults(handler=handler)
    return p


def _add_run_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="run directory written by 'ctrcal train'")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _add_sweep_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="train N runs at once in N spawned worker processes, one run per worker at a "
        "time, output in runs/<variant>/seed<k>.log (report.workers; default 0 = one per "
        "--devices entry, else 1 = one after another in this process); CPU workers get "
        "cores // N threads each; the runs are a sequential sweep's (bit-identical on CPU "
        "with train.num_threads set)",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="LIST",
        help="devices of the training processes: cuda:0,cuda:1 (one run per device at a "
        "time; more --workers than devices share them), or auto = every visible GPU, else "
        "the CPU (report.devices; evaluation runs on the first)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``ctrcal`` parser: global options, then one ``_add_<command>_parser`` each."""
    parser = argparse.ArgumentParser(
        prog="ctrcal",
        description="Calibrated CTR prediction under data shift: MaskNet with LayerNorm or "
        "MC-LayerNorm on Criteo, and shift-robustness reports.",
    )
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # the order here is the order `ctrcal --help` lists the commands in
    _add_synth_parser(sub)
    _add_prepare_parser(sub)
    _add_train_parser(sub)
    _add_evaluate_parser(sub)
    _add_predict_parser(sub)
    _add_export_parser(sub)
    _add_shift_report_parser(sub)
    _add_validate_parser(sub)
    _add_calibration_report_parser(sub)
    return parser


def _add_synth_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(
        sub, "synth", cmd_synth, "write synthetic Criteo data (dac layout) with true click probs"
    )
    p.add_argument("out", type=Path, help="output file (dac train.txt layout)")
    p.add_argument("--rows", type=int, default=1_000_000, help="number of rows")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument(
        "--drift",
        type=float,
        default=0.0,
        help="distributions and click model drift with the row index (0 = none)",
    )


def _add_prepare_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(
        sub, "prepare", cmd_prepare, "raw Criteo file(s) -> feature_map.json + parquet splits"
    )
    p.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        help="raw Criteo file(s), any layout, split by data.split (or use "
        "--train/--valid/--test, or a config's data section)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--config", type=Path, default=None, help="YAML config (data/features)")
    p.add_argument("--on-bad-row", choices=["error", "skip"], default=None)
    for split in ("train", "valid", "test"):
        p.add_argument(
            f"--{split}",
            nargs="+",
            type=Path,
            default=[],
            help=f"file(s) of the {split} split, kept as given",
        )
    p.add_argument(
        "--resplit",
        action="store_true",
        help="pool files named as splits (train.csv valid.csv ...) and split again",
    )


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(sub, "train", cmd_train, "train a model from a config")
    _add_config(p)
    p.add_argument("--data", type=Path, default=None, help="prepared data directory")
    p.add_argument("--out", type=Path, default=None, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes (one per GPU, or CPU processes with gloo): relaunches under torchrun "
        "for DistributedDataParallel; train.batch_size stays the global batch",
    )


def _add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(sub, "evaluate", cmd_evaluate, "evaluate a trained run")
    _add_run_dir(p)
    p.add_argument("--split", choices=["train", "valid", "test"], default="test")
    p.add_argument(
        "--mc-samples", type=_non_negative_int, default=0, help="MC-integration passes (0: off)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the MC passes' random subsets (default 0): the same command "
        "gives the same numbers",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="prepared data directory (default: the run's own); it must be "
        "encoded with the run's feature map",
    )


def _add_predict_parser(sub: argparse._SubParsersAction) -> None:
    from ctrcal.serving.formats import ENGINES

    p = _add_command(
        sub, "predict", cmd_predict, "write a run's click probabilities to a parquet file"
    )
    _add_run_dir(p)
    p.add_argument(
        "raw",
        nargs="*",
        type=Path,
        metavar="RAW_FILE",
        help="raw files to score, encoded with the run's feature map (default: "
        "a split of the prepared data)",
    )
    p.add_argument(
        "--split",
        choices=["train", "valid", "test"],
        default=None,
        help="split of the prepared data to score (default: test)",
    )
    p.add_argument(
        "--data", type=Path, default=None, help="prepared data directory (default: the run's own)"
    )
    p.add_argument("--out", type=Path, required=True, help="output parquet file")
    p.add_argument(
        "--mc-samples",
        type=_non_negative_int,
        default=0,
        help="MC-integration passes: write their mean and std (0: off)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the MC passes (default 0)")
    p.add_argument(
        "--on-bad-row",
        choices=["error", "skip"],
        default="error",
        help="a malformed row of a raw file: stop (error) or drop it (skip)",
    )
    p.add_argument(
        "--with-features",
        action="store_true",
        help="also write the model's inputs (numerics in the original space, categorical "
        "ids): calibration-report --reference compares them for drift",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help="score with the eager model (torch), or its exported graph in ONNX Runtime or "
        "as an AOTInductor package (one-shot; see docs/serving.md)",
    )
    p.add_argument(
        "--precision",
        default=None,
        metavar="P",
        help="fp32; bf16 with --engine torch (one-shot) or aoti; int8 with --engine "
        "onnxruntime (see docs/serving.md for the AUC cost). Default: the precision the run "
        "was trained in with --engine torch (as evaluate scores it), fp32 otherwise",
    )


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(
        sub,
        "export",
        cmd_export,
        "export a run's model for serving (ONNX, torch.export, AOTInductor)",
    )
    _add_run_dir(p)
    p.add_argument(
        "--format",
        required=True,
        metavar="FORMAT",
        help="onnx, pt2 (torch.export) or aoti (AOTInductor package, loadable from C++)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        metavar="P",
        help="fp32 (default); bf16 for pt2 and aoti (AMX / AVX512-BF16); int8 for onnx "
        "(dynamic quantization of the dense layers); see docs/serving.md for the AUC cost",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="model file; the raw-row encoding is written beside it",
    )
    p.add_argument(
        "--calibrator",
        default=None,
        metavar="NAME",
        help="temperature, platt or isotonic: fitted on the run's clean validation split "
        "and folded into the exported model",
    )
    p.add_argument(
        "--data", type=Path, default=None, help="the run's prepared data, if it has moved"
    )


def _add_shift_report_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(
        sub,
        "shift-report",
        cmd_shift_report,
        "prepare the data (unless --data), train every variant's runs (reusing finished ones) "
        "and write the shift-robustness report; 'run' is the same command",
        aliases=["run"],
    )
    _add_config(p)
    p.add_argument("--data", type=Path, default=None, help="prepared data directory")
    p.add_argument("--out", type=Path, default=None, help="report directory")
    p.add_argument("--seeds", type=int, default=None, help="training seeds per variant")
    _add_sweep_options(p)


def _add_validate_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(sub, "validate", cmd_validate, "check a config without running anything")
    _add_config(p)
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="also check the config against this prepared data (do its shifts apply?)",
    )


def _add_calibration_report_parser(sub: argparse._SubParsersAction) -> None:
    p = _add_command(
        sub,
        "calibration-report",
        cmd_calibration_report,
        "calibration report of a predictions file (parquet or CSV) from any system",
    )
    p.add_argument("file", type=Path, help="predictions file: .parquet, .csv or .tsv (.gz)")
    p.add_argument("--prob", required=True, metavar="COL", help="predicted click probability")
    p.add_argument("--label", default=None, metavar="COL", help="click label, 0/1")
    p.add_argument(
        "--no-labels",
        action="store_true",
        help="no label column: the label-free estimates alone (monitoring)",
    )
    p.add_argument(
        "--segments",
        action="append",
        default=[],
        metavar="COLS",
        help="segment columns, comma-separated (Field-RCE, MCE, worst segments)",
    )
    p.add_argument(
        "--segment-pairs",
        action="append",
        default=[],
        metavar="A:B",
        help="pairs of segment columns whose value combinations are segments too",
    )
    p.add_argument(
        "--min-count",
        type=int,
        default=100,
        metavar="N",
        help="rows a segment needs to be listed or gated (100)",
    )
    p.add_argument(
        "--gate",
        default=None,
        metavar="SPEC",
        help="deploy gate of --compare against --prob, e.g. 'ece:+0.002,auc:-0.001': "
        "exit 0 pass, 1 fail, 2 bad input",
    )
    p.add_argument(
        "--gate-segments", action="store_true", help="decide the gate's rules per segment value too"
    )
    p.add_argument(
        "--time",
        default=None,
        metavar="COL",
        help="time column: calibration over consecutive time windows",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=None,
        metavar="N",
        help="test windows (10, or as many as the distinct times allow)",
    )
    _add_monitoring_options(p)
    p.add_argument(
        "--compare",
        default=None,
        metavar="COL2",
        help="another model's probabilities: paired bootstrap",
    )
    p.add_argument("--std", default=None, metavar="COL", help="predictive std: risk-coverage")
    p.add_argument(
        "--calibrator",
        default="platt",
        metavar="NAME",
        help="calibrator fitted once vs refitted per window (platt)",
    )
    p.add_argument("--bootstrap", type=int, default=200, metavar="N", help="replicates (200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and of the floor")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="report directory (default: FILE.calibration beside the file)",
    )


def _add_monitoring_options(p: argparse.ArgumentParser) -> None:
    """calibration-report --reference: input drift and label-free estimates per chunk."""
    p.add_argument(
        "--reference",
        type=Path,
        default=None,
        metavar="REF",
        help="labelled reference predictions with the same feature columns: input drift "
        "and label-free estimates with trust flags per chunk of FILE (labels in REF only)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        metavar="N",
        help="rows per monitored chunk (FILE in 10 chunks, at most REF's rows / 20)",
    )
    p.add_argument(
        "--alarm-rate",
        type=float,
        default=0.05,
        metavar="R",
        help="false-alarm rate per clean chunk, all drift scores together (0.05)",
    )
    p.add_argument(
        "--features",
        action="append",
        default=[],
        metavar="COLS",
        help="feature columns to monitor, comma-separated (default: every column without a role)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
    # `key=value` overrides may also follow options (`ctrcal run CFG --out DIR train.lr=0.1`);
    # argparse stops filling a positional list at the first option, so collect the rest here.
    if extra:
        if hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.handler(args) or 0)
    except CtrcalError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"ctrcal {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        from ctrcal.core.utils import OUTPUT_ERRNOS, describe_os_error

        # a full disk, a read-only or forbidden path that no writer turned into an
        # OutputError itself: still one line naming the path and the cause
        if args.debug or exc.errno not in OUTPUT_ERRNOS or not exc.filename:
            raise
        print(
            f"ctrcal {args.command}: error: {describe_os_error(exc.filename, exc, 'use')}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"ctrcal {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
