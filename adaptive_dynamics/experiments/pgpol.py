"""PGPOL experiments (Habich et al. 2019, sec. IV, Tables I-II, Fig. 3-5) in MuJoCo.

``adaptive-dynamics experiment pgpol --out DIR [--quick] [--robot panda|iiwa14|URDF]
[--part all|1|2|payload] [--reality unmodelled|model] [--keep-bags] [-v]``

Every run is the closed loop over DDS, in lockstep, as separate processes (the graph
``adaptive-dynamics launch sim`` starts): ``mujoco_bridge`` (reality of
``config/<robot>.yaml``: joint friction f_v v + f_c tanh(v / 0.01)), ``trajectory``,
``adaptive_controller``, ``recorder`` and, for a learned feed-forward, the PGPOL split.
The simulated arm (``--reality unmodelled``, the default) has, besides the rigid bodies
and the viscous/Coulomb friction of its config, a joint position ripple
``a sin(N q)`` (2 % of the effort limit, 10 periods per rad) and Stribeck friction
(break-away at twice the Coulomb level, fading over 0.1 rad/s), each at most what the
PD's stiffness holds within 0.025 rad (:data:`UNMODELLED`; binds on the iiwa 14's wrist
only): effects a rigid-body model cannot represent, as on the paper's real robot.  ``--reality model`` leaves them
out; then the identified rigid-body model is exact and no learner beats it.

* ``model_update`` -- ``target: torque``: learns the measured joint torque from the
  *actual* joint state x = (q, qd, qdd), qdd the 20 Hz low-passed difference of the
  measured velocity (``acceleration: measured``; the paper's "actual joint sizes":
  with the desired acceleration instead, the soft loop's tracking error makes the
  training data inconsistent and the feed-forward destabilised the loop); every 10th
  state (100 Hz), at most ``QUEUE_LIMIT`` samples waiting; ``joint_states`` taken best
  effort, depth 1 (it learns from the newest state it can take rather than falling
  seconds behind a 2-core machine); hints the reference 10 ms ahead; a snapshot at most
  every 0.1 s wall;
* ``prediction`` -- ``feedforward/residual`` at the reference (q_d, qd_d, qdd_d), 50 ms
  ahead of its newest state;
* the controller waits (``residual_wait``) for the residual stamped for each state, so
  every cycle gets its feed-forward and a lagging prediction node slows the simulation.

How far the learner's model lags the simulation therefore depends on the machine; each
run reports learner updates and samples learned per sim second, versions published and
applied, and ``data_lag_s`` (sim time at a snapshot's arrival minus the instant of its
newest sample, found by matching the sample's q in the recorded states).  A monitor in
this process follows ``/clock``, reads every snapshot on ``learner/model`` (the
learner's change-test statistics and database size, without building it) and makes the
timed service calls (the payload).

**PD feedback plus feed-forward** (the paper's drive control): the ``adaptive_controller``
with adaptation off, ``tau = Y(q, qd, qd_r, qdd_r) pi_hat - K_D s (+ feedforward/residual)``,
``s = qd - qd_r``, ``qd_r = qd_d + Lambda e``:

* no feed-forward: law ``pd`` (pi_hat = 0): ``tau = K_D (e_dot + Lambda e)``, a PD with
  ``K_P = K_D Lambda`` and ``K_D``;
* rigid-body model (RBD, ``rbd``): law ``direct`` with ``learning: false`` and the
  identified pi_hat loaded as ``estimate_file`` (base parameters + viscous and Coulomb
  friction columns, ``sgn(v)``); the model term is evaluated on the measured state with
  the reference velocity/acceleration (Slotine-Li), so it is model-weighted feedback,
  more than a pure feed-forward;
* the paper's rigid-body baseline (``rbd_ff``): the same model as a pure feed-forward of
  the reference, ``Y(q_d, qd_d, qd_d, qdd_d) pi_hat - K_D s`` (``model_input: desired``);
* learned feed-forward: law ``pd`` plus the prediction node's ``feedforward/residual``
  (the paper's, and ``--project-prior mean``); the project mode's default
  (``--project-prior rbd``) is the ``rbd`` controller plus the prediction of a learner of
  its residual (``model_update`` ``target: residual``), so that where the learner's data
  do not reach the feed-forward is the identified rigid-body model.

Gains: the soft ones of ``config/<robot>.yaml`` (``lam`` = 10 1/s, ``kd``; Panda
K_P = 300/300/200/200/40/40/10 N m/rad, K_D = 30/30/20/20/4/4/1 N m s/rad): without
feed-forward the arm sags under gravity by centi- to deci-radians.

Any other arm: ``--robot path/to/arm.urdf`` (``--joints``, ``--ee-frame`` as for ``demo``)
runs with its generated parameter file (model-derived gains, friction) and
:data:`GENERATED` around its task pose (:func:`robot_settings`,
:mod:`~adaptive_dynamics.experiments.robot_choice`).

**Identification (the RBD baseline):** an excitation run (Modified Fourier reference of
the trajectory node, ``fourier``, 0.4 rad, 0.1 Hz, 4 harmonics; PD only), recorded;
``q``, ``qd`` and the measured torque filtered forward-backward (Butterworth, 20 Hz),
``qdd`` by central differences, least squares on the base regressor + friction columns
(:mod:`adaptive_dynamics.dynamics.identification`).  It captures everything of the arm
but the ripple and the Stribeck term (with ``--reality model``: everything), a strong
baseline a learner has to beat.

**Experiment I (Table I):** the square followed by its inscribed circle (side 0.2 m,
horizontal plane, 7 s per lap; Fig. 3a) by differential IK, repeated; every run lasts
one lap plus ``T`` = 40 s and ``A_total = sum_j int e_j^2 dt`` (eq. 10-11, trapezoidal,
in deg^2 ms as in the paper) is integrated over the last 40 s (the first lap is the
start-up: every approach, the learners included, starts from nothing at t = 0).
Constellations: windows n = 60, 120, 480 (one GP; 480 without database is the paper's
SGPOL), (60, 120), (60, 480), each with knn = 0 and 20; the paper's GP size (m = 20
inducing inputs, <= 10 optimiser iterations per refit).

**Experiment II (Table II, Fig. 5):** pick-and-place between six points on a circle
(joint-space minimum-jerk moves between IK waypoints above and at each point; Fig. 3c),
5 cycles each at 33, 66 and 100 % speed (``speed_schedule``), with no feed-forward, the
identified rigid-body model as a pure feed-forward (``rbd_ff``), and per mode
(:func:`table_ii_rows`) SGPOL (n = 480) and PGPOL (n = 60, 480, knn 20); the paper mode
adds the offline GP (one sparse GP per joint fitted once on a separate training run
over twelve other points at rising speed, Fig. 3b, tracked with the identified
rigid-body model so the arm stays on its reference; then frozen, raw, and served by the
prediction node from its ``model_file``).  nmse-bar over time (eq. 8-9 of the
feed-forward against the measured torque, cumulative and in 1 s windows; not for the
project mode's rows, which predict a residual), A_total per speed section, the recovery
time after each speed change; Fig. 5 from the paper mode.

**Payload run:** PGPOL (n = 60, 480, knn 20) on the pick-and-place at half speed; a
payload (Panda 3 kg, iiwa 7 kg) is attached mid-run (``mujoco_bridge/set_payload``, at a
pick point, at rest).  The learner's change detection (eq. 7-9: ``change_threshold``
eta, ``change_horizon``, ``change_warmup``) should clear the database after that
instant and not before; the database size, the learner's own nmse-bar and the clears
come from the snapshots, gamma of the feed-forward stream (the paper's PLC-side test)
from the bag.  Run with the learner's defaults (:data:`CHANGE`) and (full run) with the
paper's test (:data:`PAPER_CHANGE`).

**Change detection:** every learner here runs with the learner's defaults (eta 0.1,
horizon 300, lag 50, warm-up 1500: ``CHANGE_DEFAULTS`` of :mod:`adaptive_dynamics.learning.pgpol`).  The
paper's test (gamma over one sample, cumulative nmse-bar, eta 1e-3) fires on any
sample much worse than the running average -- in a closed loop every fast move has
some -- and the payload run repeats with it for comparison.  :func:`change_study`
(full run) replays the recorded learning streams through PGPOL and evaluates the test
over a grid of settings, offline, for the evidence in ``change_detection``.

**Modes** (``--mode``, Tables I and II): ``project`` runs the learners with their defaults -- a
prediction falls back to its prior where the learner's support does not reach
(``docs/learners.md``) -- on the residual of the identified rigid-body model, so the
prior is that model (``--project-prior rbd``, default; ``mean``: the torque itself, the
prior the running mean torque); ``paper`` runs the paper's algorithm as far as it
is a setting (:data:`PAPER_LEARNER`: the fused raw mean everywhere, ``raw_prediction`` on
``model_update`` and ``prediction``; the paper's one-sample change test; the fusion
weighting each GP by its scaled standard deviation, ``fusion: scaled``; each GP's scalers
on its window alone, ``scale_on: window``; one current sample per model update,
``update_samples: latest`` on ``model_update``, where the project learns every queued
sample in batches); ``both`` (the
default) runs the learned rows in each mode beside one set of baselines (``--quick``: one
constellation in the paper mode).

JSON (``pgpol.json``, printed last): ``table_i`` (A_total per approach),
``a_total_reduction_best``, ``a_total_reduction_rbd``, ``beats_rbd`` (and ``_rbd_ff``: against
the paper's pure feed-forward baseline), ``table_ii`` (every row; the second mode's keys
prefixed with it, e.g. ``paper pgpol``; ``experiment_2`` has each mode's ``table_ii`` and
``a_total_reduction`` in ``project_mode`` / ``paper_mode`` and ``fig5_mode``),
``nmse_recovery``, ``change_detected``, ``payload``, ``change_detection``,
``identification``, ``offline_gp``, ``project_mode`` / ``paper_mode`` (each mode's best
constellation, reduction and comparisons), and per run (``runs``) the wall time, sim rate,
learner updates and samples per sim second, versions published/applied, feed-forward
cycles, database clears and ``data_lag_s``.
"""
from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from ..control.adaptive import estimate_file
from ..dynamics import RobotModel
from ..dynamics.identification import identify, prepare
from ..evaluation.streams import read_streams
from ..files import json_default
from ..launcher import graph_kind, run_to_end
from ..learning import make_learner
from ..learning.pgpol import CHANGE_DEFAULTS, CHANGE_PAPER, ChangeTest
from ..learning.snapshot import encode_snapshot, read_header, write_snapshot_file
from ..robots import friction, paper_config, robot_config
from ..ros.qos import LATCHED_QOS
from ..scenarios import build_graph
from ..trajectories import ACCELERATION_LIMIT, CartesianTrajectory, square_circle
from . import save_plot, write_result
from . import add_graph_argument
from .clock_follower import ClockFollower
from .robot_choice import add_robot_args, chosen_robots, gains, is_shipped, label, task_configuration

