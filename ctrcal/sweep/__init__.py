"""Many :func:`ctrcal.train.trainer.train` jobs: the sweep (:mod:`~ctrcal.sweep.sweep`) over
worker processes and device slots (:mod:`~ctrcal.sweep.processes`)."""
