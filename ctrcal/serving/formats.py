"""The export formats and the packages they need: torch-free, so ``validate`` and a mistyped
``--format`` answer without importing torch."""

from __future__ import annotations

from ctrcal.core.errors import ConfigError, NotAvailableError

__all__ = ["EXPORT_EXTRA", "EXPORT_PACKAGES", "FORMATS", "check_format", "missing_export_packages"]

FORMATS = ("onnx", "torchscript")
EXPORT_EXTRA = "export"
EXPORT_PACKAGES = ("onnx", "onnxruntime", "onnxscript")


def check_format(fmt: str) -> str:
    """``fmt`` if it is a known format; for ONNX, the export packages must be installed.

    Raises:
        ConfigError: an unknown format (the valid ones named).
        NotAvailableError: ONNX without ``ctrcal[export]``.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown export format {fmt!r} (valid: {', '.join(FORMATS)})")
    if fmt == "onnx":
        missing = missing_export_packages()
        if missing:
            raise NotAvailableError(
                f"ONNX export needs {', '.join(missing)}: pip install 'ctrcal[{EXPORT_EXTRA}]'"
            )
    return fmt


def missing_export_packages() -> list[str]:
    """The packages of ``ctrcal[export]`` that are not installed (none: ONNX export works)."""
    import importlib.util

    return [p for p in EXPORT_PACKAGES if importlib.util.find_spec(p) is None]