#: per robot: the task's start pose, the pick-and-place base pose and offsets, the payload
#: (``q_pp``: the pick-and-place base pose, default ``q_task``; ``pp_centre``: the circle's
#: centre relative to its end effector [m]; ``task`` / ``pick_place``: overrides of TASK /
#: PICK_PLACE -- the iiwa's slower joints (1.31 rad/s on joint 4) need a slower lap and moves)
ROBOTS: dict[str, dict[str, Any]] = {
    "panda": {"q_task": [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785],
              "pp_centre": [0.15, 0.0, -0.12], "payload_mass": 3.0, "task": {}, "pick_place": {}},
    "iiwa14": {"q_task": [0.0, 0.6, 0.0, -1.2, 0.0, 0.6, 0.0], "q_pp": [0.0, 0.8, 0.0, -1.9, 0.0, 0.4, 0.0],
               "pp_centre": [0.1, 0.0, 0.0], "payload_mass": 7.0, "task": {"cartesian_period": 10.0},
               "pick_place": {"move_time": 0.7}},
}
TASK = {"type": "square_circle", "cartesian_size": 0.2, "cartesian_period": 7.0, "cartesian_plane": "xy"}
EXCITATION = {"type": "fourier", "amplitude": 0.4, "base_frequency": 0.1, "harmonics": 4}
#: pick-and-place: six test points on a circle, twelve training points in a star
PICK_PLACE = {"radius": 0.12, "height": 0.08, "move_time": 0.55, "dwell_time": 0.1, "speeds": [0.33, 0.66, 1.0],
              "cycles": 5, "train_radii": [0.08, 0.15], "train_lift": 0.03, "acceleration_limit": 15.0}
#: the paper's GP size (sec. II-C): 20 inducing inputs, <= 10 optimiser iterations
LEARNER_BASE: dict[str, Any] = {"n_inducing": 20, "max_iter": 10, "database_size": 2000}
#: Experiment I grid: (windows, knn)
CONSTELLATIONS = [((60,), 0), ((60,), 20), ((120,), 0), ((120,), 20), ((480,), 0), ((480,), 20),
                  ((60, 120), 0), ((60, 120), 20), ((60, 480), 0), ((60, 480), 20)]
QUICK_CONSTELLATIONS = [((480,), 20), ((60, 480), 20)]
#: change detection (eq. 7-9) of every PGPOL/SGPOL run here: the learner's defaults
#: (``CHANGE_DEFAULTS``, see the module docstring); the paper's one-sample test
#: (``CHANGE_PAPER``) repeats the payload run in the full experiment
CHANGE: dict[str, Any] = dict(CHANGE_DEFAULTS)
PAPER_CHANGE: dict[str, Any] = dict(CHANGE_PAPER)
#: ``--mode``: Table I's learned rows as the project runs them (the learners' defaults: the
#: prediction falls back to its prior, the running mean torque, where the learner's support
#: does not reach) and as the paper's algorithm does (every prediction the GPs' fused raw
#: mean, the paper's one-sample change test); ``both`` (default) runs each
MODES = ("both", "project", "paper")
#: ``--project-prior``: what the project mode's learners fall back to -- ``rbd`` (default):
#: they learn the residual of the identified rigid-body model (``target: residual``), the
#: controller feeds that model forward beside them (``law: direct`` on the identified
#: estimate, learning off), so the prior is the rigid-body model; ``mean``: they learn the
#: torque itself (``target: torque``, the paper's) and fall back to the running mean torque
PROJECT_PRIORS = ("rbd", "mean")
#: what the paper mode changes in a learned run (the departures that are settings so far)
PAPER_LEARNER: dict[str, Any] = {"raw": True, "change": PAPER_CHANGE, "fusion": "scaled", "scale_on": "window",
                                 "update_samples": "latest"}
#: the payload run: pick-and-place at this speed, the payload attached at the start of the
#: dwell at waypoint PAYLOAD_WAYPOINT (a pick point, at rest) of cycle 2 (quick: of cycle 1, the
#: run ending QUICK_PAYLOAD_TAIL_S [s] later -- shorter than the change test's warm-up: the quick
#: run checks the attachment and the learner's updates, the full one the detection)
PAYLOAD_SPEED = 0.5
PAYLOAD_WAYPOINT = 6
QUICK_PAYLOAD_TAIL_S = 1.5
#: the offline GP: one sparse GP on the training run
OFFLINE_GP = {"n_points": 3000, "n_inducing": 100, "max_iter": 100, "groups": "joint"}
#: ``--offline-gp paper``: the paper's size (15,000 points, 1,500 inducing inputs), one GP for
#: all joints with shared hyperparameters (GPy's multi-output regression, as the paper's): one
#: likelihood evaluation ~4 s here, where one GP per joint would take ~7x as long
OFFLINE_GP_PAPER = {"n_points": 15000, "n_inducing": 1500, "max_iter": 100, "groups": "shared"}
#: joint effects outside the rigid-body + viscous/Coulomb model class (``--reality unmodelled``,
#: the default): a position ripple of 2 % of the effort limit (harmonic-drive torque ripple is
#: typically 1-3 % of rated torque), 10 periods per rad, and Stribeck friction doubling the
#: Coulomb level at rest, fading over 0.1 rad/s; each capped where the PD's stiffness
#: K_P = K_D Lambda would let it deflect the joint by more than 0.025 rad (1.4 deg).  The cap: the
#: URDFs carry no rotor inertia, so on a wrist with a high rating and a light link (iiwa 14
#: joint 7: 40 N m rated, 1e-3 kg m^2, K_P 2 N m/rad) 2 % of the rating is a 0.8 N m ripple
#: accelerating the bare link at ~800 rad/s^2 and throwing it +-0.4 rad -- not a drive anyone
#: would run under PD; it binds on no joint of the Panda
UNMODELLED = {"ripple_fraction": 0.02, "ripple_periods": 10.0, "max_deflection": 0.025,
              "stribeck_ratio": 1.0, "stribeck_velocity": 0.1}
#: --quick caps the pace (sim s per wall s): the short runs' learners then get what a faster
#: machine would give them whatever else the machine is doing, so the quick figures are stable
QUICK_MAX_SPEED = 0.5
LEARN_RATE_HZ = 100.0            # model_update learn_decimation 10 at 1 kHz
QUEUE_LIMIT = 20                 # samples waiting for the learner at most (0.2 s): never learn stale data
PUBLISH_PERIOD = 0.1             # model_update: wall s between snapshots at most
PREDICTION_LEAD = 0.05           # prediction: residuals this far ahead of its newest state [s]
RESIDUAL_STALENESS = 0.05        # controller: use the newest residual at most this old [s]
RESIDUAL_WAIT = 0.25             # controller (lockstep): wait up to this many wall s for a state's residual
                                 # (a residual lost on the way and resent by DDS later stalled the loop
                                 # for ~5 s each time with a 5 s wait: the cap bounds that)
LEARNER_RELIABLE = False         # model_update takes joint_states best effort, depth 1: the newest state
DEG2MS = (180.0 / math.pi) ** 2 * 1e3   # rad^2 s -> deg^2 ms
RECORDED = ["joint_states", "reference", "learner/prediction", "/diagnostics"]


# ============================================================================ set-up
#: a URDF robot's settings in place of :data:`ROBOTS` (``q_task``: its
#: :func:`~adaptive_dynamics.experiments.robot_choice.task_configuration`)
GENERATED = {"pp_centre": [0.1, 0.0, -0.05], "payload_mass": 2.0, "task": {}, "pick_place": {}}


def robot_settings(robot: str) -> dict:
    """:data:`ROBOTS` of a shipped robot, else :data:`GENERATED` around the robot's task pose."""
    if robot in ROBOTS:
        return ROBOTS[robot]
    return {**GENERATED, "q_task": _task_pose(robot)}


@functools.lru_cache(maxsize=None)
def _task_pose(robot: str) -> list:
    """The most manipulable pose from which the Experiment I path and both pick-and-place
    circles stay within the limits the trajectory node checks."""
    m = RobotModel(robot)

    acc = np.full(m.n, ACCELERATION_LIMIT)   # the trajectory node's check

    def feasible(q):
        cfg = {**GENERATED, "q_task": q}
        try:
            # a coarse IK grid first (cheap), then the trajectory node's own 1 ms grid
            _task_trajectory(m, q, TASK, dt=0.01).check_limits(m.lower, m.upper, m.velocity_limit, acc)
            for which in ("test", "train"):
                _waypoints(m, cfg, {**PICK_PLACE}, which)
            _task_trajectory(m, q, TASK).check_limits(m.lower, m.upper, m.velocity_limit, acc)
        except ValueError:
            return False
        return True
    return [round(float(x), 4) for x in task_configuration(m, feasible=feasible)]


def reality(robot: str, kind: str) -> dict:
    """mujoco_bridge parameters of the experiment's reality: ``model`` (config/<robot>.yaml:
    rigid bodies + viscous/Coulomb friction, what the identified model can represent exactly)
    or ``unmodelled`` (plus :data:`UNMODELLED`'s ripple and Stribeck friction)."""
    if kind == "model":
        return {}
    lim = RobotModel(robot).effort_limit
    _, fc = friction(robot)
    u = UNMODELLED
    g = gains(robot)
    kp = np.broadcast_to(np.asarray(g["kd"], float) * np.asarray(g["lam"], float), lim.shape)
    cap = u["max_deflection"] * kp
    ripple = np.minimum(u["ripple_fraction"] * lim, cap)
    stribeck = np.minimum(u["stribeck_ratio"] * np.asarray(fc, float), cap)
    return {"ripple_amplitude": [round(float(x), 4) for x in ripple],
            "ripple_periods": u["ripple_periods"],
            "friction_stribeck": [round(float(x), 4) for x in stribeck],
            "stribeck_velocity": u["stribeck_velocity"]}


def task_params(robot: str) -> dict:
    return {**TASK, **robot_settings(robot).get("task", {})}


def task_trajectory(robot: str):
    """The Experiment I reference as the trajectory node builds it (start pose, IK)."""
    return _task_trajectory(RobotModel(robot), robot_settings(robot)["q_task"], task_params(robot))


def _task_trajectory(m, q_task, task: dict, dt: float = 1e-3):
    per = task["cartesian_period"]
    path = square_circle(task["cartesian_size"], per / 7.0, 3.0 * per / 7.0, 0.0, task["cartesian_plane"])
    return CartesianTrajectory(m, np.asarray(q_task, float), path, dt=dt)


