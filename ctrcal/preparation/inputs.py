"""Input paths as a config or the command line gives them -> the files to read.

An entry with a glob pattern (``*``, ``?``, ``[...]``) is expanded in sorted order (the same
files in the same order on every run and machine, whatever the file system lists first); an
entry that exists as it is spelled is taken literally. A pattern that matches nothing is an
error naming the key that holds it, and a file named twice (by two patterns, or a pattern and
a path) is read, and counted in the data's identity, once.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from ctrcal.core.errors import DataError


def expand_inputs(entries: Sequence[str | Path], key: str) -> list[Path]:
    """The files of ``entries`` (paths or glob patterns) in order, each once.

    Args:
        entries: the paths or patterns, as given.
        key: where they were given (``data.inputs``, ``data.train``, ``inputs``), to name
            an entry that matches nothing.

    Raises:
        DataError: a pattern that matches no file.
    """
    out: list[Path] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        text = os.fspath(entry)
        if glob.has_magic(text) and not os.path.lexists(text):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise DataError(f"{key}[{i}]: {text!r} matches no file")
            paths = [Path(m) for m in matches]
        else:
            paths = [Path(text)]
        for p in paths:
            real = os.path.realpath(p)
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


__all__ = ["expand_inputs"]
