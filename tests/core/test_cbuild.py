"""Building the C kernels: OpenMP where asked for and possible, a plain build where not."""

from __future__ import annotations

import ctypes
import shutil
import stat

import pytest

from ctrcal.core.cbuild import build_c_library
from ctrcal.layers.kernels.chunks import HEADER

_SOURCE = """
#include "chunks.h"
/* out[i] = i for every element of every chunk */
void fill(int64_t *out, CHUNKS) {
    FOR_EACH_CHUNK(for (int64_t i = lo; i < hi; ++i) out[i] = i);
}
"""


@pytest.fixture
def cc():
    found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if found is None:
        pytest.skip("no C compiler here")
    return found


def _build(tmp_path, monkeypatch, compiler, openmp):
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setattr("ctrcal.core.cbuild._cache_dir", lambda: tmp_path / "cache")
    return build_c_library(_SOURCE, "cbuild_test", openmp, {HEADER.name: HEADER.read_text()})


def _fills(lib) -> bool:
    out = (ctypes.c_int64 * 10)()
    bounds = (ctypes.c_int64 * 3)(0, 4, 10)
    lib.fill(out, bounds, ctypes.c_int64(0), ctypes.c_int64(2))
    return list(out) == list(range(10))


def test_openmp_build_runs_chunks_in_parallel(tmp_path, monkeypatch, cc):
    lib = _build(tmp_path, monkeypatch, cc, openmp=True)
    if not lib.chunks_in_parallel():
        pytest.skip("this compiler has no OpenMP")
    assert _fills(lib)
    plain = _build(tmp_path, monkeypatch, cc, openmp=False)
    assert plain.chunks_in_parallel() == 0 and _fills(plain)


def test_a_compiler_without_openmp_gives_a_plain_build(tmp_path, monkeypatch, cc):
    """-fopenmp refused (as Apple's clang does): the same source builds without it, and its
    chunks run one after the other (the Python side then spreads them over a pool)."""
    wrapper = tmp_path / "cc-without-openmp"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = "-fopenmp" ] && { echo "unsupported: -fopenmp" >&2; '
        "exit 1; }; done\n"
        f'exec {cc} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    lib = _build(tmp_path, monkeypatch, wrapper, openmp=True)
    assert lib.chunks_in_parallel() == 0
    assert _fills(lib)
