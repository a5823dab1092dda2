r"""Optimal excitation trajectories for identification (no ROS import).

The trajectory (Swevers, Ganseman, Tukel, De Schutter, Van Brussel, "Optimal robot
excitation and identification", IEEE T-RA 13(5), 1997) is a finite Fourier series per
joint with fundamental angular frequency ``w_f = 2 pi / T`` (``T`` = ``duration``, the
period) and ``H`` harmonics::

    q_j(t)   = q0_j + sum_{k=1..H}  a_jk / (w_f k) sin(w_f k t) - b_jk / (w_f k) cos(w_f k t)
    qd_j(t)  =        sum_k  a_jk cos(w_f k t) + b_jk sin(w_f k t)
    qdd_j(t) =        sum_k  w_f k ( -a_jk sin(w_f k t) + b_jk cos(w_f k t) )

It is periodic with period ``T``.  **Rest at the ends.**  ``qd_j(0) = sum_k a_jk = 0`` and
``qdd_j(0) = w_f sum_k k b_jk = 0`` are imposed by eliminating the first harmonic::

    a_j1 = - sum_{k>=2} a_jk,      b_j1 = - sum_{k>=2} k b_jk

so the free variables of joint ``j`` are ``x_j = (a_j2..a_jH, b_j2..b_jH, q0_j)``
(``2H - 1`` numbers, ``H >= 2``) and q, qd, qdd are *linear* in them:
``q_j(t_i) = P_q(t_i) x_j`` etc.  By periodicity the trajectory is at rest at
``t = T`` too, at the same position ``q_j(0) = q0_j - sum_k b_jk / (w_f k)``.  Joints that do
not move (not in ``joints``) keep ``a = b = 0`` and ``q0`` = ``q_hold`` (default the middle
of their range).

**Criterion.**  With ``t_i = i T / N`` (``i = 0..N-1``, ``N`` = ``samples``) and ``Y_b`` the
base regressor of the model with viscous and Coulomb friction columns
(:class:`~adaptive_dynamics.dynamics.RobotModel` ``friction=True``: ``tau = Y pi``, Coulomb
column ``sgn(qd)``; the base columns ``base_parameters().index``; for a joint subset the
columns that subset excites, chosen the same way), the stacked regressor is::

    W(x) = [ Y_b(q(t_0), qd(t_0), qdd(t_0)) ; ... ; Y_b(q(t_{N-1}), ...) ]      (N n x p)

and the optimiser minimises ``f(x) = log cond(W) = log(s_max / s_min)`` (``criterion=
"condition"``) or ``f(x) = -(1/p) log det(W^T W)`` (``criterion="logdet"``, D-optimality),
``s`` the singular values of ``W``.  Gradients are analytic in ``W``
(``d s_i = u_i^T dW v_i``) and reach ``x`` through ``dY/dq``, ``dY/dqd``, ``dY/dqdd`` per
sample (central / forward differences of the batched regressor; Y is quadratic in qd and
linear in qdd, so those are exact) and the linear maps ``P``.

**Constraints** (on the same grid, each scaled to be O(1), all ``>= 0``; ``m`` = ``margin``)::

    (q_j - lo_j) / r_j - m >= 0,    (up_j - q_j) / r_j - m >= 0          r_j = up_j - lo_j
    1 - m -+ qd_j / vmax_j >= 0,    1 - m -+ qdd_j / amax_j >= 0          moving joints
    1 - m -+ tau_j / taumax_j >= 0                                           every joint
    z_ee(q) - floor_z >= 0                                                   if floor_z is given
    (d_g(q) - d_min) / 0.1 m >= 0          every body pair g             if self-collision is checked

with ``tau = M(q) qdd + C(q, qd) qd + g(q)`` of the URDF model (no friction) and ``z_ee`` the
end-effector frame's height in the base frame.  Solved with ``scipy.optimize.minimize(method=
"SLSQP")`` from ``starts`` random starts (random coefficients scaled per joint into the
position / velocity / acceleration limits, ``q0`` near the middle of the range); the feasible
result with the lowest ``f`` wins.  The winner is then checked on a 1 kHz grid (peaks between
the optimisation samples): if any limit is exceeded there, its Fourier part is shrunk towards
``q0`` until none is.

**Self-collision** (``self_collision``; default: wherever collision geometry exists,
:func:`~adaptive_dynamics.trajectories.self_collision.self_collision_model`: the URDF's own
``<collision>`` elements, or example-robot-data's geometry of a shipped arm whose URDF has
none; the robot's SRDF's disabled pairs and adjacent links left out).  ``d_g(q)`` is the
smallest signed distance [m] between the convex hulls of the geometries of body pair ``g``
(pinocchio ``computeDistances``), ``d_min`` = ``collision_margin`` (0.01 m).  It is
imposed on every ``s``-th sample of the grid (``collision_samples`` of them, default
:data:`COLLISION_SAMPLES`: a distance costs ~0.2 ms, its gradient ~1 ms), with the analytic
gradient of the witness points; the winner is then checked on a
:data:`COLLISION_CHECK_HZ` grid and shrunk like the other limits until the distance holds
there too.  The result says what was checked (``info["self_collision"]``).

**Payload excitation** (``payload=True``).  Only the last three joints (the wrist) move --
the last four on a spherical wrist (:func:`payload_joints`: with the wrist centre fixed the
load's mass shows only in the held joints' torques, which their friction hides); the
others are held at ``q_hold`` (default the middle of their range, the trajectory node's
``q_center`` default).  The criterion is the condition number (or log det) of the stacked
**payload regressor** ``Y_L``: the 10 columns of the link the payload frame
(``payload_frame``, default the end-effector frame) is fixed to, as
:func:`~adaptive_dynamics.dynamics.payload.identify_payload` fits them, the moving joints'
rows (the held joints' torques carry their static friction; ``info["payload"]`` also gives
every joint's rows' figure).
The period is at most :data:`PAYLOAD_MAX_DURATION` (default 10 s).

:func:`default_fourier_condition` gives the same condition number for the trajectory node's
default excitation (:class:`~adaptive_dynamics.trajectories.fourier.ModifiedFourier` ``.random``,
seed 0, amplitude 0.4 rad, 0.1 Hz, 4 harmonics, scaled into the same limits) for comparison.
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict, Optional, Sequence

import numpy as np

from ..files import json_default
from .base import ACCELERATION_LIMIT, ArrayLike, Samples, Trajectory
from .fourier import ModifiedFourier

__all__ = ["ExcitationTrajectory", "optimise_excitation", "default_fourier", "default_fourier_condition",
           "trajectory_condition", "HeldFourier", "stacked_regressor",
           "excitation_columns", "payload_excitation_columns", "payload_joints", "DEFAULT_FOURIER", "COLLISION_MARGIN",
           "PAYLOAD_MAX_DURATION"]

#: the trajectory node's default ``fourier`` excitation (``nodes/trajectory.py`` parameters)
DEFAULT_FOURIER = {"seed": 0, "amplitude": 0.4, "base_frequency": 0.1, "harmonics": 4}

CRITERIA = ("condition", "logdet")

#: default smallest distance [m] kept between any two non-adjacent bodies
COLLISION_MARGIN = 0.01
#: default number of samples of the optimisation grid the self-collision constraint is imposed on
COLLISION_SAMPLES = 40
#: rate [Hz] of the final self-collision check of the winner
COLLISION_CHECK_HZ = 200.0
#: scale [m] of the self-collision constraint (O(1) values)
_COLLISION_SCALE = 0.1
#: distance [m] beyond which a body pair's gradient is not computed (its constraint is far from active)
_COLLISION_ACTIVE = 0.25
#: payload excitation: default and largest period [s]
PAYLOAD_DURATION = 10.0
PAYLOAD_MAX_DURATION = 15.0


# ---------------------------------------------------------------------------- helpers
def _friction_model(model):
    """``model`` itself if it has friction columns, else a friction twin (same URDF, frame)."""
    if getattr(model, "friction", False):
        return model
    from ..dynamics import RobotModel  # lazy
    return RobotModel(model.urdf_path, ee_frame=model.ee_frame, friction=True)


def _rigid_model(model):
    """A model without friction columns (the URDF's rigid body: effort limits, inertial Y)."""
    if not getattr(model, "friction", False):
        return model
    from ..dynamics import RobotModel  # lazy
    return RobotModel(model.urdf_path, ee_frame=model.ee_frame, friction=False)


def _finite_range(model):
    lo, up = np.asarray(model.lower, float), np.asarray(model.upper, float)
    bounded = np.isfinite(lo) & np.isfinite(up) & (up - lo < 1e6)
    mid = np.where(bounded, 0.5 * (np.where(bounded, lo, 0) + np.where(bounded, up, 0)), 0.0)
    return lo, up, bounded, mid


def _moving_index(model, joints) -> np.ndarray:
    if joints is None:
        return np.arange(model.n)
    if isinstance(joints, str):
        joints = [j for j in joints.split(",") if j]
    idx = []
    for j in joints:
        if isinstance(j, (int, np.integer)):
            if not 0 <= int(j) < model.n:
                raise ValueError(f"joint index {j} out of range 0..{model.n - 1}")
            idx.append(int(j))
        elif j in model.joint_names:
            idx.append(model.joint_names.index(j))
        else:
            raise ValueError(f"unknown joint {j!r}; the model's joints are {model.joint_names}")
    if not idx:
        raise ValueError("joints: no joint given")
    return np.array(sorted(set(idx)))


def excitation_columns(model_f, moving: np.ndarray, q_rest: np.ndarray, seed: int = 0) -> np.ndarray:
    """Columns of ``model_f``'s (friction) regressor that a motion of the joints ``moving``
    (the others held at ``q_rest``) can identify: ``base_parameters().index`` when every joint
    moves, else a pivoted QR of random stacked regressors (same rule as the base parameters)."""
    import scipy.linalg
    n = model_f.n
    if len(moving) == n:
        return np.asarray(model_f.base_parameters().index, dtype=int)
    rng = np.random.default_rng(seed)
    K = max(60, int(np.ceil(4 * model_f.n_params / n)))
    Q = np.tile(q_rest, (K, 1))
    V, A = np.zeros((K, n)), np.zeros((K, n))
    for k in range(K):
        q, v, a = model_f.random_state(rng)
        Q[k, moving], V[k, moving], A[k, moving] = q[moving], v[moving], a[moving]
    Wm = model_f.regressor_batch(Q, V, A).reshape(K * n, -1)
    scale = np.linalg.norm(Wm, axis=0)
    nonzero = scale > 1e-10 * scale.max()
    _, R, piv = scipy.linalg.qr(Wm[:, nonzero] / scale[nonzero], mode="economic", pivoting=True)
    d = np.abs(np.diag(R))
    rank = int(np.sum(d > 1e-9 * max(d[0], 1e-300)))
    return np.sort(np.flatnonzero(nonzero)[piv[:rank]])


def payload_excitation_columns(model, frame: Optional[str] = None):
    """``(columns, frame, link, block)``: the 10 regressor columns of the payload on
    ``frame`` (default the end-effector frame), as
    :func:`~adaptive_dynamics.dynamics.payload.identify_payload` fits them."""
    from ..dynamics.payload import _frame_of  # lazy
    name, block, _ = _frame_of(model, frame)
    return np.arange(10 * block, 10 * block + 10), name, model.link_names[block], block


def payload_joints(model, columns, q_rest, seed: int = 0) -> tuple:
    """``(moving joints, why)`` of a payload excitation: the last three, unless their torques
    alone cannot tell the payload's 10 parameters apart (a spherical wrist: its centre
    fixed, the load's mass is seen only through the held joints' torques, which their
    friction hides) -- then the last four, so that the wrist centre moves."""
    n = model.n
    rng = np.random.default_rng(seed)
    for k in (3, 4):
        if k > n:
            break
        moving = np.arange(n - k, n)
        K = 40
        Q, V, A = np.tile(q_rest, (K, 1)), np.zeros((K, n)), np.zeros((K, n))
        for i in range(K):
            q, v, a = model.random_state(rng)
            Q[i, moving], V[i, moving], A[i, moving] = q[moving], v[moving], a[moving]
        W = model.regressor_batch(Q, V, A)[:, moving][:, :, columns].reshape(-1, len(columns))
        s = np.linalg.svd(W / np.maximum(np.linalg.norm(W, axis=0), 1e-300), compute_uv=False)
        if s[-1] > 1e-8 * s[0]:
            return moving, ("the last three joints" if k == 3 else
                            "the last four joints: the last three alone leave a payload parameter unobservable"
                            " (a spherical wrist: with its centre fixed the load's mass is seen only by the held"
                            " joints, whose friction hides it)")
    raise ValueError("the payload's parameters are not observable from the last joints' torques of this robot")


def stacked_regressor(model_f, q, qd, qdd, columns) -> np.ndarray:
    """``W``: the friction model's regressors at the samples, stacked (K n x len(columns))."""
    Y = model_f.regressor_batch(q, qd, qdd)
    return Y[:, :, columns].reshape(-1, len(columns))


def _cond(W) -> float:
    s = np.linalg.svd(W, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else math.inf


# ---------------------------------------------------------------------------- the trajectory
class ExcitationTrajectory(Trajectory):
    """A periodic finite Fourier trajectory (Swevers form, see the module docstring).

    ``a``, ``b``: (n, H) [rad/s]; ``q0``: (n,) [rad]; ``period`` [s].  Also carries what the
    optimisation found (``condition_number``, ``logdet``, ``margins``, ``info``).
    """

    def __init__(self, a: ArrayLike, b: ArrayLike, q0: ArrayLike, period: float,
                 joint_names: Optional[Sequence[str]] = None, **info):
        self.a = np.atleast_2d(np.asarray(a, dtype=float)).copy()
        self.b = np.atleast_2d(np.asarray(b, dtype=float)).copy()
        if self.a.shape != self.b.shape:
            raise ValueError(f"a and b must have the same shape, got {self.a.shape} and {self.b.shape}")
        self.n, self.H = self.a.shape
        self.q0 = np.asarray(q0, dtype=float).reshape(-1).copy()
        if self.q0.shape != (self.n,):
            raise ValueError(f"q0 must have {self.n} values, got {self.q0.shape}")
        self.period = float(period)
        if not (math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"period must be > 0, got {period!r}")
        self.duration = None
        self.w_f = 2.0 * math.pi / self.period
        self.joint_names = list(joint_names) if joint_names is not None else None
        self.condition_number = info.pop("condition_number", None)
        self.logdet = info.pop("logdet", None)
        self.margins: Dict = info.pop("margins", {}) or {}
        self.info: Dict = info

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = np.mod(self._times(ts), self.period)
        wk = self.w_f * np.arange(1, self.H + 1)
        arg = np.multiply.outer(t, wk)                      # (T, H)
        s, c = np.sin(arg), np.cos(arg)
        q = self.q0 + s @ (self.a / wk).T - c @ (self.b / wk).T
        qd = c @ self.a.T + s @ self.b.T
        qdd = -(s @ (self.a * wk).T) + c @ (self.b * wk).T
        return q, qd, qdd

    def to_dict(self) -> dict:
        d = {"kind": "swevers_fourier", "period": self.period, "w_f": self.w_f, "harmonics": self.H,
             "joint_names": self.joint_names, "q0": self.q0.tolist(), "a": self.a.tolist(), "b": self.b.tolist(),
             "condition_number": self.condition_number, "logdet": self.logdet, "margins": self.margins}
        d.update(self.info)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ExcitationTrajectory":
        d = dict(d)
        for key in ("kind", "w_f", "harmonics"):
            d.pop(key, None)
        a, b, q0, period = d.pop("a"), d.pop("b"), d.pop("q0"), d.pop("period")
        return cls(a, b, q0, period, d.pop("joint_names", None), **d)

    @staticmethod
    def sidecar(path: str) -> str:
        """The JSON sidecar :meth:`save` writes beside the CSV ``path``."""
        return os.path.splitext(os.fspath(path))[0] + ".json"

    def save(self, path: str, rate_hz: float = 1000.0, extra: Optional[dict] = None) -> Dict[str, str]:
        """Write ``path`` (CSV: ``time`` then ``<joint>/position``, ``<joint>/velocity``,
        ``<joint>/acceleration`` per joint, ``rate_hz`` samples over one period, both ends
        included) and the JSON sidecar (:meth:`sidecar`: :meth:`to_dict`, updated with
        ``extra``)."""
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        K = int(round(self.period * rate_hz)) + 1
        ts = np.linspace(0.0, self.period, K)
        q, qd, qdd = self.sample_many(ts)
        names = self.joint_names or [f"joint{j}" for j in range(self.n)]
        header = (["time"] + [f"{nm}/position" for nm in names] + [f"{nm}/velocity" for nm in names]
                  + [f"{nm}/acceleration" for nm in names])
        with open(path, "w", newline="") as fh:
            fh.write(",".join(header) + "\n")
            np.savetxt(fh, np.column_stack([ts, q, qd, qdd]), delimiter=",", fmt="%.9g")
        side = self.sidecar(path)
        with open(side, "w") as fh:
            json.dump({**self.to_dict(), **(extra or {})}, fh, indent=1, default=json_default)
        return {"csv": path, "json": side}


# ---------------------------------------------------------------------------- the problem
class _Problem:
    """Objective, constraints and their Jacobians in the reduced variables x (cached per x)."""

    def __init__(self, model_r, model_f, moving, q_rest, columns, period, H, N, criterion,
                 acc_limit, margin, floor_z, collision=None, collision_margin=COLLISION_MARGIN, collision_samples=None,
                 rows=None):
        self.mr, self.mf = model_r, model_f
        self.rows = None if rows is None else np.asarray(rows, int)      # joints whose torques count
        self.n, self.moving, self.q_rest = model_r.n, moving, q_rest
        self.cols, self.H, self.N, self.criterion = columns, H, N, criterion
        self.margin, self.floor_z = margin, floor_z
        self.P = model_r.n_params                                     # inertial columns
        self.pi = np.asarray(model_r.parameters, dtype=float)
        self.w = 2 * math.pi / period
        self.ts = np.arange(N) * period / N
        self.nz = 2 * H - 1
        self.Pq, self.Pqd, self.Pqdd = self.bases(self.ts)
        self.lo, self.up, bounded, _ = _finite_range(model_r)
        self.pos_joints = np.array([j for j in moving if bounded[j]], dtype=int)
        self.vmax = np.asarray(model_r.velocity_limit, float)
        self.amax = np.broadcast_to(np.asarray(acc_limit, float), (self.n,)).copy()
        self.emax = np.asarray(model_r.effort_limit, float)
        self.collision, self.collision_margin = collision, float(collision_margin)
        K = N if collision_samples is None else max(1, min(int(collision_samples), N))
        self.col_idx = np.arange(0, N, int(math.ceil(N / K)))           # every s-th sample of the grid
        self._x = None

    # linear maps -------------------------------------------------------------
    def reduction(self) -> np.ndarray:
        """(2H+1, 2H-1): z -> (a_1..a_H, b_1..b_H, q0)."""
        H = self.H
        R = np.zeros((2 * H + 1, 2 * H - 1))
        for k in range(2, H + 1):
            R[k - 1, k - 2] = 1.0
            R[0, k - 2] = -1.0                        # a_1 = -sum a_k
            R[H + k - 1, H - 1 + k - 2] = 1.0
            R[H, H - 1 + k - 2] = -float(k)           # b_1 = -sum k b_k
        R[2 * H, 2 * H - 2] = 1.0
        return R

    def bases(self, ts):
        H, w = self.H, self.w
        wk = w * np.arange(1, H + 1)
        arg = np.multiply.outer(ts, wk)
        s, c = np.sin(arg), np.cos(arg)
        one, zero = np.ones((len(ts), 1)), np.zeros((len(ts), 1))
        Fq = np.hstack([s / wk, -c / wk, one])
        Fqd = np.hstack([c, s, zero])
        Fqdd = np.hstack([-s * wk, c * wk, zero])
        R = self.reduction()
        return Fq @ R, Fqd @ R, Fqdd @ R

    def split(self, x):
        return np.asarray(x, float).reshape(len(self.moving), self.nz)

    def coefficients(self, x):
        """Full (a, b, q0) of every joint."""
        Z = self.split(x) @ self.reduction().T                         # (m, 2H+1)
        a, b = np.zeros((self.n, self.H)), np.zeros((self.n, self.H))
        q0 = self.q_rest.copy()
        a[self.moving], b[self.moving], q0[self.moving] = Z[:, :self.H], Z[:, self.H:2 * self.H], Z[:, -1]
        return a, b, q0

    def states(self, x):
        Z = self.split(x)
        q = np.tile(self.q_rest, (self.N, 1))
        qd, qdd = np.zeros((self.N, self.n)), np.zeros((self.N, self.n))
        q[:, self.moving] = self.Pq @ Z.T
        qd[:, self.moving] = self.Pqd @ Z.T
        qdd[:, self.moving] = self.Pqdd @ Z.T
        return q, qd, qdd

    def full_regressor(self, q, qd, qdd):
        """(N, n, P + 2n): rigid Y with viscous and Coulomb columns (RobotModel's layout)."""
        n, P = self.n, self.P
        Y = np.zeros((len(q), n, P + 2 * n))
        Y[:, :, :P] = self.mr.regressor_batch(q, qd, qdd)
        idx = np.arange(n)
        Y[:, idx, P + idx] = qd
        Y[:, idx, P + n + idx] = np.sign(qd)
        return Y

    # evaluation ----------------------------------------------------------------
    def _eval(self, x):
        x = np.asarray(x, float)
        if self._x is not None and np.array_equal(x, self._x):
            return self._cache
        q, qd, qdd = self.states(x)
        Y = self.full_regressor(q, qd, qdd)
        Yr = Y if self.rows is None else Y[:, self.rows]
        W = Yr[:, :, self.cols].reshape(-1, len(self.cols))
        # singular values / right vectors from the (small) Gram matrix: much cheaper than an SVD
        # of the tall W, and accurate enough at the condition numbers met here (< 1e6)
        lam, V = np.linalg.eigh(W.T @ W)                              # ascending
        s = np.sqrt(np.maximum(lam, 1e-300))
        p = len(s)
        if self.criterion == "condition":
            f = math.log(s[-1] / s[0])
            u_max, u_min = W @ V[:, -1] / s[-1], W @ V[:, 0] / s[0]
            G = np.outer(u_max, V[:, -1]) / s[-1] - np.outer(u_min, V[:, 0]) / s[0]
        else:
            f = -2.0 * float(np.sum(np.log(s))) / p
            G = -(2.0 / p) * W @ ((V / lam) @ V.T)
        tau = Y[:, :, :self.P] @ self.pi
        self._x, self._cache = x.copy(), {"q": q, "qd": qd, "qdd": qdd, "f": f, "G": G, "tau": tau,
                                         "s": s}
        return self._cache

    def _derivatives(self, c):
        """dY_inertial/d(state) applied where needed: per joint m, arrays (N, n, P)."""
        if "dY" in c:
            return c["dY"]
        q, qd, qdd = c["q"], c["qd"], c["qdd"]
        reg = self.mr.regressor_batch
        h = 1e-6
        dY = {}
        Y0 = reg(q, qd, qdd)
        for j in self.moving:
            e = np.zeros(self.n)
            e[j] = h
            dY["q", j] = (reg(q + e, qd, qdd) - reg(q - e, qd, qdd)) / (2 * h)
            e[j] = 1.0                                # quadratic in qd, linear in qdd: exact
            dY["qd", j] = (reg(q, qd + e, qdd) - reg(q, qd - e, qdd)) / 2.0
            dY["qdd", j] = reg(q, qd, qdd + e) - Y0
        c["dY"] = dY
        return dY

    def fun(self, x):
        return self._eval(x)["f"]

    def jac(self, x):
        c = self._eval(x)
        dY = self._derivatives(c)
        n, P, N = self.n, self.P, self.N
        Gfull = np.zeros((N, n, P + 2 * n))
        if self.rows is None:
            Gfull[:, :, self.cols] = c["G"].reshape(N, n, len(self.cols))
        else:
            Gr = np.zeros((N, len(self.rows), P + 2 * n))
            Gr[:, :, self.cols] = c["G"].reshape(N, len(self.rows), len(self.cols))
            Gfull[:, self.rows] = Gr
        Gin = Gfull[:, :, :P]
        idx = np.arange(n)
        gvisc = Gfull[:, idx, P + idx]                                 # (N, n): d/dqd of viscous column
        out = np.zeros((len(self.moving), self.nz))
        for r, j in enumerate(self.moving):
            gq = np.einsum("kic,kic->k", Gin, dY["q", j])
            gqd = np.einsum("kic,kic->k", Gin, dY["qd", j]) + gvisc[:, j]
            gqdd = np.einsum("kic,kic->k", Gin, dY["qdd", j])
            out[r] = self.Pq.T @ gq + self.Pqd.T @ gqd + self.Pqdd.T @ gqdd
        return out.ravel()

    # constraints ---------------------------------------------------------------
    def cons(self, x):
        c = self._eval(x)
        q, qd, qdd, tau = c["q"], c["qd"], c["qdd"], c["tau"]
        m, mv, pj = self.margin, self.moving, self.pos_joints
        parts = []
        if pj.size:
            r = self.up[pj] - self.lo[pj]
            parts += [((q[:, pj] - self.lo[pj]) / r - m).ravel(), ((self.up[pj] - q[:, pj]) / r - m).ravel()]
        parts += [(1 - m - qd[:, mv] / self.vmax[mv]).ravel(), (1 - m + qd[:, mv] / self.vmax[mv]).ravel(),
                  (1 - m - qdd[:, mv] / self.amax[mv]).ravel(), (1 - m + qdd[:, mv] / self.amax[mv]).ravel(),
                  (1 - m - tau / self.emax).ravel(), (1 - m + tau / self.emax).ravel()]
        if self.floor_z is not None:
            parts.append(self._ee_z(q) - self.floor_z)
        if self.collision is not None:
            if "col" not in c:               # distances alone: their gradients cost 5x more
                c["col"] = (self.collision.distances(c["q"][self.col_idx]), None)
            parts.append(((c["col"][0] - self.collision_margin) / _COLLISION_SCALE).ravel())
        return np.concatenate(parts)

    def _collision(self, c):
        """(distances (Kc, G), their gradients in q (Kc, G, n)) on the collision grid."""
        if "col" not in c or c["col"][1] is None:
            c["col"] = self.collision.distances_and_gradients(c["q"][self.col_idx], active=_COLLISION_ACTIVE)
        return c["col"]

    def _ee_z(self, q):
        return np.array([self.mr.frame_pose(qk)[2, 3] for qk in q])

    def _lin_jac(self, Pm, cols_j, scale):
        """Rows (N x len(cols_j), flattened sample-major) of d(state[:, cols_j] * scale)/dx."""
        N, nz, M = self.N, self.nz, len(self.moving)
        J = np.zeros((N, len(cols_j), M, nz))
        for r, j in enumerate(cols_j):
            J[:, r, int(np.flatnonzero(self.moving == j)[0]), :] = Pm * scale[r]
        return J.reshape(N * len(cols_j), M * nz)

    def cons_jac(self, x):
        c = self._eval(x)
        mv, pj = self.moving, self.pos_joints
        blocks = []
        if pj.size:
            r = self.up[pj] - self.lo[pj]
            Jq = self._lin_jac(self.Pq, pj, 1.0 / r)
            blocks += [Jq, -Jq]
        Jv = self._lin_jac(self.Pqd, mv, 1.0 / self.vmax[mv])
        Ja = self._lin_jac(self.Pqdd, mv, 1.0 / self.amax[mv])
        blocks += [-Jv, Jv, -Ja, Ja]
        # effort: dtau[k, i]/dx
        dY = self._derivatives(c)
        N, n, M, nz = self.N, self.n, len(mv), self.nz
        Jt = np.zeros((N, n, M, nz))
        for r, j in enumerate(mv):
            dq, dqd, dqdd = dY["q", j] @ self.pi, dY["qd", j] @ self.pi, dY["qdd", j] @ self.pi   # (N, n)
            Jt[:, :, r, :] = (dq[:, :, None] * self.Pq[:, None, :] + dqd[:, :, None] * self.Pqd[:, None, :]
                              + dqdd[:, :, None] * self.Pqdd[:, None, :])
        Jt = (Jt / self.emax[None, :, None, None]).reshape(N * n, M * nz)
        blocks += [-Jt, Jt]
        if self.floor_z is not None:
            Jf = np.zeros((N, M, nz))
            for k, qk in enumerate(c["q"]):
                Jz = self.mr.jacobian(qk)[2]
                Jf[k] = Jz[mv, None] * self.Pq[k][None, :]
            blocks.append(Jf.reshape(N, M * nz))
        if self.collision is not None:
            _, dD = self._collision(c)
            Kc, G = dD.shape[:2]
            Jc = np.zeros((Kc, G, M, nz))
            Pc = self.Pq[self.col_idx]
            for r, j in enumerate(mv):
                Jc[:, :, r, :] = dD[:, :, j][:, :, None] * Pc[:, None, :]
            blocks.append(Jc.reshape(Kc * G, M * nz) / _COLLISION_SCALE)
        return np.vstack(blocks)

    # starts ----------------------------------------------------------------------
    def random_start(self, rng, amplitude=0.5):
        """Random coefficients scaled per joint into the position/velocity/acceleration limits
        (margin doubled), q0 near the middle."""
        M, H = len(self.moving), self.H
        Z = np.zeros((M, self.nz))
        Z[:, :2 * H - 2] = rng.uniform(-1, 1, (M, 2 * H - 2)) * amplitude * self.w
        lo, up, bounded, mid = _finite_range(self.mr)
        for r, j in enumerate(self.moving):
            span = (up[j] - lo[j]) if bounded[j] else 2 * math.pi
            Z[r, -1] = mid[j] + (rng.uniform(-0.15, 0.15) * span if bounded[j] else 0.0)
            zf = Z[r].copy()
            zf[-1] = 0.0
            dev, vel, acc = self.Pq @ zf, self.Pqd @ zf, self.Pqdd @ zf
            s = 1.0
            m2 = 2 * self.margin + 0.02
            if bounded[j]:
                room = min(up[j] - m2 * span - Z[r, -1], Z[r, -1] - lo[j] - m2 * span)
                s = min(s, room / max(np.abs(dev).max(), 1e-12))
            s = min(s, (1 - m2) * self.vmax[j] / max(np.abs(vel).max(), 1e-12),
                    (1 - m2) * self.amax[j] / max(np.abs(acc).max(), 1e-12))
            Z[r, :-1] *= max(s, 0.0)
        return Z.ravel()


def _margins(traj: ExcitationTrajectory, model_r, acc_limit, floor_z, rate_hz=1000.0) -> dict:
    """Min over one period (``rate_hz`` grid) of the room to each limit, per joint (>= 0: holds)."""
    K = int(round(traj.period * rate_hz)) + 1
    ts = np.linspace(0.0, traj.period, K)
    q, qd, qdd = traj.sample_many(ts)
    tau = model_r.regressor_batch(q, qd, qdd) @ np.asarray(model_r.parameters, float)
    lo, up = np.asarray(model_r.lower, float), np.asarray(model_r.upper, float)
    amax = np.broadcast_to(np.asarray(acc_limit, float), (traj.n,))
    out = {"position_lower": (q - lo).min(0), "position_upper": (up - q).min(0),
           "velocity": (model_r.velocity_limit - np.abs(qd)).min(0),
           "acceleration": (amax - np.abs(qdd)).min(0),
           "effort": (model_r.effort_limit - np.abs(tau)).min(0)}
    out = {k: [float(x) if np.isfinite(x) else None for x in v] for k, v in out.items()}
    if floor_z is not None:
        step = max(1, K // 2000)
        z = np.array([model_r.frame_pose(qk)[2, 3] for qk in q[::step]])
        out["floor"] = float(z.min() - floor_z)
    return out


def _violated(margins: dict) -> bool:
    for k, v in margins.items():
        vals = [v] if not isinstance(v, list) else v
        if any(x is not None and x < 0 for x in vals):
            return True
    return False


def optimise_excitation(model, *, duration: Optional[float] = None, harmonics: int = 5, joints=None,
                        criterion: str = "condition", starts: int = 4, seed: int = 0,
                        floor_z: Optional[float] = None, samples: Optional[int] = None,
                        acc_limit: ArrayLike = ACCELERATION_LIMIT, margin: float = 0.02, maxiter: int = 100,
                        amplitude: float = 0.5, payload: bool = False, payload_frame: Optional[str] = None,
                        q_hold: Optional[ArrayLike] = None, self_collision: Optional[bool] = None,
                        collision_margin: float = COLLISION_MARGIN,
                        collision_samples: Optional[int] = COLLISION_SAMPLES) -> ExcitationTrajectory:
    """The optimal excitation trajectory of ``model`` (see the module docstring).

    Parameters
    ----------
    model:
        A :class:`~adaptive_dynamics.dynamics.RobotModel` (with or without friction; both
        the rigid URDF model and its friction twin are used).
    duration:
        Period ``T`` [s] (default 20; ``payload``: 10, at most 15).
    harmonics:
        ``H >= 2`` (the first harmonic is spent on the rest conditions).
    joints:
        Names or indices of the joints that move (default all); the others rest at
        ``q_hold``.
    criterion:
        ``"condition"`` (minimise cond W) or ``"logdet"`` (maximise log det W^T W).
    starts, seed:
        Number of random starts and their seed.
    floor_z:
        Keep the end-effector frame at or above this height [m] in the base frame.
    samples:
        ``N``, samples per period of the criterion and constraints (default ``40 H``).
    acc_limit:
        Joint acceleration limit [rad/s^2] (scalar or per joint).
    margin:
        Fraction kept free of each limit on the optimisation grid.
    maxiter:
        SLSQP iterations per start.
    amplitude:
        Scale [rad] of the random starting coefficients.
    payload:
        Excite the payload on ``payload_frame`` (default the end-effector frame): only the
        last three joints move, the criterion is the payload regressor's.
    q_hold:
        Configuration [rad] (one value per joint) of the joints that do not move (default the
        middle of each joint's range).
    self_collision:
        Keep every pair of non-adjacent bodies ``collision_margin`` [m] apart: ``None``
        (default) where collision geometry exists, ``True`` requires it (``ValueError``
        without), ``False`` never.
    collision_samples:
        Samples of the optimisation grid the self-collision constraint is imposed on
        (every ``ceil(N / collision_samples)``-th; ``None``: all ``N``).
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    H = int(harmonics)
    if H < 2:
        raise ValueError(f"harmonics must be >= 2 (the first is spent on zero end velocity/acceleration), got {H}")
    if duration is None:
        duration = PAYLOAD_DURATION if payload else 20.0
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be > 0 [s], got {duration!r}")
    if payload and duration > PAYLOAD_MAX_DURATION:
        raise ValueError(f"payload excitation: duration must be <= {PAYLOAD_MAX_DURATION:g} s, got {duration:g}")
    if int(starts) < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    if not (math.isfinite(collision_margin) and collision_margin >= 0):
        raise ValueError(f"collision_margin must be >= 0 [m], got {collision_margin!r}")
    N = int(samples) if samples is not None else 40 * H
    with _one_blas_thread():
        return _optimise(model, float(duration), H, joints, criterion, starts, seed, floor_z, N, acc_limit, margin,
                         maxiter, amplitude, payload, payload_frame, q_hold, self_collision, float(collision_margin),
                         collision_samples)


def _one_blas_thread():
    """Small dense linear algebra many times over: one BLAS thread is far faster (threads
    contend on a loaded machine; measured 30x on the eigen-decompositions here)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:      # optional
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(1)


def _hold(model_r, q_hold, mid) -> np.ndarray:
    if q_hold is None:
        return mid.copy()
    q = np.asarray(q_hold, dtype=float).reshape(-1)
    if q.shape != (model_r.n,) or not np.all(np.isfinite(q)):
        raise ValueError(f"q_hold must be {model_r.n} finite values [rad] ({model_r.joint_names}), got {q.size}")
    return q


def _collision_model(model_r, self_collision):
    """(SelfCollision or None, note)."""
    if self_collision is False:
        return None, "not requested (--no-self-collision)"
    from .self_collision import self_collision_model  # lazy: pinocchio's collision module
    sc, note = self_collision_model(model_r)
    if sc is None and self_collision:
        raise ValueError(f"self-collision check requested but not possible: {note}")
    return sc, note


def _min_distance(sc, traj, rate_hz=COLLISION_CHECK_HZ):
    """(smallest distance [m], its time [s], body pair) over one period on a ``rate_hz`` grid."""
    ts = np.linspace(0.0, traj.period, int(round(traj.period * rate_hz)) + 1)
    d, k, pair = sc.min_distance(traj.sample_many(ts)[0])
    return d, float(ts[k]), pair


def _optimise(model, duration, H, joints, criterion, starts, seed, floor_z, N, acc_limit, margin, maxiter,
              amplitude, payload=False, payload_frame=None, q_hold=None, self_collision=None,
              collision_margin=COLLISION_MARGIN, collision_samples=COLLISION_SAMPLES):
    from scipy.optimize import minimize

    model_r, model_f = _rigid_model(model), _friction_model(model)
    _, _, _, mid = _finite_range(model_r)
    rest = _hold(model_r, q_hold, mid)
    payload_info = None
    if payload:
        if joints is not None:
            raise ValueError("payload excitation moves the last three joints: do not give joints")
        if model_r.n < 4:
            raise ValueError(f"payload excitation moves the last three joints and holds the others: {model_r.n}"
                             " joints are too few")
        cols, frame, link, block = payload_excitation_columns(model_r, payload_frame)
        moving, why = payload_joints(model_r, cols, rest, seed)
        payload_info = {"frame": frame, "link": link, "block": int(block),
                        "parameters": [model_r.parameter_names[c] for c in cols], "moving_joints_reason": why}
    else:
        moving = _moving_index(model_r, joints)
        cols = excitation_columns(model_f, moving, rest, seed)
    if N * model_r.n < len(cols):
        raise ValueError(f"samples={N}: {N * model_r.n} regressor rows for {len(cols)} parameters; raise samples")
    held = np.setdiff1d(np.arange(model_r.n), moving)
    out = held[(rest[held] < model_r.lower[held]) | (rest[held] > model_r.upper[held])]
    if out.size:
        raise ValueError("q_hold outside the position limits: " + ", ".join(
            f"{model_r.joint_names[j]} {rest[j]:.4g} not in [{model_r.lower[j]:.4g}, {model_r.upper[j]:.4g}]"
            for j in out))
    sc, sc_note = _collision_model(model_r, self_collision)
    prob = _Problem(model_r, model_f, moving, rest, cols, float(duration), H, N, criterion, acc_limit,
                    float(margin), floor_z, sc, collision_margin, collision_samples,
                    rows=moving if payload else None)
    rng = np.random.default_rng(seed)
    runs = []
    best = None
    for s in range(int(starts)):
        x0 = prob.random_start(rng, amplitude)
        res = minimize(prob.fun, x0, jac=prob.jac, method="SLSQP",
                       constraints=[{"type": "ineq", "fun": prob.cons, "jac": prob.cons_jac}],
                       options={"maxiter": int(maxiter), "ftol": 1e-7})
        viol = float(max(0.0, -prob.cons(res.x).min()))
        f = float(prob.fun(res.x))
        runs.append({"start": s, "objective": f, "violation": viol, "iterations": int(res.nit),
                     "status": int(res.status), "message": str(res.message)})
        key = (viol > 1e-6, f if viol <= 1e-6 else viol)
        if best is None or key < best[0]:
            best = (key, res.x.copy())
    x = best[1]
    a, b, q0 = prob.coefficients(x)
    names = model_r.joint_names

    def verify(tr):
        """The margins on the fine grids (the distance only once the other limits hold)."""
        mg = _margins(tr, model_r, acc_limit, floor_z)
        if sc is not None and not _violated(mg):
            mg["self_collision"] = _min_distance(sc, tr)[0] - collision_margin
        return mg

    # verify on a 1 kHz grid (self-collision: COLLISION_CHECK_HZ); shrink the Fourier part
    # towards q0 until every limit holds
    traj = ExcitationTrajectory(a, b, q0, duration, names)
    shrink = 1.0
    margins = verify(traj)
    while _violated(margins) and shrink > 0.05:
        shrink *= 0.97
        traj = ExcitationTrajectory(a * shrink, b * shrink, q0, duration, names)
        margins = verify(traj)
    collision = {"checked": False, "reason": sc_note}
    if sc is not None:
        d, t_min, pair = _min_distance(sc, traj)
        margins["self_collision"] = d - collision_margin
        collision = {"checked": True, "min_distance_m": d, "at_s": t_min, "bodies": pair,
                     "margin_m": collision_margin, "check_rate_hz": COLLISION_CHECK_HZ,
                     "optimisation_samples": int(len(prob.col_idx)),
                     "note": f"imposed on {len(prob.col_idx)} of the {N} optimisation samples (every"
                             f" {int(prob.col_idx[1] - prob.col_idx[0]) if len(prob.col_idx) > 1 else N}-th),"
                             f" checked at {COLLISION_CHECK_HZ:g} Hz; distances between convex hulls",
                     **sc.describe()}
    qs, qds, qdds = traj.sample_many(prob.ts)
    W = stacked_regressor(model_f, qs, qds, qdds, cols)
    if payload:      # the moving joints' rows: identify --payload leaves the held joints' out (their friction)
        W = model_f.regressor_batch(qs, qds, qdds)[:, moving][:, :, cols].reshape(-1, len(cols))
    sv = np.linalg.svd(W, compute_uv=False)
    traj.condition_number = float(sv[0] / sv[-1])
    traj.logdet = float(2 * np.sum(np.log(sv)))
    traj.margins = margins
    traj.info = {"criterion": criterion, "samples": N, "columns": [int(c) for c in cols],
                 "moving_joints": [names[j] for j in moving], "q_hold": rest.tolist(),
                 "acc_limit": np.broadcast_to(np.asarray(acc_limit, float), (model_r.n,)).tolist(),
                 "floor_z": floor_z, "margin": margin, "shrink": shrink, "seed": seed, "starts": runs,
                 "self_collision": collision, "feasible": not _violated(margins)}
    if payload_info is not None:
        payload_info["condition_number_all_rows"] = _cond(stacked_regressor(model_f, qs, qds, qdds, cols))
        traj.info["payload"] = payload_info
    return traj


class HeldFourier(Trajectory):
    """The trajectory node's default excitation on the joints ``moving`` (a
    :class:`~adaptive_dynamics.trajectories.ModifiedFourier`), the other joints resting at
    ``rest``: full-joint samples."""

    def __init__(self, inner, moving: np.ndarray, rest: np.ndarray, period: float):
        self.inner, self.moving, self.rest = inner, np.asarray(moving, int), np.asarray(rest, float)
        self.n, self.period, self.duration = len(self.rest), float(period), None

    def sample_many(self, ts: ArrayLike) -> Samples:
        qm, qdm, qddm = self.inner.sample_many(ts)
        q = np.tile(self.rest, (len(np.atleast_1d(ts)), 1))
        qd, qdd = np.zeros_like(q), np.zeros_like(q)
        q[:, self.moving], qd[:, self.moving], qdd[:, self.moving] = qm, qdm, qddm
        return q, qd, qdd


def default_fourier(model, duration: Optional[float] = None, harmonics: Optional[int] = None, *,
                    joints=None, acc_limit: ArrayLike = ACCELERATION_LIMIT, seed: int = DEFAULT_FOURIER["seed"],
                    amplitude: float = DEFAULT_FOURIER["amplitude"], q_hold: Optional[ArrayLike] = None) -> HeldFourier:
    """The trajectory node's default excitation: :meth:`ModifiedFourier.random` with the
    node's seed and amplitude, period ``duration`` (default 1 / 0.1 Hz = 10 s) and
    ``harmonics`` (default 4), scaled into the model's position and velocity limits and
    ``acc_limit``, centred at the middle of the range; with ``joints`` only those joints
    move (the others rest at ``q_hold``, default the middle of their range)."""
    model_r = _rigid_model(model)
    T = float(duration) if duration is not None else 1.0 / DEFAULT_FOURIER["base_frequency"]
    L = int(harmonics) if harmonics is not None else DEFAULT_FOURIER["harmonics"]
    moving = _moving_index(model_r, joints)
    _, _, _, mid = _finite_range(model_r)
    rest = _hold(model_r, q_hold, mid)
    amax = np.broadcast_to(np.asarray(acc_limit, float), (model_r.n,))
    inner = ModifiedFourier.random(len(moving), np.random.default_rng(seed), q_center=mid[moving],
                                   amplitude=amplitude, w_f=2 * math.pi / T, L=L, lower=model_r.lower[moving],
                                   upper=model_r.upper[moving], vel_limit=model_r.velocity_limit[moving],
                                   acc_limit=amax[moving])
    return HeldFourier(inner, moving, rest, T)


def trajectory_condition(model, traj, columns, *, samples: int = 200, rows=None) -> float:
    """cond W of ``traj`` over one period (``samples`` points): the friction model's
    regressor columns ``columns`` stacked; ``rows``: only these joints' rows."""
    model_f = _friction_model(model)
    ts = np.arange(int(samples)) * float(traj.period) / int(samples)
    q, qd, qdd = traj.sample_many(ts)
    with _one_blas_thread():
        Y = model_f.regressor_batch(q, qd, qdd)
        if rows is not None:
            Y = Y[:, np.asarray(rows, int)]
        return _cond(Y[:, :, np.asarray(columns, int)].reshape(-1, len(columns)))


def default_fourier_condition(model, duration: Optional[float] = None, harmonics: Optional[int] = None, *,
                              joints=None, samples: int = 200, acc_limit: ArrayLike = ACCELERATION_LIMIT,
                              seed: int = DEFAULT_FOURIER["seed"], amplitude: float = DEFAULT_FOURIER["amplitude"],
                              columns=None, q_hold: Optional[ArrayLike] = None, rows=None) -> float:
    """cond W (same columns, ``samples`` points over one period; ``rows``: only these joints'
    rows) of :func:`default_fourier`."""
    traj = default_fourier(model, duration, harmonics, joints=joints, acc_limit=acc_limit, seed=seed,
                           amplitude=amplitude, q_hold=q_hold)
    cols = (excitation_columns(_friction_model(model), traj.moving, traj.rest) if columns is None
            else np.asarray(columns, int))
    return trajectory_condition(model, traj, cols, samples=samples, rows=rows)
