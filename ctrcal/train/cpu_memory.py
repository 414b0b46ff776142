"""Keep freed memory inside the process during CPU training (glibc only).

PyTorch's CPU allocator is plain ``malloc``/``free``. A training step allocates and frees the
same few dozen activation-sized blocks every time (16 MB each for a 10000 x 400 float32
activation); glibc serves blocks that large with ``mmap`` and returns them to the system on
``free``, or trims the top of its heap once more than a couple of them are free. The next step
then takes a page fault for every 4 KiB page it touches again, and the kernel zeroes each
page: measurable time in a step that is otherwise matrix products and a few elementwise
passes. :func:`retain_freed_memory` sets glibc's thresholds (``mallopt``) so that blocks up
to 32 MiB come from the heap and freed memory stays there for the next step, which is what
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment would do (the
environment wins when it sets them). The process's resident memory then stays at its peak
instead of shrinking between steps; results do not change.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys

__all__ = ["retain_freed_memory"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20

_ENV_KEYS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.lru_cache(maxsize=1)
def retain_freed_memory() -> bool:
    """Apply the thresholds once per process; True when they are in force (glibc)."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(key in os.environ for key in _ENV_KEYS):
        return False  # the user chose the allocator's settings
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
            (_M_TOP_PAD, _TOP_PAD),
        )
    )
