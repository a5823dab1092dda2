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
* :func:`segments` -- recordings as they come: the longest runs of finite samples with
  increasing stamps and no gap, each resampled onto a uniform grid when its stamps
  jitter (linear interpolation), for :func:`prepare` (which needs a uniform grid).
* :func:`identify` -- ordinary least squares, then (``weighted``) one weighted pass
  with every joint's rows scaled by the inverse of its residual standard deviation
  (the usual remedy for joints whose torques differ by orders of magnitude);
  ``offset=True`` adds a constant torque per joint (sensor bias, unbalanced cables).
* :func:`identify_consistent` -- the same fit over the full parameters with every
  link's pseudo-inertia positive semidefinite (Wensing, Kim & Slotine 2017; a
  semidefinite program, cvxpy + Clarabel) and non-negative friction: a model that
  is a physical robot, so it stays sane away from the excitation data.
* :meth:`Identification.torque` / :func:`nmse` -- prediction and per-joint nMSE on
  held-out data.

No ROS import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np
from .inertial import pseudo_inertias

__all__ = ["Identification", "prepare", "segments", "identify", "identify_consistent", "nmse", "solve_sdp",
           "moving_rows", "MIN_VELOCITY"]


#: the ``min_velocity`` [rad/s] to use on an excitation that keeps the joints moving
#: (:func:`moving_rows`; ``identify --payload``'s rule): a joint's slower samples are left
#: out of the fit.  Not the default: on a short or slow recording whose joints rest much
#: of the time, leaving their samples out loses what only they show (gravity)
MIN_VELOCITY = 0.05


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
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0))   # constant torque per joint (offset=True)
    method: str = "least_squares"  # or "consistent"
    min_pseudo_inertia_eig: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per link, of pi
    rows_used: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per joint: samples fitted

    def torque(self, model, q, qd, qdd, *, offset: bool = True) -> np.ndarray:
        """Predicted joint torque (N x n): ``Y pi = Y_b theta``, plus the offsets unless
        ``offset=False`` (the model the adaptive controller runs from the estimate file)."""
        tau = model.regressor_batch(q, qd, qdd) @ self.pi
        return tau + self.offset if offset and self.offset.size else tau

    def to_dict(self) -> dict:
        out = {"method": self.method, "samples": int(self.samples), "condition": float(self.condition),
               "residual_rmse": [float(x) for x in self.residual_rmse],
               "tau_rms": [float(x) for x in self.tau_rms],
               "relative_residual": [float(a / max(b, 1e-12)) for a, b in zip(self.residual_rmse, self.tau_rms)]}
        if self.offset.size:
            out["offset"] = [float(x) for x in self.offset]
        if self.min_pseudo_inertia_eig.size:
            out["min_pseudo_inertia_eig"] = [float(x) for x in self.min_pseudo_inertia_eig]
        if self.rows_used.size:
            out["rows_used"] = [int(x) for x in self.rows_used]
        return out


def nmse(tau, tau_hat) -> np.ndarray:
    """Per-joint normalised mean-square error ``mean((tau - tau_hat)^2) / var(tau)``."""
    tau, tau_hat = np.asarray(tau, dtype=float), np.asarray(tau_hat, dtype=float)
    return np.mean((tau - tau_hat) ** 2, axis=0) / np.maximum(np.var(tau, axis=0), 1e-300)


