"""QP inverse dynamics for a fixed-base arm (no ROS import).

Khadivar, Chatzilygeroudis & Billard, "Self-Correcting Quadratic Programming-Based
Robot Control" (SCQP), sec. III and IV-B: eq. 1-3, 11-12, 17-18.

Decision variables ``X = (qdd, tau)`` (2n; no contact wrenches: the arm is fixed to the
world, so W and its columns of eq. 2 are absent).  Per control cycle::

    min_X  1/2 X^T G X + g^T X       G = sum_i w_i H_i^T H_i,  g = -sum_i w_i H_i^T b_i   (eq. 3)
    s.t.   (M + E) qdd - tau = -(c + e_t - E qdd_t)                                       (eq. 2, 11-12)
           qdd_min <= qdd <= qdd_max,   -tau_max <= tau <= tau_max

* **Equations of motion with the learned residual, linearised** (eq. 11-12): the
  inverse-dynamics model is ``h*(q, qd, qdd) = h_bar(q, qd, qdd) + e_h(q, qd, qdd)``
  with the rigid-body model ``h_bar = M(q) qdd + c(q, qd)`` (``c`` = Coriolis,
  centrifugal and gravity, pinocchio's RNEA at zero acceleration) and a residual
  ``e_h``; at the cycle's state ``(q_t, qd_t, qdd_t)`` (``qdd_t`` the measured
  acceleration) ``e_h(q_t, qd_t, qdd) ~= e_t + E (qdd - qdd_t)`` with
  ``e_t = e_h(q_t, qd_t, qdd_t)`` and ``E = d e_h / d qdd`` there.  ``tau = h*`` is the
  equality.  **Sign convention**: ``e_h = tau - h_bar`` (what the arm needed on top of
  the rigid-body model); :class:`~adaptive_dynamics.control.scqp.ResidualModel` learns
  exactly that target.  **The gradient's conditioning** (beyond the paper): ``M + E``
  plays the role of the inertia matrix, which is symmetric and positive definite; a GP
  fitted on noisy accelerations can return an ``E`` that makes it neither (on the
  simulated Panda ``|E|`` reached 2.5 N m s^2/rad, the wrist's inertia is ~0.01-0.1
  kg m^2, and tracking got worse with every episode).  With ``residual_inertia_bounds
  = (lo, hi)`` (default (0.8, 1.25)) the symmetric part of ``E`` is kept and its
  generalised eigenvalues with respect to ``M`` are clipped to ``[lo - 1, hi - 1]``, so
  ``lo M <= M + E <= hi M``; ``None`` uses ``E`` as learned (the paper).
* **Task** (eq. 17-18): ``|J qdd + Jdot qd - xdd_ref|^2`` for the end effector's linear
  acceleration (weight ``w_position``, 3 rows; ``xdd_ref`` from the task-space
  controller, eq. 4 / 8) and its angular acceleration (weight ``w_orientation``, 3 rows;
  ``wdot_ref = wdot_d + kp_orientation log3(R_d R^T) + kd_orientation (w_d - w)``, world
  axes).  ``J`` and ``Jdot qd`` of the end-effector frame, origin at the frame, world
  axes (pinocchio ``LOCAL_WORLD_ALIGNED``; ``Jdot qd`` is the frame's classical
  acceleration at ``qdd = 0``).
* **Preferred posture in the null space**: ``w_posture |N (qdd - qdd_post)|^2`` with
  ``qdd_post = kp_posture (q_post - q) - kd_posture qd`` and ``N = I - J^+ J`` (damped
  pseudo-inverse), so the posture never pulls against the task.
* **Regularisation**: ``w_qdd |qdd|^2 + w_tau |tau|^2`` keeps G positive definite.
* **Limits**: joint position and velocity limits become acceleration bounds (velocity
  reachable in one period and a braking distance over ``limit_horizon`` seconds to the
  position limit minus ``limit_margin``), torque limits from the URDF (``effort_limit``)
  scaled by ``torque_limit_scale``; when the state is already past a bound the
  acceleration bounds are the braking acceleration (the interval never inverts).

Solved with proxsuite's dense ProxQP, sized once at construction and warm-started from
the previous cycle's primal/dual solution (``solver="proxsuite"``); ``solver=
"qpsolvers:<name>"`` hands the same QP to another solver through qpsolvers (e.g.
``qpsolvers:osqp``; the benchmark's reference).  A solve that does not report
``PROXQP_SOLVED`` or returns non-finite values gives the **fallback** torque
``c(q, qd) + e_t - kd_fallback qd`` (gravity, Coriolis and the residual, plus damping),
clipped to the torque limits, and is counted: never a NaN.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pinocchio as pin
import proxsuite


@dataclass
class QPResult:
    """One control cycle of :class:`QPInverseDynamics`."""
    tau: np.ndarray
    qdd: np.ndarray
    status: str           # "solved" | "fallback: <reason>"
    iterations: int
    solve_time_s: float   # wall time of the solver call

    @property
    def ok(self) -> bool:
        return self.status == "solved"


def _vec(value, n: int, name: str, *, positive: bool = False, nonneg: bool = True) -> np.ndarray:
    arr = np.asarray(value, dtype=float).reshape(-1)
    if arr.size == 1:
        arr = np.full(n, float(arr[0]))
    if arr.shape != (n,) or not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected a finite scalar or {n} values, got {value!r}")
    if positive and np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonneg and np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return arr


class QPInverseDynamics:
    """Task-space QP inverse dynamics with a linearised residual model (module docstring).

    Parameters
    ----------
    model:
        :class:`~adaptive_dynamics.dynamics.RobotModel` (its current parameters are
        h_bar; its ``ee_frame`` is the task frame).
    dt:
        Control period [s] (for the limit bounds).
    w_position, w_orientation, w_posture, w_qdd, w_tau:
        Task weights (eq. 3's w_i; the costs are weighted squared norms).
    kp_orientation, kd_orientation:
        Orientation servo [1/s^2], [1/s] of the angular acceleration task.
    q_posture, kp_posture, kd_posture:
        Preferred posture (default: the middle of the joint range) and its servo.
    limit_horizon, limit_margin:
        Braking horizon [s] and margin [rad] of the position-limit bound.
    torque_limit_scale:
        Fraction of the URDF effort limits the QP may use.
    kd_fallback:
        Damping [N m s/rad] of the fallback torque.
    residual_inertia_bounds:
        ``(lo, hi)``: ``lo M <= M + E <= hi M`` for the residual's gradient ``E``
        (module docstring); ``None``: ``E`` as learned.
    eps_abs, max_iter:
        ProxQP's absolute tolerance and iteration cap.
    solver:
        ``"proxsuite"`` or ``"qpsolvers:<name>"`` (a solver qpsolvers knows).
    """

    def __init__(self, model, *, dt: float, w_position: float = 1.0, w_orientation: float = 0.1,
                 w_posture: float = 1e-3, w_qdd: float = 1e-6, w_tau: float = 1e-8,
                 kp_orientation: float = 100.0, kd_orientation: float = 20.0, q_posture=None,
                 kp_posture: float = 25.0, kd_posture: float = 10.0, limit_horizon: float = 0.05,
                 limit_margin: float = 0.02, torque_limit_scale: float = 1.0, kd_fallback: float = 5.0,
                 residual_inertia_bounds=(0.8, 1.25), eps_abs: float = 1e-7, max_iter: int = 200,
                 solver: str = "proxsuite"):
        if not (np.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be > 0, got {dt!r}")
        self.model = model
        n = self.n = model.n
        self.dt = float(dt)
        self.weights = {}
        self.set_weights(w_position=w_position, w_orientation=w_orientation, w_posture=w_posture, w_qdd=w_qdd,
                         w_tau=w_tau)
        self.kp_orientation, self.kd_orientation = float(kp_orientation), float(kd_orientation)
        self.q_posture = (0.5 * (model.lower + model.upper) if q_posture is None
                          else _vec(q_posture, n, "q_posture", nonneg=False))
        self.kp_posture, self.kd_posture = float(kp_posture), float(kd_posture)
        self.limit_horizon = float(limit_horizon)
        self.limit_margin = float(limit_margin)
        if not (self.limit_horizon >= self.dt and self.limit_margin >= 0):
            raise ValueError("limit_horizon must be >= dt and limit_margin >= 0")
        if not 0 < torque_limit_scale <= 1:
            raise ValueError(f"torque_limit_scale must be in (0, 1], got {torque_limit_scale!r}")
        self.tau_max = torque_limit_scale * np.asarray(model.effort_limit, dtype=float)
        if not np.all(self.tau_max > 0):
            raise ValueError(f"the model has no positive effort limits: {model.effort_limit}")
        self.kd_fallback = float(kd_fallback)
        if residual_inertia_bounds is None:
            self.residual_inertia_bounds = None
        else:
            lo, hi = (float(x) for x in residual_inertia_bounds)
            if not (0 < lo <= 1 <= hi and np.isfinite(hi)):
                raise ValueError(f"residual_inertia_bounds must be (lo, hi) with 0 < lo <= 1 <= hi, got"
                                 f" {residual_inertia_bounds!r}")
            self.residual_inertia_bounds = (lo, hi)
        # pinocchio buffers (own data: the caller's RobotModel caches stay untouched)
        self._pm = model.model
        self._pd = self._pm.createData()
        self._fid = model.frame_id(model.ee_frame)
        self._zero = np.zeros(n)
        if solver != "proxsuite":
            import qpsolvers
            name = solver.partition(":")[2]
            if not solver.startswith("qpsolvers:") or name not in qpsolvers.available_solvers:
                raise ValueError(f"solver must be 'proxsuite' or 'qpsolvers:<name>' with <name> in"
                                 f" {qpsolvers.available_solvers}, got {solver!r}")
        self.solver = solver
        self.eps_abs = float(eps_abs)
        self._last = None
        self._qp = proxsuite.proxqp.dense.QP(2 * n, n, 0, True)
        self._qp.settings.eps_abs = float(eps_abs)
        self._qp.settings.eps_rel = 0.0
        self._qp.settings.max_iter = int(max_iter)
        self._qp.settings.verbose = False
        # set before init: changed after it, proxsuite 0.8's dense solve crashed
        self._qp.settings.initial_guess = proxsuite.proxqp.InitialGuess.WARM_START_WITH_PREVIOUS_RESULT
        self._initialised = False
        self.solves = 0
        self.fallbacks = 0
        self.last_status = "not run"

    # ---------------------------------------------------------------- settings
    def set_weights(self, **weights) -> None:
        """Update task weights (live parameters): w_position, w_orientation, w_posture, w_qdd, w_tau."""
        known = {"w_position", "w_orientation", "w_posture", "w_qdd", "w_tau"}
        for k, v in weights.items():
            if k not in known:
                raise ValueError(f"unknown weight {k!r}; known: {sorted(known)}")
            v = float(v)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{k} must be finite and >= 0, got {v!r}")
            if k in ("w_qdd", "w_tau") and v <= 0:
                raise ValueError(f"{k} must be > 0 (it keeps the QP strictly convex), got {v!r}")
            self.weights[k] = v

    # ---------------------------------------------------------------- pieces
    def kinematics(self, q, v):
        """(pose 4x4, J 6xn, Jdot qd 6, M, c) at (q, v) from one set of pinocchio calls."""
        m, d, fid = self._pm, self._pd, self._fid
        pin.forwardKinematics(m, d, q, v, self._zero)
        pin.updateFramePlacements(m, d)
        J = pin.computeFrameJacobian(m, d, q, fid, pin.LOCAL_WORLD_ALIGNED)
        acc = pin.getFrameClassicalAcceleration(m, d, fid, pin.LOCAL_WORLD_ALIGNED)
        jdqd = np.concatenate([acc.linear, acc.angular])
        M = pin.crba(m, d, q)
        M = np.triu(M) + np.triu(M, 1).T
        c = pin.rnea(m, d, q, v, self._zero)
        return d.oMf[fid].homogeneous.copy(), J, jdqd, M, c

    def acceleration_bounds(self, q, v):
        """qdd bounds from the position and velocity limits (module docstring)."""
        dt, T = self.dt, self.limit_horizon
        m = self.model
        vmax = np.where(np.isfinite(m.velocity_limit) & (m.velocity_limit > 0), m.velocity_limit, np.inf)
        lo_q, hi_q = m.lower + self.limit_margin, m.upper - self.limit_margin
        # brake to the position bound within T: q + v T + a T^2 / 2 stays inside
        a_hi_pos = 2.0 * (hi_q - q - v * T) / (T * T)
        a_lo_pos = 2.0 * (lo_q - q - v * T) / (T * T)
        a_hi_vel = (vmax - v) / dt
        a_lo_vel = (-vmax - v) / dt
        hi = np.minimum(a_hi_pos, a_hi_vel)
        lo = np.maximum(a_lo_pos, a_lo_vel)
        bad = lo > hi           # past a bound: brake (the midpoint keeps the interval a point)
        if bad.any():
            mid = 0.5 * (lo + hi)
            lo = np.where(bad, mid, lo)
            hi = np.where(bad, mid, hi)
        return lo, hi

    def condition_gradient(self, M: np.ndarray, E: np.ndarray) -> np.ndarray:
        """E with its symmetric part's generalised eigenvalues (w.r.t. M) clipped so that
        ``lo M <= M + E <= hi M`` (module docstring)."""
        if self.residual_inertia_bounds is None:
            return E
        lo, hi = self.residual_inertia_bounds
        L = np.linalg.cholesky(M)
        Es = 0.5 * (E + E.T)
        Li = np.linalg.solve(L, np.eye(self.n))
        A = Li @ Es @ Li.T
        w, V = np.linalg.eigh(0.5 * (A + A.T))
        w = np.clip(w, lo - 1.0, hi - 1.0)
        LV = L @ V
        return (LV * w) @ LV.T

    # ---------------------------------------------------------------- the QP
    def solve(self, q, v, xdd_ref, *, R_des=None, w_des=None, wdot_des=None, residual=None,
              qdd_measured=None, kinematics=None) -> QPResult:
        """One cycle: the torque (and planned acceleration) for the task acceleration
        ``xdd_ref`` (3, world frame).  ``R_des``/``w_des``/``wdot_des``: the desired
        orientation, angular velocity and acceleration (default: hold the current
        orientation, zero velocity).  ``residual``: ``(e_t, E)`` of the residual model at
        ``(q, v, qdd_measured)`` (None = rigid-body model only).  ``kinematics``: what
        :meth:`kinematics` returned for this ``(q, v)``, when the caller has it already."""
        n = self.n
        q = np.asarray(q, dtype=float).reshape(-1)
        v = np.asarray(v, dtype=float).reshape(-1)
        xdd_ref = np.asarray(xdd_ref, dtype=float).reshape(-1)
        if q.shape != (n,) or v.shape != (n,) or xdd_ref.shape != (3,):
            raise ValueError(f"q, v: {n} values and xdd_ref: 3 values expected, got {q.shape}, {v.shape},"
                             f" {xdd_ref.shape}")
        if not (np.isfinite(q).all() and np.isfinite(v).all()):
            raise ValueError("non-finite joint state")
        T, J, jdqd, M, c = self.kinematics(q, v) if kinematics is None else kinematics
        e_t = np.zeros(n)
        E = None
        if residual is not None:
            e_t = np.asarray(residual[0], dtype=float).reshape(n)
            E = None if residual[1] is None else np.asarray(residual[1], dtype=float).reshape(n, n)
            qdd_t = np.zeros(n) if qdd_measured is None else np.asarray(qdd_measured, dtype=float).reshape(n)
            if not (np.isfinite(e_t).all() and (E is None or np.isfinite(E).all()) and np.isfinite(qdd_t).all()):
                e_t, E = np.zeros(n), None       # a broken residual falls back to the prior model
        if not np.isfinite(xdd_ref).all():
            return self._fallback(q, v, c, e_t, "non-finite task acceleration", 0, 0.0)
        w = self.weights
        # angular task: hold / track orientation
        R = T[:3, :3]
        R_d = R if R_des is None else np.asarray(R_des, dtype=float).reshape(3, 3)
        w_d = np.zeros(3) if w_des is None else np.asarray(w_des, dtype=float).reshape(3)
        wd_d = np.zeros(3) if wdot_des is None else np.asarray(wdot_des, dtype=float).reshape(3)
        omega = J[3:] @ v
        wdot_ref = wd_d + self.kp_orientation * pin.log3(R_d @ R.T) + self.kd_orientation * (w_d - omega)
        # cost over qdd (tau only in the regulariser)
        Jl, Ja = J[:3], J[3:]
        H = w["w_position"] * Jl.T @ Jl + w["w_orientation"] * Ja.T @ Ja
        g = -(w["w_position"] * Jl.T @ (xdd_ref - jdqd[:3]) + w["w_orientation"] * Ja.T @ (wdot_ref - jdqd[3:]))
        if w["w_posture"] > 0:
            JJt = J @ J.T + 1e-6 * np.eye(6)
            N = np.eye(n) - J.T @ np.linalg.solve(JJt, J)
            qdd_post = self.kp_posture * (self.q_posture - q) - self.kd_posture * v
            NtN = N.T @ N
            H = H + w["w_posture"] * NtN
            g = g - w["w_posture"] * NtN @ qdd_post
        Hx = np.zeros((2 * n, 2 * n))
        Hx[:n, :n] = H + w["w_qdd"] * np.eye(n)
        Hx[n:, n:] = w["w_tau"] * np.eye(n)
        gx = np.concatenate([g, np.zeros(n)])
        # equality: (M + E) qdd - tau = -(c + e_t - E qdd_t)
        if E is not None:
            E = self.condition_gradient(M, E)
        A = np.hstack([M if E is None else M + E, -np.eye(n)])
        b = -(c + e_t) if E is None else -(c + e_t - E @ qdd_t)
        lo, hi = self.acceleration_bounds(q, v)
        l_box = np.concatenate([lo, -self.tau_max])
        u_box = np.concatenate([hi, self.tau_max])
        if self.solver != "proxsuite":
            return self._solve_other(q, v, c, e_t, Hx, gx, A, b, l_box, u_box)
        qp = self._qp
        t0 = time.perf_counter()
        try:
            if not self._initialised:
                qp.init(Hx, gx, A, b, None, None, None, l_box, u_box)
                self._initialised = True
            else:
                qp.update(Hx, gx, A, b, None, None, None, l_box, u_box)
            qp.solve()
        except Exception as exc:  # noqa: BLE001 -- a solver error is a fallback, never a crash
            self._initialised = False
            return self._fallback(q, v, c, e_t, f"solver error {exc}", 0, time.perf_counter() - t0)
        dt_solve = time.perf_counter() - t0
        res = qp.results
        x = np.array(res.x)
        it = int(res.info.iter)
        self.solves += 1
        if res.info.status != proxsuite.proxqp.QPSolverOutput.PROXQP_SOLVED:
            self._initialised = False       # cold start next cycle
            return self._fallback(q, v, c, e_t, str(res.info.status).split(".")[-1], it, dt_solve)
        if not np.isfinite(x).all():
            self._initialised = False
            return self._fallback(q, v, c, e_t, "non-finite solution", it, dt_solve)
        self.last_status = "solved"
        return QPResult(tau=np.clip(x[n:], -self.tau_max, self.tau_max), qdd=x[:n], status="solved",
                        iterations=it, solve_time_s=dt_solve)

    def _solve_other(self, q, v, c, e_t, H, g, A, b, lb, ub) -> QPResult:
        self._last = (H, g, A, b, lb, ub)
        t0 = time.perf_counter()
        try:        # the same accuracy as ProxQP's
            x = qpsolvers_solve(H, g, A, b, lb, ub, self.solver.partition(":")[2], self.eps_abs)
        except Exception as exc:  # noqa: BLE001
            return self._fallback(q, v, c, e_t, f"solver error {exc}", 0, time.perf_counter() - t0)
        dt_solve = time.perf_counter() - t0
        self.solves += 1
        if x is None:
            return self._fallback(q, v, c, e_t, "no solution", 0, dt_solve)
        n = self.n
        self.last_status = "solved"
        return QPResult(tau=np.clip(x[n:], -self.tau_max, self.tau_max), qdd=x[:n], status="solved",
                        iterations=0, solve_time_s=dt_solve)

    def _fallback(self, q, v, c, e_t, why: str, it: int, dt_solve: float) -> QPResult:
        self.fallbacks += 1
        self.last_status = f"fallback: {why}"
        tau = c + e_t - self.kd_fallback * v
        if not np.isfinite(tau).all():
            tau = -self.kd_fallback * v
            tau = np.where(np.isfinite(tau), tau, 0.0)
        return QPResult(tau=np.clip(tau, -self.tau_max, self.tau_max), qdd=np.zeros(self.n),
                        status=self.last_status, iterations=it, solve_time_s=dt_solve)

    def qp_matrices(self):
        """The last QP as (H, g, A, b, l_box, u_box) numpy arrays (for a second solver)."""
        if self._last is not None:
            return tuple(np.array(a) for a in self._last)
        m = self._qp.model
        n2 = 2 * self.n
        H = np.array(m.H)
        H = np.triu(H) + np.triu(H, 1).T if H.shape == (n2, n2) else H
        return H, np.array(m.g), np.array(m.A), np.array(m.b), np.array(m.l_box), np.array(m.u_box)


def qpsolvers_solve(H, g, A, b, lb, ub, solver: str = "osqp", eps: float = 1e-9, **options) -> Optional[np.ndarray]:
    """The QP ``min 1/2 x^T H x + g^T x``, ``A x = b``, ``lb <= x <= ub`` through qpsolvers
    (sparse matrices for OSQP, its tolerances ``eps``); None when it finds no finite solution."""
    import qpsolvers
    import scipy.sparse as sp
    if solver == "osqp":
        H, A = sp.csc_matrix(H), sp.csc_matrix(A)
        options = {"eps_abs": eps, "eps_rel": eps, "polishing": True, **options}
    x = qpsolvers.solve_qp(H, g, None, None, A, b, lb, ub, solver=solver, **options)
    return None if x is None or not np.isfinite(x).all() else np.asarray(x)


def reference_solve(H, g, A, b, lb, ub, solver: str = "osqp") -> Optional[np.ndarray]:
    """The same QP solved by a second solver (OSQP at 1e-9), for cross-checks."""
    return qpsolvers_solve(H, g, A, b, lb, ub, solver, 1e-9, max_iter=20000)
