"""Durable atomic file writes (no ROS): learners, snapshots, estimates, generated robot files;
:func:`json_default`, the ``json.dump`` fallback for numpy values in the JSON results.

:func:`atomic_write` writes to a temporary file in the target's directory, flushes and
``fsync``s it, renames it over the target (``os.replace``: atomic on POSIX) and then
``fsync``s the directory, so the rename itself survives a power loss.  A crash at any
point leaves either the previous file or the new one, never a mix or an empty file.
"""
from __future__ import annotations

import os
import tempfile
from typing import Callable, Union

import numpy as np

__all__ = ["atomic_write", "atomic_write_text", "json_default"]


def json_default(o):
    """``json.dump(..., default=json_default)``: numpy arrays as lists, numpy scalars as
    Python numbers; anything else ``TypeError`` naming its type."""
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:   # a platform that cannot open directories: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, content: Union[bytes, bytearray, memoryview, Callable], *, suffix: str = ".tmp") -> str:
    """Write ``content`` (a bytes-like object, or a callable ``write(fh)`` that writes to
    a binary file object) to ``path`` durably and atomically (see the module); returns
    the path.  The directory is created if needed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return path


def atomic_write_text(path, text: str) -> str:
    """:func:`atomic_write` of ``text`` (UTF-8)."""
    return atomic_write(path, text.encode("utf-8"))
