"""Payload identification: the load on the flange, with the arm's model held fixed.

The arm's model is known -- the URDF's parameters, or an earlier ``identify`` estimate --
and only the 10 inertial parameters of a rigid load fixed to a frame of the arm (by
default the end-effector frame) are estimated from a recording ``q, qd, qdd, tau``:

    r = tau - tau_arm(q, qd, qdd) ~= Y_L(q, qd, qdd) pi_L + b

* ``tau_arm = Y(q, qd, qdd) pi_arm`` (+ a fixed joint friction, see below), the arm's
  torque with the arm's full parameter vector;
* ``Y_L``: the 10 columns of the standard regressor that belong to the link the frame is
  fixed to (pinocchio's regressor expresses that block in the link's **joint frame**),
  so ``pi_L`` is the payload's 10-vector (pinocchio order ``[m, m c, I about the origin]``)
  in that joint frame;
* ``b``: a constant torque per joint (torque-sensor bias, cable forces), estimated
  alongside unless ``offset=False``.

**Fit.**  Least squares with every joint's rows weighted by the inverse standard
deviation of its residual after an unweighted pass (as
:func:`~adaptive_dynamics.dynamics.identification.identify` does), then -- by default --
the physically consistent estimate: the same weighted least squares subject to the
payload's 4x4 pseudo-inertia ``J(pi_L)`` being positive semidefinite and its mass at
least ``min_mass`` (a semidefinite program, cvxpy + Clarabel, as
:func:`~adaptive_dynamics.dynamics.identification.identify_consistent`).  When the
least-squares estimate already satisfies both it *is* the constrained optimum and is
returned as it is (``method == "least_squares"``); otherwise the program is solved
(``method == "consistent"``).  The pseudo-inertia transforms by congruence under a
change of frame, so consistency does not depend on the frame it is checked in.

**Frame of the result.**  The joint-frame estimate is re-expressed in ``frame`` with
pinocchio (``Inertia.FromDynamicParameters`` then ``placement.actInv``, ``placement`` the
frame's pose in its parent joint's frame): mass [kg], centre of mass [m] in ``frame``,
inertia about the centre of mass [kg m^2] in ``frame``'s axes -- libfranka's ``setLoad``
convention (``F_x_Cload`` and ``load_inertia`` in the flange frame F: pass the flange
frame, ``panda_link8`` on a Panda, when the default end-effector frame is another one) and
a URDF ``<inertial>`` of a link whose frame is ``frame``.

**Uncertainty.**  1-sigma intervals from the covariance of the *unconstrained* weighted
least-squares fit, ``sigma^2 (A^T A)^-1`` (``sigma^2`` from its residual), propagated to
mass, centre of mass and inertia about the centre of mass by the delta method (first
order).  Filtered, decimated samples are not independent, so read them as a lower bound;
they do not describe the consistent estimate when the constraints are active.

**Friction.**  Joint friction is part of the fixed arm.  An estimate from ``identify``
(``estimate_ls.npz`` / ``estimate_consistent.npz``: :meth:`AdaptiveController.load
<adaptive_dynamics.control.adaptive.AdaptiveController.load>` ``(...).pi``) carries its
identified viscous and Coulomb columns: pass it as ``arm_pi`` with a model built with
``friction=True`` and leave ``friction=None``.  For the URDF (no friction in its
parameters) pass the joints' ``friction=(viscous, coulomb)`` per joint (e.g.
:func:`adaptive_dynamics.robots.friction` of a shipped robot): ``f_v qd + f_c sgn(qd)``
(``tanh(qd / eps)`` with the model's ``coulomb_smoothing``) is added to the arm's torque.
Torques measured on the link side of the gears (a Franka's ``tau_J``) hold no joint
friction: pass none.  Near rest no friction law predicts a joint's friction (anything
between the break-away levels: a joint held still while the wrist moves carries whatever
its controller and stiction settle on), so where the arm gives a joint Coulomb friction,
its samples slower than ``min_velocity`` (0.05 rad/s) are left out of the fit -- all of
them for a joint held still -- and its offset is the mean of what the arm and the payload
leave there.  (On a simulated 1.5 kg load this takes the errors from up to 2.6 % and 7 mm
down to 0.6 % and 2 mm: ``docs/identification.md``.)  Friction that is not modelled ends
up in the residual the payload is fitted to.

No ROS import.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .inertial import inertia_matrix, pseudo_inertia, transform_matrix
from .identification import _check, _pseudo_inertia_basis, MIN_VELOCITY, solve_sdp

__all__ = ["PayloadEstimate", "identify_payload", "arm_torque", "payload_columns"]


@dataclass
class PayloadEstimate:
    """Result of :func:`identify_payload` (mass, centre of mass and inertia in ``frame``)."""

    frame: str                  # the frame the result is expressed in
    link: str                   # the moving link the frame is fixed to (its joint frame holds pi_link)
    block: int                  # that link's parameter block (columns 10 * block ...)
    mass: float                 # [kg]
    com: np.ndarray             # (3,) centre of mass [m] in `frame`
    inertia: np.ndarray         # (3, 3) about the centre of mass [kg m^2], `frame` axes
    pi_frame: np.ndarray        # 10-vector (pinocchio order) about `frame`'s origin, its axes
    pi_link: np.ndarray         # 10-vector in the link's joint frame (what multiplies Y_L)
    offset: np.ndarray          # constant torque per joint [N m] (empty without offset)
    method: str                 # "least_squares" (feasible as it is) or "consistent" (the SDP)
    min_pseudo_inertia_eig: float
    residual_rmse: np.ndarray   # per joint [N m]: tau - tau_arm - payload - offset, over every sample given
    arm_residual_rmse: np.ndarray   # per joint [N m]: tau - tau_arm, over every sample given
    samples: int
    condition: float            # of the column-scaled weighted regressor [Y_L, 1]
    mass_std: float = float("nan")
    com_std: np.ndarray = field(default_factory=lambda: np.full(3, np.nan))
    inertia_std: np.ndarray = field(default_factory=lambda: np.full(6, np.nan))   # xx, xy, xz, yy, yz, zz
    offset_std: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rows_used: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))   # per joint: samples fitted
    least_squares: dict = field(default_factory=dict)   # the unconstrained estimate (mass, com, inertia)

    def torque(self, model, q, qd, qdd, *, offset: bool = True) -> np.ndarray:
        """The payload's joint torque (N x n) at samples ``q, qd, qdd`` (N x n), plus the
        estimated offsets unless ``offset=False``: add it to the arm's torque."""
        tau = payload_columns(model, q, qd, qdd, self.block) @ self.pi_link
        return tau + self.offset if offset and self.offset.size else tau

    def franka(self) -> dict:
        """libfranka ``setLoad(mass, F_x_Cload, load_inertia)``: mass [kg], centre of mass
        [m] in the frame (``F_x_Cload`` when the frame is the flange), inertia about the
        centre of mass [kg m^2] in its axes, 9 values column-major."""
        Ic = 0.5 * (self.inertia + self.inertia.T)
        return {"mass": float(self.mass), "F_x_Cload": [float(x) for x in self.com],
                "load_inertia": [float(x) for x in Ic.reshape(-1, order="F")]}

    def urdf_inertial(self) -> str:
        """A URDF ``<inertial>`` element of a link whose frame is :attr:`frame`: origin at
        the centre of mass (no rotation), the inertia about it in the frame's axes."""
        c, Ic = self.com, 0.5 * (self.inertia + self.inertia.T)

        def f(x):
            return repr(float(x))
        return (f'<inertial>\n'
                f'  <origin xyz="{f(c[0])} {f(c[1])} {f(c[2])}" rpy="0 0 0"/>\n'
                f'  <mass value="{f(self.mass)}"/>\n'
                f'  <inertia ixx="{f(Ic[0, 0])}" ixy="{f(Ic[0, 1])}" ixz="{f(Ic[0, 2])}" iyy="{f(Ic[1, 1])}"'
                f' iyz="{f(Ic[1, 2])}" izz="{f(Ic[2, 2])}"/>\n'
                f'</inertial>\n')

    def to_dict(self) -> dict:
        """JSON-able summary (lists of floats; ``None`` where a value is undefined, e.g. the
        centre of mass of a raw least-squares mass <= 0)."""
        def num(x):
            return float(x) if np.isfinite(x) else None

        def fl(a):
            return [num(x) for x in np.asarray(a, dtype=float).reshape(-1)]
        out = {"frame": self.frame, "link": self.link, "method": self.method,
               "mass": num(self.mass), "com": fl(self.com),
               "inertia": [fl(row) for row in 0.5 * (self.inertia + self.inertia.T)],
               "std": {"mass": num(self.mass_std), "com": fl(self.com_std), "inertia": fl(self.inertia_std),
                       "note": "1 sigma of the unconstrained weighted least-squares fit (sigma^2 (A^T A)^-1,"
                               " delta method); inertia: xx, xy, xz, yy, yz, zz about the centre of mass"},
               "franka": self.franka(),
               "pi10_frame": fl(self.pi_frame), "pi10_link": fl(self.pi_link),
               "min_pseudo_inertia_eig": num(self.min_pseudo_inertia_eig),
               "samples": int(self.samples), "condition": num(self.condition),
               "residual_rmse": fl(self.residual_rmse), "arm_residual_rmse": fl(self.arm_residual_rmse),
               "rows_used": [int(x) for x in self.rows_used]}
        if self.offset.size:
            out["offset"] = fl(self.offset)
            out["std"]["offset"] = fl(self.offset_std)
        if self.least_squares:
            ls = self.least_squares
            out["least_squares"] = {"mass": num(ls["mass"]), "com": fl(ls["com"]),
                                    "inertia": [fl(row) for row in np.asarray(ls["inertia"])]}
        return out


