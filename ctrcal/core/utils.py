"""Small shared helpers: atomic writes, write failures, directory locks, seeding, devices.

Every file ctrcal writes goes through :func:`atomic_path` (or :func:`make_dirs` for a
directory), and every failed write is described by :func:`describe_os_error`: a full disk, a
read-only file system or a missing permission is one line naming the path and the cause
(:class:`~ctrcal.core.errors.OutputError`), never a traceback, and never blamed on the input.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ctrcal.core.errors import CtrcalError, OutputError

# errno -> the cause a user acts on; everything else keeps the system's own wording
_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}
OUTPUT_ERRNOS = frozenset(_CAUSES)  # the failures the environment, not ctrcal, must fix
_LOW_SPACE = 1 << 20  # bytes; a write that failed with less than this free ran out of space


def write_failure_cause(path: str | os.PathLike, exc: BaseException) -> str | None:
    """Why writing ``path`` failed with ``exc``: no space, read-only, permission, or the
    system's words; None when ``exc`` is not a failure of the file system (a bug).

    An :class:`OSError` carries its errno; polars and pyarrow (Rust, C++) write theirs into
    the message (``... (os error 28)``). torch's C++ writer reports a short write without one
    (``RuntimeError: ... unexpected pos ...``): then the file system holding ``path`` is
    asked, while the partial file still takes its space.
    """
    if not isinstance(exc, Exception) or isinstance(exc, CtrcalError):
        return None
    if isinstance(exc, OSError) and exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    code = re.search(r"(?:os error|errno) (\d+)", str(exc), re.IGNORECASE)
    if code and int(code.group(1)) in _CAUSES:
        return _CAUSES[int(code.group(1))]
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    directory = Path(path).parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return _CAUSES[errno.EROFS]
    if min(st.f_bavail, st.f_bfree) * st.f_frsize < _LOW_SPACE:
        return _CAUSES[errno.ENOSPC]
    if not os.access(directory, os.W_OK):
        return _CAUSES[errno.EACCES]
    return None


def describe_os_error(path: str | os.PathLike, exc: BaseException, action: str = "write") -> str:
    """One line for a failed write: ``"PATH: cannot write: no space left on the device"``.

    For every writer of files (training, the report, ``prepare``): the line names the path
    and the cause, so a full disk is never mistaken for bad input. ``action`` replaces
    "write" where the failing operation is not known to be one.
    """
    cause = write_failure_cause(path, exc) or (str(exc).strip().splitlines() or ["?"])[0]
    hint = {
        _CAUSES[errno.ENOSPC]: "; free some space and run the command again",
        _CAUSES[errno.EDQUOT]: "; free some space and run the command again",
    }.get(cause, "")
    return f"{path}: cannot {action}: {cause}{hint}"


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a failed write to ``path`` inside the block into one :class:`OutputError` line.

    An ``OSError`` always becomes one; another exception only when the file system explains
    it (:func:`write_failure_cause`): anything else is a bug and keeps its traceback. A
    :class:`~ctrcal.core.errors.CtrcalError` raised inside (a nested write's ``OutputError``, bad
    input) passes through unchanged.
    """
    try:
        yield
    except CtrcalError:
        raise
    except Exception as exc:
        if write_failure_cause(path, exc) is None:
            raise
        raise OutputError(describe_os_error(path, exc)) from exc


