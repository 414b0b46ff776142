"""The export formats and what they need: torch-free, so ``validate`` and a mistyped
``--format`` answer without importing torch."""

from __future__ import annotations

import shutil

from ctrcal.core.errors import ConfigError, NotAvailableError

__all__ = [
    "EXPORT_EXTRA",
    "ENGINES",
    "EXPORT_PACKAGES",
    "FORMATS",
    "check_format",
    "cxx_compiler",
    "missing_export_packages",
]

# onnx: the ONNX graph (torch.export-based exporter); pt2: torch.export's ExportedProgram;
# aoti: an AOTInductor package (a compiled shared library in a .pt2, loadable from C++)
FORMATS = ("onnx", "pt2", "aoti")
# `ctrcal predict --engine`: the eager model, or its exported graph (ctrcal.serving.engines)
ENGINES = ("torch", "onnxruntime", "aoti")
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


def missing_export_packages() -> list[str]:
    """The packages of ``ctrcal[export]`` that are not installed (none: ONNX export works)."""
    import importlib.util

    return [p for p in EXPORT_PACKAGES if importlib.util.find_spec(p) is None]


def cxx_compiler() -> str | None:
    """The C++ compiler AOTInductor can use, or None."""
    return next((c for c in CXX_COMPILERS if shutil.which(c)), None)