def ik(model, q_seed, p, R, iters: int = 200, tol: float = 1e-10) -> np.ndarray:
    """Joint configuration placing the end effector at position ``p``, rotation ``R``:
    damped Newton steps from ``q_seed`` with a null-space pull back to it (first half of
    the iterations), then plain Newton steps to ``tol``."""
    import pinocchio as pin
    q = np.asarray(q_seed, dtype=float).copy()
    q0 = q.copy()
    n = model.n
    e = np.full(6, np.inf)
    for it in range(iters):
        T = model.frame_pose(q)
        e = np.concatenate([p - T[:3, 3], pin.log3(R @ T[:3, :3].T)])
        if np.linalg.norm(e) < tol:
            break
        J = model.jacobian(q)
        Jp = J.T @ np.linalg.solve(J @ J.T + 1e-10 * np.eye(6), np.eye(6))
        q = q + Jp @ e
        if it < iters // 2:
            q = q + 0.2 * (np.eye(n) - Jp @ J) @ (q0 - q)
    else:
        raise ValueError(f"IK did not converge to {p} (error {np.linalg.norm(e):.2e})")
    if np.any(q < model.lower) or np.any(q > model.upper):
        raise ValueError(f"IK solution for {p} violates the joint limits: {q}")
    return q


def pp_settings(robot: str) -> dict:
    return {**PICK_PLACE, **robot_settings(robot).get("pick_place", {})}


def pick_place_waypoints(robot: str, which: str = "test") -> np.ndarray:
    """Joint waypoints of one pick-and-place cycle: for each point ``k`` the pose at the
    point (``D_k``, pick/place at rest) and then above the next one (``A_k+1``), so every
    visit is a vertical descent ``A_k -> D_k``; waypoint 0 is the first pick.
    ``which``: "test" (six points on a circle, Fig. 3c) or "train" (twelve points in a
    star, alternately on two radii and slightly higher, Fig. 3b)."""
    return _waypoints(RobotModel(robot), robot_settings(robot), pp_settings(robot), which)


def _waypoints(m, cfg: dict, pp: dict, which: str) -> np.ndarray:
    qb = np.asarray(cfg.get("q_pp", cfg["q_task"]), float)
    Tb = m.frame_pose(qb)
    centre = Tb[:3, 3] + np.asarray(cfg["pp_centre"], float)
    R = Tb[:3, :3]
    if which == "test":
        ang = np.arange(6) * (2 * math.pi / 6)
        radii = np.full(6, pp["radius"])
        lift = 0.0
    else:
        ang = np.arange(12) * (2 * math.pi / 12) + math.pi / 12
        radii = np.array(pp["train_radii"] * 6)
        lift = pp["train_lift"]
    pts = [centre + np.array([r * math.cos(a), r * math.sin(a), lift]) for r, a in zip(radii, ang)]
    up = np.array([0.0, 0.0, pp["height"]])
    wps, q = [], qb
    for k in range(len(pts)):
        q = ik(m, q, pts[k], R)
        wps.append(q)
        q = ik(m, q, pts[(k + 1) % len(pts)] + up, R)
        wps.append(q)
    return np.array(wps)


def pick_place_params(robot: str, which: str = "test", schedule=None, cycles: int = 5) -> dict:
    W = pick_place_waypoints(robot, which)
    pp = pp_settings(robot)
    out = {"type": "pick_place", "q_pick": W[0].tolist(), "q_place": W[1].tolist(),
           "via": W[2:].reshape(-1).tolist(), "move_time": pp["move_time"], "dwell_time": pp["dwell_time"],
           "acceleration_limit": pp["acceleration_limit"]}
    if schedule:
        out["speed_schedule"] = [float(s) for s in schedule]
        out["cycles_per_speed"] = int(cycles)
    return out


def pick_place_period(robot: str, which: str = "test") -> float:
    n = len(pick_place_waypoints(robot, which))
    pp = pp_settings(robot)
    return n * (pp["move_time"] + pp["dwell_time"])


def learner_config(windows, knn: int, change: dict | None = None, **extra) -> dict:
    cfg = {**LEARNER_BASE, "windows": list(windows), "knn": int(knn), **(change or {}), **extra}
    return cfg


def constellation_key(windows, knn: int) -> str:
    return f"n={','.join(str(w) for w in windows)} knn={knn}"


# ============================================================================ running a graph
class RunMonitor(ClockFollower):
    """Follows one run from this process (own rclpy context): ``/clock``, every snapshot
    on ``learner/model`` (statistics of the learner inside it), and timed actions
    ``(sim time, service, request_value)`` (std_srvs/SetBool) made once the clock passes
    their time."""

    def __init__(self, actions=(), namespace: str = ""):
        from std_msgs.msg import UInt8MultiArray
        from std_srvs.srv import SetBool


        super().__init__("pgpol_monitor", namespace)
        self.actions = sorted(actions)
        self.clients = {srv: self.node.create_client(SetBool, srv) for _, srv, _ in self.actions}
        self.done: list[dict] = []
        self.snapshots: list[dict] = []
        self._next = 0
        self._lock = threading.Lock()
        self.node.create_subscription(UInt8MultiArray, "learner/model", self._on_snapshot, LATCHED_QOS, raw=True)
        self.start()

    def on_clock(self, t: float) -> None:
        from std_srvs.srv import SetBool
        while self._next < len(self.actions) and t >= self.actions[self._next][0]:
            t_act, srv, value = self.actions[self._next]
            self._next += 1
            entry = {"service": srv, "value": bool(value), "t_s": t_act, "clock_s": round(t, 4)}
            self.done.append(entry)
            req = SetBool.Request()
            req.data = bool(value)
            fut = self.clients[srv].call_async(req)

            def done(f, entry=entry):
                try:
                    res = f.result()
                    if not res.success:
                        self.errors.append(f"{entry['service']} refused: {res.message}")
                except Exception as exc:  # pragma: no cover - the service died
                    self.errors.append(f"{entry['service']}: {exc!r}")
                entry["acknowledged_s"] = round(self.last_clock, 4)
            fut.add_done_callback(done)

    def problems(self) -> list[str]:
        """Errors (refused actions, unreadable snapshots) and actions that did not happen."""
        out = self.errors[:5]
        if len(self.done) != len(self.actions):
            out.append(f"only {len(self.done)} of {len(self.actions)} timed actions happened")
        return out

    def _on_snapshot(self, raw: bytes) -> None:
        try:
            st = snapshot_stats(raw)
        except Exception as exc:  # never let the monitor die on one snapshot
            self.errors.append(f"snapshot not readable: {exc!r}")
            return
        st["t_rx"] = round(self.last_clock, 4)
        with self._lock:
            self.snapshots.append(st)


def _cdr_uint8_array_data(raw: bytes) -> memoryview:
    """The ``data`` bytes of a serialized ``std_msgs/UInt8MultiArray`` (little-endian CDR),
    without a copy: layout.dim (label, size, stride each), data_offset, then data."""
    import struct
    b = memoryview(raw)
    if len(b) < 8 or bytes(b[:2]) != b"\x00\x01":
        raise ValueError("not little-endian CDR")
    off = 4
    u32 = struct.Struct("<I")

    def take(o):
        return u32.unpack_from(b, o)[0], o + 4
    ndim, off = take(off)
    for _ in range(ndim):
        n, off = take(off)
        off = (off + n + 3) & ~3          # label (with its NUL), aligned for the next u32
        off += 8                          # size, stride
    off += 4                              # data_offset
    n, off = take(off)
    if off + n > len(b):
        raise ValueError("truncated UInt8MultiArray")
    return b[off: off + n]