def payload_columns(model, q, qd, qdd, block: int) -> np.ndarray:
    """``Y_L`` (N x n x 10): the standard regressor's columns of parameter block ``block``
    (a link's 10 parameters in its joint frame), without friction columns."""
    Y = model.regressor_batch(q, qd, qdd)
    return np.ascontiguousarray(Y[:, :, 10 * block: 10 * block + 10])


def arm_torque(model, q, qd, qdd, arm_pi=None, friction=None) -> np.ndarray:
    """The fixed arm's joint torque (N x n): ``Y pi_arm`` (``arm_pi`` default: the model's
    own :attr:`~RobotModel.parameters`, friction columns included when the model has
    them; a vector of the inertial part alone is accepted), plus ``friction =
    (viscous, coulomb)`` per joint when given (see the module docstring)."""
    q, qd, qdd = (np.atleast_2d(np.asarray(a, dtype=float)) for a in (q, qd, qdd))
    return _arm_torque(model, model.regressor_batch(q, qd, qdd), qd, arm_pi, friction)


def _arm_torque(model, Y, qd, arm_pi, friction):
    """:func:`arm_torque` from the standard regressor ``Y`` (N x n x n_params) at the samples."""
    n, P = model.n, model.n_inertial
    pi = model.parameters if arm_pi is None else np.asarray(arm_pi, dtype=float).reshape(-1)
    if pi.size not in (P, model.n_params) or not np.all(np.isfinite(pi)):
        raise ValueError(f"arm_pi must be {model.n_params} finite values (the model's parameters"
                         f"{' with friction columns' if model.friction else ''}) or {P} (inertial only),"
                         f" got {pi.size}")
    tau = Y[:, :, :pi.size] @ pi
    if friction is not None:
        fv, fc = (np.asarray(x, dtype=float).reshape(-1) for x in friction)
        if fv.shape != (n,) or fc.shape != (n,) or not (np.isfinite(fv).all() and np.isfinite(fc).all()):
            raise ValueError(f"friction must be (viscous, coulomb) with {n} finite values each,"
                             f" got {fv.size} and {fc.size}")
        if pi.size > P and np.any(pi[P:]):
            raise ValueError("arm_pi already carries friction columns: pass friction=None (it would count twice)")
        eps = model.coulomb_smoothing
        tau = tau + fv * qd + fc * (np.tanh(qd / eps) if eps > 0 else np.sign(qd))
    return tau


