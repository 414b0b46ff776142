"""The training loop (:mod:`~ctrcal.train.trainer`), its step, checkpoints, the one prediction
loop, distributed training and the run directory (:mod:`~ctrcal.train.runs`).

The job ``ctrcal.train(cfg, data_dir, run_dir)`` is :func:`ctrcal.api.train`: it checks the
config, then calls :func:`ctrcal.train.trainer.train`.
"""