def segments(t, *arrays, max_gap: float = 5.0, min_seconds: float = 0.5, jitter: float = 0.02):
    """Split a recording into pieces :func:`prepare` can take.

    ``t`` (N,) [s] and ``arrays`` (N, n) each.  A sample with a non-finite value in any
    array, or whose stamp is not after the previous kept one (out of order or
    repeated), is dropped; a stamp step above ``max_gap`` times the median step starts a
    new segment.  Segments shorter than ``min_seconds`` are dropped.  A segment whose
    steps deviate from the median by more than ``jitter`` (relative) is resampled onto a
    uniform grid at the median step by linear interpolation.  Returns
    ``(pieces, counts)``: a list of ``(t, *arrays)`` tuples and the number of samples
    dropped per reason (``nonfinite``, ``out_of_order``, ``short_segments``) plus
    ``gaps`` and ``resampled_segments``."""
    t = np.asarray(t, dtype=float).reshape(-1)
    arrays = [np.asarray(a, dtype=float) for a in arrays]
    if any(a.shape[0] != t.size for a in arrays):
        raise ValueError(f"t has {t.size} samples but the arrays have {[a.shape[0] for a in arrays]}")
    counts = {"nonfinite": 0, "out_of_order": 0, "short_segments": 0, "gaps": 0, "resampled_segments": 0}
    finite = np.isfinite(t)
    for a in arrays:
        finite &= np.isfinite(a.reshape(t.size, -1)).all(axis=1)
    counts["nonfinite"] = int((~finite).sum())
    idx = np.flatnonzero(finite)
    keep, last = [], -np.inf
    for i in idx:                          # monotonic filter (a running maximum)
        if t[i] > last:
            keep.append(i)
            last = t[i]
    keep = np.asarray(keep, dtype=np.int64)
    counts["out_of_order"] = int(idx.size - keep.size)
    if keep.size < 2:
        return [], counts
    tk = t[keep]
    dt = np.diff(tk)
    h = float(np.median(dt))
    cuts = np.flatnonzero(dt > max_gap * h) + 1
    counts["gaps"] = int(cuts.size)
    pieces = []
    for part in np.split(np.arange(keep.size), cuts):
        if part.size < 2 or tk[part[-1]] - tk[part[0]] < min_seconds:
            counts["short_segments"] += int(part.size)
            continue
        ts = tk[part]
        rows = [a[keep[part]] for a in arrays]
        steps = np.diff(ts)
        if np.any(np.abs(steps - h) > jitter * h):
            grid = ts[0] + h * np.arange(int(np.floor((ts[-1] - ts[0]) / h)) + 1)
            rows = [np.column_stack([np.interp(grid, ts, r[:, j]) for j in range(r.shape[1])]) for r in rows]
            ts = grid
            counts["resampled_segments"] += 1
        pieces.append((ts, *rows))
    return pieces, counts


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


def _check(model, q, qd, qdd, tau):
    q, qd, qdd, tau = (np.asarray(a, dtype=float) for a in (q, qd, qdd, tau))
    n = model.n
    if not (q.shape == qd.shape == qdd.shape == tau.shape and q.ndim == 2 and q.shape[1] == n):
        raise ValueError(f"q, qd, qdd, tau must be (N, {n}); got {q.shape}, {qd.shape}, {qdd.shape}, {tau.shape}")
    if not all(np.isfinite(a).all() for a in (q, qd, qdd, tau)):
        raise ValueError("identification data contain NaN/inf")
    return q, qd, qdd, tau


def moving_rows(model, qd, min_velocity: float = MIN_VELOCITY) -> np.ndarray:
    """(N, n) 1.0 / 0.0: the samples of each joint the fit keeps.  With friction columns
    (``sgn(q_dot)``) a joint's samples slower than ``min_velocity`` [rad/s] are left out:
    near rest no friction law predicts its friction (stiction, a smooth Coulomb
    characteristic), and the few such samples would split viscous and Coulomb friction
    wrongly; without friction columns, or ``min_velocity <= 0``, every sample."""
    qd = np.asarray(qd, dtype=float)
    if not getattr(model, "friction", False) or min_velocity <= 0:
        return np.ones_like(qd)
    return (np.abs(qd) >= float(min_velocity)).astype(float)


