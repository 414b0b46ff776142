"""Build and load ctrcal's C kernels: compiled once per machine with the system C compiler,
cached under ``~/.cache/ctrcal/kernels`` (or ``$CTRCAL_CACHE_DIR``), loaded with ctypes.

Free of torch, so that data preparation can use a kernel without importing it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_CFLAGS = ["-O3", "-fno-math-errno", "-fopenmp-simd", "-shared", "-fPIC"]
# The machine's own vector instructions (AVX2 / AVX-512 where present) make the kernel about
# twice as fast as the baseline x86-64 build; the cached library is keyed by the CPU's
# identity, so a cache shared between different machines never loads a foreign build.
_NATIVE = ["-march=native"]
_OPENMP = ["-fopenmp"]


def _cache_dir() -> Path:
    root = os.environ.get("CTRCAL_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    base = Path(root) / "ctrcal" if root else Path.home() / ".cache" / "ctrcal"
    return base / "kernels"


def _compile(
    cc: str, folder: Path, name: str, flags: list[str], source: str, headers: Mapping[str, str]
) -> Path:
    """Compile ``source`` (beside its ``headers``, name -> text) inside ``folder`` and rename
    the library to ``folder/name`` (atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source)
        for header, text in headers.items():
            (Path(tmp) / header).write_text(text)
        out = Path(tmp) / name
        proc = subprocess.run(
            [cc, *flags, "-o", str(out), str(src), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(out, target)  # concurrent builders all end with one complete file
    return target


def _cpu_identity() -> str:
    """Model name and feature flags of this CPU (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def build_c_library(
    source: str, stem: str, openmp: bool = False, headers: Mapping[str, str] | None = None
) -> ctypes.CDLL:
    """Compile (once per machine, cached) and load a C source of ctrcal's CPU kernels.

    Args:
        openmp: try ``-fopenmp`` first (the source's ``omp parallel`` loops then run on the
            OpenMP runtime the process has loaded; without it they run on one thread).
        headers: the local headers it includes, file name -> text.

    Raises:
        RuntimeError: no C compiler, or the source does not compile.
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (set CC)")
    headers = dict(headers or {})
    errors = []
    # native first, portable if that fails; each with OpenMP first where asked for
    choices = [
        [*base, *extra]
        for base in ([*_CFLAGS, *_NATIVE], _CFLAGS)
        for extra in ((_OPENMP, []) if openmp else ([],))
    ]
    for flags in choices:
        native = _NATIVE[0] in flags
        parts = [source, *headers.values(), cc, *flags, _cpu_identity() if native else ""]
        tag = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        name = f"{stem}_{platform.system()}_{platform.machine()}_{tag}.so".lower()
        target = _cache_dir() / name
        try:
            if not target.exists():
                try:
                    target = _compile(cc, _cache_dir(), name, flags, source, headers)
                except OSError:
                    # unwritable cache: build in a private temporary folder for this process
                    # only (never load a shared, predictable temp path another user wrote)
                    folder = Path(tempfile.mkdtemp(prefix="ctrcal-kernel-"))
                    target = _compile(cc, folder, name, flags, source, headers)
            return ctypes.CDLL(str(target))
        except (RuntimeError, OSError) as exc:
            errors.append(str(exc))
    raise RuntimeError("; ".join(errors))


class LazyLibrary:
    """One C source of ctrcal's kernels, built and loaded on first use, once per process.

    Args:
        source: the ``.c`` file.
        stem: the name of the cached build.
        declare: sets the functions' ``argtypes`` / ``restype`` on the loaded library.
        openmp: asked once, at the build: whether to build with OpenMP (see
            :func:`build_c_library`).
        headers: the local headers the source includes.

    :meth:`get` is thread-safe; a failed build is remembered (:attr:`error`), not retried.
    """

    def __init__(
        self,
        source: Path,
        stem: str,
        declare: Callable[[ctypes.CDLL], None],
        openmp: Callable[[], bool] | None = None,
        headers: Sequence[Path] = (),
    ) -> None:
        self.source, self.stem, self.declare = source, stem, declare
        self.openmp, self.headers = openmp, tuple(headers)
        self.error: str | None = None
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self._lock = threading.Lock()

    def get(self) -> ctypes.CDLL | None:
        """The loaded library; None where it cannot be built."""
        with self._lock:
            if not self._tried:
                try:
                    openmp = bool(self.openmp and self.openmp())
                    headers = {h.name: h.read_text() for h in self.headers}
                    lib = build_c_library(self.source.read_text(), self.stem, openmp, headers)
                    self.declare(lib)
                    self._lib = lib
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    self._lib, self.error = None, str(exc)
                self._tried = True
            return self._lib


__all__ = ["LazyLibrary", "build_c_library"]
