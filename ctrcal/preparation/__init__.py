"""``ctrcal prepare``: raw files -> fitted features -> encoded parquet splits, published atomically.

The prepare side of the data: readers, the row check, the column coders, the feature pipeline
and its mergeable fit statistics, the split plan, the writer and publication, on the local or
the Ray engine. What runs read of its output is :mod:`ctrcal.data`. The job is
:func:`ctrcal.preparation.prepare.prepare`; it takes the data and features sections.
"""
