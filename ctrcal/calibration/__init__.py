"""Post-hoc calibrators: one base class, one registry (see :mod:`ctrcal.calibration.base`).

Built-in: ``temperature`` and ``platt`` (:mod:`~ctrcal.calibration.scaling`), ``isotonic``
(:mod:`~ctrcal.calibration.isotonic`), ``field_aware``
(:mod:`~ctrcal.calibration.field_aware`), ``mcgrad`` (:mod:`~ctrcal.calibration.mcgrad`,
optional extra ``ctrcal[mcgrad]``) and ``label_shift`` (:mod:`~ctrcal.calibration.label_shift`).
A report variant names one by a spec::

    calibration: isotonic
    calibration: {name: field_aware, field: C14, method: platt}
"""
