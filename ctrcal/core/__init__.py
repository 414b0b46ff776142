"""The bottom layer: errors, the Batch, typed values, atomic I/O and locks, the registry, C builds.

Everything else in ctrcal may import from here; nothing here imports another ctrcal package.
"""
