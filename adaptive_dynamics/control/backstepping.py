"""Thunder Dynamics' task-space adaptive backstepping (Thunder appendix, Propositions 1-3,
Table 4 (27)-(34), Appendix E), on the joint-space Slotine-Li machinery.

The law (its derivation, term by term, in ``docs/design.md``, "Adaptive backstepping"):

* (27) task-space error ``e = [p_d - p; e_o]``, ``e_o = log(R_d R^T)`` (axis-angle
  ``theta r`` of the rotation from the current to the desired end-effector frame,
  expressed in the base frame; 0 without a rotation error, never NaN);
* (30) kinematic level: ``qd_r = J# (v_d + K e) + N k0 (q_posture - q)``, with
  ``v_d = [pd_d; w_d]``, ``J#`` a damped pseudo-inverse of the geometric Jacobian whose
  damping rises only near a singularity, ``N = I - J# J`` its null-space projector (a
  posture pull for a redundant arm); ``qdd_r`` its exact time derivative (J_dot, the
  reference acceleration, the error rate);
* (31) ``s = qd - qd_r``;
* (32)/(33) ``tau = Y(q, qd, qd_r, qdd_r) pi_hat - K_d s + J^T e``: the Slotine-Li law of
  :class:`~adaptive_dynamics.control.adaptive.AdaptiveController` with this reference,
  plus the backstepping cross term ``J^T e`` that cancels ``-e^T J s`` in the derivative
  of ``V = e^T e / 2 + s^T M s / 2``;
* (34) ``pi_hat_dot = -Gamma Y^T s`` (direct) -- or the composite law, the projection,
  base parameters, friction columns, ``adapted_links``: whatever the core is built with.

No ROS import.
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin

from .adaptive import AdaptiveController

__all__ = ["TaskSpaceReference", "BacksteppingController", "orientation_error"]


def orientation_error(R: np.ndarray, R_d: np.ndarray) -> np.ndarray:
    """``log(R_d R^T)`` (axis times angle, base frame): zero for equal frames, no NaN
    there (pinocchio's ``log3`` takes the small-angle branch, the paper's "any unit axis")."""
    return np.asarray(pin.log3(np.asarray(R_d, float) @ np.asarray(R, float).T), dtype=float)


class TaskSpaceReference:
    """The kinematic level: ``e``, ``qd_r``, ``qdd_r`` for an end-effector reference.

    ``kp``: K of (30), 1 or 6 values [1/s] (position rows, then orientation rows);
    ``damping``: the largest damping lambda of ``J# = J^T (J J^T + lambda^2 I)^-1``, reached
    at a singular pose; ``singular_threshold``: the smallest singular value of J below
    which it starts rising (``lambda^2 = damping^2 (1 - (sigma_min / threshold)^2)``,
    smooth, 0 above the threshold: the exact pseudo-inverse away from singularities);
    ``posture``, ``k_posture`` [1/s]: the null-space pull (None: the start pose the
    caller sets with :meth:`set_posture`; 0 disables it).
    """

    def __init__(self, model, kp=5.0, *, damping: float = 0.05, singular_threshold: float = 0.05,
                 posture=None, k_posture: float = 1.0, frame: str | None = None):
        self.model = model
        self.n = model.n
        self.frame = frame
        self.set_gains(kp=kp)
        if not (damping >= 0 and singular_threshold > 0 and k_posture >= 0):
            raise ValueError("damping >= 0, singular_threshold > 0 and k_posture >= 0 are required")
        self.damping, self.threshold, self.k_posture = float(damping), float(singular_threshold), float(k_posture)
        self.posture = None if posture is None else np.asarray(posture, dtype=float).copy()
        # the last evaluation (diagnostics, the cross term)
        self.e = np.zeros(6)
        self.e_dot = np.zeros(6)
        self.J = np.zeros((6, self.n))
        self.sigma_min = np.nan
        self.lam2 = 0.0

    def set_gains(self, *, kp=None) -> None:
        if kp is not None:
            k = np.broadcast_to(np.asarray(kp, dtype=float).reshape(-1), (6,)).copy() \
                if np.size(kp) in (1, 6) else None
            if k is None or not np.all(np.isfinite(k)) or np.any(k <= 0):
                raise ValueError(f"kp: 1 or 6 finite values > 0 (position rows, then orientation), got {kp!r}")
            self.kp = k

    def set_posture(self, q) -> None:
        self.posture = np.asarray(q, dtype=float).copy()

    def error(self, q, p_d, R_d) -> np.ndarray:
        """(27): ``[p_d - p; log(R_d R^T)]``."""
        T = self.model.frame_pose(q, self.frame)
        return np.concatenate([np.asarray(p_d, float) - T[:3, 3], orientation_error(T[:3, :3], R_d)])

    def compute(self, q, v, p_d, R_d, v_d, a_d):
        """``(qd_r, qdd_r)`` at the state ``(q, v)`` for the reference pose ``(p_d, R_d)``,
        twist ``v_d = [pd_d; w_d]`` and its derivative ``a_d`` (base frame); the error,
        its rate and J stay in :attr:`e`, :attr:`e_dot`, :attr:`J`."""
        m, n = self.model, self.n
        q = np.asarray(q, float)
        v = np.asarray(v, float)
        v_d = np.asarray(v_d, float).reshape(6)
        a_d = np.asarray(a_d, float).reshape(6)
        T = m.frame_pose(q, self.frame)
        R = T[:3, :3]
        R_e = np.asarray(R_d, float) @ R.T
        e = np.concatenate([np.asarray(p_d, float) - T[:3, 3], pin.log3(R_e)])
        J = m.jacobian(q, self.frame)
        Jd = m.jacobian_dot(q, v, self.frame)
        # e_dot (exact): position p_d_dot - J_p v; orientation d/dt log(R_e) = Jlog3(R_e) (R_e^T w_d - w)
        w = J[3:] @ v
        e_dot = np.concatenate([v_d[:3] - J[:3] @ v, pin.Jlog3(R_e) @ (R_e.T @ v_d[3:] - w)])
        # damped pseudo-inverse and its time derivative
        U, S, Vt = np.linalg.svd(J)
        smin = float(S[-1])
        lam2, lam2_dot = 0.0, 0.0
        if self.damping > 0 and smin < self.threshold:
            ratio = smin / self.threshold
            lam2 = self.damping ** 2 * (1.0 - ratio * ratio)
            smin_dot = float(U[:, -1] @ Jd @ Vt[5])           # d sigma_min / dt = u^T J_dot v
            lam2_dot = -2.0 * self.damping ** 2 * ratio * smin_dot / self.threshold
        A_inv = np.linalg.inv(J @ J.T + lam2 * np.eye(6))
        Jp = J.T @ A_inv
        A_dot = Jd @ J.T + J @ Jd.T + lam2_dot * np.eye(6)
        Jp_dot = Jd.T @ A_inv - Jp @ A_dot @ A_inv
        wref = v_d + self.kp * e
        wref_dot = a_d + self.kp * e_dot
        qd_r = Jp @ wref
        qdd_r = Jp_dot @ wref + Jp @ wref_dot
        if self.k_posture > 0 and self.posture is not None:
            N = np.eye(n) - Jp @ J
            N_dot = -(Jp_dot @ J + Jp @ Jd)
            pull = self.k_posture * (self.posture - q)
            qd_r += N @ pull
            qdd_r += N_dot @ pull - N @ (self.k_posture * v)
        self.e, self.e_dot, self.J, self.sigma_min, self.lam2 = e, e_dot, J, smin, lam2
        return qd_r, qdd_r


class BacksteppingController:
    """(27)-(34): :class:`TaskSpaceReference` in front of an
    :class:`~adaptive_dynamics.control.adaptive.AdaptiveController` (``law`` "direct" or
    "composite", every option of the core: base parameters, friction, projection,
    ``adapted_links``, ``pi0``...; ``kd`` is K_d of (32), ``gamma`` Gamma of (34)).
    ``learn=False`` in :meth:`compute` (or a fixed ``pi0`` and no adaptation) is the
    non-adaptive backstepping controller (the paper's Fig. 10 baseline)."""

    def __init__(self, model, law: str = "direct", *, kp_task=5.0, damping: float = 0.05,
                 singular_threshold: float = 0.05, posture=None, k_posture: float = 1.0, frame: str | None = None,
                 **core):
        self.model = model
        self.ref = TaskSpaceReference(model, kp_task, damping=damping, singular_threshold=singular_threshold,
                                      posture=posture, k_posture=k_posture, frame=frame)
        self.core = AdaptiveController(model, law, **core)
        self.cross_torque = np.zeros(model.n)

    def compute(self, q, v, p_d, R_d, v_d, a_d, tau_measured=None, learn: bool = True) -> np.ndarray:
        """The torque for this state and end-effector reference (model joint order, not
        saturated), then the parameter update; ``ValueError`` on non-finite inputs."""
        q = np.asarray(q, float)
        v = np.asarray(v, float)
        for name, x in (("q", q), ("v", v), ("p_d", p_d), ("R_d", R_d), ("v_d", v_d), ("a_d", a_d)):
            if not np.all(np.isfinite(np.asarray(x, float))):
                raise ValueError(f"{name} is not finite")
        if self.ref.posture is None:
            self.ref.set_posture(q)
        qd_r, qdd_r = self.ref.compute(q, v, p_d, R_d, v_d, a_d)
        np.dot(self.ref.J.T, self.ref.e, out=self.cross_torque)
        e = self.ref.e
        return self.core.compute(q, v, q, v, np.zeros_like(q), tau_measured, learn,
                                 reference=(qd_r, qdd_r), extra_torque=self.cross_torque,
                                 tracking_error=float(np.sqrt(e @ e)))

    def lyapunov(self, q, v, qd_r) -> float:
        """``V = e^T e / 2 + s^T M(q) s / 2`` with the last error and ``s = v - qd_r``
        (Proposition 2's function; with the true model and pi_hat = pi it does not grow)."""
        s = np.asarray(v, float) - np.asarray(qd_r, float)
        return 0.5 * float(self.ref.e @ self.ref.e) + 0.5 * float(s @ self.model.mass_matrix(q) @ s)
