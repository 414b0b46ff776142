"""Who runs the preparation (``data.engine``), and what each engine needs: the rules the rule
book asks, without importing an engine (``validate`` stays light)."""

from __future__ import annotations

import importlib.util
from typing import Any


def missing_package() -> str | None:
    """What to install when the Ray engine's package is missing (one line), else None."""
    if importlib.util.find_spec("ray") is None:
        return "the ray engine needs the ray package: pip install 'ctrcal[ray]'"
    return None


def check_engine(data: Any) -> list[tuple[str, str]]:
    """``(key, message)`` per problem of a config's ``data`` section with its engine: Ray
    missing for ``engine: ray``, or a ``ray_address`` that the local engine would not use."""
    out = []
    if data.engine == "ray":
        missing = missing_package()
        if missing:
            out.append(("data.engine", missing))
    elif data.ray_address is not None:
        out.append(("data.ray_address", "is used by data.engine: ray only (engine is local)"))
    return out


__all__ = ["check_engine", "missing_package"]