def _frame_of(model, frame):
    """(frame name, parameter block, joint-frame placement of the frame)."""
    name = frame or model.ee_frame
    fid = model.frame_id(name)
    f = model.model.frames[fid]
    if f.parentJoint < 1:
        raise ValueError(f"frame {name!r} is fixed to the base, not to a moving link: no payload can be seen there")
    return name, int(f.parentJoint) - 1, f.placement


def _in_frame(pi_link, placement):
    """(pi_frame, mass, com, inertia about the com) of a joint-frame 10-vector re-expressed
    in the frame at ``placement`` (pinocchio ``actInv``); a non-positive mass (a raw
    least-squares estimate) has no centre of mass: NaN."""
    import pinocchio as pin

    m = float(pi_link[0])
    if m > 0:
        I_f = placement.actInv(pin.Inertia.FromDynamicParameters(np.asarray(pi_link, dtype=float)))
        Ic = np.array(I_f.inertia)
        return np.array(I_f.toDynamicParameters()), float(I_f.mass), np.array(I_f.lever), 0.5 * (Ic + Ic.T)
    inv = placement.inverse()
    pi_f = transform_matrix(inv.rotation, inv.translation) @ pi_link
    return pi_f, float(pi_f[0]), np.full(3, np.nan), np.full((3, 3), np.nan)


