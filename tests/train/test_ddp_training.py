"""torchrun DDP on CPU (gloo): two processes train like one, and only rank 0 writes."""

from __future__ import annotations

import json

import pytest
from forked_cli import free_port, preloaded_context

from ctrcal.cli import main
from ctrcal.train.trainer import train
from ctrcal.validate import load_config

TINY = [
    "model.embedding_dim=4",
    "model.hidden_units=[16]",
    "model.reduction_ratio=0.5",
    "train.batch_size=2048",
    "train.eval_batch_size=8192",
    "train.epochs=2",
    "train.progress=false",
    "train.num_threads=1",
    "train.data_mode=memory",
]


@pytest.mark.slow
def test_two_gloo_processes_match_a_single_process(prepared_dir, tmp_path, capsys):
    single = train(load_config(None, TINY), prepared_dir, tmp_path / "single")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("{}\n")
    run = tmp_path / "ddp"
    status = main(
        ["train", str(cfg), "--nproc", "2", "--data", str(prepared_dir), "--out", str(run), *TINY]
    )
    assert status == 0, capsys.readouterr()
    result = json.loads((run / "result.json").read_text())
    history = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2]
    # Step i of the two ranks together sees exactly the rows of step i of one process with
    # the same global batch; both train with one thread (train.num_threads=1), so what differs
    # is the order of the float32 gradient sums and the one row per epoch that DDP drops from
    # an odd-sized split (1 of ~16k): validation metrics agree to about 1e-4 (measured 4e-5).
    assert result["valid"]["auc"] == pytest.approx(single.valid["auc"], abs=1e-3)
    assert result["valid"]["logloss"] == pytest.approx(single.valid["logloss"], abs=1e-3)
    assert result["test"]["auc"] == pytest.approx(single.test["auc"], abs=1e-3)
    # metrics cover the whole validation split (gathered), not one rank's half
    assert history[0]["valid_auc"] == pytest.approx(
        json.loads((tmp_path / "single" / "metrics.jsonl").read_text().splitlines()[0])[
            "valid_auc"
        ],
        abs=1e-3,
    )


def test_global_batch_must_split_evenly(prepared_dir, tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("{}\n")
    status = main(
        [
            "train",
            str(cfg),
            "--nproc",
            "2",
            "--data",
            str(prepared_dir),
            "--out",
            str(tmp_path / "odd"),
            *TINY,
            "train.batch_size=2047",
        ]
    )
    assert status != 0
    # refused before any process starts, in one line naming the key
    err = capsys.readouterr().err.strip()
    assert "train.batch_size: 2047 rows cannot be split evenly over 2 processes" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "odd").exists()


def _flag_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from ctrcal.train.distributed import DistContext, rank0_flag

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ctx = DistContext(rank=rank, world_size=2, local_rank=rank, backend="gloo")
        # each rank decided alone, and differently (as two probes timing their own process may)
        agreed = rank0_flag(rank == 1, ctx, torch.device("cpu"))
        with open(f"{out}.{rank}", "w") as f:
            f.write(str(agreed))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_take_rank_0s_precision_verdict(tmp_path):
    port, out = free_port(), str(tmp_path / "flag")
    # the ranks fork from the server that imported torch and ctrcal once (what they run needs
    # nothing else), not from two new interpreters importing them again (about 2 s of CPU each)
    context = preloaded_context()
    ranks = [context.Process(target=_flag_rank, args=(r, port, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    for p in ranks:
        if p.is_alive():  # its peer failed: it would wait for it until gloo's timeout
            p.kill()
            p.join()
    assert [p.exitcode for p in ranks] == [0, 0]
    assert [(tmp_path / f"flag.{r}").read_text() for r in (0, 1)] == ["False", "False"]
