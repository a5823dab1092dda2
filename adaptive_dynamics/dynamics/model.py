"""RobotModel: URDF -> pinocchio, inertial parameters and every regressor.

Conventions (all documented in the README "Dynamics core" section):

* Joint order is the URDF chain order (pinocchio's).  Only 1-DoF revolute/prismatic
  joints are supported (a fixed-base serial or tree arm).
* pi stacks 10 inertial parameters per joint-moving link in pinocchio order
  ``[m, mcx, mcy, mcz, Ixx, Ixy, Iyy, Ixz, Iyz, Izz]`` (inertia about the link frame
  origin), then, when ``friction=True``, ``n`` viscous and ``n`` Coulomb coefficients.
* C(q, v) is the Christoffel-consistent Coriolis matrix (pinocchio's
  ``computeCoriolisMatrix``): C(q, v) w = C(q, w) v, Mdot = C + C^T, and
  Mdot - 2C is skew-symmetric.  The Slotine-Li regressor uses the same C.

The Slotine-Li regressor runs as one compiled (numba) Newton-Euler pass when numba is
available (:mod:`._slotine_li_compiled`), else as two calls of pinocchio's regressor
(polarisation); both give the same Y to rounding.  The kernel is loaded on first use
(or by :meth:`RobotModel.warm_up`).

Hot-path functions call pinocchio's C++ regressor directly and check for NaN/inf by
inspecting a few output entries that together depend on every input (see
``_choose_probes``); on any
failure the slow path re-validates the inputs and raises a ``ValueError`` that names
the offending argument.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pinocchio as pin

from ..robots import default_ee_frame, end_effector_links, strip_inertials, urdf_path
from ..validation import as_vector, valid_vectors
from . import _slotine_li_compiled as slc
from .base_parameters import BaseParameters
from .continuous import is_continuous, unbind_continuous
from .filtered import FilteredRegressor
from .inertial import check_physical_consistency, PhysicalConsistencyError, PINOCCHIO_ORDER, transform_matrix
from .parameter_change import _LinearInertias, ShiftedParameterChange
from .thunder_params import load_thunder_parameters, save_thunder_parameters

_REFERENCE_FRAMES = {
    "world": pin.ReferenceFrame.WORLD,
    "local": pin.ReferenceFrame.LOCAL,
    "local_world_aligned": pin.ReferenceFrame.LOCAL_WORLD_ALIGNED,
}


@dataclass
class Payload:
    """A rigid payload attached to ``frame`` (10-vector in that frame's coordinates)."""

    frame: str
    parameters: np.ndarray  # pinocchio order, about the frame origin
    link_index: int          # which joint-moving link carries it
    transform: np.ndarray    # 10x10, payload-frame params -> link-frame params


_STRICT_UPPER: dict = {}   # n -> the strict upper triangle's (rows, cols)


def _sym(M):
    """Symmetrise from the upper triangle (pinocchio fills at least the upper part): a copy
    with the upper part mirrored into the lower one, ``+ 0.0`` as the sum of the two
    triangles this replaces gave (-0.0 -> 0.0; bit-identical to it, a seventh of its time)."""
    n = M.shape[0]
    iu = _STRICT_UPPER.get(n)
    if iu is None:
        iu = _STRICT_UPPER.setdefault(n, np.triu_indices(n, 1))
    out = np.array(M, dtype=float)      # pinocchio reuses its buffer: a copy
    out[iu[1], iu[0]] = out[iu]
    out += 0.0
    return out


class RobotModel:
    """Rigid-body model of a fixed-base arm with all the regressors adaptive control needs.

    Parameters
    ----------
    urdf:
        Path to a URDF file, a URDF XML string, a robot name known to
        :mod:`adaptive_dynamics.robots` (``"panda"``, ``"iiwa14"``, ``"planar2"``), or a
        ``pinocchio.Model`` (copied).
    ee_frame:
        Name of the end-effector frame (default: the one the robot's parameter file names
        -- a shipped robot, or a URDF :func:`~adaptive_dynamics.robot_setup.resolve_robot` wrote
        -- else the last frame of the model).
    friction:
        Append viscous and Coulomb friction columns (``n`` each) to every regressor
        and to pi.
    coulomb_smoothing:
        Velocity scale [rad/s] of the Coulomb term ``tanh(v / eps)``; ``0`` (default)
        uses ``sign(v)``.
    gravity:
        Gravity vector in the base frame [m/s^2].
    end_effector:
        ``"hand"`` (default): the bodies with mass that the URDF fixes after its last
        moving joint (the Franka Hand of the Panda, a tool: :attr:`end_effector_links`)
        are part of the model, kept as their own 10 parameters
        (:meth:`end_effector_parameters`) rather than merged into the last link;
        ``"none"``: the arm without them (a robot run without its hand).
        :meth:`set_end_effector` switches later.
    """

    def __init__(self, urdf, *, ee_frame: str | None = None, friction: bool = False,
                 coulomb_smoothing: float = 0.0, gravity=(0.0, 0.0, -9.81), end_effector: str = "hand"):
        text = None
        if isinstance(urdf, pin.Model):
            self.urdf_path, model = None, urdf.copy()
        else:
            self.urdf_path, model = _load_pinocchio_model(urdf)
            text = os.fspath(urdf) if self.urdf_path is None else None
        for j in range(1, model.njoints):
            if model.joints[j].nq != 1 or model.joints[j].nv != 1:
                raise ValueError(
                    f"joint {model.names[j]!r} has nq={model.joints[j].nq}, nv={model.joints[j].nv}:"
                    " only 1-DoF revolute/prismatic/continuous joints are supported")
        model.gravity.linear = np.asarray(gravity, dtype=float).reshape(3)
        self.model = model
        self.data = model.createData()
        self.n = model.nv
        self.joint_names = [model.names[j] for j in range(1, model.njoints)]
        self.link_names = [self._child_link(j) for j in range(1, model.njoints)]
        self.lower = np.array(model.lowerPositionLimit, dtype=float)
        self.upper = np.array(model.upperPositionLimit, dtype=float)
        #: the URDF's continuous joints (revolute without position limits: one angle each)
        self.continuous = is_continuous(self.lower, self.upper)
        self.velocity_limit = np.array(model.velocityLimit, dtype=float)
        self.effort_limit = np.array(model.effortLimit, dtype=float)
        self.friction = bool(friction)
        self.coulomb_smoothing = float(coulomb_smoothing)
        if self.coulomb_smoothing < 0 or not math.isfinite(self.coulomb_smoothing):
            raise ValueError(f"coulomb_smoothing must be >= 0, got {coulomb_smoothing!r}")
        self.n_inertial = 10 * self.n
        self.n_params = self.n_inertial + (2 * self.n if self.friction else 0)

        # kinematics-only copies: gravity on / off (regressors do not depend on pi)
        self._mg = model.copy()
        self._dg = self._mg.createData()
        self._m0 = model.copy()
        self._m0.gravity.setZero()
        self._d0 = self._m0.createData()
        self._zero = np.zeros(self.n)
        self._half_sum = np.empty(self.n)
        self._half_diff = np.empty(self.n)
        self._probes = self._choose_probes()

        if ee_frame is None and isinstance(urdf, (str, os.PathLike)) and text is None:
            ee_frame = default_ee_frame(os.fspath(urdf))
        if ee_frame is None:
            ee_frame = model.frames[model.nframes - 1].name
        self.ee_frame = ee_frame
        self._ee_id = self.frame_id(ee_frame)

        self._lin = _LinearInertias(model, self.n)
        self._delta = ShiftedParameterChange(model, self.n)
        self._link_pi = np.concatenate(
            [model.inertias[j].toDynamicParameters() for j in range(1, model.njoints)])
        self._split_end_effector(text)
        self.set_end_effector(end_effector, _sync=False)
        self._friction_pi = np.zeros(2 * self.n) if self.friction else np.zeros(0)
        self._payload: Payload | None = None
        self._sync()
        self._bind_hot_paths()

    # ------------------------------------------------------------------ structure
    def _child_link(self, joint_id: int) -> str:
        """Name of the link moved by ``joint_id`` (its first BODY frame)."""
        for f in self.model.frames:
            if f.type == pin.FrameType.BODY and f.parentJoint == joint_id:
                return f.name
        return self.model.names[joint_id]

    def frame_id(self, name: str) -> int:
        if not self.model.existFrame(name):
            names = [f.name for f in self.model.frames]
            raise ValueError(f"unknown frame {name!r}; frames in this model: {names}")
        return self.model.getFrameId(name)

    @property
    def parameter_names(self) -> list[str]:
        names = [f"{link}.{p}" for link in self.link_names for p in PINOCCHIO_ORDER]
        if self.friction:
            names += [f"{j}.fv" for j in self.joint_names] + [f"{j}.fc" for j in self.joint_names]
        return names

    def joint_index(self, names) -> np.ndarray:
        """Indices into the model's joint order for ``names`` (matched by name).

        Raises ``ValueError`` listing missing and unexpected joints.
        """
        names = list(names)
        missing = [j for j in self.joint_names if j not in names]
        extra = [j for j in names if j not in self.joint_names]
        if missing or extra or len(names) != len(set(names)):
            raise ValueError(f"joint names do not match the model: missing {missing}, unexpected {extra},"
                             f" duplicates {len(names) - len(set(names))}; model joints: {self.joint_names}")
        pos = {j: k for k, j in enumerate(names)}
        return np.array([pos[j] for j in self.joint_names])

    # ----------------------------------------------------------------- parameters
    @property
    def parameters(self) -> np.ndarray:
        """Effective pi (links + end effector + payload, then friction): what the
        regressors multiply."""
        return np.concatenate([self._effective_link_pi(), self._friction_pi])

    @property
    def link_parameters(self) -> np.ndarray:
        """Inertial parameters of the links alone (without the end effector and the
        payload)."""
        return self._link_pi.copy()

    def set_parameters(self, pi, *, check: bool = True) -> None:
        """Set the effective pi (length ``n_params``; the payload, if any, is cleared).

        With ``check=True`` every link must be physically consistent (mass > 0,
        pseudo-inertia positive definite); the error names the link.  ``check=False``
        accepts any finite vector (adaptive estimates need not be physical).
        """
        pi = as_vector(pi, self.n_params, "pi")
        if check:
            check_physical_consistency(pi[: self.n_inertial], self.link_names)
        self._payload = None
        self._link_pi = pi[: self.n_inertial].copy()
        if self.end_effector == "hand":         # the end effector stays declared: the links are the rest
            self._link_pi[-10:] -= self._ee_pi
        self._friction_pi = pi[self.n_inertial:].copy()
        self._sync()

    def set_link_parameters(self, link: str, pi10, *, check: bool = True) -> None:
        i = self._link_index(link)
        blk = as_vector(pi10, 10, f"pi10 of {link!r}")
        if check:
            check_physical_consistency(blk, [link])
        self._link_pi[10 * i: 10 * i + 10] = blk
        if i == self.n - 1 and self.end_effector == "hand":   # as get_link_parameters: the end effector included
            self._link_pi[10 * i: 10 * i + 10] -= self._ee_pi
        self._sync()

    def parameters_with_links(self, link_pi) -> np.ndarray:
        """The effective pi (as :attr:`parameters`) this model would have after
        :meth:`set_link_parameters` of every link with its block of ``link_pi`` -- the model
        itself is not changed (the end effector and payload kept as they are)."""
        blk = as_vector(link_pi, self.n_inertial, "link_pi")
        held = self._link_pi.copy()
        if self.end_effector == "hand":
            held[-10:] += self._ee_pi
        pi = self.parameters
        pi[: self.n_inertial] += blk - held
        return pi

    def get_link_parameters(self, link: str) -> np.ndarray:
        i = self._link_index(link)
        return self._effective_link_pi()[10 * i: 10 * i + 10].copy()

    def load_thunder_yaml(self, path, *, check: bool = True, frames=None) -> dict:
        """Link parameters from a Thunder Dynamics ``*_inertial_REG.yaml`` file (its
        ``load_conf``); see :mod:`~adaptive_dynamics.dynamics.thunder_params` (``frames``:
        the frame a link's block is expressed in, where Thunder's differs)."""
        return load_thunder_parameters(self, path, check=check, frames=frames)

    def save_thunder_yaml(self, path, comment: str = "", *, frames=None) -> str:
        """The link parameters as a Thunder ``*_inertial_REG.yaml`` file (its ``save_par_REG``)."""
        return save_thunder_parameters(self, path, comment, frames=frames)

    def set_friction(self, viscous, coulomb) -> None:
        if not self.friction:
            raise ValueError("this model was built with friction=False; rebuild with friction=True")
        fv = as_vector(viscous, self.n, "viscous")
        fc = as_vector(coulomb, self.n, "coulomb")
        self._friction_pi = np.concatenate([fv, fc])

    # ------------------------------------------------------------ end effector
    def _split_end_effector(self, text: str | None) -> None:
        """Separate the end-effector bodies (fixed after the last moving joint) from the
        last link: the URDF built without their inertials gives the links alone, the
        difference (in the last joint's frame) is the end effector's 10 parameters."""
        self.end_effector_links: list[str] = []
        self._ee_pi = np.zeros(10)
        if text is None and self.urdf_path is not None:
            with open(self.urdf_path, encoding="utf-8") as fh:
                text = fh.read()
        if text is None:
            return
        links = end_effector_links(text, self.model)
        if not links:
            return
        bare = pin.buildModelFromXML(unbind_continuous(strip_inertials(text, links))[0])
        if bare.njoints != self.model.njoints:  # pragma: no cover - the same kinematic tree
            raise RuntimeError("the URDF without its end-effector inertials has another joint structure")
        pi_bare = np.concatenate([bare.inertias[j].toDynamicParameters() for j in range(1, bare.njoints)])
        diff = self._link_pi - pi_bare
        if np.abs(diff[:-10]).max(initial=0.0) > 1e-9 * max(1.0, np.abs(self._link_pi).max()):
            import warnings
            warnings.warn(f"end-effector bodies {links} change other links than the last: kept merged",
                          RuntimeWarning, stacklevel=3)   # pragma: no cover - end_effector_links picks the last
            return
        self.end_effector_links = links
        self._ee_pi = diff[-10:].copy()
        self._link_pi = pi_bare

    def end_effector_parameters(self) -> np.ndarray | None:
        """The end effector's 10 parameters (pinocchio order, about the last joint's
        frame), or None when the URDF has no end-effector bodies."""
        return self._ee_pi.copy() if self.end_effector_links else None

    def set_end_effector(self, kind: str, *, _sync: bool = True) -> None:
        """``"hand"``: the URDF's end-effector bodies are part of the model; ``"none"``:
        the arm without them (the payload, if any, stays)."""
        if kind not in ("hand", "none"):
            raise ValueError(f"end_effector must be 'hand' (the URDF's end-effector bodies"
                             f"{': ' + ', '.join(self.end_effector_links) if self.end_effector_links else ''})"
                             f" or 'none', got {kind!r}")
        self.end_effector = kind
        if _sync:
            self._sync()

    def set_payload(self, pi10, frame: str | None = None, *, check: bool = True) -> None:
        """Attach a rigid payload (10-vector about ``frame``'s origin, in its axes).

        ``frame`` defaults to the end-effector frame.  It is added to the parameters of
        the link that carries the frame, so every dynamics quantity includes it while
        :attr:`link_parameters` and :meth:`payload_parameters` keep it separate.
        """
        frame = frame or self.ee_frame
        fid = self.frame_id(frame)
        blk = as_vector(pi10, 10, "payload pi10")
        if check:
            check_physical_consistency(blk, [f"payload@{frame}"])
        f = self.model.frames[fid]
        X = f.placement  # frame placement in its parent joint frame
        L = transform_matrix(X.rotation, X.translation)
        self._payload = Payload(frame, blk.copy(), f.parentJoint - 1, L)
        self._sync()

    def clear_payload(self) -> None:
        self._payload = None
        self._sync()

    def payload_parameters(self) -> np.ndarray | None:
        return None if self._payload is None else self._payload.parameters.copy()

    def payload_regressor(self, Y: np.ndarray) -> np.ndarray:
        """Columns that multiply the payload's own 10 parameters, from a full regressor
        ``Y`` (any of the regressors): ``Y[:, link block] @ L``."""
        if self._payload is None:
            raise ValueError("no payload attached; call set_payload first")
        i = self._payload.link_index
        return Y[:, 10 * i: 10 * i + 10] @ self._payload.transform

    def link_block(self, name: str) -> int:
        """Index of the parameter block (10 columns from ``10 * index``) that holds link
        ``name``'s inertia: a moving link, or a body fixed to one (the end effector's
        bodies, such as the Panda's ``panda_hand``, are part of the last link's block)."""
        if name in self.link_names:
            return self.link_names.index(name)
        if self.model.existFrame(name):
            f = self.model.frames[self.model.getFrameId(name)]
            if f.type == pin.FrameType.BODY and f.parentJoint > 0:
                return f.parentJoint - 1
        raise ValueError(f"unknown link {name!r}; moving links: {self.link_names}"
                         + (f", end-effector bodies (part of {self.link_names[-1]}): {self.end_effector_links}"
                            if self.end_effector_links else ""))

    def _link_index(self, link: str) -> int:
        try:
            return self.link_names.index(link)
        except ValueError:
            raise ValueError(f"unknown link {link!r}; links: {self.link_names}") from None

    def _effective_link_pi(self) -> np.ndarray:
        pi = self._link_pi.copy()
        if self.end_effector == "hand":
            pi[-10:] += self._ee_pi
        if self._payload is not None:
            i = self._payload.link_index
            pi[10 * i: 10 * i + 10] += self._payload.transform @ self._payload.parameters
        return pi

    def _sync(self) -> None:
        self._lin.set(self._effective_link_pi())

    # ------------------------------------------------------------ rigid-body terms
    def _state(self, **named):
        n = self.n
        return tuple([as_vector(v, n, k) for k, v in named.items()])

    def mass_matrix(self, q) -> np.ndarray:
        (q,) = self._state(q=q)
        return _sym(self._lin.eval(pin.crba, q))

    def coriolis_matrix(self, q, v) -> np.ndarray:
        q, v = self._state(q=q, v=v)
        return np.array(self._lin.eval(pin.computeCoriolisMatrix, q, v))

    def mass_matrix_dot(self, q, v) -> np.ndarray:
        """dM/dt along velocity v: Mdot = C + C^T (exact for the Christoffel C)."""
        C = self.coriolis_matrix(q, v)
        return C + C.T

    def gravity(self, q) -> np.ndarray:
        (q,) = self._state(q=q)
        return np.array(self._lin.eval(pin.computeGeneralizedGravity, q))

    def gravity_dot(self, q, v) -> np.ndarray:
        """dg/dt along velocity v: (dg/dq) v, from pinocchio's analytical gravity
        derivatives (Thunder's ``get_G_dot``)."""
        q, v = self._state(q=q, v=v)
        return np.asarray(self._lin.eval(_gravity_dq, q)) @ v

    def coriolis_matrix_dot(self, q, v, a) -> np.ndarray:
        """dC/dt along a motion with velocity v and acceleration a (Thunder's ``get_C_dot``),
        analytically from pinocchio's RNEA derivatives.

        pinocchio's C is the Christoffel one, bilinear through the quadratic
        ``h(q, x) = C(q, x) x = tau(q, x, 0) - g(q)``: ``C(q, v) e_j = (h(q, v + e_j) -
        h(q, v - e_j)) / 4``.  Hence ``dC/dt e_j = (dh/dq(q, v + e_j) - dh/dq(q, v - e_j)) v / 4
        + C(q, a) e_j`` (C is linear in its velocity argument), with ``dh/dq = dtau/dq`` at
        zero acceleration (g cancels): 2n RNEA-derivative calls."""
        q, v, a = self._state(q=q, v=v, a=a)
        n = self.n
        out = np.array(self._lin.eval(pin.computeCoriolisMatrix, q, a))
        e = np.zeros(n)
        for j in range(n):
            e[j] = 1.0
            plus = np.asarray(self._lin.eval(_rnea_dq, q, v + e))
            minus = np.asarray(self._lin.eval(_rnea_dq, q, v - e))
            out[:, j] += 0.25 * ((plus - minus) @ v)
            e[j] = 0.0
        return out

    def friction_torque(self, v) -> np.ndarray:
        (v,) = self._state(v=v)
        if not self.friction:
            return np.zeros(self.n)
        fv, fc = self._friction_pi[: self.n], self._friction_pi[self.n:]
        return fv * v + fc * self._coulomb(v)

    def inverse_dynamics(self, q, v, a) -> np.ndarray:
        """tau = M a + C v + g (+ friction when enabled) for the current pi."""
        if not valid_vectors(self.n, q, v, a):   # one test for the hot path's valid arrays
            n = self.n
            q, v, a = as_vector(q, n, "q"), as_vector(v, n, "v"), as_vector(a, n, "a")
        tau = np.array(self._lin.eval(pin.rnea, q, v, a))
        if self.friction:
            tau += self.friction_torque(v)
        return tau

    def _coulomb(self, v):
        eps = self.coulomb_smoothing
        return np.tanh(v / eps) if eps > 0 else np.sign(v)

    def _coulomb_slope(self, v):
        eps = self.coulomb_smoothing
        return (1.0 - np.tanh(v / eps) ** 2) / eps if eps > 0 else np.zeros_like(v)

    # ---------------------------------------------------------------- kinematics
    def frame_pose(self, q, frame: str | None = None) -> np.ndarray:
        """4x4 homogeneous transform of ``frame`` (default: end effector) in the base frame."""
        (q,) = self._state(q=q)
        fid = self._ee_id if frame is None else self.frame_id(frame)
        pin.framesForwardKinematics(self._mg, self._dg, q)
        return self._dg.oMf[fid].homogeneous.copy()

    def jacobian(self, q, frame: str | None = None, reference: str = "local_world_aligned") -> np.ndarray:
        """6xn geometric Jacobian [linear; angular] of ``frame`` (default end effector).

        ``reference``: ``"local_world_aligned"`` (frame origin, world axes; default),
        ``"world"`` (spatial, world origin) or ``"local"`` (body frame).
        """
        (q,) = self._state(q=q)
        fid = self._ee_id if frame is None else self.frame_id(frame)
        return pin.computeFrameJacobian(self._mg, self._dg, q, fid, self._ref(reference)).copy()

    def jacobian_dot(self, q, v, frame: str | None = None, reference: str = "local_world_aligned") -> np.ndarray:
        """Time derivative of :meth:`jacobian` along velocity v."""
        q, v = self._state(q=q, v=v)
        fid = self._ee_id if frame is None else self.frame_id(frame)
        pin.computeJointJacobiansTimeVariation(self._mg, self._dg, q, v)
        pin.updateFramePlacements(self._mg, self._dg)
        return pin.getFrameJacobianTimeVariation(self._mg, self._dg, fid, self._ref(reference)).copy()

    @staticmethod
    def _ref(reference: str):
        try:
            return _REFERENCE_FRAMES[reference]
        except KeyError:
            raise ValueError(f"reference must be one of {sorted(_REFERENCE_FRAMES)}, got {reference!r}") from None

    # ---------------------------------------------------------------- regressors
    def regressor(self, q, v, a) -> np.ndarray:
        """Standard regressor Y(q, v, a) with Y pi = M a + C v + g (+ friction).

        Returns a new ``n x n_params`` array.  (Replaced per instance by a closure
        built in :meth:`_bind_hot_paths`; this body documents and defines it.)
        """
        return self._regressor_fast(q, v, a)

    def regressor_batch(self, Q, V, A, *, base=None) -> np.ndarray:
        """Standard regressors of K samples at once: ``Y[k] = regressor(Q[k], V[k], A[k])``
        (K x n x n_params), or with ``base`` (a :class:`~.base_parameters.BaseParameters`
        of this model, or True for :meth:`base_parameters`) the base regressors: the
        ``base.index`` columns, ``Y[k] @ base.projector`` (K x n x n_base).

        ``Q, V, A``: K x n (one sample: n values).  One compiled call for all samples
        (the kernel of :meth:`slotine_li_regressor` with vr = v, ar = a), else one
        pinocchio call per sample.  A non-finite or misshaped input raises ValueError
        naming the first bad sample."""
        Q, V, A = (np.ascontiguousarray(np.atleast_2d(np.asarray(x, dtype=float))) for x in (Q, V, A))
        n = self.n
        if not (Q.shape == V.shape == A.shape and Q.ndim == 2 and Q.shape[1] == n):
            raise ValueError(f"regressor_batch: Q, V, A must be K x {n}, got {Q.shape}, {V.shape}, {A.shape}")
        ok = np.isfinite(Q).all(1) & np.isfinite(V).all(1) & np.isfinite(A).all(1)
        if not ok.all():
            k = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"regressor_batch: sample {k} (of {len(ok)}) has a non-finite q, v or a"
                             f" ({int((~ok).sum())} such samples)")
        K = Q.shape[0]
        self._resolve_slotine_li()
        Y = np.empty((K, n, self.n_params))
        batch = None
        if self._sl_impl == "compiled":
            batch = slc.load_regressor_batch()
        if batch is not None:
            batch(Q, V, V, A, self._sl_geo, self._sl_work, Y)
        else:
            for k in range(K):
                Y[k] = self.regressor(Q[k], V[k], A[k])
        if base is None or base is False:
            return Y
        if base is True:
            base = self.base_parameters()
        return Y[:, :, base.index]

    def slotine_li_regressor(self, q, v, vr, ar) -> np.ndarray:
        """Slotine-Li regressor: Y pi = M(q) ar + C(q, v) vr + g(q) (+ friction at v).

        C is the Christoffel-consistent C of :meth:`coriolis_matrix`.  Default
        implementation (``slotine_li_implementation == "compiled"``): one numba-compiled
        Newton-Euler pass carrying both velocity fields, with every velocity product
        symmetrised, ``(V x S vr + Vr x S v)/2`` and ``(V x* I Vr + Vr x* I V)/2``
        (see :mod:`._slotine_li_compiled`).  Fallback (``"polarised"``, when numba is
        unavailable): the polarisation identity C(q, v) vr = N((v + vr)/2) - N((v - vr)/2)
        with N(w) = C(q, w) w, i.e. Y_SL = Y_g(q, (v+vr)/2, ar) - Y_0(q, (v-vr)/2, 0),
        where Y_0 is the regressor with gravity switched off: two calls of pinocchio's
        regressor.  Both are exact and agree to rounding.
        Returns a new ``n x n_params`` array.
        """
        return self._slotine_li_fast(q, v, vr, ar)

    def _choose_probes(self) -> tuple:
        """Pick the fewest entries of Y whose sum is non-finite whenever any entry of
        q, v or a is (NaN/inf checking on the hot path at ~0.06 us per probe).

        Candidates are row 0 (first joint) of the last link's block: it is a product
        of every joint placement and carries the last link's velocity and
        acceleration.  Which of its columns see which input depends on the joint
        types (pinocchio's axis-specialised RX/RY/RZ joints never touch the other
        components), so coverage is established here by propagating a NaN from every
        input entry, and a greedy set cover picks the probes.  Returned as flat
        indices into the C-ordered n x 10n regressor.
        """
        n, P = self.n, self.n_inertial
        rng = np.random.default_rng(12345)
        q, v, a = self.random_state(rng)
        cands = [(0, c) for c in range(10 * (n - 1), P)] + [(0, c) for c in range(10 * (n - 1))]
        need = []
        for which in range(3):
            for k in range(n):
                args = [q.copy(), v.copy(), a.copy()]
                args[which][k] = np.nan
                Y = pin.computeJointTorqueRegressor(self._mg, self._dg, *args)
                need.append({c for c in cands if not math.isfinite(Y[c])})
        if any(not s for s in need):  # pragma: no cover - no entry sees some input
            raise RuntimeError("no regressor entry depends on some input; cannot build NaN probes")
        chosen, uncovered = [], list(range(len(need)))
        while uncovered:
            best = max(cands, key=lambda c: sum(c in need[i] for i in uncovered))
            chosen.append(best)
            uncovered = [i for i in uncovered if best not in need[i]]
        return tuple(r * P + c for r, c in chosen)

    def _bind_hot_paths(self) -> None:
        """Build closures for the per-cycle regressors (no attribute lookups, scalar
        constants as 0-d arrays: each saves a fraction of a microsecond per call)."""
        reg = pin.computeJointTorqueRegressor
        isfinite = math.isfinite
        add, sub, mul = np.add, np.subtract, np.multiply
        mg, dg, m0, d0 = self._mg, self._dg, self._m0, self._d0
        zero, hs, hd = self._zero, self._half_sum, self._half_diff
        half = np.array(0.5)
        probes = self._probes
        p1, p2 = (probes * 2)[:2]  # one or two probes inline; more (rare) checked by `extra`
        rest = probes[2:]
        extra = (lambda Y: isfinite(sum(map(Y.item, rest)))) if rest else None  # noqa: E731
        friction = self.friction
        check = self._state
        with_friction = self._with_friction

        def regressor(q, v, a):
            try:
                Y = reg(mg, dg, q, v, a)
            except Exception:  # wrong type/length: name the argument
                q, v, a = check(q=q, v=v, a=a)
                Y = reg(mg, dg, q, v, a)
            if not isfinite(Y.item(p1) + Y.item(p2)) or (extra is not None and not extra(Y)):
                check(q=q, v=v, a=a)
                raise ValueError("regressor: non-finite result")  # pragma: no cover
            return with_friction(Y, v) if friction else Y

        n2 = 2 * self.n

        def slotine_li(q, v, vr, ar):
            try:
                if len(v) + len(vr) != n2:  # numpy would broadcast a length-1 vector
                    raise IndexError
                add(v, vr, hs)
                mul(hs, half, hs)
                sub(v, hs, hd)  # v - (v + vr)/2 = (v - vr)/2
                Y = reg(mg, dg, q, hs, ar)
                Y -= reg(m0, d0, q, hd, zero)
            except Exception:
                q, v, vr, ar = check(q=q, v=v, vr=vr, ar=ar)
                return slotine_li(q, v, vr, ar)
            if not isfinite(Y.item(p1) + Y.item(p2)) or (extra is not None and not extra(Y)):
                check(q=q, v=v, vr=vr, ar=ar)
                raise ValueError("slotine_li_regressor: non-finite result")  # pragma: no cover
            return with_friction(Y, v) if friction else Y

        regressor.__doc__ = RobotModel.regressor.__doc__
        slotine_li.__doc__ = RobotModel.slotine_li_regressor.__doc__
        self._regressor_fast = self.regressor = regressor
        self._slotine_li_polarised = slotine_li
        self._sl_impl = None

        def slotine_li_first_call(q, v, vr, ar):
            return self._resolve_slotine_li()(q, v, vr, ar)

        slotine_li_first_call.__doc__ = RobotModel.slotine_li_regressor.__doc__
        self._slotine_li_fast = self.slotine_li_regressor = slotine_li_first_call

    def _resolve_slotine_li(self):
        """Load the compiled Slotine-Li kernel (numba import + cached compile, ~1-2 s once
        per process) on first use, so processes that never need it do not pay."""
        if self._sl_impl is None:
            compiled = self._compiled_slotine_li(self._slotine_li_polarised)
            self._sl_impl = "polarised" if compiled is None else "compiled"
            self._slotine_li_fast = self.slotine_li_regressor = compiled or self._slotine_li_polarised
        return self._slotine_li_fast

    @property
    def slotine_li_implementation(self) -> str:
        """``"compiled"`` (single numba pass) or ``"polarised"`` (two pinocchio calls)."""
        self._resolve_slotine_li()
        return self._sl_impl

    def warm_up(self) -> None:
        """Load every lazily built hot path now (call before a control loop starts, so
        the first cycle does not pay for loading the compiled kernel)."""
        self._resolve_slotine_li()

    def _compiled_slotine_li(self, reference):
        """The single-pass compiled Slotine-Li regressor as a closure, or ``None``
        (numba unavailable or disabled, a joint type the kernel does not know, or a
        construction-time cross-check against ``reference`` failing)."""

        kernel = slc.load_kernel()
        if kernel is None:
            return None
        mode = (2 if self.coulomb_smoothing > 0 else 1) if self.friction else 0
        geo = slc.geometry(self._mg, mode, self.coulomb_smoothing)
        if geo is None:
            return None
        work = slc.workspace(self._mg)
        self._sl_geo, self._sl_work = geo, work
        empty, copy = np.empty, np.array
        shape = (self.n, self.n_params)
        check = self._state

        def slotine_li(q, v, vr, ar):
            Y = empty(shape)
            try:
                kernel(q, v, vr, ar, geo, work, Y)
            except Exception:  # wrong type/length/layout, NaN/inf: name the argument
                q, v, vr, ar = check(q=q, v=v, vr=vr, ar=ar)
                kernel(copy(q), copy(v), copy(vr), copy(ar), geo, work, Y)  # (copies: writable)
            return Y

        slotine_li.__doc__ = RobotModel.slotine_li_regressor.__doc__
        # cross-check against the two-call implementation (guards conventions the
        # kernel might not share with this pinocchio build)
        rng = np.random.default_rng(7)
        for _ in range(2):
            q, v, _a = self.random_state(rng)
            vr, ar = rng.standard_normal(self.n), rng.standard_normal(self.n)
            Yp = reference(q, v, vr, ar)
            try:
                err = float(np.abs(slotine_li(q, v, vr, ar) - Yp).max())
            except Exception as exc:  # pragma: no cover - a numba/runtime failure
                err, why = math.inf, f"{type(exc).__name__}: {exc}"
            else:
                why = f"construction-time cross-check failed (max |dY| = {err:.3g})"
            if not err <= 1e-9 * max(1.0, float(np.abs(Yp).max())):
                slc.warn_fallback(why)  # pragma: no cover
                return None  # pragma: no cover
        return slotine_li

    def compiled_filtered_step(self):
        """``(step, geo, work)``: the compiled filtered-regressor sample of
        :mod:`._slotine_li_compiled` with this model's geometry and workspace, or
        ``None`` when the Slotine-Li regressor is not the compiled one (the filter then
        calls :meth:`regressor`)."""
        if self.slotine_li_implementation != "compiled":
            return None

        step = slc.load_filtered_step()
        return None if step is None else (step, self._sl_geo, self._sl_work)

    def momentum_regressor(self, q, v) -> np.ndarray:
        """Y_p(q, v) with Y_p pi = M(q) v (generalised momentum; friction columns zero)."""
        q, v = self._state(q=q, v=v)
        Y = pin.computeJointTorqueRegressor(self._m0, self._d0, q, self._zero, v)
        if self.friction:
            out = np.zeros((self.n, self.n_params))
            out[:, : self.n_inertial] = Y
            return out
        return Y

    def _with_friction(self, Y, v):
        n, P = self.n, self.n_inertial
        out = np.zeros((n, self.n_params))
        out[:, :P] = Y
        idx = np.arange(n)
        out[idx, P + idx] = v
        out[idx, P + n + idx] = self._coulomb(np.asarray(v, dtype=float))
        return out

    def regressor_derivatives(self, q, v, a, dpi):
        """State derivatives of Y(q, v, a) applied to a parameter change ``dpi``.

        Returns ``(dq, dv, da)``, each ``n x n``: the Jacobians of ``Y(q, v, a) @ dpi``
        with respect to q, v and a (consistency paper eq. 18).  ``dpi`` may be any
        finite vector (zero or negative masses allowed).  ``da`` equals M(dpi).
        """
        q, v, a = self._state(q=q, v=v, a=a)
        dpi = as_vector(dpi, self.n_params, "dpi")
        self._delta.set(dpi[: self.n_inertial])
        dq, dv, da = self._delta.derivatives(q, v, a)
        if self.friction:
            fv, fc = dpi[self.n_inertial: self.n_inertial + self.n], dpi[self.n_inertial + self.n:]
            dv = dv + np.diag(fv + fc * self._coulomb_slope(v))
        return dq, dv, da

    def filtered_regressor(self, lam: float, dt: float):
        """A :class:`~adaptive_dynamics.dynamics.filtered.FilteredRegressor` for this model."""
        return FilteredRegressor(self, lam, dt)

    def base_parameters(self, **kwargs):
        """Numerically identified base parameters (see :mod:`.base_parameters`)."""
        return BaseParameters(self, **kwargs)

    # ----------------------------------------------------------------- sampling
    def random_state(self, rng: np.random.Generator, *, margin: float = 0.05, v_scale=1.0, a_scale=1.0):
        """Random (q, v, a) with q inside the joint limits (shrunk by ``margin``)."""
        lo, hi = self.lower.copy(), self.upper.copy()
        unlimited = ~np.isfinite(lo) | ~np.isfinite(hi) | (hi - lo > 1e6)
        lo[unlimited], hi[unlimited] = -np.pi, np.pi
        span = hi - lo
        q = rng.uniform(lo + margin * span, hi - margin * span)
        v = v_scale * rng.standard_normal(self.n)
        a = a_scale * rng.standard_normal(self.n)
        return q, v, a


