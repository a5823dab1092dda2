"""Thunder Dynamics' task-space adaptive backstepping (Thunder appendix, Propositions 1-3,
Table 4 (27)-(34), Appendix E), on the joint-space Slotine-Li machinery.

The law (its derivation, term by term, in ``docs/derivations.md``, "Adaptive backstepping"):

* (27) task-space error ``e = [p_d - p; e_o]``, ``e_o = log(R_d R^T)`` (axis-angle
  ``theta r`` of the rotation from the current to the desired end-effector frame,
  expressed in the base frame; 0 without a rotation error, never NaN) -- or, with
  ``orientation="vect"`` (the lab's controller), ``e_o = vect(R_d R^T) = sin(theta) r =
  1/2 sum_i x_i x x_d,i`` (x_i the columns of R; Siciliano et al., *Robotics*, eq. 3.85)
  with ``e_o_dot = L^T w_d - L w``, ``L = -1/2 sum_i S(x_d,i) S(x_i)``: the reference's
  orientation rows are then ``L^-1 (L^T w_d + K_o e_o)`` instead of ``w_d + K_o e_o``, and
  the cross term's ``J_o^T L^T e_o`` instead of ``J_o^T e_o`` (equal to first order in
  the error; L is invertible for |theta| < pi/2);
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

import math

import numpy as np
import pinocchio as pin
from scipy.linalg.lapack import dpotrf as _dpotrf, dpotrs as _dpotrs, dsyev as _dsyev

from ..validation import as_vector
from .adaptive import AdaptiveController
from .law import NpzState

__all__ = ["TaskSpaceReference", "BacksteppingController", "orientation_error"]

_LWA = pin.ReferenceFrame.LOCAL_WORLD_ALIGNED
_DIAG6 = np.diag_indices(6)


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
    caller sets with :meth:`set_posture`; 0 disables it).  ``orientation``: ``"log"``
    (default) or ``"vect"`` (the lab's; see the module docstring).
    """

    ORIENTATIONS = ("log", "vect")

    def __init__(self, model, kp=5.0, *, damping: float = 0.05, singular_threshold: float = 0.05,
                 posture=None, k_posture: float = 1.0, frame: str | None = None, orientation: str = "log"):
        if orientation not in self.ORIENTATIONS:
            raise ValueError(f"orientation must be one of {self.ORIENTATIONS}, got {orientation!r}")
        self.orientation = orientation
        self.model = model
        self.n = model.n
        self.frame = frame
        self.set_gains(kp=kp)
        if not (damping >= 0 and singular_threshold > 0 and k_posture >= 0):
            raise ValueError("damping >= 0, singular_threshold > 0 and k_posture >= 0 are required")
        self.damping, self.threshold, self.k_posture = float(damping), float(singular_threshold), float(k_posture)
        self.posture = None if posture is None else np.asarray(posture, dtype=float).copy()
        self._pm = model.model                      # kinematics only (the inertias are not used)
        self._pd = model.model.createData()
        self._fid = model.frame_id(frame or model.ee_frame)
        # the last evaluation (diagnostics, the cross term)
        self.e = np.zeros(6)
        self.e_dot = np.zeros(6)
        self.e_cross = self.e          # what J^T multiplies in the cross term (vect: [e_p; L^T e_o])
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

    def _kinematics(self, q, v):
        """Frame pose, J and J_dot (LOCAL_WORLD_ALIGNED) at (q, v): one pinocchio pass."""
        pm, d, fid = self._pm, self._pd, self._fid
        pin.computeJointJacobiansTimeVariation(pm, d, q, v)     # forward kinematics, J and dJ of every joint
        pin.updateFramePlacement(pm, d, fid)
        J = pin.getFrameJacobian(pm, d, fid, _LWA)
        Jd = pin.getFrameJacobianTimeVariation(pm, d, fid, _LWA)
        return d.oMf[fid], J, Jd

    def compute(self, q, v, p_d, R_d, v_d, a_d):
        """``(qd_r, qdd_r)`` at the state ``(q, v)`` for the reference pose ``(p_d, R_d)``,
        twist ``v_d = [pd_d; w_d]`` and its derivative ``a_d`` (base frame); the error,
        its rate and J stay in :attr:`e`, :attr:`e_dot`, :attr:`J`.

        With ``A = J J^T + lambda^2 I``, ``J# = J^T A^-1``, the posture pull
        ``u = k0 (q_posture - q)`` and ``g = v_d + K e - J u``::

            qd_r  = J# g + u                           (= J# (v_d + K e) + N u)
            qdd_r = J_dot^T y + J^T A^-1 (g_dot - A_dot y) - k0 v,   y = A^-1 g,
            g_dot = a_d + K e_dot - J_dot u + k0 J v,   A_dot = J_dot J^T + J J_dot^T + (lambda^2)' I

        (the derivative of J# = J^T A^-1 written on vectors: no n x n or 6 x n products
        beyond J J^T).  sigma_min(J) comes from the eigenvalues of J J^T; only below the
        threshold (damping active) the SVD gives its rate ``u^T J_dot v``.
        """
        q = np.asarray(q, float)
        v = np.asarray(v, float)
        v_d = np.asarray(v_d, float).reshape(6)
        a_d = np.asarray(a_d, float).reshape(6)
        oMf, J, Jd = self._kinematics(q, v)
        R_e = np.asarray(R_d, float) @ oMf.rotation.T
        e, e_dot = self.e, self.e_dot
        e[:3] = p_d
        e[:3] -= oMf.translation
        Jv = J.dot(v)
        e_dot[:3] = v_d[:3] - Jv[:3]
        vect = self.orientation == "vect"
        if vect:
            L, Ld = _vect_L(oMf.rotation, R_d, Jv[3:], v_d[3:])
            e[3:] = 0.5 * (R_e[[2, 0, 1], [1, 2, 0]] - R_e[[1, 2, 0], [2, 0, 1]])   # vect(R_e)
            e_dot[3:] = L.T.dot(v_d[3:]) - L.dot(Jv[3:])
        else:
            e[3:] = pin.log3(R_e)
            # e_dot (exact): position p_d_dot - J_p v; orientation d/dt log(R_e) = Jlog3(R_e) (R_e^T w_d - w)
            e_dot[3:] = pin.Jlog3(R_e).dot(R_e.T.dot(v_d[3:]) - Jv[3:])
        A = J.dot(J.T)
        lam_min = float(_dsyev(A, compute_v=0)[0][0])            # sigma_min^2
        smin = lam_min ** 0.5 if lam_min > 0.0 else 0.0
        lam2 = lam2_dot = 0.0
        if self.damping > 0 and smin < self.threshold:
            U, S, Vt = np.linalg.svd(J)
            smin = float(S[-1])
            ratio = smin / self.threshold
            lam2 = self.damping ** 2 * (1.0 - ratio * ratio)
            smin_dot = float(U[:, -1] @ Jd @ Vt[5])           # d sigma_min / dt = u^T J_dot v
            lam2_dot = -2.0 * self.damping ** 2 * ratio * smin_dot / self.threshold
            A[_DIAG6] += lam2
        c, info = _dpotrf(A, lower=1)
        if info != 0:     # only an exactly singular J without damping: the damped least squares
            A[_DIAG6] += max(self.damping, 1e-6) ** 2
            c, info = _dpotrf(A, lower=1)
        g = self.kp * e
        g += v_d
        g_dot = self.kp * e_dot
        g_dot += a_d
        if vect:   # orientation rows L^-1 b, b = L^T w_d + K_o e_o; d/dt: L^-1 (b_dot - L_dot L^-1 b)
            b, b_dot = g[3:].copy(), g_dot[3:].copy()
            b += L.T.dot(v_d[3:]) - v_d[3:]
            b_dot += Ld.T.dot(v_d[3:]) + L.T.dot(a_d[3:]) - a_d[3:]
            go = np.linalg.solve(L, b)
            g[3:] = go
            g_dot[3:] = np.linalg.solve(L, b_dot - Ld.dot(go))
            self.e_cross = np.concatenate([e[:3], L.T.dot(e[3:])])
        else:
            self.e_cross = e
        pull = self.k_posture > 0 and self.posture is not None
        if pull:
            u = self.k_posture * (self.posture - q)
            g -= J.dot(u)
            g_dot -= Jd.dot(u)
            g_dot += self.k_posture * Jv
        y = _dpotrs(c, g, lower=1)[0]
        Jty = J.T.dot(y)
        g_dot -= Jd.dot(Jty)
        g_dot -= J.dot(Jd.T.dot(y))
        if lam2_dot != 0.0:
            g_dot -= lam2_dot * y
        qd_r = Jty
        qdd_r = Jd.T.dot(y)
        qdd_r += J.T.dot(_dpotrs(c, g_dot, lower=1)[0])
        if pull:
            qd_r += u
            qdd_r -= self.k_posture * v
        self.J, self.sigma_min, self.lam2 = J, smin, lam2
        return qd_r, qdd_r