def snapshot_stats(raw: bytes) -> dict:
    """Version and PGPOL statistics of one serialized ``learner/model`` message, read from
    the snapshot's small arrays without building the learner: samples inserted, database
    size (from the array header only), nmse-bar of the change test (eq. 8) and its sample
    count, refits, clears and the sequence number of the last one."""
    import zipfile

    data = _cdr_uint8_array_data(raw)
    header, payload = read_header(data, max_bytes=None)
    out = {"version": int(header["version"]), "kind": header["kind"], "bytes": len(data)}
    with zipfile.ZipFile(io.BytesIO(payload)) as z:
        names = set(z.namelist())

        def arr(key):
            with z.open(key + ".npy") as fh:
                return np.lib.format.read_array(fh, allow_pickle=False)
        meta = json.loads(str(arr("__meta__")))
        if "a_state.npy" in names:
            out["samples"] = int(arr("a_state")[0])
        if "a_seq.npy" in names and "a_X.npy" in names:
            # the newest sample's q (and the triggering sample's, if still in the window): the
            # analysis finds their instants in the recorded joint_states by exact match
            seq, X = arr("a_seq"), arr("a_X")
            if len(seq):
                out["newest_q"] = X[-1, : X.shape[1] // 3].tobytes()
                last = int(json.loads(str(arr("__meta__"))).get("counters", {}).get("last_change", -1))
                hit = np.flatnonzero(seq == last)
                if last >= 0 and hit.size:
                    out["change_q"] = X[hit[0], : X.shape[1] // 3].tobytes()
        if "a_cd.npy" in names:
            cd = arr("a_cd")
            out["cd_t"], out["nmse"] = int(cd[0]), float(cd[1])
        if "a_dbX.npy" in names:
            with z.open("a_dbX.npy") as fh:
                major, _ = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape = read(fh)[0]
            out["database"] = int(shape[0])
    c = meta.get("counters", {})
    for k in ("n_refits", "n_changes", "last_change", "n_updates"):
        if k in c:
            out[k] = int(c[k])
    return out


def run_graph(robot: str, spec: dict, bag: str, *, echo: bool = False, timeout: float | None = None) -> dict:
    """One closed-loop run over DDS (see the module docstring); ``spec``: ``duration``,
    ``trajectory`` (node parameters), ``controller`` (adaptive_controller parameters),
    ``learner`` (None, ``{"kind", "config"}`` or ``{"kind", "model_file"}`` for a frozen
    model), ``bridge`` (extra parameters), ``actions`` (timed SetBool calls)."""

    lrn = spec.get("learner")
    frozen = bool(lrn and lrn.get("model_file"))
    topics = list(RECORDED) if lrn else [t for t in RECORDED if t != "learner/prediction"]
    overrides: dict[str, dict] = {
        "mujoco_bridge": dict(spec.get("bridge", {})),
        "trajectory": dict(spec["trajectory"]),
        "adaptive_controller": {"residual_staleness": RESIDUAL_STALENESS,
                                **({"residual_wait": RESIDUAL_WAIT} if lrn else {}), **spec["controller"]},
        "recorder": {"topics": topics,
                     "wait_for_publishers": ["reference"]
                     + (["learner/prediction"] if lrn else [])},
    }
    if lrn:
        # the measured torque, as these runs were made (the node's default learns the commanded one)
        overrides["model_update"] = {"learner": lrn["kind"], "target": lrn.get("target", "torque"),
                                     "target_torque": "measured",
                                     "warmup": 20,
                                     "acceleration": "measured", "queue_limit": QUEUE_LIMIT,
                                     "reliable_streams": LEARNER_RELIABLE,
                                     "learner_config": json.dumps(lrn.get("config", {})),
                                     "learn_decimation": int(round(1000.0 / LEARN_RATE_HZ)),
                                     "publish_period": PUBLISH_PERIOD}
        if lrn.get("raw"):   # the paper's: the learner's own mean everywhere, no fall-back
            overrides["model_update"]["raw_prediction"] = True
        if lrn.get("update_samples"):   # the paper's "latest": one current point per update
            overrides["model_update"]["update_samples"] = lrn["update_samples"]
        overrides["prediction"] = {"learner": lrn["kind"], "monitor_decimation": 10,
                                   **({"raw_prediction": True} if lrn.get("raw") else {}),
                                   "prediction_lead": PREDICTION_LEAD,
                                   **({"model_file": lrn["model_file"]} if frozen else {})}
    nodes = build_graph("sim", robot=robot, controller="direct", learner=lrn["kind"] if lrn else "none",
                        learner_split=bool(lrn), duration=float(spec["duration"]), record=True, bag=bag,
                        overrides=overrides, without=("model_update",) if frozen else (),
                        param_files=paper_config(robot))
    bridge = nodes[0]
    bridge.params["wait_for_nodes"] += 1          # this process's monitor subscribes /clock too
    if frozen:                                    # no model_update: one /clock and state reader less
        bridge.params["wait_for_nodes"] -= 1
        bridge.params["wait_for_state_subscribers"] -= 1
    if timeout is None:   # generous: 0.05 sim-s per wall-s, plus start-up and shutdown
        timeout = 120.0 + 20.0 * float(spec["duration"])
    monitor = RunMonitor(spec.get("actions", ()))
    wall = run_to_end(nodes, timeout=timeout, companions=[monitor], echo=echo, what="the closed loop failed").wall_s
    return {"wall_s": round(wall, 1), "sim_s": float(spec["duration"]),
            "sim_s_per_wall_s": round(float(spec["duration"]) / wall, 3),
            "actions": monitor.done, "snapshots": monitor.snapshots}


# ============================================================================ reading a bag
def load_bag(bag: str, names: list[str]) -> dict:
    """Arrays of one run: states (t, q, qd, tau) at 1 kHz with their references (q_d,
    qd_d, qdd_d), the learner's feed-forward at its stamps (every 10th reference point)
    and the last /diagnostics values of every node."""
    rec = read_streams(bag, names, joints=["/joint_states", "/learner/prediction"], diagnostics=True)
    st, ref = rec.referenced()
    pred = rec.joint["/learner/prediction"]
    return {"t_ns": st.t_ns, "q": st.position, "qd": st.velocity, "tau": st.effort,
            "q_d": ref.q, "qd_d": ref.qd, "qdd_d": ref.qdd, "t": st.t,
            "pred_t_ns": pred.t_ns, "pred": pred.effort, "diagnostics": rec.diagnostics,
            # exact q bytes -> instant [s]: where a learner's sample came from (every state)
            "q_index": {q.tobytes(): t for q, t in zip(rec.joints().position, rec.joints().t)}}


def _num(d: dict, key: str):
    try:
        return float(d[key])
    except (KeyError, TypeError, ValueError):
        return None


def run_summary(info: dict, data: dict) -> dict:
    """Wall time, sim rate and the split's update / version counts of one run."""
    mu = data["diagnostics"].get("model_update", {})
    pr = data["diagnostics"].get("prediction", {})
    ctl = data["diagnostics"].get("adaptive_controller", {})
    sim = info["sim_s"]
    snaps = info.get("snapshots", [])
    last = snaps[-1] if snaps else {}
    out = {"wall_s": info["wall_s"], "sim_s": sim, "sim_s_per_wall_s": info["sim_s_per_wall_s"]}
    if mu or pr:
        fits = _num(mu, "fit_calls")
        out.update({
            "learner_updates": fits, "updates_per_sim_s": None if fits is None else round(fits / sim, 2),
            "samples_learned": _num(mu, "samples_learned"),
            "versions_published": _num(mu, "snapshots_published"),
            "versions_applied": _num(pr, "snapshots_applied"),
            "versions_applied_per_sim_s": None if _num(pr, "snapshots_applied") is None
            else round(_num(pr, "snapshots_applied") / sim, 2),
            "held_outputs": _num(pr, "held_outputs"), "snapshots_refused": _num(pr, "snapshots_refused"),
            "residual_used": _num(ctl, "residual_used"), "residual_missing": _num(ctl, "residual_missing"),
            "residual_waited": _num(ctl, "residual_waited"),
            "residual_wait_expired": _num(ctl, "residual_wait_expired"),
            "samples_dropped": _num(mu, "samples_dropped"), "samples_offered": _num(mu, "samples_offered"),
            "queue": _num(mu, "queue"), "fit_ms_last": _num(mu, "fit_ms_last"),
            "n_changes": last.get("n_changes"), "database_final": last.get("database"),
            "snapshots_seen": len(snaps)})
        lag = np.array([s["t_rx"] - s["t_newest"] for s in snaps if s.get("t_newest") is not None])
        out["samples_learned_per_sim_s"] = None if _num(mu, "samples_learned") is None \
            else round(_num(mu, "samples_learned") / sim, 1)
        if lag.size:   # sim time at a snapshot's arrival here minus the instant of its newest sample
            out["data_lag_s"] = {"median": round(float(np.median(lag)), 3),
                                 "p90": round(float(np.percentile(lag, 90)), 3), "max": round(float(lag.max()), 3)}
    return out


# ============================================================================ metrics
def a_total(t: np.ndarray, e: np.ndarray, t0: float, t1: float) -> tuple[float, list]:
    """Eq. 10-11: sum over joints of the trapezoidal integral of e_j^2 over [t0, t1], in
    deg^2 ms; also the per-joint A_j."""
    m = (t >= t0 - 1e-9) & (t <= t1 + 1e-9)
    if m.sum() < 2:
        raise ValueError(f"no samples in [{t0}, {t1}] s")
    A = np.trapezoid(e[m] ** 2, t[m], axis=0) * DEG2MS
    return float(A.sum()), [float(x) for x in A]


def prediction_pairs(data: dict):
    """(t [s], measured torque, feed-forward) at the feed-forward's stamps."""
    idx = {int(s): i for i, s in enumerate(data["t_ns"])}
    rows = [(idx[int(s)], k) for k, s in enumerate(data["pred_t_ns"]) if int(s) in idx]
    if not rows:
        return np.zeros(0), np.zeros((0, data["q"].shape[1])), np.zeros((0, data["q"].shape[1]))
    i_s, i_p = (np.array(x) for x in zip(*rows))
    return data["t"][i_s], data["tau"][i_s], data["pred"][i_p]


def nmse_cumulative(y: np.ndarray, yhat: np.ndarray) -> np.ndarray:
    """Eq. 8-9 at every sample: mean over joints of (mean squared error since the start)
    / (variance of y since the start)."""
    k = np.arange(1, len(y) + 1)[:, None]
    mse = np.cumsum((y - yhat) ** 2, axis=0) / k
    mean = np.cumsum(y, axis=0) / k
    var = np.cumsum(y * y, axis=0) / k - mean ** 2
    out = np.mean(mse / np.maximum(var, 1e-9 * (1.0 + mean ** 2)), axis=1)
    out[0] = np.nan
    return out


def nmse_windowed(t: np.ndarray, y: np.ndarray, yhat: np.ndarray, window: float = 1.0):
    """nmse-bar in consecutive windows of ``window`` s, normalised by each joint's variance
    over the whole run: (window centres, values)."""
    if len(t) < 2:
        return np.zeros(0), np.zeros(0)
    var = np.maximum(np.var(y, axis=0), 1e-12)
    edges = np.arange(t[0], t[-1] + window, window)
    cen, val = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        m = (t >= a) & (t < b)
        if m.sum() >= 5:
            cen.append(0.5 * (a + b))
            val.append(float(np.mean(np.mean((y[m] - yhat[m]) ** 2, axis=0) / var)))
    return np.array(cen), np.array(val)


def change_gamma(y: np.ndarray, yhat: np.ndarray, change: dict) -> np.ndarray:
    """gamma of eq. 7 at every sample (no resets) with ``change``'s horizon and lag -- the
    statistic PGPOL's prediction thread computes on the PLC from the feed-forward and the
    measured torque."""
    test = ChangeTest(y.shape[1], np.inf, change["change_horizon"], 0, change["change_lag"])
    g = np.full(len(y), np.nan)
    for i, (yy, pp) in enumerate(zip(y, yhat)):
        test.update((yy - pp) ** 2, yy)
        g[i] = test.gamma
    return g


def recovery_time(cen: np.ndarray, val: np.ndarray, t_change: float, t_end: float, factor: float = 2.0):
    """Seconds after ``t_change`` until the windowed nmse-bar is back below ``factor`` x its
    steady level in [t_change, t_end) (the median over the section's second half); None if
    never."""
    m = (cen > t_change) & (cen < t_end)
    if m.sum() < 4:
        return None, None
    c, v = cen[m], val[m]
    level = float(np.median(v[len(v) // 2:]))
    ok = np.flatnonzero(v <= factor * level)
    if not ok.size:
        return None, level
    return round(float(c[ok[0]] - t_change), 2), level


# ============================================================================ change detection
CHANGE_KEYS = tuple(CHANGE_DEFAULTS)


def learning_stream(data: dict, rate_hz: float = LEARN_RATE_HZ, filter_hz: float = 20.0):
    """``(t, X, Y)``: the samples ``model_update`` learns from (``target: torque``,
    ``acceleration: measured``), rebuilt from a run's 1 kHz states: x = (q, qd, the
    first-order low-pass (``filter_hz``) of the backward difference of qd), y = the
    measured torque, every (1 kHz / ``rate_hz``)-th state (rounded down: at least ``rate_hz``)."""
    t, q, v, tau = data["t"], data["q"], data["qd"], data["tau"]
    acc = np.zeros_like(v)
    a = np.zeros(v.shape[1])
    for k in range(1, len(t)):
        dt = t[k] - t[k - 1]
        a += (1.0 - math.exp(-2.0 * math.pi * filter_hz * dt)) * ((v[k] - v[k - 1]) / dt - a)
        acc[k] = a
    step = max(1, int(1.0 / (rate_hz * np.median(np.diff(t))) + 1e-6))   # at least rate_hz
    sel = slice(0, None, step)
    return t[sel], np.hstack([q[sel], v[sel], acc[sel]]), tau[sel].copy()


def replay_prequential(X: np.ndarray, Y: np.ndarray, kind: str, config: dict, batch: int = 2) -> np.ndarray:
    """Each sample's prediction by the learner *before* it learns it (the input of PGPOL's
    change test), the stream fed in batches of ``batch`` with the next sample as the
    hint; change detection off (a clear would change later predictions: the sweep
    below neglects that feedback)."""
    cfg = {k: v for k, v in config.items() if k not in CHANGE_KEYS}
    L = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1], change_threshold=None, **cfg)
    P = np.zeros_like(Y)
    for i in range(0, len(X), batch):
        j = min(i + batch, len(X))
        if j < len(X):
            L.hint(X[j])
        P[i:j] = L.predict(X[i:j])
        L.partial_fit(X[i:j], Y[i:j])
    return P


def detect_changes(E2: np.ndarray, Y: np.ndarray, threshold: float, horizon: int, warmup: int,
                   lag: int = 1) -> list[int]:
    """The indices of the samples at which PGPOL's test (eq. 7-9,
    :class:`adaptive_dynamics.learning.pgpol.ChangeTest`) clears the database, from the
    prequential squared errors ``E2`` and the targets ``Y`` (N x outputs)."""
    test = ChangeTest(Y.shape[1], threshold, horizon, warmup, lag)
    return [i for i in range(len(Y)) if test.update(E2[i], Y[i])]


#: the (eta, horizon, warmup, lag) grid of the sweep
SWEEP = {"change_threshold": [1e-3, 1e-2, 3e-2, 0.1, 0.3], "change_horizon": [0, 100, 300, 1000],
         "change_warmup": [300], "change_lag": [1, 20, 50, 100]}


# ============================================================================ the parts
class RunBudgetSpent(Exception):
    """``--max-new-runs`` graphs ran: the run named is left to the next invocation."""


def _bytes_default(o):
    if isinstance(o, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(o)).decode("ascii")}
    return json_default(o)


def _bytes_hook(d: dict):
    return base64.b64decode(d["__bytes__"]) if set(d) == {"__bytes__"} else d


class Runner:
    """Runs the graphs of one experiment invocation, keeps their bags (or not) and the
    per-run summaries."""

    def __init__(self, robot: str, out_dir: str, *, keep_bags: bool, echo: bool, quick: bool,
                 reality_kind: str = "unmodelled", max_speed: float = 0.0, runs_dir: str = "",
                 max_new_runs: int = 0):
        self.robot, self.out_dir, self.keep, self.echo, self.quick = robot, out_dir, keep_bags, echo, quick
        #: runs_dir: every run's bag and run record kept there, and a run found there is read
        #: back instead of run again; max_new_runs > 0: at most that many graphs run here
        self.runs_dir, self.max_new_runs, self.new_runs = runs_dir, int(max_new_runs), 0
        if runs_dir:
            os.makedirs(runs_dir, exist_ok=True)
        self.label = label(robot)
        self.reality = reality(robot, reality_kind)
        self.max_speed = float(max_speed)
        self.names = list(robot_config(robot)["joint_names"])
        self.bag_root = runs_dir or (out_dir if keep_bags else tempfile.mkdtemp(prefix="pgpol_bags_"))
        self.files_dir = tempfile.mkdtemp(prefix="pgpol_files_")   # estimate / model files the nodes read
        self.gains = gains(robot)
        self.runs: dict[str, dict] = {}
        self.streams: dict[str, tuple] = {}       # run -> its learning stream (change-detection study)
        self.payload_times: dict[str, float] = {}

    def close(self) -> None:
        if not self.keep and not self.runs_dir:
            shutil.rmtree(self.bag_root, ignore_errors=True)
        shutil.rmtree(self.files_dir, ignore_errors=True)

    def controller(self, mode: str, estimate_file: str = "") -> dict:
        rbd = mode in ("rbd", "rbd_ff")
        p = {"law": "direct" if rbd else "sliding_pd", "learning": False,
             "feedforward": mode in ("learned", "learned_rbd"),
             "friction": True, "initial_estimate": "zero", "autosave_period": 0.0, **self.gains}
        if mode == "learned_rbd":   # the project's: the learner's residual on the identified model
            p.update(law="direct", estimate_file=estimate_file)
        if rbd:
            p["estimate_file"] = estimate_file
        if mode == "rbd_ff":   # the paper's: the model a pure feed-forward of the reference
            p["model_input"] = "desired"
        return p

    def run(self, key: str, spec: dict, stream: bool = False) -> dict:
        slug = key.replace(" ", "_").replace("=", "").replace(",", "-")
        bag = os.path.join(self.bag_root, f"bag_pgpol_{self.label}_{slug}")
        record = os.path.join(self.runs_dir, f"run_{self.label}_{slug}.json") if self.runs_dir else ""
        if record and os.path.exists(record) and os.path.exists(bag):   # run by an earlier invocation
            with open(record, encoding="utf-8") as fh:
                info = json.load(fh, object_hook=_bytes_hook)
            print(f"[pgpol] {self.label} {key}: read back from {self.runs_dir}", flush=True)
        else:
            if self.max_new_runs and self.new_runs >= self.max_new_runs:
                raise RunBudgetSpent(key)
            if os.path.exists(bag):
                shutil.rmtree(bag)
            print(f"[pgpol] {self.label} {key}: {spec['duration']:.1f} s sim ...", flush=True)
            pace = {"lockstep_max_speed": self.max_speed} if spec.get("learner") else {}   # only a learner needs it
            spec = {**spec, "bridge": {**self.reality, **pace, **spec.get("bridge", {})}}
            info = run_graph(self.robot, spec, bag, echo=self.echo)
            self.new_runs += 1
            if record:
                with open(record, "w", encoding="utf-8") as fh:
                    json.dump(info, fh, default=_bytes_default)
        data = load_bag(bag, self.names)
        index = data.pop("q_index")
        for st in info["snapshots"]:   # the instants of the snapshots' newest and change samples
            if "newest_q" in st:
                st["t_newest"] = index.get(st.pop("newest_q"))
            if "change_q" in st:
                st["t_change"] = index.get(st.pop("change_q"))
        data["snapshots"] = info["snapshots"]
        if stream:
            self.streams[key] = learning_stream(data)
        data["actions"] = info["actions"]
        summ = run_summary(info, data)
        self.runs[key] = summ
        print(f"[pgpol]   {summ['wall_s']} s wall ({summ['sim_s_per_wall_s']} sim-s/wall-s)"
              + (f", {summ.get('updates_per_sim_s')} learner updates and {summ.get('versions_applied_per_sim_s')}"
                 f" versions applied per sim-s" if "updates_per_sim_s" in summ else ""), flush=True)
        if not self.keep and not self.runs_dir:
            shutil.rmtree(bag, ignore_errors=True)
        return data


def identification(R: Runner) -> tuple[dict, str]:
    """Excitation run, least squares, the controller's estimate file; JSON summary."""

    dur = 5.0 if R.quick else 40.0
    data = R.run("excitation", {"duration": dur, "trajectory": dict(EXCITATION), "controller": R.controller("noff")})
    model = RobotModel(R.robot, friction=True)
    ident = identify(model, *prepare(data["t"], data["q"], data["qd"], data["tau"]))
    path = estimate_file(model, ident, os.path.join(R.files_dir, "rbd_estimate.npz"))
    fv, fc = friction(R.robot)
    truth = model.base_parameters().to_base(np.concatenate([RobotModel(R.robot).parameters, fv, fc]))
    out = ident.to_dict()
    out.update({"duration_s": dur, "trajectory": EXCITATION, "filter_hz": 20.0,
                "parameter_rel_error": round(float(np.linalg.norm(ident.theta - truth) / np.linalg.norm(truth)), 5),
                "note": "error against the simulator's true base parameters + friction (viscous, Coulomb"
                        " tanh(v/0.01) in the plant, sgn(v) in the model)"})
    return out, path


def experiment_1(R: Runner, estimate: str, mode: str = "both",
                 project_prior: str = "rbd") -> tuple[dict, dict]:
    """Table I: A_total per approach; returns (JSON part, traces for the plots).  ``mode``
    (:data:`MODES`): the learned rows as the project runs them, as the paper's algorithm
    does (:data:`PAPER_LEARNER`), or both; the baselines are run once.  The top-level
    table and figures are the project mode's (the paper mode's with ``mode="paper"``);
    ``project_mode`` / ``paper_mode`` give each mode's."""
    traj = task_trajectory(R.robot)
    period = float(traj.period)
    warm, T = (2.0, 5.0) if R.quick else (period, 40.0)
    q0 = traj.sample(0.0)[0]
    base = {"duration": warm + T, "bridge": {"q0": q0.tolist()},
            "trajectory": {**task_params(R.robot), "q_center": list(robot_settings(R.robot)["q_task"])}}
    table, per_joint, traces, second_half = {}, {}, {}, {}

    def evaluate(key, data):
        e = data["q_d"] - data["q"]
        A, Aj = a_total(data["t"], e, warm, warm + T)
        table[key], per_joint[key] = round(A, 4), [round(x, 4) for x in Aj]
        second_half[key] = round(a_total(data["t"], e, warm + T / 2, warm + T)[0], 4)
        traces[key] = (data["t"], np.linalg.norm(e, axis=1))
        return A

    evaluate("no_ff", R.run("I no_ff", {**base, "controller": R.controller("noff")}))
    evaluate("rbd", R.run("I rbd", {**base, "controller": R.controller("rbd", estimate)}))
    evaluate("rbd_ff", R.run("I rbd_ff", {**base, "controller": R.controller("rbd_ff", estimate)}))
    grid = QUICK_CONSTELLATIONS if R.quick else CONSTELLATIONS
    modes = ["project", "paper"] if mode == "both" else [mode]
    per_mode = {}
    a0, arbd = table["no_ff"], table["rbd"]
    for m in modes:
        cons = {}
        # the quick run: one learned case of the paper mode
        for windows, knn in (grid[:1] if (R.quick and m == "paper" and len(modes) > 1) else grid):
            key = constellation_key(windows, knn)
            name = key if m == modes[0] else f"{m} {key}"
            ctl, lrn = learned_run(R, m, windows, knn, estimate, project_prior)
            spec = {**base, "controller": ctl, "learner": lrn}
            stream = m == modes[0] and knn > 0 and windows in ((480,), (60, 480))
            cons[name] = evaluate(name, R.run(f"I {name}", spec, stream=stream))
        best = min(cons, key=cons.get)
        per_mode[m] = {"table_i": {k: table[k] for k in cons}, "constellations": list(cons), "best_constellation": best,
                       "a_total_reduction_best": round(1.0 - cons[best] / a0, 5),
                       "a_total_reduction": {k: round(1.0 - v / a0, 5) for k, v in cons.items()},
                       "beats_rbd": bool(cons[best] < arbd), "beats_rbd_ff": bool(cons[best] < table["rbd_ff"]),
                       **({"learner": dict(PAPER_LEARNER)} if m == "paper" else {"prior": project_prior})}
    first = per_mode[modes[0]]
    cons = {k: table[k] for k in first["constellations"]}
    best = first["best_constellation"]
    out = {"trajectory": {**task_params(R.robot), "q_task": robot_settings(R.robot)["q_task"], "period_s": period},
           "window_s": [warm, warm + T], "units": "deg^2 ms",
           "table_i": {k: v for k, v in table.items() if k in cons or k in ("no_ff", "rbd", "rbd_ff")},
           "a_j": per_joint, "mode": mode, **{f"{m}_mode": per_mode[m] for m in modes},
           "a_total_second_half": second_half, "second_half_window_s": [warm + T / 2, warm + T],
           "constellations": list(cons), "best_constellation": best,
           "a_total_reduction_best": round(1.0 - cons[best] / a0, 5),
           "a_total_reduction_rbd": round(1.0 - arbd / a0, 5),
           "a_total_reduction": {k: round(1.0 - v / a0, 5) for k, v in table.items()
                                 if k != "no_ff" and (k in cons or k in ("rbd", "rbd_ff"))},
           "beats_rbd": bool(cons[best] < arbd),
           # the paper's baseline: the identified model as a pure feed-forward of the reference
           "a_total_reduction_rbd_ff": round(1.0 - table["rbd_ff"] / a0, 5),
           "beats_rbd_ff": bool(cons[best] < table["rbd_ff"])}
    return out, {"traces": traces, "best": best}


def offline_gp(R: Runner, estimate: str, size: dict | None = None) -> tuple[dict, str]:
    """Training run (twelve star points at rising speed, tracked with the identified
    rigid-body feed-forward so the arm stays on its reference), one sparse GP fitted once
    on its samples (the online learners' input: q, qd, low-passed measured qdd).
    ``size`` overrides :data:`OFFLINE_GP` (``n_points``, ``n_inducing``, ``max_iter``);
    the run is sampled at the online learners' 100 Hz, faster if ``n_points`` needs it."""

    per = pick_place_period(R.robot, "train")
    speeds = PICK_PLACE["speeds"]
    dur = (per / speeds[-1]) if R.quick else sum(per / s for s in speeds)
    W = pick_place_waypoints(R.robot, "train")
    traj = pick_place_params(R.robot, "train", [speeds[-1]] if R.quick else speeds, 1)
    data = R.run("II offline_gp training", {"duration": dur, "bridge": {"q0": W[0].tolist()}, "trajectory": traj,
                                          "controller": R.controller("rbd", estimate)})
    cfg = {**OFFLINE_GP, **(size or {})}
    # the online learners' 100 Hz, or as fast as the run must be sampled to give n_points
    rate = min(1000.0, max(LEARN_RATE_HZ, 1.02 * cfg["n_points"] / max(dur, 1e-9)))
    _, X, Y = learning_stream(data, rate_hz=rate)
    n = min(len(X), cfg["n_points"])
    sel = np.linspace(0, len(X) - 1, n).round().astype(int)
    t0 = time.perf_counter()
    L = make_learner("sgpol", input_dim=X.shape[1], output_dim=Y.shape[1], windows=[n], knn=0,
                     n_inducing=cfg["n_inducing"], max_iter=cfg["max_iter"], groups=cfg["groups"],
                     change_threshold=None)
    L.partial_fit(X[sel], Y[sel])
    fit_s = time.perf_counter() - t0
    L.set_prediction(raw=True)   # the paper's offline GP: its own mean everywhere (Table II's paper rows)
    P = L.predict(X)
    nm = np.mean((P - Y) ** 2, axis=0) / np.maximum(np.var(Y, axis=0), 1e-12)
    path = write_snapshot_file(os.path.join(R.files_dir, "offline_gp.snap"), encode_snapshot(L, 1, source="offline"))
    return {"training_s": round(dur, 2), "samples": int(n), "sample_rate_hz": round(rate, 1), **cfg,
            "controller": "identified rigid-body model",
            "fit_s": round(fit_s, 2), "training_nmse": [round(float(x), 5) for x in nm]}, path


def learned_run(R: Runner, mode: str, windows, knn: int, estimate: str = "",
                project_prior: str = "rbd") -> tuple[dict, dict]:
    """``(controller, learner)`` of a learned row in ``mode``: the paper's with every
    :data:`PAPER_LEARNER` setting; the project's with the learners' defaults, on the
    identified model's residual when ``project_prior`` is rbd and there is an ``estimate``."""
    if mode == "paper":
        extra = {k: PAPER_LEARNER[k] for k in ("fusion", "scale_on")}
        return R.controller("learned"), {
            "kind": "sgpol" if len(windows) == 1 else "pgpol",
            "config": learner_config(windows, knn, PAPER_LEARNER["change"], **extra),
            **{k: PAPER_LEARNER[k] for k in ("raw", "update_samples")}}
    on_rbd = project_prior == "rbd" and bool(estimate)
    return (R.controller("learned_rbd", estimate) if on_rbd else R.controller("learned"),
            {"kind": "sgpol" if len(windows) == 1 else "pgpol", "config": learner_config(windows, knn, CHANGE),
             **({"target": "residual"} if on_rbd else {})})


def table_ii_rows(R: Runner, offline_path: str, modes, estimate: str = "",
                  project_prior: str = "rbd") -> list:
    """``(key, mode, controller, learner)`` of Table II (mode None: a baseline): PD alone, the identified model as a pure
    feed-forward (with ``estimate``), and per mode (the first's keys bare, the others'
    prefixed with the mode) SGPOL n = 480 and PGPOL n = 60, 480, knn 20 -- the paper mode's
    as the paper runs them (:data:`PAPER_LEARNER`, raw means), with the offline GP (raw),
    the project mode's with the learners' defaults, on the identified model's residual
    (``project_prior`` rbd, as Table I's)."""
    rows = [("no_ff", None, R.controller("noff"), None)]
    if estimate:
        rows.append(("rbd_ff", None, R.controller("rbd_ff", estimate), None))
    for m in modes:
        pre = "" if m == modes[0] else f"{m} "
        if m == "paper":
            rows.append((pre + "offline_gp", m, R.controller("learned"),
                         {"kind": "sgpol", "model_file": offline_path, "raw": True}))
        for key, windows, knn in (("sgpol", (480,), 0), ("pgpol", (60, 480), 20)):
            rows.append((pre + key, m, *learned_run(R, m, windows, knn, estimate, project_prior)))
    return rows


def experiment_2(R: Runner, offline_path: str, mode: str = "both", estimate: str = "",
                 project_prior: str = "rbd") -> tuple[dict, dict]:
    """Table II and Fig. 5: the speed schedule with each feed-forward (:func:`table_ii_rows`);
    ``mode`` as Table I's.  Fig. 5 shows the paper mode's curves when it ran."""
    modes = ["project", "paper"] if mode == "both" else [mode]
    per = pick_place_period(R.robot)
    speeds = PICK_PLACE["speeds"]
    cycles = PICK_PLACE["cycles"]
    edges = np.concatenate([[0.0], np.cumsum([cycles * per / s for s in speeds])])
    W = pick_place_waypoints(R.robot)
    base = {"duration": float(edges[-1]), "bridge": {"q0": W[0].tolist()},
            "trajectory": pick_place_params(R.robot, "test", speeds, cycles)}
    table, sections, curves, recov = {}, {}, {}, {}
    rows = table_ii_rows(R, offline_path, modes, estimate, project_prior)
    for key, _, ctl, lrn in rows:
        spec = {**base, "controller": ctl}
        if lrn:
            spec["learner"] = lrn
        data = R.run(f"II {key}", spec, stream=key == "pgpol")
        e = data["q_d"] - data["q"]
        table[key] = round(a_total(data["t"], e, 0.0, edges[-1])[0], 4)
        sections[key] = [round(a_total(data["t"], e, a, b)[0], 4) for a, b in zip(edges[:-1], edges[1:])]
        if lrn and lrn.get("target") != "residual":   # (a residual's prediction is no torque: no nmse)
            t, y, yh = prediction_pairs(data)
            cen, val = nmse_windowed(t, y, yh, 1.0)
            curves[key] = {"t": t, "nmse": nmse_cumulative(y, yh), "cen": cen, "win": val}
            if key.split()[-1] in ("sgpol", "pgpol"):
                recov[key] = {}
                for i, tc in enumerate(edges[1:-1]):
                    r, lvl = recovery_time(cen, val, tc, edges[i + 2])
                    recov[key][f"{int(speeds[i] * 100)}->{int(speeds[i + 1] * 100)}%"] = {
                        "t_change_s": round(float(tc), 2), "recovery_s": r,
                        "steady_nmse": None if lvl is None else round(lvl, 5)}
            sec_nmse = []
            for a, b in zip(edges[:-1], edges[1:]):
                m = (t >= a) & (t < b)
                sec_nmse.append(round(float(np.mean(np.mean((y[m] - yh[m]) ** 2, axis=0)
                                                    / np.maximum(np.var(y[m], axis=0), 1e-12))), 5)
                                if m.sum() > 10 else None)
            curves[key]["section_nmse"] = sec_nmse
    reduction = {k: round(1.0 - v / table["no_ff"], 5) for k, v in table.items() if k != "no_ff"}
    out = {"trajectory": {"waypoints": len(W), "period_s": per, "speeds": speeds, "cycles_per_speed": cycles,
                          "move_time_s": pp_settings(R.robot)["move_time"],
                          "dwell_time_s": pp_settings(R.robot)["dwell_time"]},
           "speed_change_s": [round(float(x), 3) for x in edges[1:-1]], "duration_s": float(edges[-1]),
           "units": "deg^2 ms", "table_ii": table, "a_total_per_speed": sections,
           "a_total_reduction": reduction,
           "mode": mode, **{f"{m}_mode": {"table_ii": {r[0]: table[r[0]] for r in rows if r[1] == m},
                                          "a_total_reduction": {r[0]: reduction[r[0]] for r in rows if r[1] == m},
                                          **({"learner": dict(PAPER_LEARNER)} if m == "paper" else
                                             {"prior": project_prior if estimate else "mean"})} for m in modes},
           "nmse_per_speed": {k: v["section_nmse"] for k, v in curves.items()},
           "nmse_final": {k: round(float(v["nmse"][-1]), 5) for k, v in curves.items() if len(v["nmse"])},
           "nmse_recovery": recov,
           "recovery_rule": "seconds after the speed change until the 1 s windowed nmse-bar is <= 2x its"
                            " median over the second half of that speed section"}
    fig5 = "paper" if "paper" in modes else modes[0]
    shown = {r[0].split()[-1]: curves[r[0]] for r in rows if r[1] == fig5 and r[0] in curves}
    out["fig5_mode"] = fig5
    return out, {"curves": shown, "edges": edges}


def payload_run(R: Runner, change: dict, label: str) -> tuple[dict, dict]:
    """PGPOL on the pick-and-place at constant speed, a payload attached mid-run."""
    pp = pp_settings(R.robot)
    per = pick_place_period(R.robot)
    speed = PAYLOAD_SPEED
    cyc = per / speed
    slot = (pp["move_time"] + pp["dwell_time"]) / speed
    t_p = (0.0 if R.quick else cyc) + PAYLOAD_WAYPOINT * slot
    duration = t_p + (QUICK_PAYLOAD_TAIL_S if R.quick else 2 * cyc)
    W = pick_place_waypoints(R.robot)
    mass = robot_settings(R.robot)["payload_mass"]
    spec = {"duration": round(duration, 3),
            "bridge": {"q0": W[0].tolist(), "payload_mass": mass, "payload_enabled": False},
            "trajectory": {**pick_place_params(R.robot), "speed": speed},
            "controller": R.controller("learned"),
            "learner": {"kind": "pgpol", "config": learner_config((60, 480), 20, change)},
            "actions": [(round(t_p, 3), "mujoco_bridge/set_payload", True)]}
    data = R.run(f"payload {label}", spec, stream=True)
    R.payload_times[f"payload {label}"] = t_p
    snaps = sorted((s for s in data["snapshots"] if s.get("t_newest") is not None), key=lambda s: s["version"])
    act = data["actions"][0]
    t_attach = float(act.get("acknowledged_s", act["clock_s"]))
    t_s = np.array([s["t_newest"] for s in snaps])     # instant of each snapshot's newest sample
    nch = np.array([s.get("n_changes", 0) for s in snaps])
    before_idx = np.flatnonzero(t_s <= t_attach)
    n_before = int(nch[before_idx[-1]]) if before_idx.size else 0
    first_after = None
    for i, s in enumerate(snaps):
        if t_s[i] > t_attach and s.get("n_changes", 0) > n_before:
            exact = s["n_changes"] == n_before + 1 and s.get("t_change") is not None
            first_after = s["t_change"] if exact else t_s[i]
            break
    t, y, yh = prediction_pairs(data)
    gam = change_gamma(y, yh, change)
    cen, val = nmse_windowed(t, y, yh, 1.0)
    pre = (cen > t_p - min(cyc, t_p - 1.0)) & (cen < t_p)
    post_last = cen > duration - min(cyc, 3.0)
    out = {"label": label, "change": change, "speed": speed, "payload_kg": mass, "t_payload_s": round(t_p, 3),
           "payload_clock_s": act["clock_s"], "payload_acknowledged_s": act.get("acknowledged_s"),
           "clears_before_payload": n_before, "clears_total": int(nch[-1]) if nch.size else 0,
           "first_clear_after_s": None if first_after is None else round(float(first_after), 3),
           "detection_delay_s": None if first_after is None else round(float(first_after - t_attach), 3),
           "database_final": int(snaps[-1].get("database", 0)) if snaps else None,
           "nmse_window_before": round(float(np.mean(val[pre])), 5) if pre.any() else None,
           "nmse_window_end": round(float(np.mean(val[post_last])), 5) if post_last.any() else None,
           "gamma_plc_max_before": round(float(np.nanmax(gam[t < t_p])), 6) if (t < t_p).any() else None,
           "gamma_plc_max_after": round(float(np.nanmax(gam[t >= t_p])), 6) if (t >= t_p).any() else None,
           "run": R.runs[f"payload {label}"]}
    out["change_detected"] = bool(first_after is not None and n_before == 0 and first_after > t_attach)
    trace = {"snap_t": t_s, "snap_db": np.array([s.get("database", 0) for s in snaps]),
             "snap_nmse": np.array([s.get("nmse", np.nan) for s in snaps]), "snap_changes": nch,
             "t": t, "gamma": gam, "cen": cen, "win": val, "t_p": t_p, "first_after": first_after,
             "eta": change["change_threshold"], "cd_t": np.array([s.get("cd_t", 0) for s in snaps])}
    return out, trace


def change_study(R: Runner, speed_changes=()) -> dict:
    """Offline evidence for the change-detection settings: each recorded learning stream
    replayed through PGPOL (n = 60, 480, knn 20; detection off) for its prequential errors,
    then PGPOL's test (:func:`detect_changes`) with every setting of :data:`SWEEP` and the
    named ones: clears in the stationary runs (Experiment I: every one is false), clears
    before / after the payload, clears near the speed changes of Experiment II."""
    base = learner_config((60, 480), 20)
    replays = {}
    for key, (t, X, Y) in R.streams.items():
        P = replay_prequential(X, Y, "pgpol", base)
        replays[key] = (t, np.square(Y - P), Y)

    def evaluate(eta, horizon, warmup, lag) -> dict:
        out = {"false_clears_stationary": 0, "stationary_minutes": 0.0, "payload": {}, "speed_runs": {}}
        for key, (t, E2, Y) in replays.items():
            hits = t[detect_changes(E2, Y, eta, horizon, warmup, lag)]
            if key in R.payload_times:
                tp = R.payload_times[key]
                after = hits[hits >= tp]
                out["payload"][key] = {"clears_before": int(np.sum(hits < tp)),
                                       "first_after_s": None if not after.size else round(float(after[0] - tp), 3),
                                       "clears_after": int(after.size)}
            elif key.startswith("II"):
                near = [float(h) for h in hits if any(0 <= h - c < 10.0 for c in speed_changes)]
                out["speed_runs"][key] = {"clears": int(hits.size), "within_10s_after_a_speed_change": len(near)}
            else:
                out["false_clears_stationary"] += int(hits.size)
                out["stationary_minutes"] += float(t[-1] - t[0]) / 60.0
        out["stationary_minutes"] = round(out["stationary_minutes"], 2)
        return out

    named = {"learner_defaults": CHANGE, "paper": PAPER_CHANGE,
             "paper_with_horizon": {**PAPER_CHANGE, "change_horizon": 1000}}
    res: dict[str, Any] = {"streams": {k: {"samples": int(len(v[0])), "seconds": round(float(v[0][-1] - v[0][0]), 1)}
                                       for k, v in replays.items()},
                           "named": {k: {"settings": v, **evaluate(*(v[c] for c in CHANGE_KEYS))}
                                     for k, v in named.items()}}
    works = []
    import itertools
    for eta, hz, wu, lag in itertools.product(*(SWEEP[c] for c in CHANGE_KEYS)):
        ev = evaluate(eta, hz, wu, lag)
        pay = list(ev["payload"].values())
        if ev["false_clears_stationary"] == 0 and pay and all(p["clears_before"] == 0 and p["first_after_s"] is not None
                                                             and p["first_after_s"] < 2.0 for p in pay):
            works.append({"change_threshold": eta, "change_horizon": hz, "change_warmup": wu, "change_lag": lag})
    res["grid"] = SWEEP
    res["grid_settings_without_false_clears_that_detect_every_payload_within_2s"] = works
    res["method"] = ("each stream's samples (q, qd, low-passed measured qdd; measured torque at 100 Hz) replayed"
                     " through PGPOL n = 60, 480, knn 20 in batches of 2 with detection off; each sample's"
                     " prediction before it is learnt is what PGPOL's eq. 7-9 test sees")
    return res


# ============================================================================ plots
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_table_i(robot: str, ex1: dict, out_dir: str, files: list) -> None:
    plt = _plt()
    tab = ex1["table_i"]
    groups = []
    for key in ex1["constellations"]:
        w = key.split()[0]
        if w not in groups:
            groups.append(w)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    x = np.arange(len(groups))
    for off, knn, col in ((-0.18, 0, "#4c72b0"), (0.18, 20, "#dd8452")):
        vals = [tab.get(f"{g} knn={knn}") for g in groups]
        xs = [xi + off for xi, v in zip(x, vals) if v is not None]
        ax.bar(xs, [v for v in vals if v is not None], width=0.36, color=col, label=f"knn = {knn}")
    ax.axhline(tab["no_ff"], color="k", ls="--", lw=1.0, label=f"no feed-forward ({tab['no_ff']:.3g})")
    ax.axhline(tab["rbd"], color="g", ls=":", lw=1.2,
               label=f"identified rigid-body model, on the state ({tab['rbd']:.3g})")
    if "rbd_ff" in tab:
        ax.axhline(tab["rbd_ff"], color="g", ls="-.", lw=1.2,
                   label=f"identified rigid-body model, pure feed-forward: the paper's ({tab['rbd_ff']:.3g})")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([g.replace("n=", "n = ") for g in groups])
    ax.set_ylabel("A_total [deg² ms]")
    which = "the paper's algorithm" if ex1.get("mode") == "paper" else "the learners' defaults"
    ax.set_title(f"{robot}: Experiment I (Table I), total squared tracking-error area over "
                 f"{ex1['window_s'][1] - ex1['window_s'][0]:.0f} s; {which}", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    save_plot(fig, out_dir, f"pgpol_table1_{robot}.png", files)


def plot_tracking(robot: str, ex1: dict, tr: dict, out_dir: str, files: list) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    best = tr["best"]
    for key, lab, col in (("no_ff", "no feed-forward", "k"), ("rbd", "identified rigid-body model", "g"),
                          (best, f"best learned: {best}", "#dd8452")):
        t, en = tr["traces"][key]
        ax.semilogy(t[::10], np.maximum(en[::10], 1e-7), lw=0.7, color=col, label=lab)
    a, b = ex1["window_s"]
    ax.axvspan(0, a, color="0.92", zorder=0)
    ax.set_xlabel("sim time [s]  (grey: start-up, not in A_total)")
    ax.set_ylabel("|q_d - q| [rad]")
    ax.set_title(f"{robot}: tracking error, square + circle, PD feedback plus feed-forward", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    save_plot(fig, out_dir, f"pgpol_tracking_{robot}.png", files)


def plot_nmse(robot: str, ex2: dict, tr: dict, out_dir: str, files: list) -> None:
    plt = _plt()
    edges = tr["edges"]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    shades = ["#f2f2f2", "#e3e3e3", "#d0d0d0"]
    for k in range(len(edges) - 1):
        ax.axvspan(edges[k], edges[k + 1], color=shades[k % 3], zorder=0)
        ax.text(0.5 * (edges[k] + edges[k + 1]), 0.97, f"{int(ex2['trajectory']['speeds'][k] * 100)} %",
                transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=9)
    cols = {"offline_gp": "#4c72b0", "sgpol": "#55a868", "pgpol": "#dd8452"}
    labels = {"offline_gp": "offline GP", "sgpol": "SGPOL (n = 480)", "pgpol": "PGPOL (n = 60, 480, knn 20)"}
    for key, c in tr["curves"].items():
        ax.semilogy(c["t"], c["nmse"], color=cols[key], lw=1.4, label=f"{labels[key]}: eq. 8-9, since start")
        ax.semilogy(c["cen"], c["win"], color=cols[key], lw=0.6, alpha=0.8, ls="--")
    ax.plot([], [], color="0.3", lw=0.6, ls="--", label="dashed: 1 s windows")
    ax.set_xlabel("sim time [s]")
    ax.set_ylabel("nmse-bar of the feed-forward")
    ax.set_title(f"{robot}: Experiment II (Fig. 5), pick-and-place at 33 / 66 / 100 % speed", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    fig.tight_layout()
    save_plot(fig, out_dir, f"pgpol_nmse_{robot}.png", files)


def plot_payload(robot: str, res: dict, tr: dict, out_dir: str, files: list, label: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
    t_p = tr["t_p"]
    ax = axes[0]
    g = tr["gamma"]
    ax.plot(tr["t"], g, lw=0.6, color="#4c72b0", label="gamma (eq. 7) of the feed-forward stream")
    ax.axhline(tr["eta"], color="r", ls="--", lw=0.9, label=f"eta = {tr['eta']:g}")
    ax.set_yscale("symlog", linthresh=1e-5)
    ax.set_ylabel("gamma")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[1]
    ax.semilogy(tr["cen"], tr["win"], lw=0.9, color="#dd8452", label="nmse-bar of the feed-forward, 1 s windows")
    ok = np.isfinite(tr["snap_nmse"]) & (tr["snap_nmse"] > 0)
    ax.semilogy(tr["snap_t"][ok], tr["snap_nmse"][ok], ".", ms=2.5, color="#55a868",
                label="the learner's own nmse-bar of the change test (snapshots)")
    ax.set_ylabel("nmse-bar")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[2]
    ax.step(tr["snap_t"], tr["snap_db"], where="post", color="#8172b2", label="database size (snapshots)")
    ax.set_ylabel("samples")
    ax.set_xlabel("sim time [s] (snapshots: at the instant of their newest sample)")
    ch = np.flatnonzero(np.diff(tr["snap_changes"]) > 0) + 1
    for ax in axes:
        ax.axvline(t_p, color="k", lw=1.2)
        for i in ch:
            ax.axvline(tr["snap_t"][i], color="r", lw=0.6, alpha=0.5)
    axes[2].plot([], [], color="k", lw=1.2, label=f"payload {res['payload_kg']:g} kg attached")
    axes[2].plot([], [], color="r", lw=0.6, label="database cleared (change detected)")
    axes[2].legend(fontsize=8, loc="upper left")
    c = res["change"]
    axes[0].set_title(f"{robot}: payload picked up at {t_p:.1f} s, PGPOL (n = 60, 480, knn 20); change test"
                      f" ({label}): eta {c['change_threshold']:g}, horizon {c['change_horizon']}, lag"
                      f" {c['change_lag']}, warm-up {c['change_warmup']}", fontsize=9)
    fig.tight_layout()
    save_plot(fig, out_dir, f"pgpol_payload_{robot}_{label}.png", files)


# ============================================================================ driver
def offline_gp_size(text: str) -> dict:
    """``--offline-gp POINTS,INDUCING[,ITER]`` (or ``paper``, :data:`OFFLINE_GP_PAPER`) as
    :data:`OFFLINE_GP` keys."""
    if text.strip() == "paper":
        return dict(OFFLINE_GP_PAPER)
    try:
        v = [int(x) for x in text.split(",")]
        if not 2 <= len(v) <= 3 or v[0] < 2 or not 1 <= v[1] <= v[0] or (len(v) == 3 and v[2] < 0):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected POINTS,INDUCING[,ITER] with 1 <= INDUCING <= POINTS and"
                                         f" ITER >= 0, got {text!r}") from None
    return dict(zip(("n_points", "n_inducing", "max_iter"), v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment pgpol",
                                 description="PGPOL (Habich et al. 2019) Table I / II, Fig. 5 and a payload"
                                             " change, in closed loop over DDS (MuJoCo, lockstep)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    add_robot_args(ap, "panda", plural=False)
    ap.add_argument("--quick", action="store_true",
                    help="short version for tests: two constellations, a few seconds per run, the payload run")
    ap.add_argument("--part", default="all", choices=["all", "1", "2", "payload"],
                    help="1: identification + Table I; 2: Table II, Fig. 5 and the payload run; payload: only"
                         " the payload run")
    ap.add_argument("--mode", default="both", choices=list(MODES),
                    help="Table I's and Table II's learned rows: project (the learners' defaults: predictions fall back to the"
                         " prior where the learner's data do not reach), paper (the paper's algorithm: the fused"
                         " raw mean everywhere, its one-sample change test) or both (default); the JSON carries"
                         " project_mode / paper_mode")
    ap.add_argument("--project-prior", default="rbd", choices=list(PROJECT_PRIORS),
                    help="the project mode's learners: rbd (default; they learn the residual of the identified"
                         " rigid-body model, which the controller feeds forward beside them: where their data do"
                         " not reach, the prediction falls back to that model) or mean (they learn the torque"
                         " itself, as the paper's, and fall back to the running mean torque)")
    ap.add_argument("--reality", default="unmodelled", choices=["unmodelled", "model"],
                    help="the simulated arm: unmodelled (default; config/<robot>.yaml plus a 2 %% position"
                         " ripple and Stribeck friction, which the identified rigid-body model cannot"
                         " represent, as on a real arm) or model (rigid bodies + viscous/Coulomb friction only)")
    ap.add_argument("--max-speed", type=float, default=None,
                    help="cap the pace of every run with a learner at this many sim s per wall s (the bridge's"
                         " lockstep_max_speed), so the asynchronous learner gets the CPU a faster machine"
                         " would give it; default: as fast as the graph runs, %(quick)s with --quick"
                         % {"quick": QUICK_MAX_SPEED})
    ap.add_argument("--offline-gp", type=offline_gp_size, default=None, metavar="POINTS,INDUCING[,ITER]|paper",
                    help="Table II's offline GP: training points, inducing inputs and at most ITER optimiser"
                         " iterations, one GP per joint (default %s,%s,%s); paper: the paper's 15000 points and"
                         " 1500 inducing inputs, one GP with shared hyperparameters for all joints (as GPy's"
                         " multi-output regression; docs/pgpol.md gives what each costs here)"
                         % (OFFLINE_GP["n_points"], OFFLINE_GP["n_inducing"], OFFLINE_GP["max_iter"]))
    ap.add_argument("--keep-bags", action="store_true", help="keep every run's bag in --out")
    ap.add_argument("--runs-dir", default="", metavar="DIR",
                    help="keep every run's bag and record in DIR, and read a run found there back instead of"
                         " running it again (an invocation continues what an earlier one ran)")
    ap.add_argument("--max-new-runs", type=int, default=0, metavar="N",
                    help="with --runs-dir: run at most N graphs, then write what is done (JSON 'incomplete':"
                         " the next run's name) and end; the next invocation goes on from there (the tests"
                         " split the quick run so)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the nodes' logs")
    add_graph_argument(ap)
    args = ap.parse_args(argv)
    with graph_kind(args.graph):
        return _main(args, ap)


def _main(args, ap) -> int:
    robot = chosen_robots(args, allowed=ROBOTS)
    if len(robot) != 1:
        ap.error("--robot takes one robot")
    robot = robot[0]
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    max_speed = args.max_speed if args.max_speed is not None else (QUICK_MAX_SPEED if args.quick else 0.0)
    if max_speed < 0:
        ap.error("--max-speed must be >= 0")
    if args.max_new_runs < 0 or (args.max_new_runs and not args.runs_dir):
        ap.error("--max-new-runs takes N >= 0 and needs --runs-dir")
    R = Runner(robot, args.out, keep_bags=args.keep_bags, echo=args.verbose, quick=args.quick,
               reality_kind=args.reality, max_speed=max_speed, runs_dir=args.runs_dir,
               max_new_runs=args.max_new_runs)
    files: list[str] = []
    summary: dict[str, Any] = {"experiment": "pgpol", "robot": R.label, "quick": bool(args.quick),
                               **({} if is_shipped(robot) else {"urdf": robot,
                                                                "settings": robot_settings(robot)}),
                               "part": args.part, "reality": args.reality,
                               "reality_parameters": R.reality,
                               "gains": {**R.gains, "law": "pd: tau = K_D (e_dot + Lambda e) (+ Y pi_hat for the RBD)"},
                               "learner_base": LEARNER_BASE, "change_detection_settings": CHANGE,
                               "learn_rate_hz": LEARN_RATE_HZ, "max_speed_sim_s_per_wall_s": max_speed}
    try:
        est = None
        if args.part in ("all", "1") or (args.part == "2" and not args.quick):
            summary["identification"], est = identification(R)
        if args.part in ("all", "1"):
            ex1, tr1 = experiment_1(R, est, args.mode, args.project_prior)
            summary["experiment_1"] = ex1
            for k in ("table_i", "a_total_reduction_best", "a_total_reduction_rbd", "beats_rbd",
                      "a_total_reduction_rbd_ff", "beats_rbd_ff", "best_constellation"):
                summary[k] = ex1[k]
            for m in ("project", "paper"):
                if f"{m}_mode" in ex1:
                    summary[f"{m}_mode"] = {k: ex1[f"{m}_mode"][k] for k in (
                        "best_constellation", "a_total_reduction_best", "beats_rbd", "beats_rbd_ff")}
            plot_table_i(R.label, ex1, args.out, files)
            plot_tracking(R.label, ex1, tr1, args.out, files)
        if args.part in ("all", "2", "payload"):
            if not args.quick and args.part != "payload":
                off = ""   # the offline GP is a paper-mode row
                if args.mode in ("both", "paper"):
                    summary["offline_gp"], off = offline_gp(R, est, args.offline_gp)
                ex2, tr2 = experiment_2(R, off, args.mode, est, args.project_prior)
                summary["experiment_2"] = ex2
                summary["table_ii"] = ex2["table_ii"]
                summary["nmse_recovery"] = ex2["nmse_recovery"]
                plot_nmse(R.label, ex2, tr2, args.out, files)
            pay, trp = payload_run(R, CHANGE, "defaults")
            summary["payload"] = pay
            summary["change_detected"] = pay["change_detected"]
            plot_payload(R.label, pay, trp, args.out, files, "defaults")
            if not args.quick and args.part != "payload":
                pay0, trp0 = payload_run(R, PAPER_CHANGE, "paper")
                summary["payload_paper_test"] = pay0
                plot_payload(R.label, pay0, trp0, args.out, files, "paper")
        if not args.quick and R.streams:
            print("[pgpol] change-detection study (offline replays) ...", flush=True)
            summary["change_detection"] = change_study(
                R, summary.get("experiment_2", {}).get("speed_change_s", ()))
    except RunBudgetSpent as left:   # --max-new-runs: what is done so far; the next invocation goes on
        summary["incomplete"] = str(left)
        print(f"[pgpol] {R.new_runs} new runs: stopping before {left} (--max-new-runs)", flush=True)
    finally:
        R.close()
    summary["runs"] = R.runs
    summary["plots"] = [os.path.basename(f) for f in files]
    summary["runtime_s"] = round(time.perf_counter() - t_start, 1)
    return write_result(args.out, "pgpol", summary, default=json_default)


if __name__ == "__main__":
    sys.exit(main())
