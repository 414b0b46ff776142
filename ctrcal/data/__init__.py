"""Criteo readers, the synthetic generator, the feature pipeline and batch loading."""