def _vect_L(R, R_d, w, w_d):
    """``L = -1/2 sum_i S(x_d,i) S(x_i)`` and its time derivative (``x_i`` the columns of
    ``R`` turning with ``w``, ``x_d,i`` those of ``R_d`` with ``w_d``; base frame)."""
    L = np.zeros((3, 3))
    Ld = np.zeros((3, 3))
    for i in range(3):
        x, xd = R[:, i], R_d[:, i]
        Sx, Sxd = pin.skew(x), pin.skew(xd)
        L -= 0.5 * Sxd.dot(Sx)
        Ld -= 0.5 * (pin.skew(np.cross(w_d, xd)).dot(Sx) + Sxd.dot(pin.skew(np.cross(w, x))))
    return L, Ld


class BacksteppingController(NpzState):
    """(27)-(34): :class:`TaskSpaceReference` in front of an
    :class:`~adaptive_dynamics.control.adaptive.AdaptiveController` (``law`` "direct" or
    "composite", every option of the core: base parameters, friction, projection,
    ``adapted_links``, ``pi0``...; ``kd`` is K_d of (32), ``gamma`` Gamma of (34)).
    ``learn=False`` in :meth:`compute` (or a fixed ``pi0`` and no adaptation) is the
    non-adaptive backstepping controller (the paper's Fig. 10 baseline)."""

    def __init__(self, model, law: str = "direct", *, kp_task=5.0, damping: float = 0.05,
                 singular_threshold: float = 0.05, posture=None, k_posture: float = 1.0, frame: str | None = None,
                 orientation: str = "log", **core):
        self.model = model
        self.ref = TaskSpaceReference(model, kp_task, damping=damping, singular_threshold=singular_threshold,
                                      posture=posture, k_posture=k_posture, frame=frame, orientation=orientation)
        self.core = AdaptiveController(model, law, **core)
        self.cross_torque = np.zeros(model.n)
        self._zero = np.zeros(model.n)

    STATE_WHAT = "an adaptive-controller state file"

    def state_dict(self) -> dict:
        """The adaptive core's (estimate, covariance, gains): the same file as the joint-space laws'."""
        return self.core.state_dict()

    def load_state_dict(self, state: dict, **kwargs) -> None:
        self.core.load_state_dict(state, **kwargs)

    def compute(self, q, v, p_d, R_d, v_d, a_d, tau_measured=None, learn: bool = True) -> np.ndarray:
        """The torque for this state and end-effector reference (model joint order, not
        saturated), then the parameter update; ``ValueError`` naming the input on a
        non-finite or wrongly sized one (nothing changed: a non-finite input makes the
        reference non-finite, which the core refuses before it changes anything)."""
        try:
            if self.ref.posture is None:
                self.ref.set_posture(as_vector(q, self.model.n, "q"))
            qd_r, qdd_r = self.ref.compute(q, v, p_d, R_d, v_d, a_d)
            e = self.ref.e
            np.dot(self.ref.J.T, self.ref.e_cross, out=self.cross_torque)
            return self.core.compute(q, v, q, v, self._zero, tau_measured, learn,
                                     reference=(qd_r, qdd_r), extra_torque=self.cross_torque,
                                     tracking_error=math.sqrt(e.dot(e)))
        except (ValueError, TypeError, RuntimeError) as exc:
            self._name_bad_input(q, v, p_d, R_d, v_d, a_d, tau_measured)
            raise ValueError(str(exc)) from None

    def _name_bad_input(self, q, v, p_d, R_d, v_d, a_d, tau_measured) -> None:
        """Raise ``ValueError`` naming the first malformed input (returns if none is)."""
        n = self.model.n
        for name, x, size in (("q", q, n), ("v", v, n), ("p_d", p_d, 3), ("R_d", R_d, (3, 3)), ("v_d", v_d, 6),
                              ("a_d", a_d, 6), ("tau_measured", tau_measured, n)):
            if x is None and name == "tau_measured":
                continue
            if size == (3, 3):   # a matrix: its entries as a vector, after the shape
                try:
                    shape = np.shape(x)
                except ValueError:   # ragged nesting
                    shape = "ragged"
                if shape != (3, 3):
                    raise ValueError(f"R_d: expected a 3x3 rotation matrix, got shape {shape}")
                x, size = np.ravel(x), 9
            as_vector(x, size, name)

    def lyapunov(self, q, v, qd_r) -> float:
        """``V = e^T e / 2 + s^T M(q) s / 2`` with the last error and ``s = v - qd_r``
        (Proposition 2's function; with the true model and pi_hat = pi it does not grow)."""
        s = np.asarray(v, float) - np.asarray(qd_r, float)
        return 0.5 * float(self.ref.e @ self.ref.e) + 0.5 * float(s @ self.model.mass_matrix(q) @ s)