def _delta_std(pi_f, cov_f):
    """1-sigma of mass, com (3) and the inertia about the com (xx, xy, xz, yy, yz, zz) from
    the covariance of a frame 10-vector (first order)."""
    m, h = pi_f[0], pi_f[1:4]
    if not m > 0 or not np.all(np.isfinite(cov_f)):
        return float("nan"), np.full(3, np.nan), np.full(6, np.nan)
    S = h @ h * np.eye(3) - np.outer(h, h)
    Jc = np.zeros((3, 10))
    JI = np.zeros((6, 10))
    iu = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))
    for k in range(10):                       # d/d pi_k of c = h/m and Ic = I_o - S(h)/m
        e = np.zeros(10)
        e[k] = 1.0
        dm, dh = e[0], e[1:4]
        Jc[:, k] = dh / m - h * dm / m ** 2
        dS = 2.0 * (h @ dh) * np.eye(3) - np.outer(dh, h) - np.outer(h, dh)
        dI = inertia_matrix(e) - dS / m + S * dm / m ** 2
        JI[:, k] = [dI[a, b] for a, b in iu]
    var_c = np.einsum("ik,kl,il->i", Jc, cov_f, Jc)
    var_I = np.einsum("ik,kl,il->i", JI, cov_f, JI)
    return (float(np.sqrt(max(cov_f[0, 0], 0.0))), np.sqrt(np.maximum(var_c, 0.0)), np.sqrt(np.maximum(var_I, 0.0)))


def _consistent(R, z, scale, min_mass, solver):
    """min |R xs - z|^2 s.t. J(x[:10]) >= 0, x[0] >= min_mass, x = xs / scale (cvxpy SDP)."""
    import cvxpy as cp

    p = R.shape[1]
    xs = cp.Variable(p)
    x = cp.multiply(1.0 / scale, xs)
    E = _pseudo_inertia_basis()
    J = sum(x[k] * E[k] for k in range(10))
    cons = [0.5 * (J + J.T) >> 0, x[0] >= min_mass]
    # a vanishing ridge keeps the program strictly convex where the data leave a direction free
    prob = cp.Problem(cp.Minimize(cp.sum_squares(R @ xs - z) + 1e-10 * cp.sum_squares(xs)), cons)
    return solve_sdp(prob, xs, solver, "consistent payload identification") / scale


