"""Contact detection and external torques from the learned model: the generalized-momentum
observer on the URDF, on the adapted estimate and on the adapted estimate + residual learner.

The cores: :mod:`~adaptive_dynamics.control.momentum_observer`,
:mod:`~adaptive_dynamics.control.contact` (the ``external_torque`` node's).

``adaptive-dynamics experiment contact --out DIR [--quick] [--robots panda,iiwa14] [--seeds 0,1,2] [--learner KIND]
[--parametric-torque state|law] [--residual-input state|reference] [--detector change|whitened|r]
[--friction-smoothing EPS]``

Per robot (the Panda and the iiwa 14), one run in process, deterministic (the plant and
the cores, no DDS; :func:`simulate`):

* **the robot** -- MuJoCo with ``experiment realdata``'s proxy of it (:mod:`.proxies`: the
  joint friction -- viscous, Coulomb, Stribeck on the Panda, a position ripple on the
  iiwa --, the torque-sensor bias and noise, velocity and position noise), the drives'
  armature its parameter file states, and an unmodelled tool on the flange (:data:`TOOL`:
  1 kg off the flange axis, anisotropic inertia; the URDF has none);
* **the motion** -- a Modified Fourier trajectory (``realdata``'s excitation: period 10 s,
  4 harmonics, 0.4 rad) around the arm's task pose
  (:func:`~.robot_choice.task_configuration`), tracked by the adaptive controller core as
  the graph runs it (composite law, viscous + Coulomb friction columns -- the Coulomb one
  ``tanh(qd / eps)`` with the ``friction_smoothing`` the robot's parameter file gives the
  graph, 0.03 rad/s (``--friction-smoothing``, 0 = sgn) --, ``forget_to="prior"``,
  the robot's ``adaptive_controller`` gains, started from the URDF's estimate);
* **the phases** (:data:`FULL`: 60 s) -- *learning* (the controller adapts; the residual
  learner core, ``OnlineResidual(KIND)`` (``--learner``, default ``joint_local``) with the
  ``residual_learner`` node's defaults but 100 Hz and a 2 s warm-up (:data:`LEARNER_SETTINGS`),
  learns ``tau_measured - parametric torque`` at ``(q, qd, qdd_d)`` -- the controller's
  ``parametric_torque`` (:data:`PARAMETRIC_TORQUE`, ``--parametric-torque``): ``state``
  ``Y(q, qd, qdd_d) pi_hat`` or ``law`` (ARDL's Slotine-Li torque) -- from
  :data:`LEARNER_START_S` on, with the consistency transform on every parameter update --
  the node with ``target_torque: measured``: the observer compares the measured torque,
  sensor bias included, with the model), then everything frozen: *calibration* (free
  motion, one period), *held out* (free motion, one period), *contact* (pushes of 5-30 N
  at the end effector and at the elbow -- the link the 4th joint moves, at its origin --
  along the world's x and y axes, each :data:`PUSH_ON` s; :func:`push_schedule`).
* **another motion** (:func:`other_motion`, after the run: ``other_motion_s`` of
  :data:`FULL`) -- the frozen controller on another draw of the excitation, from rest: the
  learned model's level against the adapted one's where the learner has not been (its
  support, measured there): never worse off the motion learnt.

Observers (``K_O`` = :data:`GAIN`; ``min_samples`` = :data:`MIN_SAMPLES`) run on what the
``external_torque`` node would get (measured ``q``, ``qd``, torque; ``torque_timing:
held``): the **URDF**'s model (the robot's ``armature``), the **adapted** estimate (frozen
at the end of learning, with its friction; no armature: :data:`ESTIMATE_ARMATURE`), the
**adapted + learned** one (plus the learner's prediction at the measured state, as the
node takes ``residual/state`` -- each state's own: the node waits for it (``residual_wait``) --,
or at the reference, ``feedforward/residual``:
:data:`RESIDUAL_INPUT`, ``--residual-input``; kept
on a joint only where it lowers the calibrated threshold, as the node's calibration with
``residual_select`` does, :func:`select_residual` -- the residual on every joint beside it,
``learned_every_joint``), and,
as the floor no model can go below, the simulator's own model (tool, friction, bias:
what the sensor noise alone leaves).  For each:

* per-joint thresholds calibrated on the calibration segment (``calibration_method: max``,
  margin 1.5: the node's defaults, over :data:`MIN_SAMPLES` consecutive samples as the
  detector's debounce) -- on r and, with :data:`DETECTOR` ``change`` (the node's ``whiten``
  and ``change_window``, ``--detector``), on the noise-whitened estimate z and on its change
  over 10 samples d beside it, the noise model calibrated on the same segment with the
  URDF's inertia plus the drives' -- and the false alarms they give on the held-out segment
  (and between the pushes); r and z alone (``whitened``) beside (``other_detector``);
* per push: detected (while it acts, a joint flagged -- or z's flag on -- that was not at
  its start: a flag left on by the last push is no detection of this one), the detection
  delay (from its first step to that sample), the joints flagged; the smallest push
  detected (every push at least that strong detected, both locations);
* the external-torque RMSE over the contact phase against the applied ``J(q)^T F``
  (:attr:`~adaptive_dynamics.sim.plant.MujocoPlant.external_torque`) passed through the
  observer's own first-order low pass ``K_O / (s + K_O)`` (what a perfect model gives: the
  figure measures the model, not the chosen bandwidth) and, beside it, against the raw
  ``J(q)^T F``;
* the wrench direction error: the angle between the estimated and the applied force --
  at the end effector the node's 6-D wrench (damped pseudo-inverse of ``J^T``), at the
  elbow the force at the known point (least squares on its translational Jacobian) --,
  averaged over each push once settled (from ``3 / K_O`` after its start).

The velocity noise reaches the observer's output almost white, ``K_O M(q)`` times it:
with the proxies' 0.003 rad/s it sets a floor of about 0.6-1.2 N m on the shoulder joints
(the simulator's own model's thresholds), which the debounce lowers and ``K_O`` scales;
``sensitivity`` (full run) gives the figures for K_O 30, 50 (the node's default) and 100,
with and without the debounce, with and without a second low pass ``K_F`` = 100 1/s
(``sensitivity_best``: the best of the grid, per figure, worst robot).

Seeds (``--seeds``, default :data:`SEEDS`): the trajectory and the sensor noise; the first
seed's run gives the tables, plots and sensitivity, every seed the figures of
:data:`SEED_KEYS` -- ``per_seed`` and ``over_seeds`` (median, min, max, the targets met on
every seed) and ``contact_seeds.png`` (each seed's threshold ratios per joint).

JSON (``contact.json``, printed last; :data:`TARGETS`, the adapted + learned model, worst
robot): ``threshold_vs_urdf_max`` (largest per-joint threshold ratio to the URDF's;
target <= 1/3), ``detection_delay_ms_max`` (slowest 10 N push, both locations; target <=
20 ms; a missed one counts as not met; per location and the simulator's own model's
beside it), ``external_torque_rmse_vs_urdf`` (RMSE over all joints, ratio to the URDF's;
target <= 1/3), ``learned_never_worse`` (every joint's threshold -- at most the adapted
model's by the calibration's construction -- and, measured, its level on the held-out
segment (``learned_vs_adapted_heldout_max``) and on another motion
(``learned_vs_adapted_other_motion_max``) and the RMSE at most 1.05 x the adapted
model's, the smallest push detected no larger); the adapted model's ratios and every
per-robot table beside them; ``residual_joints`` (per robot, the joints that keep the
residual) and ``every_joint`` (the residual on every joint: ``learned_every_joint`` per
robot); ``uncertainty`` (the learner's std in the thresholds: :func:`uncertainty_table`);
``sensitivity``, ``sensitivity_best``; ``per_seed``, ``over_seeds``.  With ``K_F`` the
RMSE's reference is the applied ``J(q)^T F`` through both low passes.  Plots:
``contact_timeline_<robot>.png`` (estimated vs applied external torque of the two most
loaded joints over the contact phase, per model, pushes shaded, thresholds dotted),
``contact_thresholds.png`` and, with more than one seed, ``contact_seeds.png``.

``--quick``: one robot and one seed (the first), :data:`QUICK` (20 s of learning, 4 s of
pushes, no sensitivity table).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Optional

import numpy as np

from ..control.adaptive import AdaptiveController
from ..control.contact import (CHANGE_HOLD, CHANGE_WINDOW, ContactDetector, ThresholdCalibration, calibrate_change,
                               calibrate_residual_joints, calibrate_whitening, change_samples)
from ..control.momentum_observer import MomentumObserver, observer_model, wrench_estimate
from ..dynamics import RobotModel
from ..learning import OnlineResidual
from ..learning.base import LEARNERS
from ..robot_setup import controller_gains
from ..robots import armature, friction, friction_smoothing
from ..sim.plant import MujocoPlant, RealityConfig
from ..trajectories import ModifiedFourier
from . import save_plot, write_result
from .proxies import REALITY, proxy_reality
from .realdata import EXCITATION
from .robot_choice import label, task_configuration

ROBOTS = ("panda", "iiwa14")
#: the unmodelled tool on the flange (``experiment excitation``'s 1 kg tool): mass [kg], CoM in the
#: end-effector frame [m], inertia about the CoM (xx, xy, xz, yy, yz, zz) [kg m^2]
TOOL = {"mass": 1.0, "com": (0.02, 0.01, 0.05), "inertia": (4e-3, 2e-4, -1e-4, 5e-3, 1e-4, 3e-3)}
#: phases [sim s] and the trajectory's base frequency [Hz]; pushes [N] and their directions
FULL = {"learn_s": 30.0, "calibrate_s": 10.0, "heldout_s": 10.0, "contact_s": 10.0, "base_frequency": 0.1,
        "magnitudes": (5.0, 10.0, 15.0, 20.0, 30.0), "directions": ("x", "y"), "other_motion_s": 12.0}
QUICK = {"learn_s": 20.0, "calibrate_s": 10.0, "heldout_s": 10.0, "contact_s": 4.0, "base_frequency": 0.1,
         "magnitudes": (5.0, 10.0, 20.0, 30.0), "directions": ("y",), "other_motion_s": 6.0}
#: the other motion (:func:`other_motion`): another draw of the excitation (this seed offset), from
#: rest at its start; its first OTHER_SETTLE_S [s] (the start's transient) left out
OTHER_SEED_OFFSET = 1000
OTHER_SETTLE_S = 2.0
#: push directions (world axes)
DIRECTIONS = {"x": (1.0, 0.0, 0.0), "y": (0.0, 1.0, 0.0), "down": (0.0, 0.0, -1.0)}
#: each push acts this long [s]; one starts every PUSH_SLOT s (the first PUSH_SLOT - PUSH_ON in)
PUSH_ON, PUSH_SLOT = 0.25, 0.5
#: observer gain K_O [1/s] (the external_torque node's `gains`; its default is 50: with this velocity
#: noise 30 gives lower thresholds on the Panda, the same on the iiwa, at the same detection delays
#: and a lower RMSE, ``sensitivity``) and the
#: calibration (the node's defaults)
GAIN = 30.0
CALIBRATION = {"method": "max", "margin": 1.5}
#: the observers start this long [s] before the freeze (on the frozen models: their start transient,
#: ~1 / K_O, is over when the calibration segment begins with the freeze)
OBSERVER_LEAD_S = 0.5
#: the detector's debounce (the node's ``min_samples``): a joint is in contact after this many
#: consecutive samples above its threshold, and the calibration takes the level r stayed above
#: for as long (``ThresholdCalibration``): the velocity noise reaches r nearly white, a model
#: error is slow, so 4 ms of delay buy a several-fold lower threshold where noise dominates
MIN_SAMPLES = 5
#: what the detector watches (the node's ``whiten`` and ``change_window``): ``change`` -- r, the
#: noise-whitened estimate z (:class:`~adaptive_dynamics.control.contact.NoiseWhitening`) and its
#: change over :data:`~adaptive_dynamics.control.contact.CHANGE_WINDOW` samples d, each calibrated
#: on the same segment --, ``whitened`` (r and z) or ``r`` alone; ``whitened``'s figures are kept
#: beside (``other_detector``; ``r``'s when the experiment's is ``whitened``)
DETECTOR = "change"
DETECTORS = ("change", "whitened", "r")
#: the residual learner (the node's default kind and defaults); it learns from this sim time
#: on [s] (the controller adapts from the start): the start's transient -- the arm sagging under
#: the tool the URDF lacks while the estimate catches up, at the trajectory's rest state --
#: is no residual of the motion to come, and the rest state is revisited for an instant
#: once per period only, so what the learner made of the transient would stay there
LEARNER = "joint_local"
LEARNER_START_S = 2.0
#: what the learner's target subtracts (the adaptive controller's ``parametric_torque``):
#: ``state`` -- the estimate at the learner's input, ``Y(q, qd, qdd_d) pi_hat``: the residual a
#: function of the state, not of the tracking error -- or ``law`` (the control law's Slotine-Li
#: model torque, ARDL's); and where the observer takes the learner's prediction
#: (``external_torque``'s ``residual_input``): at the measured ``state`` (``residual_learner``'s
#: ``residual/state``) or at the ``reference`` (``feedforward/residual``)
PARAMETRIC_TORQUE = "state"
RESIDUAL_INPUT = "state"
#: the drives' inertia in the observers on the estimate: none -- the adaptive controller's
#: regressor has no armature term, so its estimate holds what of it the link inertias can
#: carry and the residual learner (the joint's acceleration among its inputs) the rest; the
#: URDF's observer and the simulator's own model take the robot's armature
ESTIMATE_ARMATURE = 0.0
#: beyond the node's defaults: 100 Hz and a 200-sample (2 s) warm-up, so the residual feeds the
#: observer from 4 s on.  The node's 10 s warm-up (200 Hz) lets the estimate adapt alone first,
#: which pays where the residual falls back (docs/learners.md); here the arm stays on one motion
#: and the residual's 18 s left of 28 give worse thresholds (docs/contact.md)
LEARNER_SETTINGS = {"learn_every": 10, "warmup": 200}
MODELS = ("urdf", "adapted", "learned")
MODEL_LABELS = {"urdf": "URDF", "adapted": "adapted estimate", "learned": "adapted + residual learner"}
#: the elbow: the link each robot's 4th joint moves (the push at its origin, on the elbow's axis)
ELBOW = {"panda": "panda_link4", "iiwa14": "iiwa_link_4"}
TARGETS = {"threshold_vs_urdf_max": 1.0 / 3.0, "detection_delay_ms_max": 20.0, "external_torque_rmse_vs_urdf": 1.0 / 3.0,
           "learned_vs_adapted_max": 1.05}
#: the push whose detection delay is the target's [N]
DELAY_PUSH = 10.0
DT = 1e-3


# ----------------------------------------------------------------------------- set-up

def reality(robot: str, seed: int = 0) -> RealityConfig:
    """The proxy's joint friction and sensor (``experiment realdata``'s, as its ``record``
    builds them) with :data:`TOOL` on the end effector instead of the proxy's extra mass."""
    m = RobotModel(robot)
    r, _ = proxy_reality(robot, m.effort_limit)
    r = {**REALITY, **r}
    fv, fc = friction(robot)
    return RealityConfig(friction_viscous=r.get("viscous_scale", 1.0) * fv, friction_coulomb=r["coulomb_scale"] * fc,
                         coulomb_smoothing=r["coulomb_smoothing"],
                         friction_stribeck=r["stribeck_ratio"] * r["coulomb_scale"] * fc,
                         stribeck_velocity=r["stribeck_velocity"], tau_bias=r["tau_bias"],
                         ripple_amplitude=r.get("ripple_amplitude", 0.0), ripple_periods=r.get("ripple_periods", 1.0),
                         noise_std_tau=r["noise_std_tau"], noise_std_v=r["noise_std_v"], noise_std_q=r["noise_std_q"],
                         payload_mass=TOOL["mass"], payload_com=TOOL["com"], payload_inertia=TOOL["inertia"],
                         payload_enabled=True, seed=seed, armature=armature(robot))