def _rnea_dq(model, data, q, v) -> np.ndarray:
    """d tau / dq at (q, v, a = 0) (a copy: pinocchio reuses the data's buffer)."""
    return np.array(pin.computeRNEADerivatives(model, data, q, v, np.zeros(model.nv))[0])


def _gravity_dq(model, data, q) -> np.ndarray:
    """d g / dq (a copy)."""
    return np.array(pin.computeGeneralizedGravityDerivatives(model, data, q))


def _load_pinocchio_model(urdf):
    """Return (path or None, pinocchio.Model) from a path, XML string or robot name; a
    continuous joint becomes a revolute one of the same angle (:mod:`.continuous`)."""
    if isinstance(urdf, (str, os.PathLike)):
        s = os.fspath(urdf)
        if s.lstrip().startswith("<"):
            return None, pin.buildModelFromXML(unbind_continuous(s)[0])
        if not os.path.exists(s):
            s = urdf_path(s)
        with open(s, encoding="utf-8") as fh:
            text, names = unbind_continuous(fh.read())
        return s, (pin.buildModelFromXML(text) if names else pin.buildModelFromUrdf(s))
    raise ValueError(f"urdf must be a path, a URDF string or a robot name, got {type(urdf).__name__}")


__all__ = ["RobotModel", "PhysicalConsistencyError"]
