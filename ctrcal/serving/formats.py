"""The export formats and what they need: torch-free, so ``validate`` and a mistyped
``--format`` answer without importing torch."""

from __future__ import annotations

import shutil

from ctrcal.core.errors import ConfigError, NotAvailableError

__all__ = [
    "EXPORT_EXTRA",
    "ENGINES",
    "ENGINE_FORMATS",
    "EXPORT_PACKAGES",
    "FORMATS",
    "PRECISIONS",
    "check_format",
    "check_precision",
    "cxx_compiler",
    "missing_export_packages",
]

# onnx: the ONNX graph (torch.export-based exporter); pt2: torch.export's ExportedProgram;
# aoti: an AOTInductor package (a compiled shared library in a .pt2, loadable from C++)
FORMATS = ("onnx", "pt2", "aoti")
# the numbers an exported graph computes in, and the formats that hold each: bf16 (autocast,
# the dense layers' weights stored in bf16) runs on AMX / AVX512-BF16 in torch's kernels; int8
# (the dense layers' weights quantized, activations per batch) runs in ONNX Runtime
PRECISIONS = {"fp32": ("onnx", "pt2", "aoti"), "bf16": ("pt2", "aoti"), "int8": ("onnx",)}
# `ctrcal predict --engine`: the eager model, or its exported graph (ctrcal.serving.engines)
ENGINES = ("torch", "onnxruntime", "aoti")
ENGINE_FORMATS = {"onnxruntime": "onnx", "aoti": "aoti"}  # what an exported engine scores
EXPORT_EXTRA = "export"
EXPORT_PACKAGES = ("onnx", "onnxruntime", "onnxscript")
CXX_COMPILERS = ("g++", "clang++", "c++")


def check_format(fmt: str) -> str:
    """``fmt`` if it is a known format whose tools are present.

    Raises:
        ConfigError: an unknown format (the valid ones named); ``torchscript``, with what
            replaces it.
        NotAvailableError: ONNX without ``ctrcal[export]``; AOTInductor without a C++ compiler.
    """
    if fmt == "torchscript":
        raise ConfigError(
            "--format: TorchScript is deprecated by PyTorch and ctrcal no longer writes it: "
            "use pt2 (torch.export, loaded with torch.export.load) or aoti (AOTInductor, "
            "loaded from C++ or Python)"
        )
    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown export format {fmt!r} (valid: {', '.join(FORMATS)})")
    if fmt == "onnx":
        missing = missing_export_packages()
        if missing:
            raise NotAvailableError(
                f"ONNX export needs {', '.join(missing)}: pip install 'ctrcal[{EXPORT_EXTRA}]'"
            )
    if fmt == "aoti" and cxx_compiler() is None:
        raise NotAvailableError(
            f"AOTInductor export compiles C++: it needs one of {', '.join(CXX_COMPILERS)} on PATH"
        )
    return fmt


def check_precision(fmt: str, precision: str) -> str:
    """``precision`` if ``fmt`` can hold it.

    Raises:
        ConfigError: an unknown precision, or one the format cannot hold (the valid ones named).
    """
    if precision not in PRECISIONS:
        raise ConfigError(
            f"--precision: unknown precision {precision!r} (valid: {', '.join(PRECISIONS)})"
        )
    if fmt not in PRECISIONS[precision]:
        raise ConfigError(
            f"--precision {precision}: the {fmt} format cannot hold it (valid for {precision}: "
            f"{', '.join(PRECISIONS[precision])})"
        )
    return precision


def missing_export_packages() -> list[str]:
    """The packages of ``ctrcal[export]`` that are not installed (none: ONNX export works)."""
    import importlib.util

    return [p for p in EXPORT_PACKAGES if importlib.util.find_spec(p) is None]


def cxx_compiler() -> str | None:
    """The C++ compiler AOTInductor can use, or None."""
    return next((c for c in CXX_COMPILERS if shutil.which(c)), None)
