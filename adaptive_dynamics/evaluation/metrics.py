"""Tracking and prediction metrics (no ROS).  Arrays are (samples, joints)."""
from __future__ import annotations

import numpy as np


def rmse(err, axis=0) -> np.ndarray:
    """Root-mean-square of ``err`` along ``axis`` (per joint by default)."""
    err = np.asarray(err, dtype=float)
    return np.sqrt(np.mean(err * err, axis=axis))


def nmse(pred, target, axis=0, eps: float = 1e-12) -> np.ndarray:
    """Normalised MSE: mean((pred - target)^2) / var(target), per joint (0 = perfect,
    1 = as good as predicting the target's mean)."""
    pred = np.asarray(pred, dtype=float)
    target = np.asarray(target, dtype=float)
    return np.mean((pred - target) ** 2, axis=axis) / np.maximum(np.var(target, axis=axis), eps)


def phase_rmse(t, err, phases: dict[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    """Per-joint RMSE of ``err`` (samples x joints) within each named [t0, t1) window of ``t``."""
    t = np.asarray(t, dtype=float)
    out = {}
    for name, (t0, t1) in phases.items():
        sel = (t >= t0) & (t < t1)
        if not np.any(sel):
            raise ValueError(f"phase {name!r} [{t0}, {t1}) contains no samples")
        out[name] = rmse(np.asarray(err)[sel])
    return out


def running_nmse(pred, target, window: int) -> np.ndarray:
    """nMSE per joint over consecutive windows of ``window`` samples -> (n_windows, joints)."""
    pred = np.asarray(pred, dtype=float)
    target = np.asarray(target, dtype=float)
    k = len(pred) // window
    if k == 0:
        raise ValueError(f"need at least {window} samples, got {len(pred)}")
    p = pred[:k * window].reshape(k, window, -1)
    y = target[:k * window].reshape(k, window, -1)
    return np.mean((p - y) ** 2, axis=1) / np.maximum(np.var(target, axis=0), 1e-12)
