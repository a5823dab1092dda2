"""Self-correcting QP control (SCQP; Khadivar, Chatzilygeroudis & Billard): the residual
inverse-dynamics model (sec. IV-B, eq. 10-16) and the episodic loop (Algorithm 1) that
puts it together with the task-space MRAC (:mod:`.mrac`, eq. 4-9) and the QP inverse
dynamics (:mod:`.qp_id`, eq. 1-3, 11-12, 17-18).  No ROS import.

Residual model (eq. 10-16)
--------------------------
``h*(q, qd, qdd) = h_bar(q, qd, qdd) + e_h(q, qd, qdd)`` (eq. 11), ``h_bar`` the
rigid-body model (:class:`~adaptive_dynamics.dynamics.RobotModel`, pinocchio RNEA) as
the prior.  **Sign convention**: the training target is ``e_t = tau_t - h_bar(q_t,
qd_t, qdd_t)`` -- the torque the arm needed beyond the rigid-body model for the
acceleration it actually had -- so ``tau = h_bar + e_h`` is the inverse dynamics.  (The
paper writes ``e_t = h_bar(q_t, qd_t, qdd_{t+1}) - tau_t`` with the commanded
acceleration; the commanded acceleration is what the QP asked for, not what happened, so
a model trained on it only learns its own previous output.  The measured acceleration
of the period in which ``tau_t`` acted, ``(qd_{t+1} - qd_t) / dt``, is used here.)
Inputs ``(q, qd, qdd)``; one exact GP per joint (:class:`~adaptive_dynamics.learning.gp.ExactGP`,
squared-exponential kernel, inputs and outputs standardised, hyperparameters fixed by
default: away from data the residual falls back to the mean residual of the data, the
prior model plus a constant -- the paper's argument for not optimising them;
``optimize=True`` fits them by type-II ML).  Every ``subsample``-th sample is kept (the
paper: every 5th-10th), at most ``max_points`` (oldest dropped).  ``predict`` returns
``e_h`` and ``d e_h / d qdd`` (eq. 16, the qdd block of the GP's mean gradient) for the
QP's linearisation (eq. 12).  The GP is refitted only by :meth:`ResidualModel.refit`,
between episodes -- never inside a control cycle.

Episodes (Algorithm 1)
----------------------
:class:`SCQPController` runs one control cycle per :meth:`~SCQPController.step`:
measured acceleration from the velocity difference, the sample of the previous period
into the episode's data, the task-space feedback (``mode``: ``scqp`` = MRAC + GP,
``gp_pid`` = a PID on the task + GP, ``mrac`` = MRAC without GP), the residual at the
current state, the QP.  :meth:`~SCQPController.end_episode` refits the GP on all data so
far and keeps the MRAC gains for the next episode.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..learning.gp import ExactGP
from .law import NpzState
from .mrac import TaskSpaceMRAC
from .qp_id import QPInverseDynamics, QPResult

MODES = ("scqp", "gp_pid", "mrac")
#: the paper as written (Khadivar et al.): every departure of this implementation off --
#: ``SCQPController(**PAPER)`` (each entry is a named option; docs/decisions.md measures them)
PAPER = {"qp": {"residual_inertia_bounds": None},           # eq. 12: E as learned
         "mrac": {"reference": "paper", "rbf_velocity": True},  # eq. 4/8; Phi over e in R^2l
         "residual": {"prior_mean": "zero"},                # the GP on the rigid-body prior
         "target_acceleration": "commanded"}                # e_t at the QP's planned qdd_{t+1}
#: this implementation's defaults, the same keys (what ``PAPER`` switches off)
PROJECT = {"qp": {"residual_inertia_bounds": (0.8, 1.25)},
           "mrac": {"reference": "trajectory", "rbf_velocity": False},
           "residual": {"prior_mean": "data"},
           "target_acceleration": "measured"}
TARGET_ACCELERATIONS = ("measured", "commanded")


class ResidualModel:
    """The GP residual ``e_h = tau - h_bar(q, qd, qdd)`` (module docstring).

    Parameters
    ----------
    model:
        :class:`~adaptive_dynamics.dynamics.RobotModel`: h_bar.
    subsample:
        Keep every k-th sample offered to :meth:`add`.
    max_points:
        Training-set cap of the GP (FIFO).
    length_scale, signal_var, noise_var, optimize, max_iter:
        :class:`~adaptive_dynamics.learning.gp.ExactGP`'s (standardised units).
    prior_mean:
        ``"data"`` (default): away from its data the GP returns the data's mean residual;
        ``"zero"`` (the paper): it returns zero, i.e. the rigid-body model.
    """

    def __init__(self, model, *, subsample: int = 5, max_points: int = 2000, length_scale=None,
                 signal_var: float = 1.0, noise_var: float = 0.01, optimize: bool = False, max_iter: int = 50,
                 prior_mean: str = "data"):
        if int(subsample) < 1 or int(max_points) < 1:
            raise ValueError("subsample and max_points must be >= 1")
        self.model = model
        n = self.n = model.n
        self.subsample = int(subsample)
        if length_scale is None:     # sqrt(3n) standardised units: the SCQP tables were made with it
            length_scale = float(np.sqrt(3 * n))
        self.gp = ExactGP(3 * n, n, length_scale=length_scale, signal_var=signal_var, noise_var=noise_var,
                          max_points=int(max_points), refit_every=10 ** 9, optimize=optimize, max_iter=max_iter,
                          prior_mean=prior_mean)
        self._offered = 0
        self._X: list = []
        self._Y: list = []

    # ---------------------------------------------------------------- data
    def target(self, q, v, qdd, tau) -> np.ndarray:
        """e = tau - h_bar(q, qd, qdd) (the sign convention of the module docstring)."""
        return np.asarray(tau, dtype=float) - self.model.inverse_dynamics(q, v, qdd)

    def add(self, q, v, qdd, tau, qdd_target=None) -> bool:
        """Offer one sample: input ``(q, v, qdd)``, target ``tau - h_bar(q, v, qdd_target)``
        (``qdd_target`` default ``qdd``; the paper's: the planned acceleration); every
        ``subsample``-th finite one is kept.  Returns kept."""
        self._offered += 1
        if (self._offered - 1) % self.subsample:
            return False
        x = np.concatenate([np.asarray(q, float), np.asarray(v, float), np.asarray(qdd, float)])
        tau = np.asarray(tau, dtype=float)
        if x.shape != (3 * self.n,) or tau.shape != (self.n,) or not (np.isfinite(x).all()
                                                                     and np.isfinite(tau).all()):
            return False
        e = self.target(q, v, qdd if qdd_target is None else qdd_target, tau)
        if not np.isfinite(e).all():
            return False
        self._X.append(x)
        self._Y.append(e)
        return True

    @property
    def pending(self) -> int:
        """Samples kept since the last :meth:`refit`."""
        return len(self._X)

    @property
    def n_points(self) -> int:
        """Training points of the GP in use."""
        return self.gp.n_points

    def refit(self) -> int:
        """Move the kept samples into the GP and refit it (between episodes)."""
        job = self.begin_refit()
        self.finish_refit(job.run())
        return self.gp.n_points

    # A refit off the control thread: begin_refit (quick; with the control loop's lock
    # held) -> job.run() (the O(n^3) part, on any thread; touches nothing shared) ->
    # finish_refit (swaps the new GP in as one reference) or abort_refit (the samples
    # go back to the pending ones).
    def begin_refit(self) -> "RefitJob":
        """Hand the kept samples (cleared here) and the GP's data to a :class:`RefitJob`."""
        new_X = np.array(self._X).reshape(-1, 3 * self.n)
        new_Y = np.array(self._Y).reshape(-1, self.n)
        self._X, self._Y = [], []
        return RefitJob(self.gp, new_X, new_Y)

    def finish_refit(self, gp: ExactGP) -> None:
        """Use the GP a :meth:`RefitJob.run` returned."""
        self.gp = gp

    def abort_refit(self, job: "RefitJob") -> None:
        """Put a failed job's samples back in front of the pending ones."""
        self._X[:0] = list(job.new_X)
        self._Y[:0] = list(job.new_Y)

    def pending_arrays(self):
        """The kept samples not in the GP yet as ``(X, Y)`` arrays (copies)."""
        return (np.array(self._X).reshape(-1, 3 * self.n), np.array(self._Y).reshape(-1, self.n))

    def restore_pending(self, X, Y) -> None:
        """Append saved pending samples (``(k, 3n)``, ``(k, n)``, finite) to the pending ones."""
        X = np.asarray(X, dtype=float).reshape(-1, 3 * self.n)
        Y = np.asarray(Y, dtype=float).reshape(-1, self.n)
        if X.shape[0] != Y.shape[0] or not (np.isfinite(X).all() and np.isfinite(Y).all()):
            raise ValueError(f"pending samples: {X.shape[0]} inputs, {Y.shape[0]} targets (or non-finite)")
        self._X.extend(X)
        self._Y.extend(Y)

    # ---------------------------------------------------------------- query
    def predict(self, q, v, qdd):
        """``(e_h, d e_h / d qdd)`` at ``(q, qd, qdd)``: n and n x n (zeros before a fit)."""
        n = self.n
        x = np.concatenate([np.asarray(q, float), np.asarray(v, float), np.asarray(qdd, float)])
        if self.gp.n_points == 0 or self.gp._snap is None:
            return np.zeros(n), np.zeros((n, n))
        e, G = self.gp.predict_with_gradient(x)      # n, n x 3n
        return e, G[:, 2 * n:]

    # ---------------------------------------------------------------- persistence
    def to_bytes(self) -> bytes:
        return self.gp.to_bytes()

    def load_bytes(self, data: bytes) -> None:
        gp = ExactGP.from_bytes(data)
        if gp.input_dim != 3 * self.n or gp.output_dim != self.n:
            raise ValueError(f"saved residual GP is {gp.input_dim} -> {gp.output_dim}, expected"
                             f" {3 * self.n} -> {self.n}")
        self.gp = gp


class RefitJob:
    """A GP refit prepared by :meth:`ResidualModel.begin_refit`: :meth:`run` trains a
    new :class:`ExactGP` (same hyperparameters) on the old GP's data plus ``new_X``,
    ``new_Y`` (the newest ``max_points`` kept) without touching the GP in use."""

    def __init__(self, gp: ExactGP, new_X: np.ndarray, new_Y: np.ndarray):
        self.config = gp.get_config()
        self.X, self.Y = gp.X, gp.Y          # never modified in place (a refit replaces them)
        self.new_X, self.new_Y = new_X, new_Y

    def run(self) -> ExactGP:
        gp = ExactGP(**self.config)
        gp.X = np.vstack([self.X, self.new_X])[-gp.max_points:]
        gp.Y = np.vstack([self.Y, self.new_Y])[-gp.max_points:]
        gp.refit()
        return gp


class SCQPController(NpzState):
    """Algorithm 1: task-space feedback -> QP with the linearised residual -> torque.

    Parameters
    ----------
    model:
        :class:`~adaptive_dynamics.dynamics.RobotModel` (h_bar, kinematics, limits).
    dt:
        Control period [s].
    mode:
        ``scqp`` (MRAC + GP residual), ``gp_pid`` (task PID + GP residual) or ``mrac``
        (MRAC, rigid-body model only).
    kp_task, kd_task, ki_task:
        The PID of ``gp_pid`` [1/s^2, 1/s, 1/s^3] (and the MRAC reference model's kp, kd
        unless ``mrac`` sets them).
    qp, mrac, residual:
        Keyword arguments of :class:`~.qp_id.QPInverseDynamics`,
        :class:`~.mrac.TaskSpaceMRAC` (default here ``reference="trajectory"``; the
        paper's ``"paper"`` lags a moving target) and :class:`ResidualModel`.
    target_acceleration:
        A GP sample of the torque ``tau_t``: ``"measured"`` (default) input and target at
        the acceleration ``tau_t`` produced (the velocity difference over its period);
        ``"commanded"`` (the paper, sec. IV-B) input ``(q_t, qd_t, qdd_t)`` with the
        acceleration measured before, target ``tau_t - h_bar(q_t, qd_t, qdd_{t+1})`` at
        the acceleration the QP planned -- which the QP's own equality makes the GP's
        previous output: as written, the GP learns what it already predicts.
    :data:`PAPER` holds the settings of the paper as written, :data:`PROJECT` the defaults.
    """

    STATE_WHAT = "an SCQP state file"

    def __init__(self, model, *, dt: float, mode: str = "scqp", kp_task: float = 400.0, kd_task: float = 40.0,
                 ki_task: float = 0.0, qp: Optional[Dict[str, Any]] = None, mrac: Optional[Dict[str, Any]] = None,
                 residual: Optional[Dict[str, Any]] = None, target_acceleration: str = "measured"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if target_acceleration not in TARGET_ACCELERATIONS:
            raise ValueError(f"target_acceleration must be one of {TARGET_ACCELERATIONS}, got {target_acceleration!r}")
        self.target_acceleration = target_acceleration
        self.model, self.dt, self.mode = model, float(dt), mode
        n = self.n = model.n
        self.qp = QPInverseDynamics(model, dt=dt, **(qp or {}))
        self.kp_task, self.kd_task, self.ki_task = float(kp_task), float(kd_task), float(ki_task)
        # reference "trajectory": r = B_r^+ (zeta_d_dot - A_r zeta_d), so the reference
        # model follows a moving target and the stability proof holds for any trajectory
        self._mrac_kwargs = {"kp": kp_task, "kd": kd_task, "reference": "trajectory", **(mrac or {})}
        self._residual_kwargs = dict(residual or {})
        self.mrac = TaskSpaceMRAC(**self._mrac_kwargs)
        self.residual = ResidualModel(model, **self._residual_kwargs)
        self._prev = None            # (q, v, tau, measured qdd, planned qdd) of the previous cycle
        self._qdd = np.zeros(n)      # measured acceleration of the last period
        self._int = np.zeros(3)
        self.episode = 0
        self.steps = 0
        self.collect = True          # keep samples for the GP (off: control only, e.g. between episodes)
        self.last: Optional[QPResult] = None

    @property
    def uses_gp(self) -> bool:
        return self.mode in ("scqp", "gp_pid")

    @property
    def uses_mrac(self) -> bool:
        return self.mode in ("scqp", "mrac")

    def start_episode(self, q, v) -> None:
        """Reset the per-episode state (the MRAC reference model starts at the arm's state)."""
        T = self.model.frame_pose(q)
        J = self.model.jacobian(q)
        x, xd = T[:3, 3], J[:3] @ np.asarray(v, float)
        self.mrac.reset_reference(np.concatenate([x, xd]))
        self._prev = None
        self._qdd = np.zeros(self.n)
        self._int = np.zeros(3)

    def compute(self, q, v, x_d, xd_d, xdd_d, R_d=None, w_d=None, wdot_d=None) -> np.ndarray:
        """One control cycle: the torque for the state ``(q, v)`` and the task reference
        (position, velocity, acceleration; orientation ``R_d``, angular velocity ``w_d``
        and acceleration ``wdot_d`` in world axes, default: hold the current orientation)."""
        q = np.asarray(q, dtype=float)
        v = np.asarray(v, dtype=float)
        if self._prev is not None:
            qp_, vp_, taup, qdd_then, qdd_plan = self._prev
            self._qdd = (v - vp_) / self.dt
            if self.uses_gp and self.collect:
                if self.target_acceleration == "measured":    # what tau_t produced
                    self.residual.add(qp_, vp_, self._qdd, taup)
                else:   # the paper: input (q_t, qd_t, qdd_t), target at the planned qdd_{t+1}
                    self.residual.add(qp_, vp_, qdd_then, taup, qdd_target=qdd_plan)
        kin = self.qp.kinematics(q, v)          # shared with the QP below
        T, J = kin[0], kin[1]
        x, xd = T[:3, 3], J[:3] @ v
        x_d, xd_d, xdd_d = (np.asarray(a, dtype=float).reshape(3) for a in (x_d, xd_d, xdd_d))
        if self.uses_mrac:
            xdd_r = self.mrac.compute(x, xd, x_d, xd_d, xdd_d, self.dt)
        else:
            e = x_d - x
            self._int += e * self.dt
            xdd_r = xdd_d + self.kp_task * e + self.kd_task * (xd_d - xd) + self.ki_task * self._int
        res = self.residual.predict(q, v, self._qdd) if self.uses_gp else None
        out = self.qp.solve(q, v, xdd_r, R_des=R_d, w_des=w_d, wdot_des=wdot_d, residual=res,
                            qdd_measured=self._qdd, kinematics=kin)
        self.last = out
        self._prev = (q.copy(), v.copy(), out.tau.copy(), self._qdd.copy(), out.qdd.copy())
        self.steps += 1
        return out.tau

    def discard_last(self) -> None:
        """The torque of the last :meth:`compute` was not applied as computed (a safe command
        answered a control instant, or control instants were missed): the next step keeps
        no sample of that period and does not difference velocities across it."""
        self._prev = None

    def snapshot(self, pending=None) -> dict:
        """References to what :meth:`state_dict` writes, cheap to take under a lock (a
        node takes it there and serialises outside): the GP, the samples not in it yet
        (``pending``: arrays to put in front of the model's own, e.g. those of a refit in
        flight) and the MRAC's state."""
        pX, pY = self.residual.pending_arrays()
        if pending is not None:
            pX, pY = np.vstack([pending[0], pX]), np.vstack([pending[1], pY])
        return {"gp": self.residual.gp, "pending_X": pX, "pending_Y": pY, "mrac": self.mrac.state_dict(),
                "mode": self.mode}

    def state_dict(self, snapshot: Optional[dict] = None) -> dict:
        """The GP residual (its bytes), the samples not in it yet and the MRAC's gains
        (``mrac_*``), as plain arrays."""
        snap = self.snapshot() if snapshot is None else snapshot
        return {"mode": np.array(snap["mode"]), "gp": np.frombuffer(snap["gp"].to_bytes(), dtype=np.uint8),
                "pending_X": snap["pending_X"], "pending_Y": snap["pending_Y"],
                **{f"mrac_{k}": v for k, v in snap["mrac"].items()}}

    def load_state_dict(self, state: dict, *, where: str = "state", residual: Optional[Dict[str, Any]] = None,
                        mrac: Optional[Dict[str, Any]] = None) -> None:
        """Take the GP, its pending samples and the MRAC's gains of a :meth:`state_dict`
        (a new episode starts from the arm's state: the MRAC reference is not taken);
        ``residual`` / ``mrac``: the settings to rebuild them with (default: this
        controller's).  Nothing changes unless all of it reads."""
        try:
            res = ResidualModel(self.model, **(self._residual_kwargs if residual is None else residual))
            res.load_bytes(np.asarray(state["gp"]).tobytes())
            if residual is not None and "max_points" in residual:
                res.gp.max_points = int(residual["max_points"])   # a cap, not a hyperparameter: the caller's
            res.restore_pending(state["pending_X"], state["pending_Y"])
            ctl = TaskSpaceMRAC(**(self._mrac_kwargs if mrac is None else mrac))
            gains = {k[len("mrac_"):]: v for k, v in state.items() if k.startswith("mrac_") and k != "mrac_zeta_r"}
            ctl.transfer_gains(gains)
        except KeyError as exc:
            raise ValueError(f"{where}: missing {exc}; not {self.STATE_WHAT}") from None
        self.residual, self.mrac = res, ctl

    def end_episode(self) -> int:
        """Refit the residual GP on everything collected (Algorithm 1, line 12)."""
        self.episode += 1
        return self.residual.refit() if self.uses_gp else 0
