"""``ctrcal prepare``: raw files -> fitted features -> encoded parquet splits, published atomically.

The job is :func:`ctrcal.data.prepare.prepare.prepare`; it takes the data and features sections.
"""