def trajectory(m: RobotModel, seed: int, base_frequency: float) -> ModifiedFourier:
    """``realdata``'s excitation around the arm's task pose
    (:func:`~.robot_choice.task_configuration`: the most manipulable of poses in the middle
    of the joint ranges -- the middle itself is a stretched, singular iiwa, where a
    sideways push meets the structure and no joint)."""
    e = EXCITATION
    return ModifiedFourier.random(m.n, np.random.default_rng(seed), q_center=task_configuration(m),
                                  amplitude=e["amplitude"], w_f=2 * math.pi * base_frequency, L=e["harmonics"],
                                  lower=m.lower, upper=m.upper, vel_limit=0.8 * m.velocity_limit,
                                  acc_limit=np.full(m.n, 10.0), margin=0.1)


def push_schedule(robot: str, m: RobotModel, t0: float, cfg: dict) -> list:
    """The contact phase's pushes from ``t0`` [s]: for each magnitude, at the end effector
    and at the elbow, along each direction of ``cfg`` (:data:`DIRECTIONS`, world axes), one
    every :data:`PUSH_SLOT` s, acting :data:`PUSH_ON` s."""
    out = []
    k = 0
    for mag in cfg["magnitudes"]:
        for where, link in (("ee", m.ee_frame), ("elbow", ELBOW.get(robot, m.ee_frame))):
            for kind in cfg["directions"]:
                start = round(t0 + (k + 1) * PUSH_SLOT - PUSH_ON, 6)
                out.append({"where": where, "link": link, "direction_kind": kind, "magnitude": float(mag),
                            "direction": list(DIRECTIONS[kind]), "start": start, "duration": PUSH_ON})
                k += 1
    return out


