"""Owned temporaries and publishing: how a prepared directory appears, whole or not at all.

Everything is written into a temporary sibling directory (``.DIR.<owner>.XXXX.tmp``, recording
its owner's host, pid and process start time in its name and in ``_owner.json``) that is
renamed onto ``DIR`` only when complete, so an interrupted run leaves nothing a later run
trusts; the next run deletes such leftovers once their owner is gone
(:func:`clean_stale_temporaries`). A run holds an exclusive lock on ``.DIR.lock`` (``flock``:
released by the kernel when the process dies, even by ``kill -9``; deleted by a holder that
ends normally) from its up-to-date check to its publication, so two runs into one directory
take turns: the second finds the first's output and reuses it (same inputs and config) or
replaces it by renames (different ones). Readers see either the old directory or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import zlib
from pathlib import Path

from ctrcal.core.errors import DataError
from ctrcal.core.utils import directory_lock
from ctrcal.data.feature_map import FEATURE_MAP_FILE, SCHEMA_VERSION
from ctrcal.preparation.splits import SPLITS

OWNER_FILE = "_owner.json"
STALE_SECONDS = 3600
"""A temporary directory whose owner cannot be asked (another host, no record) is deleted
after this long without a change."""


def is_prepared(out_dir: str | Path, expected_hash: str | None = None) -> bool:
    """True when ``out_dir`` is a complete prepared directory (with that hash, if given)."""
    out_dir = Path(out_dir)
    try:
        data = json.loads((out_dir / FEATURE_MAP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if data.get("schema_version") != SCHEMA_VERSION or not data.get("complete"):
        return False
    if expected_hash is not None and data.get("source_hash") != expected_hash:
        return False
    return all((out_dir / s).is_dir() for s in SPLITS)


def check_out_dir(out_dir: Path) -> None:
    # atomic replacement deletes the old directory: never do that to something that is not
    # a prepared directory (a typo like --out . must not wipe a project)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise DataError(f"{out_dir}: exists and is not a directory")
    if any(out_dir.iterdir()) and not (out_dir / FEATURE_MAP_FILE).exists():
        raise DataError(
            f"{out_dir}: exists, is not empty and is not a prepared data directory "
            "(no feature_map.json); choose another --out"
        )


def publish_lock(out_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the exclusive lock of ``out_dir`` while inside; a second process waits
    (:func:`ctrcal.core.utils.directory_lock`, the lock every ctrcal command uses)."""
    return directory_lock(out_dir, "'ctrcal prepare'", wait=True)


def _owner_tag() -> str:
    """``h<host crc>.p<pid>.s<start>.``: this process, in the name of what it creates, so that
    a kill before its owner record is written still leaves the owner to ask."""
    start = _process_start(os.getpid())
    host = zlib.crc32(socket.gethostname().encode())
    return f"h{host:08x}.p{os.getpid()}.s{'x' if start is None else start}."


_OWNER_TAG = re.compile(r"\.h([0-9a-f]{8})\.p(\d+)\.s(\d+|x)\.")


def owned_temp_dir(out_dir: Path, kind: str = "") -> Path:
    """A fresh ``.<name>.[kind-]<owner>.XXXX.tmp`` sibling of ``out_dir`` recording who owns
    it, in its name (from the instant it exists) and in ``_owner.json``."""
    prefix = f".{out_dir.name}.{kind + '-' if kind else ''}{_owner_tag()}"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the result private
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "start": _process_start(os.getpid())}
    (tmp / OWNER_FILE).write_text(json.dumps(owner))
    return tmp


def _process_start(pid: int) -> int | None:
    """The start time of a process in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except OSError:
        return True
    now = _process_start(pid)
    return start is None or now is None or now == start


def _last_activity(path: Path) -> float:
    """Newest modification time of a directory, its entries and theirs (two levels)."""
    newest = 0.0
    try:
        newest = path.stat().st_mtime
        for child in path.iterdir():
            newest = max(newest, child.stat().st_mtime)
            if child.is_dir():
                for grandchild in child.iterdir():
                    newest = max(newest, grandchild.stat().st_mtime)
    except OSError:
        pass
    return newest


def _is_stale(path: Path, now: float) -> bool:
    name = path.name
    if ".old-" in name:
        # a previous result moved aside by publish, normally deleted right away
        try:
            pid = int(name.rsplit(".old-", 1)[1].split("-")[0])
        except ValueError:
            pid = None
        if pid is not None and not _owner_alive(pid, None):
            return True
        return now - _last_activity(path) > STALE_SECONDS
    try:
        owner = json.loads((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        owner = None
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname():
        try:
            return not _owner_alive(int(owner["pid"]), owner.get("start"))
        except (KeyError, TypeError, ValueError):
            pass
    # killed before (or while) writing its record: the name says who made it
    tag = _OWNER_TAG.search(name)
    if tag and int(tag[1], 16) == zlib.crc32(socket.gethostname().encode()):
        return not _owner_alive(int(tag[2]), None if tag[3] == "x" else int(tag[3]))
    # no owner on this host to ask (another machine sharing the folder, or no record):
    # only long inactivity tells
    return now - _last_activity(path) > STALE_SECONDS


def clean_stale_temporaries(out_dir: str | Path) -> list[Path]:
    """Delete what killed runs left next to ``out_dir``; returns what was deleted.

    Candidates are ``.<name>.*.tmp`` (a run's work in progress) and ``.<name>.old-*`` (a
    previous result being replaced). One is deleted when the process that made it is gone
    (same host: its pid is dead or was reused), or, without such an owner to ask, when
    nothing in it changed for :data:`STALE_SECONDS`. A concurrent run's directory is left
    alone.
    """
    out_dir = Path(out_dir)
    prefix = f".{out_dir.name}."
    removed = []
    now = time.time()
    try:
        entries = list(out_dir.parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        name = path.name
        if not name.startswith(prefix) or not path.is_dir() or path.is_symlink():
            continue
        if not (name.endswith(".tmp") or name[len(prefix) :].startswith("old-")):
            continue
        if _is_stale(path, now):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def publish(tmp: Path, out_dir: Path, key: str) -> None:
    """Move the finished ``tmp`` onto ``out_dir`` by renames only."""
    try:
        if out_dir.exists():
            # move the old directory aside first so the new one appears in one rename
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except OSError:
        # another process published the same result meanwhile: keep theirs
        if not is_prepared(out_dir, key):
            raise
