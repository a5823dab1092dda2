"""Offline rigid-body identification: least squares on the base regressor (+ friction).

The classic procedure (Gautier & Khalil; Swevers et al. 1997): drive the robot along
an exciting trajectory (e.g. a Modified Fourier series), record ``q``, ``qd`` and the
joint torque, estimate ``qdd`` by differentiation, and solve

    tau = Y_b(q, qd, qdd) theta_b        (stacked over all samples)

for the base parameters ``theta_b`` of a :class:`~adaptive_dynamics.dynamics.RobotModel`
with friction columns (viscous ``f_v qd`` and Coulomb ``f_c sgn(qd)`` per joint), in
the same coordinates the :class:`~adaptive_dynamics.control.AdaptiveController` adapts
(``model.base_parameters()``), so the result can be loaded as a fixed estimate.

* :func:`prepare` -- zero-phase low-pass filtering of q, qd and tau with the same
  Butterworth filter (parallel filtering: the regressor and the torque see the same
  filter, so it does not bias the fit), qdd from the filtered velocity by central
  differences, then decimation.
* :func:`identify` -- ordinary least squares, then (``weighted``) one weighted pass
  with every joint's rows scaled by the inverse of its residual standard deviation
  (the usual remedy for joints whose torques differ by orders of magnitude).

No ROS import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np

__all__ = ["Identification", "prepare", "identify", "estimate_file"]


@dataclass
class Identification:
    """Result of :func:`identify`."""

    theta: np.ndarray              # base parameters (+ friction), the model's base coordinates
    names: list                    # their names (``model.base_parameters().names``)
    pi: np.ndarray                 # a full pi with ``K pi = theta`` (dependent entries zero)
    residual_rmse: np.ndarray      # per joint [N m], of the final fit on the identification data
    tau_rms: np.ndarray            # per joint [N m], RMS of the torque that was fitted
    condition: float               # condition number of the column-scaled base regressor
    samples: int                   # samples used
    relative_std: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sigma(theta_i) / |theta_i|

    def to_dict(self) -> dict:
        return {"samples": int(self.samples), "condition": float(self.condition),
                "residual_rmse": [float(x) for x in self.residual_rmse],
                "tau_rms": [float(x) for x in self.tau_rms],
                "relative_residual": [float(a / max(b, 1e-12)) for a, b in zip(self.residual_rmse, self.tau_rms)]}


def prepare(t, q, qd, tau, *, cutoff_hz: float = 20.0, order: int = 4, decimate: int = 5,
            trim: float = 0.1):
    """Filtered, differentiated and decimated identification data.

    ``t`` (N,) [s] uniformly sampled; ``q``, ``qd``, ``tau`` (N, n).  All three are
    low-pass filtered forward and backward (``scipy.signal.filtfilt``, Butterworth of
    ``order`` at ``cutoff_hz``: zero phase); ``qdd`` is the central difference of the
    filtered velocity.  ``trim`` [s] is dropped at both ends (filter transients), then
    every ``decimate``-th sample is kept.  Returns ``(q, qd, qdd, tau)``.
    """
    from scipy.signal import butter, filtfilt

    t = np.asarray(t, dtype=float).reshape(-1)
    q, qd, tau = (np.asarray(a, dtype=float) for a in (q, qd, tau))
    if not (q.shape == qd.shape == tau.shape and q.ndim == 2 and q.shape[0] == t.size):
        raise ValueError(f"t {t.shape}, q {q.shape}, qd {qd.shape}, tau {tau.shape}: need (N,) and three (N, n)")
    if t.size < 10:
        raise ValueError(f"need at least 10 samples, got {t.size}")
    dt = np.diff(t)
    h = float(np.median(dt))
    if not (h > 0 and np.allclose(dt, h, rtol=1e-3, atol=1e-9)):
        raise ValueError("identification data must be uniformly sampled (a gap or a repeated stamp?)")
    nyq = 0.5 / h
    if not 0 < cutoff_hz < nyq:
        raise ValueError(f"cutoff_hz must be in (0, {nyq:g}) Hz for a {1 / h:g} Hz signal, got {cutoff_hz}")
    b, a = butter(int(order), cutoff_hz / nyq)
    qf, vf, tf = (filtfilt(b, a, x, axis=0) for x in (q, qd, tau))
    af = np.gradient(vf, h, axis=0)
    k = int(round(trim / h))
    sel = slice(k, t.size - k, max(1, int(decimate)))
    if len(range(*sel.indices(t.size))) < 2:
        raise ValueError("nothing left after trimming: record a longer run")
    return qf[sel], vf[sel], af[sel], tf[sel]


def identify(model, q, qd, qdd, tau, *, weighted: bool = True) -> Identification:
    """Least-squares base parameters of ``model`` (a :class:`RobotModel`, usually with
    ``friction=True``) from samples (N, n) of ``q, qd, qdd`` and the joint torque."""
    q, qd, qdd, tau = (np.asarray(a, dtype=float) for a in (q, qd, qdd, tau))
    n = model.n
    if not (q.shape == qd.shape == qdd.shape == tau.shape and q.ndim == 2 and q.shape[1] == n):
        raise ValueError(f"q, qd, qdd, tau must be (N, {n}); got {q.shape}, {qd.shape}, {qdd.shape}, {tau.shape}")
    if not all(np.isfinite(a).all() for a in (q, qd, qdd, tau)):
        raise ValueError("identification data contain NaN/inf")
    base = model.base_parameters()
    N = q.shape[0]
    b = base.n_base
    if N * n < 3 * b:
        raise ValueError(f"{N} samples of {n} joints are too few for {b} base parameters")
    A = model.regressor_batch(q, qd, qdd, base=base)
    y = tau.copy()
    scale = np.linalg.norm(A.reshape(N * n, b), axis=0)
    scale[scale == 0] = 1.0

    def solve(w):
        Aw = (A * w[None, :, None]).reshape(N * n, b) / scale
        yw = (y * w[None, :]).reshape(N * n)
        sol, *_ = np.linalg.lstsq(Aw, yw, rcond=None)
        return sol / scale, Aw

    theta, Aw = solve(np.ones(n))
    if weighted:
        res = y - np.einsum("knb,b->kn", A, theta)
        sd = np.sqrt(np.mean(res * res, axis=0))
        w = 1.0 / np.maximum(sd, 1e-6 * max(float(sd.max()), 1e-12))
        theta, Aw = solve(w)
    res = y - np.einsum("knb,b->kn", A, theta)
    sv = np.linalg.svd(Aw, compute_uv=False)
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    # parameter standard deviations from the (weighted) residual: sigma^2 (A^T A)^-1
    dof = max(N * n - b, 1)
    wres = (res * (w if weighted else np.ones(n))[None, :]).reshape(-1)
    sigma2 = float(wres @ wres) / dof
    try:
        cov = sigma2 * np.linalg.inv(Aw.T @ Aw) / np.outer(scale, scale)
        rel = np.sqrt(np.maximum(np.diag(cov), 0.0)) / np.maximum(np.abs(theta), 1e-12)
    except np.linalg.LinAlgError:
        rel = np.full(b, np.inf)
    return Identification(theta=theta, names=list(base.names), pi=base.from_base(theta),
                          residual_rmse=np.sqrt(np.mean(res * res, axis=0)),
                          tau_rms=np.sqrt(np.mean(tau * tau, axis=0)), condition=cond, samples=N,
                          relative_std=rel)


def estimate_file(model, ident: Identification, path: str, *, law: str = "direct") -> str:
    """Write ``ident`` as an :class:`~adaptive_dynamics.control.AdaptiveController`
    state file (``estimate_file`` of the ``adaptive_controller`` node), for a
    controller with base parameters and friction columns exactly as ``model`` has."""
    from ..control.adaptive import AdaptiveController

    ctl = AdaptiveController(model, law, pi0=ident.pi)
    if not np.allclose(ctl.theta, ident.theta, rtol=1e-12, atol=1e-12):
        raise ValueError("the identified parameters are not in the controller's base coordinates")
    return ctl.save(path)