def identify(model, q, qd, qdd, tau, *, weighted: bool = True, offset: bool = False,
             min_velocity: float = 0.0) -> Identification:
    """Least-squares base parameters of ``model`` (a :class:`RobotModel`, usually with
    ``friction=True``) from samples (N, n) of ``q, qd, qdd`` and the joint torque;
    ``offset``: plus a constant torque per joint (:attr:`Identification.offset`);
    ``min_velocity``: :func:`moving_rows` (the residuals are those of the kept samples)."""
    q, qd, qdd, tau = _check(model, q, qd, qdd, tau)
    keep = moving_rows(model, qd, min_velocity)
    n = model.n
    base = model.base_parameters()
    N = q.shape[0]
    nb = base.n_base
    b = nb + (n if offset else 0)
    if N * n < 3 * b:
        raise ValueError(f"{N} samples of {n} joints are too few for {b} parameters")
    A = model.regressor_batch(q, qd, qdd, base=base)
    if offset:
        A = np.concatenate([A, np.broadcast_to(np.eye(n), (N, n, n))], axis=2)
    A = A * keep[:, :, None]
    y = tau * keep
    kept = np.maximum(keep.sum(axis=0), 1.0)
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
        sd = np.sqrt(np.sum(res * res, axis=0) / kept)
        w = 1.0 / np.maximum(sd, 1e-6 * max(float(sd.max()), 1e-12))
        theta, Aw = solve(w)
    res = y - np.einsum("knb,b->kn", A, theta)
    sv = np.linalg.svd(Aw, compute_uv=False)
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    # parameter standard deviations from the (weighted) residual: sigma^2 (A^T A)^-1
    dof = max(int(keep.sum()) - b, 1)
    wres = (res * (w if weighted else np.ones(n))[None, :]).reshape(-1)
    sigma2 = float(wres @ wres) / dof
    try:
        cov = sigma2 * np.linalg.inv(Aw.T @ Aw) / np.outer(scale, scale)
        rel = np.sqrt(np.maximum(np.diag(cov), 0.0)) / np.maximum(np.abs(theta), 1e-12)
    except np.linalg.LinAlgError:
        rel = np.full(b, np.inf)
    return Identification(theta=theta[:nb], names=list(base.names), pi=base.from_base(theta[:nb]),
                          residual_rmse=np.sqrt(np.sum(res * res, axis=0) / kept),
                          tau_rms=np.sqrt(np.sum((tau * keep) ** 2, axis=0) / kept), condition=cond, samples=N,
                          relative_std=rel[:nb], offset=theta[nb:].copy(), rows_used=keep.sum(axis=0).astype(int))


def _pseudo_inertia_basis() -> np.ndarray:
    """E (10 x 4 x 4) with J(pi10) = sum_k pi10[k] E[k] (the pseudo-inertia is linear)."""
    return pseudo_inertias(np.eye(10))


def solve_sdp(prob, xs, solver, what: str) -> np.ndarray:
    """Solve the cvxpy problem ``prob`` with ``solver`` (default: Clarabel, else SCS) and
    return ``xs.value``; ``RuntimeError`` naming ``what`` when no solver is installed or
    the solver does not reach an optimum."""
    import cvxpy as cp   # lazy: only the consistent identifications need it (slow import)

    names = [solver] if solver else [s_ for s_ in ("CLARABEL", "SCS") if s_ in cp.installed_solvers()]
    if not names:
        raise RuntimeError(f"no SDP solver for cvxpy (installed: {cp.installed_solvers()}); install clarabel or scs")
    prob.solve(solver=names[0])
    if prob.status not in ("optimal", "optimal_inaccurate") or xs.value is None:
        raise RuntimeError(f"{what}: solver {names[0]} ended with status {prob.status!r}")
    return np.asarray(xs.value, dtype=float)