def make_dirs(path: str | os.PathLike) -> Path:
    """``mkdir -p path`` whose failure is one :class:`OutputError` line."""
    path = Path(path)
    with writing(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; rename it onto ``path`` only on success.

    Works for files and directories alike: whatever the body writes at the yielded path
    replaces ``path`` in one rename, so a crash never leaves a half-written target that a
    later run could trust, and a failed write (a full disk, say) leaves the previous
    ``path`` as it was. Such a failure is an :class:`OutputError` naming ``path`` and the
    cause (:func:`writing`), so the body should only write: an input it fails to read there
    would be reported as this write's failure.
    """
    path = Path(path)
    make_dirs(path.parent)
    with writing(path):
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.rmdir(tmp)  # the caller decides whether it becomes a file or a directory
    try:
        # classified before the finally below frees the partial file's space
        with writing(path):
            yield tmp
            if path.is_dir() and not path.is_symlink():
                _rmtree(path)
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            _rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def remove_stale_temporaries(
    directory: str | os.PathLike, targets: Iterable[str] = ("*",)
) -> list[Path]:
    """Delete the temporaries :func:`atomic_path` left in ``directory`` when a kill stopped
    their writer; return what was removed.

    Only for files that one process writes at a time (a run directory being resumed, a
    report's own outputs): another writer's temporary in flight would be removed too.

    Args:
        directory: where the targets live.
        targets: glob patterns of the target names whose temporaries go (default: all).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = sorted({p for t in targets for p in directory.glob(f".{t}.*.tmp")})
    for tmp in stale:
        _rmtree(tmp) if tmp.is_dir() and not tmp.is_symlink() else tmp.unlink(missing_ok=True)
    return stale


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def json_safe(obj: Any) -> Any:
    """``obj`` as plain JSON values, recursively: every non-finite float (NaN, ±inf) replaced
    by None, numpy arrays and scalars as Python lists and numbers, paths as strings, dict keys
    as strings.

    Python's ``json`` writes NaN as a bare ``NaN``, which is not JSON: strict parsers (and
    every other language's) refuse the file. A metric that is undefined (the AUC of a split
    without a click) is written as ``null`` instead.
    """
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {_json_key(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if not isinstance(obj, (str, bytes, int)) and hasattr(obj, "tolist"):
        # numpy arrays and scalars (np.float32, np.int64, np.bool_) without importing numpy
        return json_safe(obj.tolist())
    return obj


def _json_key(key: Any) -> Any:
    # the keys json writes itself stay as they are (an int key is written "3" either way)
    return key if key is None or isinstance(key, (str, int, float)) else str(key)


def json_dumps(obj: Any, indent: int | None = None) -> str:
    """``json.dumps`` that never writes a bare NaN or Infinity (see :func:`json_safe`)."""
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, strictly valid JSON to ``path`` atomically."""
    write_text_atomic(path, json_dumps(obj, indent=2) + "\n")


@contextlib.contextmanager
def directory_lock(target: str | os.PathLike, what: str, wait: bool = True) -> Iterator[None]:
    """Hold the exclusive lock of ``target`` (``.<name>.lock`` beside it) while inside.

    ``flock`` is released by the kernel when its holder dies, even by ``kill -9``, so a lock
    is never left behind; the holder records its pid, host and start time in the file and
    deletes it before releasing it, so a waiter that wakes up on a deleted file tries again
    on the current one.

    Args:
        target: the directory the lock protects (it need not exist yet).
        what: the holder's command, for messages (``"'ctrcal prepare'"``).
        wait: block until the holder is done (saying so once on stderr), or refuse at once.

    Raises:
        CtrcalError: ``wait=False`` and another process holds the lock (named in the message).
        OutputError: the lock file cannot be created.
    """
    target = Path(target)
    path = target.with_name(f".{target.name}.lock")
    said = False
    while True:
        make_dirs(path.parent)
        with writing(path):
            fh = open(path, "a+")  # noqa: SIM115 - held open for as long as the lock is
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                fh.close()
                raise CtrcalError(
                    f"{target}: another {what} is writing it ({holder}); wait for it to "
                    "finish or choose another directory"
                ) from None
            if not said:
                print(
                    f"waiting for another {what} into {target} to finish ({holder})",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fh.fileno()).st_ino:
            break
        fh.close()  # the holder we waited for deleted this file: lock the new one
    try:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        with contextlib.suppress(OSError):  # the record is for messages only
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(owner))
            fh.flush()
        yield
    finally:
        path.unlink(missing_ok=True)
        fh.close()  # releases the lock


def _lock_holder(path: Path) -> str:
    """``"pid 123 on host, since 22:04:05"`` from a lock file, or what is known of it."""
    try:
        owner = json.loads(path.read_text())
        since = time.strftime("%H:%M:%S", time.localtime(float(owner["since"])))
        return f"pid {int(owner['pid'])} on {owner['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not recorded itself yet"


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (for benchmarks).

    Reads ``VmHWM`` from ``/proc/self/status``: unlike ``ru_maxrss`` it is reset by exec, so a
    child process started from a big parent reports only its own peak.
    """
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model_name() -> str:
    """The CPU's ``lscpu`` model name, with family and model numbers (for benchmark output).

    Names like ``AMD EPYC`` say little (a Zen 4 and a Zen 5 part differ twofold in some of
    our figures); ``family 25, model 17`` pins the generation down.
    """
    import subprocess

    name = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as info:
            fields = {}
            for line in info:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        if "cpu family" in fields:
            name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    except OSError:
        pass
    return name
