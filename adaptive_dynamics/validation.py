"""Input checks shared by the ROS-free layers (clear ``ValueError`` naming the argument)."""
from __future__ import annotations

import numpy as np


_F64 = np.dtype(np.float64)


def valid_vectors(n: int, *xs) -> bool:
    """All ``xs`` are contiguous float64 vectors of length ``n`` with finite entries: the
    hot path's case, one ``isfinite`` for all of them (a NaN or inf in any one propagates
    into their sum).  False says "check them one by one" (:func:`as_vector`)."""
    for x in xs:
        if type(x) is not np.ndarray or x.shape != (n,) or x.dtype != _F64 or not x.flags.c_contiguous:
            return False
    total = xs[0]
    if len(xs) > 1:
        total = total + xs[1]
        for x in xs[2:]:
            total += x
    return bool(np.isfinite(total).all())


def as_vector(x, n: int, name: str) -> np.ndarray:
    """Return ``x`` as a contiguous float64 vector of length ``n`` or raise ``ValueError``.

    The message names the argument, the expected and actual length, and the first
    non-finite entry (NaN/inf) if any.
    """
    if valid_vectors(n, x):   # the hot path's case: already a valid vector (returned as is)
        return x
    try:
        arr = np.ascontiguousarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot convert to a float vector ({exc})") from None
    if arr.ndim != 1:
        arr = arr.reshape(-1) if arr.size == n and arr.ndim == 2 and 1 in arr.shape else arr
    if arr.ndim != 1 or arr.size != n:
        raise ValueError(f"{name}: expected a vector of length {n}, got shape {np.shape(x)}")
    finite = np.isfinite(arr)
    if not finite.all():
        k = int(np.argmin(finite))
        raise ValueError(f"{name}: entry {k} is not finite ({arr[k]!r}); NaN/inf inputs are rejected")
    return arr


def per_joint(value, n: int, what: str, *, nonneg: bool = True, one_for_all: bool = False) -> np.ndarray:
    """``value`` as ``n`` per-joint values (a copy): a scalar for every joint, or ``n``
    values (``one_for_all``: a 1-value sequence too, as ROS array parameters give a
    scalar); finite, and ``>= 0`` when ``nonneg``; else ``ValueError`` naming ``what``."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a number or {n} numbers, got {value!r}") from None
    if one_for_all and arr.size == 1:
        arr = arr.reshape(())
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{what}: expected a scalar or {n} values (one per joint), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} must be finite, got {arr.tolist()}")
    if nonneg and np.any(arr < 0):
        raise ValueError(f"{what} must be >= 0, got {arr.tolist()}")
    return arr.copy()


def check_vectors(n: int, **named) -> tuple:
    """Validate several equally sized vectors; returns them in keyword order."""
    return tuple(as_vector(v, n, k) for k, v in named.items())


def as_positive(x, name: str) -> float:
    try:
        val = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive number, got {x!r}") from None
    if not np.isfinite(val) or val <= 0.0:
        raise ValueError(f"{name}: expected a positive finite number, got {x!r}")
    return val