def identify_consistent(model, q, qd, qdd, tau, *, weights=None, offset: bool = False, prior=None,
                        prior_weight: float = 1e-6, solver: str | None = None,
                        min_velocity: float = 0.0) -> Identification:
    """Physically consistent identification: least squares over the full parameters
    ``pi`` (10 per link, then viscous and Coulomb friction; ``offset``: a constant torque
    per joint) subject to every link's pseudo-inertia ``J(pi_i)`` being positive
    semidefinite and the friction coefficients non-negative -- a semidefinite program
    (cvxpy; Clarabel, else SCS).

    The data fix only the base combinations; the rest of ``pi`` is pulled towards
    ``prior`` (default: the model's own parameters, i.e. the URDF) with
    ``prior_weight`` relative to the column-normalised data term, small enough not to
    bias what the data determine.  ``weights``: per-joint row weights (default: the
    inverse residual standard deviations of an unconstrained fit, as :func:`identify`).
    The returned ``pi`` is the consistent full vector and ``theta`` its base
    combinations, so :func:`estimate_file` writes it like any other result."""
    import cvxpy as cp

    if not model.friction:
        raise ValueError("identify_consistent needs a model with friction columns (RobotModel(..., friction=True))")
    q, qd, qdd, tau = _check(model, q, qd, qdd, tau)
    n, P, nP = model.n, model.n_inertial, model.n_params
    N = q.shape[0]
    keep = moving_rows(model, qd, min_velocity)
    Y = model.regressor_batch(q, qd, qdd)                              # N x n x nP
    if offset:
        Y = np.concatenate([Y, np.broadcast_to(np.eye(n), (N, n, n))], axis=2)
    p = Y.shape[2]
    if weights is None:
        w = 1.0 / np.maximum(identify(model, q, qd, qdd, tau, weighted=False, offset=offset,
                                      min_velocity=min_velocity).residual_rmse, 1e-9)
    else:
        w = np.asarray(weights, dtype=float).reshape(n)
    A = (Y * (w[None, :] * keep)[:, :, None]).reshape(N * n, p)
    y = (tau * w[None, :] * keep).reshape(N * n)
    scale = np.linalg.norm(A, axis=0)
    scale[scale < 1e-12 * max(scale.max(), 1e-300)] = 1.0
    Qm, R = np.linalg.qr(A / scale)                                  # |A x - y|^2 = |R xs - Q^T y|^2 + c
    z = Qm.T @ y
    pi0 = model.parameters if prior is None else np.asarray(prior, dtype=float).reshape(nP)
    x0 = np.concatenate([pi0, np.zeros(p - nP)]) * scale
    xs = cp.Variable(p)
    x = cp.multiply(1.0 / scale, xs)                                  # physical units
    E = _pseudo_inertia_basis()
    cons = []
    for i in range(n):
        Ji = sum(x[10 * i + k] * E[k] for k in range(10))
        cons.append(0.5 * (Ji + Ji.T) >> 0)
    cons.append(x[P:nP] >= 0)                                        # viscous, Coulomb
    obj = cp.Minimize(cp.sum_squares(R @ xs - z) + prior_weight * cp.sum_squares(xs - x0))
    sol = solve_sdp(cp.Problem(obj, cons), xs, solver, "consistent identification") / scale
    pi = sol[:nP].copy()
    pi[P:] = np.maximum(pi[P:], 0.0)
    eig = np.linalg.eigvalsh(pseudo_inertias(pi[:P].reshape(n, 10)))[:, 0]
    base = model.base_parameters()
    theta = base.to_base(pi)
    off = sol[nP:] if offset else np.zeros(0)
    Yb = model.regressor_batch(q, qd, qdd, base=base)
    res = (tau - Yb @ theta - (off if offset else 0.0)) * keep
    kept = np.maximum(keep.sum(axis=0), 1.0)
    Ab = (Yb * (w[None, :] * keep)[:, :, None]).reshape(N * n, -1)   # condition of the (identifiable) base columns
    nb = np.linalg.norm(Ab, axis=0)
    sv = np.linalg.svd(Ab / np.where(nb > 0, nb, 1.0), compute_uv=False)
    return Identification(theta=theta, names=list(base.names), pi=pi,
                          residual_rmse=np.sqrt(np.sum(res * res, axis=0) / kept),
                          tau_rms=np.sqrt(np.sum((tau * keep) ** 2, axis=0) / kept),
                          condition=float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf"), samples=N, offset=off,
                          method="consistent", min_pseudo_inertia_eig=eig, rows_used=keep.sum(axis=0).astype(int))