def controller(m: RobotModel, robot: str) -> AdaptiveController:
    """The composite adaptive core as the graph runs it: friction columns, the robot's
    ``adaptive_controller`` gains, ``forget_to="prior"``, from the URDF's estimate."""
    g = controller_gains(robot)
    return AdaptiveController(m, "composite", pi0=m.parameters.copy(), lam=g["lam"], kd=g["kd"], p0=g["p0"],
                              r=g["r"], filter_lambda=g["filter_lambda"], lambda0=g["lambda0"], k0=g["k0"],
                              k1=g["k1"], forget_to="prior")


# ----------------------------------------------------------------------------- the run

def simulate(robot: str, cfg: dict, seed: int = 0, log=print, learner_kind: str = LEARNER,
             parametric_torque: str = PARAMETRIC_TORQUE, smoothing: Optional[float] = None) -> dict:
    """One run: learning, then frozen calibration, held-out and contact phases.  Returns
    the samples from :data:`OBSERVER_LEAD_S` before the freeze on (``t``, ``q``, ``v``, ``tau`` measured, the reference
    ``Q``, ``V``, ``A``, ``truth``: the pushes' joint torques), the frozen estimate ``pi``,
    the learner's prediction ``f`` at the references, the schedule and the phases.
    ``smoothing``: the friction columns' Coulomb shape eps (None: the robot's parameter
    file's ``friction_smoothing``, the graph's)."""
    eps = friction_smoothing(robot) if smoothing is None else float(smoothing)
    m = RobotModel(robot, friction=True, coulomb_smoothing=eps)
    traj = trajectory(m, seed, cfg["base_frequency"])
    phases = {"learn": (0.0, cfg["learn_s"])}
    t = cfg["learn_s"]
    for name in ("calibrate", "heldout", "contact"):
        phases[name] = (t, t + cfg[f"{name}_s"])
        t += cfg[f"{name}_s"]
    total = t
    T = np.arange(int(round(total / DT)) + 1) * DT
    Q, V, A = traj.sample_many(T)
    plant = MujocoPlant(robot, reality=reality(robot, seed), q0=Q[0])
    pushes = push_schedule(robot, m, phases["contact"][0], cfg)
    for p in pushes:
        plant.add_push(p["link"], p["direction"], p["magnitude"], start=p["start"], duration=p["duration"])
    core = controller(m, robot)
    core.state_torque = parametric_torque == "state"
    learner = OnlineResidual(m, learner_kind, threaded=False, **LEARNER_SETTINGS)
    k_freeze = int(round(cfg["learn_s"] / DT))
    k_rec = k_freeze - int(round(OBSERVER_LEAD_S / DT))   # the observers start a little before the freeze
    K = T.size
    keep = K - k_rec
    rec = {key: np.empty((keep, m.n)) for key in ("q", "v", "tau", "truth")}
    err = np.empty((K, m.n))
    x = np.empty(3 * m.n)
    n = m.n
    wall = time.perf_counter()
    for k in range(K):
        tk, q, v, tm = plant.state()
        learn = k < k_freeze
        if k >= k_rec:
            j = k - k_rec
            rec["q"][j], rec["v"][j], rec["tau"][j], rec["truth"][j] = q, v, tm, plant.external_torque
        err[k] = Q[k] - q
        if k == K - 1:
            break
        cmd = core.compute(q, v, Q[k], V[k], A[k], tm, learn=learn)
        if learn and tk >= LEARNER_START_S - 1e-9:
            x[:n], x[n:2 * n], x[2 * n:] = q, v, A[k]
            learner.add_sample(x, tm - (core.model_torque if core.state_torque else core.parametric_torque))
            learner.add_parameter_update(core.last_delta_pi)
            if k % 50 == 49 or k == k_freeze - 1:
                learner.process()
        plant.step(cmd)
    learner.process()
    sim_wall = time.perf_counter() - wall
    sl = slice(k_rec, K)
    X = np.hstack([Q[sl], V[sl], A[sl]])
    f, fvar = learner.predict(X, return_var=True)
    f_state = learner.predict(np.hstack([rec["q"], rec["v"], A[sl]]))   # at the measured state (residual/state)
    f_std = np.sqrt(np.maximum(np.asarray(fvar, dtype=float), 0.0)) if fvar is not None else np.full_like(f, np.nan)
    log(f"[contact] {label(robot)}: {total:g} s simulated in {sim_wall:.1f} s (learner: "
        f"{learner.counters['samples_learned']} samples, {learner.counters['transforms_applied']} transforms)")
    learn_rmse = np.sqrt(np.mean(err[k_freeze // 2:k_freeze] ** 2, axis=0))
    frozen_rmse = np.sqrt(np.mean(err[k_freeze:] ** 2, axis=0))
    return {"robot": robot, "model": m, "t": T[sl], "Q": Q[sl], "V": V[sl], "A": A[sl], **rec, "f": f, "f_state": f_state,
            "f_std": f_std, "pi": core.pi.copy(), "pushes": pushes, "phases": phases, "sim_wall_s": round(sim_wall, 1),
            "tracking_rmse_rad": {"learning_second_half": learn_rmse.tolist(), "frozen": frozen_rmse.tolist()},
            "learner_counters": {k: learner.counters[k] for k in ("samples_learned", "transforms_applied",
                                                                     "fit_errors")},
            "base_frequency": cfg["base_frequency"], "_core": core, "_learner": learner}


def true_model(robot: str, seed: int = 0) -> tuple:
    """The simulator's own model -- the URDF with :data:`TOOL` -- and what it adds beside
    the rigid body: ``(model, f(q, qd, qdd))``, ``f`` its joint friction (Stribeck, ripple
    and all) plus the torque-sensor bias, the residual that makes the observer exact but
    for the sensor noise (the floor no model can go below)."""
    plant = MujocoPlant(robot, reality=reality(robot, seed))
    m = RobotModel(robot)
    m.set_payload(plant.payload_parameters(), plant.payload_frame)        # the plant's own tool
    bias = np.asarray(plant.tau_bias, dtype=float)
    return m, lambda q, v, _a: bias + plant.friction_model(v, q)


def observers(run: dict, seed: int = 0, gain: float = GAIN, models=(*MODELS, "true"), filter_gain: float = 0.0,
              residual_input: Optional[str] = None) -> dict:
    """The observers' estimates ``r`` (samples x joints) on the run's samples: of the three
    models and the simulator's own (``"true"``, :func:`true_model`), gain ``K_O``, second
    low pass ``K_F`` = ``filter_gain`` (0: off); the learned model takes the learner's
    prediction at the measured ``state`` or at the ``reference`` (``residual_input``;
    default the run's, :data:`RESIDUAL_INPUT`)."""
    residual_input = residual_input or run.get("residual_input", RESIDUAL_INPUT)
    m = run["model"]
    robot_arm = armature(run["robot"])   # the drives' inertia the robot's parameter file states (the node's `armature`)
    adapted = observer_model(m, run["pi"])
    out = {}
    for name in models:
        residual, callable_ = None, None
        if name == "learned":
            if residual_input == "state":   # residual/state comes after its state: the node waits for it
                residual = run["f_state"]
            else:
                residual = run["f"]
        arm = ESTIMATE_ARMATURE if name in ("adapted", "learned") else robot_arm
        if name == "urdf":
            model = RobotModel(run["robot"])
        elif name == "true":
            model, callable_ = true_model(run["robot"], seed)
        else:
            model = adapted
        ob = MomentumObserver(model, gain, armature=arm, residual=callable_, filter_gains=filter_gain)
        out[name] = ob.run(run["t"], run["q"], run["v"], run["tau"], residual)
    return out


def other_motion(run: dict, seed: int, seconds: float, keep) -> dict:
    """Never worse off the motion learnt: the frozen controller (its estimate, learning
    off) tracks another draw of the excitation (``seed`` + :data:`OTHER_SEED_OFFSET`, around
    the same pose, same amplitude) from rest at its start, ``seconds`` long, on the same
    plant (other sensor noise); the observers on the adapted estimate, on the adapted + learned model (the
    learner's prediction at the measured state -- its support fall-back and all --, on the
    joints ``keep`` of the calibration) and on the simulator's own model.  Per joint,
    after :data:`OTHER_SETTLE_S`: each model's level (the largest ``|r|`` held over the
    debounce, what a calibration takes) and RMS, the learned model's ratios to the adapted
    one, and the learner's support there (mean; share of states below 1/2).  The learner's
    prediction is taken where the run's observer takes it (``residual_input``)."""
    m, core, learner, robot = run["model"], run["_core"], run["_learner"], run["robot"]
    traj = trajectory(m, seed + OTHER_SEED_OFFSET, run["base_frequency"])
    T = np.arange(int(round(seconds / DT)) + 1) * DT
    Q, V, A = traj.sample_many(T)
    plant = MujocoPlant(robot, reality=reality(robot, seed + OTHER_SEED_OFFSET), q0=Q[0])   # (other noise)
    rec = {key: np.empty((T.size, m.n)) for key in ("q", "v", "tau")}
    for k in range(T.size):
        _tk, q, v, tm = plant.state()
        rec["q"][k], rec["v"][k], rec["tau"][k] = q, v, tm
        if k < T.size - 1:
            plant.step(core.compute(q, v, Q[k], V[k], A[k], tm, learn=False))
    X, X_ref = np.hstack([rec["q"], rec["v"], A]), np.hstack([Q, V, A])
    residual_input = run.get("residual_input", RESIDUAL_INPUT)
    other = {"robot": robot, "model": m, "t": T, **rec, "pi": run["pi"], "f_state": learner.predict(X),
             "f": learner.predict(X_ref), "residual_input": residual_input}
    R = observers(other, seed, models=("adapted", "learned", "true"))
    R["learned"] = np.where(keep, R["learned"], R["adapted"])
    seg = T >= OTHER_SETTLE_S - 1e-9
    level = {k: ThresholdCalibration.from_samples(T[seg], R[k][seg], min_samples=MIN_SAMPLES).max_abs for k in R}
    rms = {k: np.sqrt(np.mean(R[k][seg] ** 2, axis=0)) for k in R}
    at = (X if residual_input == "state" else X_ref)[seg]     # where the prediction is taken
    sup = (np.zeros((at.shape[0], 1)) if learner.learner is None
           else np.asarray(learner.learner.support(at), dtype=float).reshape(at.shape[0], -1))
    return {"seconds": seconds, "seed": seed + OTHER_SEED_OFFSET, "level": {k: _r(v) for k, v in level.items()},
            "rms": {k: _r(v) for k, v in rms.items()},
            "learned_vs_adapted_level": _ratio(level["learned"], level["adapted"]),
            "learned_vs_adapted_rms": _ratio(rms["learned"], rms["adapted"]),
            "support_mean": _r(sup.mean(axis=0), 3), "support_below_half": _r((sup < 0.5).mean(axis=0), 3)}


def whitening_inertia(run: dict) -> np.ndarray:
    """The inertia the node's whitening takes at each sample (samples x n x n): the URDF's
    ``M(q)`` plus the drives' armature its parameter file states -- physical, where an
    adapted estimate's need not be positive definite.  Cached in the run."""
    if "_whitening_inertia" not in run:
        m = RobotModel(run["robot"])
        arm = np.diag(armature(run["robot"]))
        k0 = int(np.searchsorted(run["t"], run["phases"]["calibrate"][0] - 1e-9))
        out = np.zeros((len(run["t"]), m.n, m.n))
        for k in range(k0, len(run["t"])):
            out[k] = m.mass_matrix(run["q"][k]) + arm
        run["_whitening_inertia"] = out
    return run["_whitening_inertia"]


def detector_settings(run: dict, detector: str) -> dict:
    """:func:`evaluate`'s keywords for a detector of :data:`DETECTORS`: the whitening's
    inertia (``change`` and ``whitened``) and the change statistic's window (``change``)."""
    if detector not in DETECTORS:
        raise ValueError(f"detector must be one of {list(DETECTORS)}, got {detector!r}")
    return {"inertia": None if detector == "r" else whitening_inertia(run),
            "change": CHANGE_WINDOW if detector == "change" else 0}


# ----------------------------------------------------------------------------- the figures

def _lowpass(x: np.ndarray, a: float) -> np.ndarray:
    """The observer's own discrete first-order low pass of the samples ``x`` (the torque
    acting over the step ending at each sample): ``y_k = a y_{k-1} + (1 - a) x_k``."""
    y = np.empty_like(x)
    acc = np.zeros(x.shape[1])
    for k in range(len(x)):
        acc = a * acc + (1.0 - a) * x[k]
        y[k] = acc
    return y


def _mask(t, span):
    return (t >= span[0] - 1e-9) & (t < span[1] - 1e-9)


def select_residual(run: dict, R_learned: np.ndarray, R_adapted: np.ndarray,
                    min_samples: int = MIN_SAMPLES, U=None) -> tuple:
    """The ``external_torque`` node's calibration with the residual (``residual_select``):
    over the calibration segment, the estimate with the residual and without it, the
    residual kept on a joint only where its threshold is not higher
    (:func:`~adaptive_dynamics.control.contact.calibrate_residual_joints`).  Returns the
    adapted + learned model's estimates (each joint's from the kept one) and the mask.
    ``U``: the learner's uncertainty term per sample (``k_u std``), the one with the
    residual calibrated under it."""
    n = R_learned.shape[1]
    mg = CALIBRATION["margin"]
    cw, cwo = (ThresholdCalibration(n, min_samples=min_samples, margin=mg),
               ThresholdCalibration(n, min_samples=min_samples, margin=mg))
    t = run["t"]
    for k in np.flatnonzero(_mask(t, run["phases"]["calibrate"])):
        cw.add(t[k], R_learned[k], None if U is None else U[k])
        cwo.add(t[k], R_adapted[k])
    _thr, keep = calibrate_residual_joints(cw, cwo, CALIBRATION["method"], floor=1e-6)   # (the margin: cw's, cwo's)
    return np.where(keep, R_learned, R_adapted), keep


def evaluate(run: dict, R: np.ndarray, model: RobotModel, gain: float = GAIN, min_samples: int = MIN_SAMPLES,
             filter_gain: float = 0.0, std=None, uncertainty_gain: float = 0.0, inertia=None,
             change: int = 0) -> dict:
    """One model's figures (module docstring) from its estimates ``R`` (observer gain
    ``gain``, second low pass ``filter_gain``; the detector's and the calibration's
    ``min_samples``).  ``std`` (samples x joints) with ``uncertainty_gain`` k_u: the
    thresholds ``base + k_u std(t)``, the bases calibrated under that term (the node's
    ``use_residual_std``); ``effective_thresholds_median`` the median over the contact
    phase of what the detector compared with.  ``inertia`` (samples x n x n:
    :func:`whitening_inertia`): the detector watches the noise-whitened estimate beside r
    (:class:`~adaptive_dynamics.control.contact.NoiseWhitening`, calibrated on the same
    segment, the node's ``whiten``); None: r alone.  ``change`` > 0 (with ``inertia``): the
    change statistic d over that many samples beside them (its thresholds calibrated on the
    same segment, the node's ``change_window``; :data:`~adaptive_dynamics.control.contact.CHANGE_HOLD`)."""
    U = None if std is None or uncertainty_gain == 0 else uncertainty_gain * np.asarray(std)
    decay = 5.0 / gain + (5.0 / filter_gain if filter_gain > 0 else 0.0)   # r's decay after a push [s]
    t, ph, truth = run["t"], run["phases"], run["truth"]
    n = R.shape[1]
    cal_span = ph["calibrate"]   # (the observers started OBSERVER_LEAD_S before: settled)
    cal = ThresholdCalibration(n, min_samples=min_samples, margin=CALIBRATION["margin"])
    for k in np.flatnonzero(_mask(t, cal_span)):
        cal.add(t[k], R[k], None if U is None else U[k])
    thr = cal.thresholds(CALIBRATION["method"], margin=CALIBRATION["margin"], floor=1e-6)
    held = _mask(t, ph["heldout"])
    held_cal = ThresholdCalibration(n, min_samples=min_samples)   # the held-out segment's level, alike
    for k in np.flatnonzero(held):
        held_cal.add(t[k], R[k])
    held_max = held_cal.max_abs
    det = ContactDetector(thr, joint_names=list(model.joint_names), min_samples=min_samples,
                          uncertainty_gain=uncertainty_gain if U is not None else 0.0)
    Z = Dz = None
    if inertia is not None:
        ci = _mask(t, cal_span)
        whitening, thr_z = calibrate_whitening(R[ci], inertia[ci], CALIBRATION["method"], min_samples=min_samples,
                                               margin=CALIBRATION["margin"])
        det.set_whitening(whitening, thr_z)
        k0 = int(np.searchsorted(t, ph["heldout"][0] - 1e-9))
        Z = np.zeros_like(R)
        Z[k0:] = whitening.transform_many(R[k0:], inertia[k0:])
        if change:
            kc = np.flatnonzero(ci)
            span = slice(kc[0] - change, kc[-1] + 1)   # r change samples before the segment: the observers run
            thr_d = calibrate_change(R[span], inertia[span], whitening, change, CALIBRATION["method"],
                                     min_samples=min_samples, margin=CALIBRATION["margin"])
            det.set_change(thr_d, change, CHANGE_HOLD)
            Dz = np.zeros_like(R)
            Dz[k0 - change:] = change_samples(R[k0 - change:], inertia[k0 - change:], whitening, change)
    flags = np.zeros(len(t), dtype=bool)
    joints = np.zeros((len(t), n), dtype=bool)
    zflag = np.zeros(len(t), dtype=bool)
    for k in range(len(t)):
        if t[k] < ph["heldout"][0] - 1e-9:
            continue
        flags[k], joints[k] = det.update(R[k], None if U is None else std[k], z=None if Z is None else Z[k],
                                         d=None if Dz is None else Dz[k])
        zflag[k] = det.z_contact or det.change_contact
    fl = flags[held]
    held_alarms = int(fl.sum())
    held_episodes = int(np.sum(np.diff(fl.astype(int)) == 1)) + int(bool(fl.size and fl[0]))
    # pushes: acting on the steps starting in [start, start + duration) -> samples in (start, end]
    contact = _mask(t, ph["contact"])
    expected = np.zeros(len(t), dtype=bool)
    per_push = []
    lin = model.ee_frame
    for p in run["pushes"]:
        s, e = p["start"], p["start"] + p["duration"]
        on = (t > s + 1e-9) & (t <= e + 1e-9)
        expected |= (t > s + 1e-9) & (t <= e + decay + min_samples * DT)   # acting, and r's decay after it
        # detected: a joint flagged, or z's flag on, that was not at the push's start (a flag
        # still on from before -- the last push's aftermath -- is no detection of this one)
        k_s = max(int(np.searchsorted(t, s + 1e-9)) - 1, 0)
        fresh = (joints & ~joints[k_s]).any(axis=1) | (zflag & ~zflag[k_s])
        hit = np.flatnonzero(on & fresh)
        delay = None if not hit.size else round(1e3 * float(t[hit[0]] - s), 1)
        flagged = joints[on].any(axis=0)
        # the wrench direction once settled
        settled = np.flatnonzero(on & (t >= s + 3.0 / gain))[::5]
        F_true = np.asarray(p["direction"])
        angles = []
        for k in settled:
            if p["where"] == "ee":
                F = wrench_estimate(model, run["q"][k], R[k], frame=lin, reference="local_world_aligned")[:3]
            else:
                J = model.jacobian(run["q"][k], p["link"], "local_world_aligned")[:3]
                F = np.linalg.lstsq(J.T, R[k], rcond=None)[0]
            c = float(np.dot(F, F_true) / max(np.linalg.norm(F), 1e-12))
            angles.append(math.degrees(math.acos(max(-1.0, min(1.0, c)))))
        per_push.append({"where": p["where"], "direction_kind": p["direction_kind"], "magnitude": p["magnitude"],
                         "start": p["start"], "detected": delay is not None, "delay_ms": delay,
                         "joints_flagged": [j for j, f in zip(model.joint_names, flagged) if f],
                         "true_torque_max_nm": round(float(np.abs(truth[on]).max()), 3),
                         "direction_error_deg": round(float(np.mean(angles)), 2) if angles else None})
    stray = int((flags & contact & ~expected).sum())
    # the smallest push detected: every push at least that strong detected (both locations)
    mags = sorted({p["magnitude"] for p in per_push})
    smallest = None
    for mag in reversed(mags):
        if all(p["detected"] for p in per_push if p["magnitude"] >= mag):
            smallest = mag
        else:
            break
    by_loc = {}
    for where in ("ee", "elbow"):
        got = [p["magnitude"] for p in per_push if p["where"] == where and p["detected"]]
        by_loc[where] = min(got) if got else None

    def worst_delay(where=("ee", "elbow")):
        d = [p["delay_ms"] for p in per_push if p["magnitude"] == DELAY_PUSH and p["where"] in where]
        return None if (not d or any(x is None for x in d)) else max(d)

    d10 = [p["delay_ms"] for p in per_push if p["magnitude"] == DELAY_PUSH]
    d10_max = worst_delay()
    # RMSE over the contact phase: against the low-passed truth and the raw truth
    ideal = _lowpass(truth, math.exp(-gain * DT))
    if filter_gain > 0:
        ideal = _lowpass(ideal, math.exp(-filter_gain * DT))
    err = R[contact] - ideal[contact]
    raw = R[contact] - truth[contact]
    dir_err = {w: [p["direction_error_deg"] for p in per_push if p["where"] == w and p["direction_error_deg"] is not None]
               for w in ("ee", "elbow")}
    return {
        "thresholds": _r(thr), "heldout_max_abs": _r(held_max),
        "effective_thresholds_median": _r(thr if U is None else np.median(thr + U[_mask(t, ph["contact"])], axis=0)),
        "heldout_headroom_min": round(float(np.min(thr / np.maximum(held_max, 1e-12))), 3),
        "heldout_false_alarm_samples": held_alarms, "heldout_false_alarm_episodes": held_episodes,
        "contact_false_alarm_samples": stray,
        "pushes": per_push, "pushes_detected": int(sum(p["detected"] for p in per_push)),
        "smallest_push_detected_n": smallest, "smallest_detected_per_location_n": by_loc,
        "detection_delay_ms_10n": d10, "detection_delay_ms_10n_max": d10_max,
        "detection_delay_ms_10n_max_per_location": {w: worst_delay((w,)) for w in ("ee", "elbow")},
        "rmse": _r(np.sqrt(np.mean(err ** 2, axis=0))), "rmse_all": round(float(np.sqrt(np.mean(err ** 2))), 5),
        "rmse_raw": _r(np.sqrt(np.mean(raw ** 2, axis=0))), "rmse_raw_all": round(float(np.sqrt(np.mean(raw ** 2))), 5),
        "wrench_direction_error_deg": {w: (round(float(np.mean(v)), 2) if v else None) for w, v in dir_err.items()},
        "_flags": flags, "_thr": thr,
    }


def _r(x, digits: int = 5) -> list:
    return [round(float(v), digits) for v in np.asarray(x).reshape(-1)]


def _ratio(a, b) -> list:
    return [round(float(x / max(y, 1e-12)), 4) for x, y in zip(a, b)]


def run_robot(robot: str, cfg: dict, seed: int, out_dir: str, files: list, log=print,
              with_sensitivity: bool = True, learner: str = LEARNER, plots: bool = True,
              parametric_torque: str = PARAMETRIC_TORQUE, residual_input: str = RESIDUAL_INPUT,
              detector: str = DETECTOR, smoothing: Optional[float] = None) -> dict:
    run = simulate(robot, cfg, seed, log, learner, parametric_torque, smoothing)
    run["residual_input"] = residual_input
    t0 = time.perf_counter()
    R = observers(run, seed)
    kw = detector_settings(run, detector)
    other = "r" if detector == "whitened" else "whitened"     # the other detector, beside

    model = RobotModel(robot)
    every = evaluate(run, R["learned"], model, **kw)      # the residual on every joint
    R_every = R["learned"]
    R["learned"], keep = select_residual(run, R["learned"], R["adapted"])
    res = {name: evaluate(run, R[name], model, **kw) for name in MODELS}
    floor = evaluate(run, R["true"], model, **kw)
    alt = {name: evaluate(run, R[name], model, **detector_settings(run, other)) for name in ("learned", "true")}
    log(f"[contact] {label(robot)}: observers and figures in {time.perf_counter() - t0:.1f} s")
    if plots:
        _plot_timeline(run, R, res, out_dir, files)
    u, ad, le = res["urdf"], res["adapted"], res["learned"]
    ratios = {
        "threshold_vs_urdf": {"adapted": _ratio(ad["thresholds"], u["thresholds"]),
                              "learned": _ratio(le["thresholds"], u["thresholds"])},
        "rmse_vs_urdf": {"adapted": round(ad["rmse_all"] / u["rmse_all"], 4),
                         "learned": round(le["rmse_all"] / u["rmse_all"], 4)},
        "rmse_raw_vs_urdf": {"adapted": round(ad["rmse_raw_all"] / u["rmse_raw_all"], 4),
                             "learned": round(le["rmse_raw_all"] / u["rmse_raw_all"], 4)},
        "rmse_per_joint_vs_urdf": {"adapted": _ratio(ad["rmse"], u["rmse"]), "learned": _ratio(le["rmse"], u["rmse"])},
        "learned_vs_adapted": {"thresholds": _ratio(le["thresholds"], ad["thresholds"]),
                               "rmse": round(le["rmse_all"] / ad["rmse_all"], 4),
                               "heldout_max_abs": _ratio(le["heldout_max_abs"], ad["heldout_max_abs"])},
        "learned_every_joint": {"threshold_vs_urdf": _ratio(every["thresholds"], u["thresholds"]),
                                "vs_adapted": _ratio(every["thresholds"], ad["thresholds"]),
                                "rmse_vs_urdf": round(every["rmse_all"] / u["rmse_all"], 4),
                                "smallest_push_detected_n": every["smallest_push_detected_n"],
                                "detection_delay_ms_10n_max_per_location":
                                    every["detection_delay_ms_10n_max_per_location"],
                                "false_alarm_samples": [every["heldout_false_alarm_samples"],
                                                        every["contact_false_alarm_samples"]]},
    }
    other_detector = {"detector": other, **{name: {
        k: alt[name][k] for k in ("detection_delay_ms_10n", "detection_delay_ms_10n_max",
                                  "detection_delay_ms_10n_max_per_location", "smallest_push_detected_n",
                                  "heldout_false_alarm_samples", "contact_false_alarm_samples")}
        for name in alt}}
    for r_ in (*res.values(), floor, every, *alt.values()):
        r_.pop("_flags")
        r_.pop("_thr")
    uncertainty = uncertainty_table(run, R_every, R["adapted"], model, u["thresholds"], kw)
    other_m = other_motion(run, seed, cfg["other_motion_s"], keep)
    log(f"[contact] {label(robot)}: another motion ({other_m['seconds']:g} s): learned / adapted level"
        f" {max(other_m['learned_vs_adapted_level']):.3g} (worst joint), the learner's support < 1/2 on"
        f" {100 * min(other_m['support_below_half']):.0f}-{100 * max(other_m['support_below_half']):.0f} % of its states")
    sensitivity = []
    if with_sensitivity:
        sensitivity = observer_sensitivity(run, seed, model, res, floor, detector)
        log(f"[contact] {label(robot)}: sensitivity to K_O, K_F and min_samples in {time.perf_counter() - t0:.1f} s")
    return {"robot": label(robot), "joints": list(model.joint_names), "phases": run["phases"],
            "residual_joints": [j for j, k in zip(model.joint_names, keep) if k],
            "pushes": run["pushes"], "sim_wall_s": run["sim_wall_s"], "tracking_rmse_rad": run["tracking_rmse_rad"],
            "learner_counters": run["learner_counters"], "models": res, "ratios": ratios, "sensitivity": sensitivity,
            "uncertainty": uncertainty, "other_detector": other_detector, "other_motion": other_m,
            "true_model": {k: floor[k] for k in ("thresholds", "heldout_false_alarm_samples", "rmse", "rmse_all",
                                                 "smallest_push_detected_n", "detection_delay_ms_10n_max",
                                                 "wrench_direction_error_deg")}}


#: the uncertainty gains k_u of the learner's std in the thresholds (``uncertainty``)
UNCERTAINTY_GAINS = (0.0, 1.0, 2.0)


def uncertainty_table(run: dict, R_every: np.ndarray, R_adapted: np.ndarray, model: RobotModel, urdf_thr,
                      detector_kw: Optional[dict] = None) -> list:
    """The adapted + learned model with the learner's predictive std in its thresholds
    (``base + k_u std``, the node's ``use_residual_std`` and ``uncertainty_gain``; the bases
    and the residual's joints calibrated under that term; the std only where the residual
    is kept), for each k_u of :data:`UNCERTAINTY_GAINS`: the threshold ratio to the URDF's
    (the median over the contact phase of the threshold the detector compared with; worst
    joint), the false alarms, the 10 N delays and the smallest push seen.  Empty when the
    learner gives no finite std."""
    std = run["f_std"]
    if not np.all(np.isfinite(std)):
        return []
    rows = []
    for k in UNCERTAINTY_GAINS:
        Rs, keep = select_residual(run, R_every, R_adapted, U=k * std)
        ev = evaluate(run, Rs, model, std=np.where(keep, std, 0.0), uncertainty_gain=k, **(detector_kw or {}))
        rows.append({"uncertainty_gain": k, "residual_joints": [j for j, m in zip(model.joint_names, keep) if m],
                     "threshold_vs_urdf": _ratio(ev["effective_thresholds_median"], urdf_thr),
                     "threshold_vs_urdf_max": round(max(_ratio(ev["effective_thresholds_median"], urdf_thr)), 4),
                     "heldout_false_alarm_samples": ev["heldout_false_alarm_samples"],
                     "contact_false_alarm_samples": ev["contact_false_alarm_samples"],
                     "detection_delay_ms_10n_max_per_location": ev["detection_delay_ms_10n_max_per_location"],
                     "smallest_push_detected_n": ev["smallest_push_detected_n"]})
    return rows


#: the observer gains, second low passes and debounces of the sensitivity table
SENSITIVITY = {"gains": (30.0, 50.0, 100.0), "filter_gains": (0.0, 100.0), "min_samples": (1, MIN_SAMPLES)}


def observer_sensitivity(run: dict, seed: int, model: RobotModel, res: dict, floor: dict,
                         detector: str = DETECTOR) -> list:
    """The adapted + learned model's threshold ratio to the URDF's and its 10 N detection
    delays, and the simulator's own model's (the floor), for the gains, second low passes
    and debounces of :data:`SENSITIVITY` (the experiment's own setting reuses ``res`` and
    ``floor``; ``detector``: the experiment's, :data:`DETECTOR`)."""
    rows = []
    kw = detector_settings(run, detector)
    for gain in SENSITIVITY["gains"]:
        for kf in SENSITIVITY["filter_gains"]:
            R = None
            for m in SENSITIVITY["min_samples"]:
                if gain == GAIN and kf == 0.0 and m == MIN_SAMPLES:
                    ev = {"urdf": res["urdf"], "learned": res["learned"], "true": floor}
                else:
                    R = R if R is not None else observers(run, seed, gain, ("urdf", "adapted", "learned", "true"), kf)
                    ev = {k: evaluate(run, R[k], model, gain, m, kf, **kw) for k in ("urdf", "true")}
                    ev["learned"] = evaluate(run, select_residual(run, R["learned"], R["adapted"], m)[0], model,
                                             gain, m, kf, **kw)
                rows.append({"gain": gain, "filter_gain": kf, "min_samples": m,
                             "threshold_vs_urdf_max": round(max(_ratio(ev["learned"]["thresholds"],
                                                                       ev["urdf"]["thresholds"])), 4),
                             "true_model_threshold_vs_urdf_max": round(max(_ratio(ev["true"]["thresholds"],
                                                                                  ev["urdf"]["thresholds"])), 4),
                             "detection_delay_ms_10n": ev["learned"]["detection_delay_ms_10n"],
                             "detection_delay_ms_10n_max": ev["learned"]["detection_delay_ms_10n_max"],
                             "true_model_detection_delay_ms_10n": ev["true"]["detection_delay_ms_10n"],
                             "true_model_detection_delay_ms_10n_max": ev["true"]["detection_delay_ms_10n_max"],
                             "heldout_false_alarm_samples": ev["learned"]["heldout_false_alarm_samples"],
                             "smallest_push_detected_n": ev["learned"]["smallest_push_detected_n"],
                             "rmse_vs_urdf": round(ev["learned"]["rmse_all"] / ev["urdf"]["rmse_all"], 4)})
    return rows


def _slowest(delays: dict):
    """The longest of per-location delays (None: a push missed somewhere)."""
    return None if None in delays.values() else max(delays.values())


def summarise(per_robot: dict) -> dict:
    rs = list(per_robot.values())

    def worst(fn):
        vals = [fn(r) for r in rs]
        return None if any(v is None for v in vals) else max(vals)

    s = {
        "threshold_vs_urdf_max": worst(lambda r: max(r["ratios"]["threshold_vs_urdf"]["learned"])),
        "threshold_vs_urdf_max_adapted": worst(lambda r: max(r["ratios"]["threshold_vs_urdf"]["adapted"])),
        "detection_delay_ms_max": worst(lambda r: r["models"]["learned"]["detection_delay_ms_10n_max"]),
        "detection_delay_ms_max_per_model": {m: worst(lambda r, m=m: r["models"][m]["detection_delay_ms_10n_max"])
                                             for m in MODELS},
        "detection_delay_ms_max_per_location": {
            w: worst(lambda r, w=w: r["models"]["learned"]["detection_delay_ms_10n_max_per_location"][w])
            for w in ("ee", "elbow")},
        "detection_delay_ms_max_true_model": worst(lambda r: r["true_model"]["detection_delay_ms_10n_max"]),
        "other_detector": {"detector": rs[0]["other_detector"]["detector"], **{
            k: worst(lambda r, m=m: r["other_detector"][m]["detection_delay_ms_10n_max"])
            for k, m in (("detection_delay_ms_max", "learned"), ("detection_delay_ms_max_true_model", "true"))}},
        "threshold_vs_urdf_max_true_model": worst(lambda r: max(_ratio(r["true_model"]["thresholds"],
                                                                       r["models"]["urdf"]["thresholds"]))),
        "external_torque_rmse_vs_urdf": worst(lambda r: r["ratios"]["rmse_vs_urdf"]["learned"]),
        "external_torque_rmse_vs_urdf_adapted": worst(lambda r: r["ratios"]["rmse_vs_urdf"]["adapted"]),
        "external_torque_rmse_raw_vs_urdf": worst(lambda r: r["ratios"]["rmse_raw_vs_urdf"]["learned"]),
        "learned_vs_adapted_max": worst(lambda r: max(max(r["ratios"]["learned_vs_adapted"]["thresholds"]),
                                                      r["ratios"]["learned_vs_adapted"]["rmse"])),
        "learned_vs_adapted_heldout_max": worst(lambda r: max(r["ratios"]["learned_vs_adapted"]["heldout_max_abs"])),
        "learned_vs_adapted_other_motion_max": worst(lambda r: max(r["other_motion"]["learned_vs_adapted_level"])),
        "residual_joints": {r["robot"]: r["residual_joints"] for r in rs},
        "every_joint": {"threshold_vs_urdf_max": worst(lambda r: max(r["ratios"]["learned_every_joint"]
                                                                     ["threshold_vs_urdf"])),
                        "learned_vs_adapted_max": worst(lambda r: max(r["ratios"]["learned_every_joint"]
                                                                      ["vs_adapted"]))},
        "smallest_push_detected_n": {m: {r["robot"]: r["models"][m]["smallest_push_detected_n"] for r in rs}
                                     for m in MODELS},
        "heldout_false_alarm_samples": {m: sum(r["models"][m]["heldout_false_alarm_samples"] for r in rs)
                                        for m in MODELS},
        "contact_false_alarm_samples": {m: sum(r["models"][m]["contact_false_alarm_samples"] for r in rs)
                                        for m in MODELS},
        "wrench_direction_error_deg": {m: {r["robot"]: r["models"][m]["wrench_direction_error_deg"] for r in rs}
                                       for m in MODELS},
    }

    if all(r["uncertainty"] for r in rs):
        s["uncertainty"] = [
            {"uncertainty_gain": row["uncertainty_gain"],
             "threshold_vs_urdf_max": max(r["uncertainty"][i]["threshold_vs_urdf_max"] for r in rs),
             "heldout_false_alarm_samples": sum(r["uncertainty"][i]["heldout_false_alarm_samples"] for r in rs),
             "contact_false_alarm_samples": sum(r["uncertainty"][i]["contact_false_alarm_samples"] for r in rs),
             "detection_delay_ms_max": worst(lambda r, i=i: _slowest(r["uncertainty"][i]
                                                                      ["detection_delay_ms_10n_max_per_location"]))}
            for i, row in enumerate(rs[0]["uncertainty"])]

    def best(r, key):
        vals = [row[key] for row in r["sensitivity"] if row[key] is not None]
        return min(vals) if vals else None

    if all(r["sensitivity"] for r in rs):
        s["sensitivity_best"] = {
            "detection_delay_ms_max": worst(lambda r: best(r, "detection_delay_ms_10n_max")),
            "detection_delay_ms_max_true_model": worst(lambda r: best(r, "true_model_detection_delay_ms_10n_max")),
            "threshold_vs_urdf_max": worst(lambda r: best(r, "threshold_vs_urdf_max"))}

    def no_larger(a, b):
        return a is not None and (b is None or a <= b)

    smaller_ok = all(no_larger(r["models"]["learned"]["smallest_push_detected_n"],
                               r["models"]["adapted"]["smallest_push_detected_n"])
                     or r["models"]["adapted"]["smallest_push_detected_n"] is None for r in rs)
    s["learned_never_worse"] = bool(s["learned_vs_adapted_max"] is not None
                                    and s["learned_vs_adapted_max"] <= TARGETS["learned_vs_adapted_max"]
                                    and s["learned_vs_adapted_heldout_max"] <= TARGETS["learned_vs_adapted_max"]
                                    and s["learned_vs_adapted_other_motion_max"] <= TARGETS["learned_vs_adapted_max"]
                                    and smaller_ok)

    def le(key):
        return bool(s[key] is not None and s[key] <= TARGETS[key])

    met = {"threshold_vs_urdf_max": le("threshold_vs_urdf_max"), "detection_delay_ms_max": le("detection_delay_ms_max"),
           "external_torque_rmse_vs_urdf": le("external_torque_rmse_vs_urdf"),
           "learned_never_worse": s["learned_never_worse"]}
    return {**s, "targets": TARGETS, "targets_met": met, "target_met": all(met.values())}


#: the seeds of a full run (``--seeds``): the figures vary with the trajectory and the noise
SEEDS = (0, 1, 2)
#: the figures taken over the seeds (medians and spreads)
SEED_KEYS = ("threshold_vs_urdf_max", "threshold_vs_urdf_max_adapted", "threshold_vs_urdf_max_true_model",
             "detection_delay_ms_max", "detection_delay_ms_max_true_model", "external_torque_rmse_vs_urdf",
             "learned_vs_adapted_max", "learned_vs_adapted_heldout_max", "learned_vs_adapted_other_motion_max")


def seed_summary(seed: int, runs: dict) -> dict:
    """One seed's figures: the summary's keys of :data:`SEED_KEYS`, the targets met, and
    per robot the threshold ratios to the URDF's (adapted, learned, the simulator's own
    model), the residual's joints and the residual on every joint's worst ratio."""
    s = summarise(runs)
    return {"seed": seed, **{k: s[k] for k in SEED_KEYS}, "targets_met": s["targets_met"],
            "uncertainty": s.get("uncertainty", []), "other_detector": s["other_detector"],
            "every_joint_threshold_vs_urdf_max": s["every_joint"]["threshold_vs_urdf_max"],
            "per_robot": {name: {"threshold_vs_urdf": r["ratios"]["threshold_vs_urdf"],
                                 "true_model_threshold_vs_urdf": _ratio(r["true_model"]["thresholds"],
                                                                        r["models"]["urdf"]["thresholds"]),
                                 "residual_joints": r["residual_joints"],
                                 "smallest_push_detected_n": r["models"]["learned"]["smallest_push_detected_n"],
                                 "false_alarm_samples": [r["models"]["learned"]["heldout_false_alarm_samples"],
                                                         r["models"]["learned"]["contact_false_alarm_samples"]]}
                          for name, r in runs.items()}}


def over_seeds(per_seed: list) -> dict:
    """Median, min and max over the seeds of each of :data:`SEED_KEYS` (a missed push's
    delay, None, counts as longer than any: the median is None when half the seeds or more
    missed one) and the targets met on every seed."""
    out = {}
    for key in (*SEED_KEYS, "every_joint_threshold_vs_urdf_max"):
        vals = [p[key] for p in per_seed]
        x = np.array([math.inf if v is None else float(v) for v in vals])
        med = float(np.median(x))
        out[key] = {"median": None if not math.isfinite(med) else round(med, 4),
                    "min": None if not math.isfinite(x.min()) else round(float(x.min()), 4),
                    "max": None if not math.isfinite(x.max()) else round(float(x.max()), 4), "values": vals}
    out["targets_met_every_seed"] = {k: all(p["targets_met"][k] for p in per_seed) for k in per_seed[0]["targets_met"]}
    return out


# ----------------------------------------------------------------------------- plots

def _shade(ax, pushes, t_lo, t_hi):
    for p in pushes:
        if p["start"] + p["duration"] < t_lo or p["start"] > t_hi:
            continue
        ax.axvspan(p["start"], p["start"] + p["duration"], color="C1" if p["where"] == "ee" else "C2", alpha=0.15,
                   lw=0)


def _plot_timeline(run, R, res, out_dir, files) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t, truth, ph = run["t"], run["truth"], run["phases"]
    lo, hi = ph["contact"][0] - 0.5, ph["contact"][1]
    w = (t >= lo) & (t <= hi)
    load = np.sqrt(np.mean(truth[_mask(t, ph["contact"])] ** 2, axis=0))
    cols = sorted(np.argsort(-load)[:2])
    names = RobotModel(run["robot"]).joint_names
    fig, axes = plt.subplots(len(MODELS), len(cols), figsize=(13, 7.5), sharex=True, squeeze=False)
    for i, name in enumerate(MODELS):
        thr = res[name]["_thr"]
        flags = res[name]["_flags"]
        for j, c in enumerate(cols):
            ax = axes[i, j]
            _shade(ax, run["pushes"], lo, hi)
            ax.plot(t[w], truth[w, c], color="k", lw=0.8, ls="--", label="applied J^T F")
            ax.plot(t[w], R[name][w, c], color=f"C{i if i else 3}", lw=0.8, label=f"estimate ({MODEL_LABELS[name]})")
            ax.axhline(thr[c], color="0.4", lw=0.7, ls=":")
            ax.axhline(-thr[c], color="0.4", lw=0.7, ls=":")
            on = np.flatnonzero(np.diff(flags.astype(int)) == 1) + 1
            on = on[(t[on] >= lo) & (t[on] <= hi)]
            if on.size:
                ax.plot(t[on], np.full(on.size, ax.get_ylim()[1] * 0.9), "v", color="C3", ms=4, label="contact flag on")
            if i == 0:
                ax.set_title(f"{names[c]}", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{MODEL_LABELS[name]}\n[N m]", fontsize=8)
            ax.legend(fontsize=6, loc="lower left", ncol=3)
    for ax in axes[-1]:
        ax.set_xlabel("sim time [s]  (orange: end-effector push, green: elbow push; dotted: threshold)")
    fig.suptitle(f"{label(run['robot'])}: external torque, estimated vs applied, with the unmodelled tool and joint"
                 f" friction (K_O = {GAIN:g} 1/s)", fontsize=10)
    fig.tight_layout()
    save_plot(fig, out_dir, f"contact_timeline_{label(run['robot'])}.png", files)


def _plot_thresholds(per_robot: dict, out_dir: str, files: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(per_robot), figsize=(6.5 * len(per_robot), 3.8), squeeze=False)
    for ax, (name, r) in zip(axes[0], per_robot.items()):
        n = len(r["joints"])
        x = np.arange(1, n + 1)
        for i, mname in enumerate(MODELS):
            ax.bar(x + (i - 1) * 0.27, r["models"][mname]["thresholds"], 0.27, label=MODEL_LABELS[mname],
                   color=f"C{i if i else 3}")
        ax.plot(x, r["true_model"]["thresholds"], "k_", ms=22, mew=1.5, label="the simulator's own model (noise floor)")
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * 30)
        ax.set_xticks(x)
        ax.set_xlabel("joint")
        ax.set_ylabel("threshold for no false alarm [N m]")
        ax.set_title(f"{name}: contact thresholds ({CALIBRATION['margin']:g} x the largest |r| held {MIN_SAMPLES}"
                     " samples in free motion)", fontsize=9)
        ax.legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    save_plot(fig, out_dir, "contact_thresholds.png", files)


def _plot_seeds(per_seed: list, out_dir: str, files: list) -> None:
    """Per robot and joint, each seed's threshold ratio to the URDF's: adapted, adapted +
    learned, the simulator's own model (the floor); the 1/3 target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    robots = list(per_seed[0]["per_robot"])
    fig, axes = plt.subplots(1, len(robots), figsize=(6.5 * len(robots), 3.8), squeeze=False)
    for ax, name in zip(axes[0], robots):
        for p in per_seed:
            r = p["per_robot"][name]
            x = np.arange(1, len(r["true_model_threshold_vs_urdf"]) + 1)
            first = p is per_seed[0]
            ax.plot(x - 0.15, r["threshold_vs_urdf"]["adapted"], "o", color="C1", ms=4, alpha=0.8,
                    label=MODEL_LABELS["adapted"] if first else None)
            ax.plot(x + 0.15, r["threshold_vs_urdf"]["learned"], "o", color="C3", ms=4, alpha=0.8,
                    label=MODEL_LABELS["learned"] if first else None)
            ax.plot(x, r["true_model_threshold_vs_urdf"], "k_", ms=10, label="the simulator's own model" if first else None)
        ax.axhline(TARGETS["threshold_vs_urdf_max"], color="0.3", ls="--", lw=0.8, label="target 1/3")
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xlabel("joint")
        ax.set_ylabel("threshold / the URDF's")
        ax.set_title(f"{name}: threshold ratio per joint, seeds {[p['seed'] for p in per_seed]}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, out_dir, "contact_seeds.png", files)


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment contact", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="one robot (the first), 20 s of learning, a period each of"
                    " calibration and held-out free motion, 4 s of pushes; no sensitivity table")
    ap.add_argument("--robots", default=",".join(ROBOTS), help=f"comma-separated, of {', '.join(ROBOTS)}"
                    f" (default {','.join(ROBOTS)}; --quick: the first)")
    seeds_arg = ap.add_mutually_exclusive_group()
    seeds_arg.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                    help=f"comma-separated trajectory and sensor-noise seeds (default {','.join(map(str, SEEDS))};"
                    " --quick: the first): the first seed's run gives the tables, plots and sensitivity, every seed"
                    " the medians and spreads (over_seeds)")
    seeds_arg.add_argument("--seed", type=int, default=None, help="one seed (= --seeds S)")
    ap.add_argument("--learner", default=LEARNER, choices=sorted(LEARNERS),
                    help=f"the residual learner of the adapted + learned model (default {LEARNER})")
    ap.add_argument("--parametric-torque", default=PARAMETRIC_TORQUE, choices=["law", "state"],
                    help="what the learner's target subtracts (the adaptive controller's parametric_torque): state"
                    " (default): the estimate at the learner's input | law: the control law's Slotine-Li torque")
    ap.add_argument("--detector", default=DETECTOR, choices=list(DETECTORS),
                    help="what the contact detector watches (external_torque's whiten and change_window): change"
                    " (default): r, the noise-whitened estimate z and its change over 10 samples d | whitened: r"
                    " and z | r: r alone")
    ap.add_argument("--friction-smoothing", type=float, default=None, metavar="EPS",
                    help="the estimate's Coulomb column tanh(qd / EPS) [rad/s], 0 = sgn(qd) (the papers'); default:"
                    " the robot's parameter file's friction_smoothing, as the graph takes it")
    ap.add_argument("--residual-input", default=RESIDUAL_INPUT, choices=["reference", "state"],
                    help="where the observer takes the learner's prediction (external_torque's residual_input):"
                    " state (default): at the measured state | reference: feedforward/residual")
    args = ap.parse_args(argv)
    robots = [r.strip() for r in args.robots.split(",") if r.strip()]
    bad = [r for r in robots if r not in ROBOTS]
    if bad or not robots:
        raise SystemExit(f"robots {bad or robots}: this experiment has settings for {list(ROBOTS)}")
    try:
        seeds = [args.seed] if args.seed is not None else [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, got {args.seeds!r}") from None
    seeds = list(dict.fromkeys(seeds))   # each once, in the order given
    if args.friction_smoothing is not None and not (math.isfinite(args.friction_smoothing)
                                                    and args.friction_smoothing >= 0):
        raise SystemExit(f"--friction-smoothing: >= 0 rad/s, got {args.friction_smoothing!r}")
    if not seeds:
        raise SystemExit("--seeds: at least one seed")
    if args.quick:
        robots, seeds = robots[:1], seeds[:1]
    cfg = QUICK if args.quick else FULL
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    files: list = []
    per_seed = []
    for i, seed in enumerate(seeds):
        runs = {}
        for robot in robots:
            res = run_robot(robot, cfg, seed, args.out, files, with_sensitivity=not args.quick and i == 0,
                            learner=args.learner, plots=i == 0, parametric_torque=args.parametric_torque,
                            residual_input=args.residual_input, detector=args.detector,
                            smoothing=args.friction_smoothing)
            runs[res["robot"]] = res
        if i == 0:
            per_robot = runs
        per_seed.append(seed_summary(seed, runs))
    _plot_thresholds(per_robot, args.out, files)
    if len(seeds) > 1:
        _plot_seeds(per_seed, args.out, files)
    out = {"experiment": "contact", "quick": bool(args.quick), "robots": list(per_robot), "seed": seeds[0],
           "seeds": seeds,
           "config": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}, "push_on_s": PUSH_ON,
                      "push_slot_s": PUSH_SLOT, "observer_gain": GAIN, "calibration": CALIBRATION, "learner": args.learner,
                      "parametric_torque": args.parametric_torque, "residual_input": args.residual_input,
                      "detector": args.detector,
                      "friction_smoothing": {label(r): (friction_smoothing(r) if args.friction_smoothing is None
                                                        else args.friction_smoothing) for r in robots},
                      "estimate_armature": ESTIMATE_ARMATURE,
                      "tool": TOOL, "elbow": {label(r): ELBOW[r] for r in robots}},
           **summarise(per_robot), "over_seeds": over_seeds(per_seed), "per_seed": per_seed, "per_robot": per_robot,
           "plots": [os.path.basename(f) for f in files], "runtime_s": round(time.perf_counter() - t0, 1)}
    return write_result(args.out, "contact", out)


if __name__ == "__main__":
    sys.exit(main())