def _coulomb_joints(model, arm_pi, friction) -> np.ndarray:
    """Which joints the fixed arm gives a Coulomb friction (a non-zero coefficient)."""
    n, P = model.n, model.n_inertial
    fc = np.zeros(n)
    if friction is not None:
        fc = fc + np.abs(np.asarray(friction[1], dtype=float).reshape(-1))
    pi = model.parameters if arm_pi is None else np.asarray(arm_pi, dtype=float).reshape(-1)
    if pi.size == P + 2 * n:
        fc = fc + np.abs(pi[P + n:])
    return fc > 0


def identify_payload(model, q, qd, qdd, tau, *, arm_pi=None, frame: str | None = None, friction=None,
                     offset: bool = True, consistent: bool = True, weighted: bool = True,
                     min_velocity: float = MIN_VELOCITY, min_mass: float = 1e-3, solver: str | None = None
                     ) -> PayloadEstimate:
    """The 10 inertial parameters of a rigid load fixed to ``frame`` (default
    ``model.ee_frame``) with the arm's model held fixed (see the module docstring).

    ``model``: a :class:`~adaptive_dynamics.dynamics.RobotModel` (the arm; with
    ``friction=True`` when ``arm_pi`` carries friction columns).  ``q, qd, qdd, tau``:
    samples (N x n), e.g. from :func:`~adaptive_dynamics.dynamics.identification.prepare`.
    ``arm_pi``: the arm's parameters (default ``model.parameters``: the URDF's, plus the
    model's friction columns).  ``friction``: ``(viscous, coulomb)`` per joint added to the
    arm's torque (for an ``arm_pi`` without friction).  ``offset``: also a constant torque
    per joint.  ``min_velocity`` [rad/s]: a joint to which the arm gives Coulomb friction
    is left out of the fit at the samples where it moves slower than this (near rest its
    friction is anything between the break-away levels, which no friction law predicts:
    a joint held still while the wrist moves is left out altogether); its offset is then
    the mean of what the arm and the payload leave on it.  ``0`` keeps every sample.
    ``consistent``: the physically consistent estimate (pseudo-inertia positive
    semidefinite, mass >= ``min_mass`` [kg]); ``False``: the weighted least squares as it
    is.  ``weighted``: rows of each joint scaled by the inverse residual standard
    deviation of an unweighted pass.  ``solver``: a cvxpy solver name (default Clarabel,
    else SCS)."""

    q, qd, qdd, tau = _check(model, q, qd, qdd, tau)
    n, N = model.n, q.shape[0]
    name, block, placement = _frame_of(model, frame)
    if not min_mass >= 0:
        raise ValueError(f"min_mass must be >= 0 [kg], got {min_mass}")
    if not min_velocity >= 0:
        raise ValueError(f"min_velocity must be >= 0 [rad/s], got {min_velocity}")
    Y = model.regressor_batch(q, qd, qdd)
    r = tau - _arm_torque(model, Y, qd, arm_pi, friction)
    YL = np.ascontiguousarray(Y[:, :, 10 * block: 10 * block + 10])          # Y_L
    del Y
    # the rows (sample, joint) the fit uses: not where a joint with Coulomb friction is near rest
    keep = np.ones((N, n), dtype=bool)
    if min_velocity > 0:
        keep &= ~(_coulomb_joints(model, arm_pi, friction)[None, :] & (np.abs(qd) < min_velocity))
    rows_used = keep.sum(axis=0)
    k = keep.reshape(-1)
    joint = np.tile(np.arange(n), N)[k]
    off_joints = np.flatnonzero(rows_used > 0) if offset else np.zeros(0, dtype=np.int64)
    A = YL.reshape(N * n, 10)[k]
    if offset:
        A = np.concatenate([A, (joint[:, None] == off_joints[None, :]).astype(float)], axis=1)
    y = r.reshape(-1)[k]
    p = A.shape[1]
    if y.size < 3 * p:
        moving = f" moving faster than {min_velocity:g} rad/s" if min_velocity > 0 else ""
        raise ValueError(f"{y.size} usable rows (samples x joints{moving}) are too few for {p} parameters:"
                         " record a longer or faster motion")
    scale = np.linalg.norm(A, axis=0)
    if np.any(scale <= 1e-12 * max(float(scale.max()), 1e-300)):
        raise ValueError("the recording does not excite the payload's parameters (no motion of the link the"
                         f" frame is fixed to?): columns {np.flatnonzero(scale <= 1e-12 * scale.max()).tolist()}")

    def solve(w):
        Aw = A * w[joint][:, None] / scale
        sol, *_ = np.linalg.lstsq(Aw, y * w[joint], rcond=None)
        return sol / scale, Aw

    w = np.ones(n)
    x, Aw = solve(w)
    if weighted:
        res = y - A @ x
        sd = np.sqrt(np.bincount(joint, res * res, minlength=n) / np.maximum(rows_used, 1))
        sd_max = float(sd[rows_used > 0].max())
        w = 1.0 / np.maximum(sd, 1e-6 * max(sd_max, 1e-12))
        x, Aw = solve(w)
    res_w = (y - A @ x) * w[joint]
    sv = np.linalg.svd(Aw, compute_uv=False)
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    sigma2 = float(res_w @ res_w) / max(y.size - p, 1)
    try:
        cov = sigma2 * np.linalg.inv(Aw.T @ Aw) / np.outer(scale, scale)
    except np.linalg.LinAlgError:
        cov = np.full((p, p), np.inf)

    inv = placement.inverse()
    L = transform_matrix(inv.rotation, inv.translation)          # pi_frame = L pi_link (linear)
    _, ls_m, ls_c, ls_I = _in_frame(x[:10], placement)
    least_squares = {"mass": ls_m, "com": ls_c, "inertia": ls_I}
    method = "least_squares"
    feasible = x[0] >= min_mass and np.linalg.eigvalsh(pseudo_inertia(x[:10]))[0] >= 0.0
    if consistent and not feasible:
        Qm, Rm = np.linalg.qr(Aw)
        x = _consistent(Rm, Qm.T @ (y * w[joint]), scale, min_mass, solver)
        method = "consistent"
    pi_link = x[:10].copy()
    fit = r - YL @ pi_link                                    # what the arm and the payload leave (N, n)
    off, off_std = np.zeros(0), np.zeros(0)
    if offset:
        off, off_std = np.zeros(n), np.zeros(n)
        off[off_joints] = x[10:]
        off_std[off_joints] = np.sqrt(np.maximum(np.diag(cov)[10:], 0.0))
        rest = np.setdiff1d(np.arange(n), off_joints)         # joints left out altogether: the mean
        off[rest] = fit[:, rest].mean(axis=0)
        off_std[rest] = fit[:, rest].std(axis=0) / np.sqrt(N)
        fit = fit - off
    pi_f, mass, com, Ic = _in_frame(pi_link, placement)
    m_std, c_std, I_std = _delta_std(pi_f, L @ cov[:10, :10] @ L.T)   # at the estimate, the LS covariance
    return PayloadEstimate(
        frame=name, link=model.link_names[block], block=block, mass=mass, com=com, inertia=Ic, pi_frame=pi_f,
        pi_link=pi_link, offset=off, method=method,
        min_pseudo_inertia_eig=float(np.linalg.eigvalsh(pseudo_inertia(pi_link))[0]),
        residual_rmse=np.sqrt(np.mean(fit * fit, axis=0)), arm_residual_rmse=np.sqrt(np.mean(r * r, axis=0)),
        samples=N, condition=cond, mass_std=m_std, com_std=c_std, inertia_std=I_std, offset_std=off_std,
        rows_used=rows_used, least_squares=least_squares)
