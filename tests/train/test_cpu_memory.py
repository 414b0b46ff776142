"""retain_freed_memory: freed activation-sized blocks are reused without new page faults."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# A step's pattern: several 16 MiB activations alive at once, all freed, again and again.
_CHILD = """
import ctypes, json, resource, sys
from ctrcal.train.cpu_memory import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "on" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 16 << 20
def cycle():
    blocks = [libc.malloc(size) for _ in range(4)]
    for b in blocks:
        libc.memset(b, 1, size)
    for b in reversed(blocks):
        libc.free(b)
for _ in range(3):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _faults(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, env=env, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_freed_blocks_are_reused_without_page_faults():
    on, off = _faults("on"), _faults("off")
    assert on["applied"]
    pages = 10 * 4 * (16 << 20) // 4096  # what touching fresh pages every cycle would cost
    assert off["faults"] > pages // 2  # glibc's defaults give the memory back every cycle
    assert on["faults"] < pages // 20


def test_environment_settings_win(monkeypatch):
    from ctrcal.train import cpu_memory

    cpu_memory.retain_freed_memory.cache_clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    try:
        assert cpu_memory.retain_freed_memory() is False
    finally:
        cpu_memory.retain_freed_memory.cache_clear()
