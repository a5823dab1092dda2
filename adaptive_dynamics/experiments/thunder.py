"""Thunder Dynamics' adaptive backstepping (appendix: Figures 5-13, Tables 6-8) on the MuJoCo Panda.

``adaptive-dynamics experiment thunder --out DIR [--quick] [--seconds S] [--robot R] [--mode M]
[--part all|runs] [--runs-dir DIR] [-v]``

Set-up (the paper's validation, in simulation): the Panda follows a 3D Lissajous path of
its end effector (:func:`~adaptive_dynamics.trajectories.cartesian.lissajous3d`, size
0.3 m, period 5 s, the orientation held; no joint friction, as the paper's simulation) carrying a hand like the Softhand that its
model does not have: the simulated link 7 + hand weighs 1.5655 kg with its centre of
mass at (0.0617, -0.0004, 0.0009) m in Thunder's link 7 frame (the flange,
``panda_link8``; Table 8 "True").  The controller's model is the URDF's except link 7 +
hand, which starts at Table 8's "Initial" (0.736 kg, CoM (0.014, -0.004, -0.045) m: the
bare link 7), loaded from a Thunder ``*_inertial_REG.yaml`` written with those numbers;
only link 7's 10 parameters are adapted (``adapted_links``).  In MuJoCo the hand's URDF
body is emptied (``link_scales panda_hand:0``) and the hand is a rigid payload on
``panda_link7`` whose sum with the bare link 7 is Table 8's truth.

* Sweeps (Tables 6-7, Figures 6-9), the core loop in process (plant and
  :class:`~adaptive_dynamics.control.backstepping.BacksteppingController` in lockstep,
  1 kHz): three K_d (0.5, 1, 2 x the model-derived K_d of
  :func:`~adaptive_dynamics.control.gains.default_gains`) at the middle Gamma, three
  Gamma (25, 100, 400, times ``diag(s_i^2)`` of the URDF block's sizes as the node's
  ``gamma_scaling: nominal``) at the middle K_d: task-error norm over time, steady-state
  error and rise time per setting, link 7's mass and CoM over time.
* Adaptive vs non-adaptive (Figure 10): the same law with the update off (the model stays
  at the initial estimate); and, beyond the paper, with the suite's composite update
  (prediction error of the filtered regressor added, P0 = I): JSON ``composite``.
* Headline (Figures 12-13, Table 8): the ``adaptive_controller`` node (``law:
  backstepping``, direct adaptation, middle K_d and Gamma) over DDS in lockstep with the
  ``mujoco_bridge`` and the trajectory node in task space, as ``adaptive-dynamics launch
  sim controller:=backstepping`` starts them; recorded, and read back from the bag: the
  task error from the recorded joint states (forward kinematics) against the recorded
  ``task_reference``, link 7's estimate over time from ``adaptive/parameters``, the final
  estimate from the node's estimate file.

Another arm (``--robot iiwa14`` or a URDF file): the same with a 1 kg tool (:data:`TOOL`,
CoM (0.06, 0, 0.05) m in its last link's frame) on the last link, the bare last link (the
URDF's, without end-effector bodies) as the initial estimate, mass and CoM reported in
that link's frame, the model-derived gains, and the most manipulable start pose from
which the largest of :data:`SIZES` keeps the path within the trajectory node's limits.

In stages (``--part runs``: the in-process runs alone, no node graph; ``--runs-dir DIR``:
every in-process run's arrays kept in DIR and a run found there read back instead of run
again), e.g. the runs in one call and the headline on them in the next: the tests' way of
keeping each call under a minute.

Metrics: the error is the norm of the 6-D task error e of (27) (position [m] and
axis-angle [rad] rows); ``steady_state_error`` = its mean over the last path period;
``rise_time_s`` = the time at which the one-period moving mean of the error has completed
90 % of its fall from its largest value to the steady state (the adaptation's
convergence; the paper's rise times are 4-24 s).  Targets: link 7 + hand mass error <= 3 %
and CoM error <= 1 cm at the end of the headline run (the paper's: 12 % and ~3 cm), the
adaptive steady-state error <= 1/4 of the non-adaptive one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..control.adaptive import AdaptiveController
from ..control.backstepping import BacksteppingController
from ..control.gains import default_gains
from ..dynamics import RobotModel
from ..dynamics.inertial import from_mass_com_inertia, inertia_matrix
from ..evaluation.streams import read_streams
from ..launcher import graph_kind, run_to_end
from ..robot_setup import resolve_robot
from ..robots import armature, paper_config, ROBOT_NAMES
from ..ros.task_references import quaternion_to_matrix
from ..scenarios import build_graph
from ..sim.plant import MujocoPlant, RealityConfig
from ..trajectories import ACCELERATION_LIMIT, CartesianTrajectory, lissajous3d
from . import save_plot, write_result
from . import add_graph_argument
from .robot_choice import add_robot_args, chosen_robots, label, task_configuration

ROBOT = "panda"
#: Thunder's Panda: link 7 + hand, reported in Thunder's link 7 frame (its DH table's row 7
#: ends at the flange, panda_link8)
PANDA = {"link": "panda_link7", "frame": "panda_link8"}
#: Table 8 (Thunder's link 7 frame): mass [kg], CoM [m]
TRUE = (1.5655, (0.0617, -0.0004, 0.0009))
INITIAL = (0.736, (0.014, -0.004, -0.045))
PAPER_ESTIMATE = (1.7542, (0.0414, -0.0039, -0.0191))
#: another arm: an unmodelled tool on its last link (mass [kg], CoM [m] in that link's frame)
TOOL = (1.0, (0.06, 0.0, 0.05))
PATH = {"size": 0.3, "period": 5.0}
#: path sizes tried on another arm, largest first, until a start pose keeps it within the limits
SIZES = (0.3, 0.2, 0.15, 0.1)
KP_TASK = 5.0
KD_SCALES = (0.5, 1.0, 2.0)
GAMMAS = (25.0, 100.0, 400.0)
MIDDLE = {"kd_scale": 1.0, "gamma": 100.0}
SECONDS = 60.0
QUICK_SECONDS = 12.0
#: ``--mode``: the project's law (log orientation error, posture pull, damped pseudo-inverse,
#: link 7 alone adapted), the lab's as far as it is a setting (:data:`PAPER`), or both
MODES = ("both", "project", "paper")
#: the paper mode: e_o = vect(R_d R^T) with its L mapping, no posture pull, the exact
#: pseudo-inverse, every link's parameters adapted (Gamma scaled per parameter by the
#: URDF's sizes, as the project's)
PAPER = {"orientation": "vect", "k_posture": 0.0, "damping": 0.0, "adapt_every_link": True}
RATE_HZ = 1000.0
PARAMETERS_DECIMATION = 100      # the node's estimate on adaptive/parameters every 0.1 s


# ============================================================================ the set-up
@dataclass
class Setup:
    """One robot's experiment: the adapted ``link`` (the last; with the end-effector bodies
    the URDF fixes to it), the ``frame`` its mass and CoM are reported in (origin at
    ``offset`` in the link frame), the ``hand`` bodies the simulator empties, the truth and
    the controller's initial block (10-vectors about the link frame), the simulator's
    ``payload`` (bare link + payload = truth), the start pose and the path size."""

    robot: str
    label: str
    link: str
    frame: str
    offset: np.ndarray
    hand: list
    truth: np.ndarray
    initial: np.ndarray
    payload: dict
    q0: np.ndarray
    size: float
    paper: bool                  # Thunder's Panda: Table 8's numbers
    path: Any = None             # the task-space path (task_path: computed once, every run follows it)

    def mass_com(self, pi10) -> tuple[float, np.ndarray]:
        """Mass and CoM (in :attr:`frame`) of a block about the link frame."""
        m = float(pi10[0])
        return m, np.asarray(pi10[1:4]) / m - self.offset


def _path_ok(model, q0, size: float, coarse: bool) -> bool:
    try:
        CartesianTrajectory(model, q0, lissajous3d(size, PATH["period"]), dt=0.01 if coarse else 1e-3).check_limits(
            model.lower, model.upper, model.velocity_limit, np.full(model.n, ACCELERATION_LIMIT))
    except ValueError:
        return False
    return True


def make_setup(robot: str) -> Setup:
    """The Panda as in Thunder's paper (Table 8, the middle of the joint ranges, 0.3 m);
    another arm: :data:`TOOL` on its last link, the bare link as the initial estimate, the
    most manipulable start pose (robot_choice.task_configuration) from which the largest
    of :data:`SIZES` stays within the trajectory node's limits."""

    if robot not in ROBOT_NAMES:
        robot = resolve_robot(robot).urdf      # the locked URDF beside its generated parameter file
    model = RobotModel(robot)
    paper = robot == ROBOT
    link = PANDA["link"] if paper else model.link_names[-1]
    frame = PANDA["frame"] if paper else link
    offset = np.array(model.model.frames[model.frame_id(frame)].placement.translation) if paper else np.zeros(3)
    bare = RobotModel(model.urdf_path, ee_frame=model.ee_frame)
    bare.set_end_effector("none")
    blk = bare.get_link_parameters(link)
    c = blk[1:4] / blk[0]
    I_c = inertia_matrix(blk) - blk[0] * (c @ c * np.eye(3) - np.outer(c, c))   # about its CoM
    if paper:
        m_t, c_t = TRUE[0], np.asarray(TRUE[1]) + offset
        initial = from_mass_com_inertia(INITIAL[0], np.asarray(INITIAL[1]) + offset, I_c)
        q0, size = 0.5 * (model.lower + model.upper), PATH["size"]
    else:
        m_t = blk[0] + TOOL[0]
        c_t = (blk[1:4] + TOOL[0] * np.asarray(TOOL[1])) / m_t
        initial = blk.copy()
        for size in SIZES:
            try:
                q0 = task_configuration(model, feasible=lambda q, s=size: _path_ok(model, q, s, True)
                                        and _path_ok(model, q, s, False))
                break
            except ValueError:
                continue
        else:
            raise SystemExit(f"{robot}: no start pose keeps a lissajous3d path of {SIZES[-1]} m within the joint,"
                             " velocity and acceleration limits")
    m_p = m_t - blk[0]
    c_p = (m_t * c_t - blk[1:4]) / m_p
    I_p = 0.4 * m_p * 0.04 ** 2 * np.eye(3)        # a solid ball of 4 cm radius
    payload = from_mass_com_inertia(m_p, c_p, I_p)
    return Setup(robot, label(robot), link, frame, offset, list(model.end_effector_links), blk + payload, initial,
                 {"mass": float(m_p), "com": c_p.tolist(), "inertia": I_p.diagonal().tolist()},
                 np.asarray(q0, float), float(size), paper)


def reality(st: Setup):
    p = st.payload
    return RealityConfig(link_scale={b: 0.0 for b in st.hand} or 1.0, payload_mass=p["mass"], payload_com=p["com"],
                         payload_inertia=p["inertia"], payload_frame=st.link, payload_enabled=True)


def start_model(st: Setup):
    """The controller's start model: the URDF's, the adapted link at the initial estimate."""
    m = RobotModel(st.robot)
    m.set_link_parameters(st.link, st.initial)
    return m


def task_path(model, st: Setup):
    """The trajectory node's ``lissajous3d`` path from the start pose (its IK once per set-up)."""
    if st.path is None:
        st.path = CartesianTrajectory(model, st.q0, lissajous3d(st.size, PATH["period"])).task_space()
    return st.path


# ============================================================================ in-process runs
def run_core(st: Setup, kd_scale: float, gamma: float, adapt: bool, seconds: float, law: str = "direct",
             mode: str = "project") -> dict:
    """One closed loop of plant + backstepping core; the error norm at 1 kHz and the adapted
    link's block every 10 ms.  ``law`` "composite": the suite's composite update in the same
    law (P0 = I, R = I, no forgetting: the node's defaults but ``lambda0``).  ``mode``
    (:data:`MODES`): "paper" runs the lab's law as far as it is a setting (:data:`PAPER`)."""

    model = RobotModel(st.robot)
    kd = np.asarray(default_gains(model, armature=armature(st.robot, paper=True))["kd"]) * kd_scale   # as the node derives it
    paper = PAPER if mode == "paper" else {}
    ctl = BacksteppingController(model, law, kp_task=KP_TASK, kd=kd, pi0=start_model(st).parameters,
                                 adapted_links=None if paper.get("adapt_every_link") else [st.link],
                                 dt=1.0 / RATE_HZ, p0=1.0, r=1.0, lambda0=0.0,
                                 **{k: v for k, v in paper.items() if k != "adapt_every_link"})
    ctl.core.set_gains(gamma=gamma * ctl.core.nominal_gamma_scale(model.parameters))   # gamma_scaling: nominal
    path = task_path(model, st)
    blk = slice(10 * model.link_block(st.link), 10 * model.link_block(st.link) + 10)
    plant = MujocoPlant(st.robot, reality=reality(st), timestep=1.0 / RATE_HZ, q0=st.q0)
    n = int(round(seconds * RATE_HZ))
    P, V, A = path.sample_many(np.arange(n) / RATE_HZ)
    z3, Rd = np.zeros(3), path.R_start
    err = np.empty(n)
    est_t, est = [], []
    for k in range(n):
        _, q, v, tau_m = plant.state()
        tau = ctl.compute(q, v, P[k], Rd, np.r_[V[k], z3], np.r_[A[k], z3], tau_m, learn=adapt)
        e = ctl.ref.e
        err[k] = np.sqrt(e @ e)
        if k % 10 == 0:
            est_t.append(k / RATE_HZ)
            est.append(ctl.core.pi[blk].copy())
        plant.step(tau)
    return {"t": np.arange(n) / RATE_HZ, "err": err, "est_t": np.array(est_t), "est": np.array(est),
            "saturated_steps": int(plant.saturation_count.sum())}


#: a run's arrays (:func:`run_core`'s dict), as ``--runs-dir`` keeps them
RUN_KEYS = ("t", "err", "est_t", "est", "saturated_steps")


def core_runner(st: Setup, seconds: float, runs_dir: str = ""):
    """:func:`run_core` for this set-up and length; with ``runs_dir`` every run's arrays are
    kept there (``run_<robot>_<seconds>s_<setting>.npz``) and a run found there is read
    back instead of run again (bit-identical: the arrays as they were)."""
    if runs_dir:
        os.makedirs(runs_dir, exist_ok=True)

    def core(kd_scale: float, gamma: float, adapt: bool, law: str = "direct", mode: str = "project") -> dict:
        if not runs_dir:
            return run_core(st, kd_scale, gamma, adapt, seconds, law=law, mode=mode)
        name = (f"run_{st.label}_{seconds:g}s_kd{kd_scale:g}_gamma{gamma:g}_{'adaptive' if adapt else 'fixed'}"
                f"_{law}_{mode}.npz")
        path = os.path.join(runs_dir, name)
        if os.path.exists(path):
            with np.load(path) as z:
                r = {k: z[k] for k in RUN_KEYS}
            r["saturated_steps"] = int(r["saturated_steps"])
            print(f"[thunder] {name}: read back from {runs_dir}", flush=True)
            return r
        r = run_core(st, kd_scale, gamma, adapt, seconds, law=law, mode=mode)
        tmp = os.path.join(runs_dir, f".{name[:-4]}.{os.getpid()}.npz")
        np.savez(tmp, **{k: r[k] for k in RUN_KEYS})
        os.replace(tmp, path)      # whole or absent, for a reader beside
        return r
    return core


def moving_mean(t: np.ndarray, x: np.ndarray, window: float) -> np.ndarray:
    k = max(1, int(round(window / (t[1] - t[0]))))
    c = np.cumsum(np.r_[0.0, x])
    out = np.empty_like(x)
    out[k - 1:] = (c[k:] - c[:-k]) / k
    out[:k - 1] = c[1:k] / np.arange(1, k)
    return out


def error_metrics(t: np.ndarray, err: np.ndarray, period: float) -> dict:
    """Steady-state error (mean over the last period) and the 90 % rise time (module docstring)."""
    ss = float(err[t >= t[-1] - period].mean())
    mm = moving_mean(t, err, period)
    full = t >= t[0] + period                      # whole windows only
    peak_i = int(np.argmax(np.where(full, mm, -np.inf)))
    level = ss + 0.1 * (mm[peak_i] - ss)
    after = np.flatnonzero((mm <= level) & full & (t >= t[peak_i]))
    rise = float(t[after[0]]) if after.size else None
    return {"steady_state_error": ss, "rise_time_s": rise, "peak_error": float(mm[peak_i])}


# ============================================================================ the headline over DDS
def run_headline(st: Setup, out_dir: str, seconds: float, *, echo: bool = False, keep_bag: bool = False) -> dict:
    """The node graph in lockstep (module docstring); returns arrays read from its bag."""

    model = RobotModel(st.robot)
    work = out_dir if keep_bag else tempfile.mkdtemp(prefix="thunder_")
    bag = os.path.join(work, "bag_thunder")
    if os.path.exists(bag):
        shutil.rmtree(bag)
    yaml_path = start_model(st).save_thunder_yaml(
        os.path.join(out_dir, f"{st.label}_initial_inertial_REG.yaml"),
        "the controller's start model: the URDF's, " + ("link 7 + Softhand at Thunder's Table 8 initial estimate"
                                                        if st.paper else f"{st.link} without the tool"))
    estimate = os.path.join(out_dir, "thunder_estimate.npz")
    if os.path.exists(estimate):
        os.remove(estimate)
    p = st.payload
    overrides = {
        "mujoco_bridge": {"payload_mass": p["mass"], "payload_com": p["com"], "payload_inertia": p["inertia"],
                          "payload_frame": st.link, "payload_enabled": True,
                          "link_scales": [f"{b}:0" for b in st.hand] or [""], "q0": st.q0.tolist(),
                          "friction_viscous": [0.0], "friction_coulomb": [0.0]},
        "trajectory": {"type": "lissajous3d", "cartesian_size": st.size, "cartesian_period": PATH["period"],
                       "q_center": st.q0.tolist()},
        "adaptive_controller": {"adaptation": "direct", "kp_task": [KP_TASK], "kd": [0.0], "friction": False,
                                "gamma": [MIDDLE["gamma"]], "gamma_scaling": "nominal", "adapted_links": [st.link],
                                "initial_estimate": "file", "initial_estimate_file": yaml_path,
                                "estimate_file": estimate, "autosave_period": 0.0,
                                "parameters_decimation": PARAMETERS_DECIMATION},
        "recorder": {"topics": ["joint_states", "task_reference", "effort_controller/commands", "adaptive/parameters",
                                "/diagnostics"]},
    }
    nodes = build_graph("sim", robot=st.robot, controller="backstepping", duration=seconds, record=True, bag=bag,
                        overrides=overrides, param_files=paper_config(st.robot))
    wall = run_to_end(nodes, timeout=180.0 + 20.0 * seconds, echo=echo, what="the closed loop failed").wall_s
    try:
        data = read_bag(bag, model)
    finally:
        if not keep_bag:
            shutil.rmtree(work, ignore_errors=True)
    final = AdaptiveController.load(estimate, RobotModel(st.robot))
    i = model.link_block(st.link)
    # the estimate over time: adaptive/parameters carries theta (the adapted link's base
    # parameters); its full-coordinate block is the state file's mapping of it (the fixed
    # part is zero on the adapted block)
    blocks = []
    for names, theta in data.pop("params"):
        if names != final.parameter_names:
            raise RuntimeError(f"adaptive/parameters names {names[:3]}... are not the estimate file's layout")
        blocks.append(final.base.from_base(theta)[10 * i: 10 * i + 10])
    data.update(wall_s=round(wall, 1), sim_s_per_wall_s=round(seconds / wall, 3), est=np.asarray(blocks),
                final_block=final.pi[10 * i: 10 * i + 10].copy(), estimate_file=estimate, initial_file=yaml_path)
    return data


def read_bag(bag: str, model) -> dict:
    """Task error over time (recorded states against the recorded task references), the
    estimate messages (names, theta) and the last diagnostics."""
    import pinocchio as pin

    rec = read_streams(bag, model.joint_names, reference=None, task_reference="/task_reference",
                       frame=model.ee_frame, vectors=["/adaptive/parameters"], diagnostics=True)
    st = rec.joints()
    refs = dict(zip(rec.task_reference[0].tolist(), rec.task_reference[1]))
    params, diag = rec.vectors["/adaptive/parameters"], rec.diagnostics
    t, err = [], []
    for stamp, q in zip(st.t_ns, st.position):
        r = refs.get(int(stamp))
        if r is None:
            continue
        T = model.frame_pose(q)
        R_d = quaternion_to_matrix(r[3:])
        e = np.r_[r[:3] - T[:3, 3], pin.log3(R_d @ T[:3, :3].T)]
        t.append(stamp * 1e-9)
        err.append(float(np.linalg.norm(e)))
    return {"t": np.asarray(t), "err": np.asarray(err), "est_t": np.array([p[0] * 1e-9 for p in params]),
            "params": [(names, values) for _, names, values in params], "states": len(st.t_ns), "diagnostics": diag}


# ============================================================================ plots
def _what(st: Setup) -> str:
    return "link 7 + hand" if st.paper else f"{st.link} + tool"


def _plot_sweep(st: Setup, runs: dict, title: str, out_dir: str, stem: str, files: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, r in runs.items():
        ax.plot(r["t"][10::10], r["err"][10::10], lw=0.9, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("t [s]")
    ax.set_ylabel("|e| (task error norm)")
    ax.set_title(f"Task-error norm, {title}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_plot(fig, out_dir, f"thunder_{stem}_error.png", files)
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.5), sharex=True)
    truth_m, truth_c = st.mass_com(st.truth)
    for name, r in runs.items():
        m = r["est"][:, 0]
        c = r["est"][:, 1:4] / m[:, None] - st.offset
        axes[0, 0].plot(r["est_t"], m, lw=0.9, label=name)
        for k, ax in enumerate((axes[0, 1], axes[1, 0], axes[1, 1])):
            ax.plot(r["est_t"], c[:, k], lw=0.9, label=name)
    for ax, val, lab in zip(axes.flat, (truth_m, *truth_c), ("mass [kg]", "CoM x [m]", "CoM y [m]", "CoM z [m]")):
        ax.axhline(val, color="k", ls="--", lw=0.8)
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
        # the first second's burst (the path starts moving, the arm at rest) would hide the rest
        ax.set_ylim(*((0.0, 2.0 * truth_m) if lab.startswith("mass") else (val - 0.1, val + 0.1)))
    axes[0, 0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("t [s]")
    fig.suptitle(f"{_what(st).capitalize()} estimate, {title} (dashed: truth; start transient clipped)")
    fig.tight_layout()
    save_plot(fig, out_dir, f"thunder_{stem}_parameters.png", files)


def _plot_compare(adaptive: dict, fixed: dict, composite: dict, out_dir: str, files: list) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(fixed["t"][10::10], fixed["err"][10::10], color="tab:red", lw=0.9, label="non-adaptive")
    ax.plot(adaptive["t"][10::10], adaptive["err"][10::10], color="tab:blue", lw=0.9, label="adaptive (34)")
    ax.plot(composite["t"][10::10], composite["err"][10::10], color="tab:green", lw=0.9,
            label="adaptive, composite update")
    ax.set_yscale("log")
    ax.set_xlabel("t [s]")
    ax.set_ylabel("|e|")
    ax.set_title("Adaptive vs non-adaptive backstepping (Fig. 10)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_plot(fig, out_dir, "thunder_adaptive_vs_nonadaptive.png", files)


def _plot_headline(st: Setup, h: dict, out_dir: str, files: list) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(h["t"][10::10], h["err"][10::10], lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("t [s]")
    axes[0].set_ylabel("|e|")
    axes[0].set_title("adaptive_controller node over DDS (Fig. 12)")
    axes[0].grid(True, which="both", alpha=0.3)
    if len(h["est"]):
        truth_m, truth_c = st.mass_com(st.truth)
        m = h["est"][:, 0]
        c = h["est"][:, 1:4] / m[:, None] - st.offset
        axes[1].plot(h["est_t"], m, color="C0", label="estimate")
        axes[1].axhline(truth_m, color="k", ls="--", lw=0.8, label="truth")
        axes[1].axhline(st.initial[0], color="0.5", ls=":", lw=0.8, label="initial")
        axes[1].set_ylim(0.0, 2.0 * truth_m)
        axes[1].set_ylabel("mass [kg]")
        axes[1].set_title(f"{_what(st).capitalize()} mass (Fig. 13)")
        for k, lab in enumerate("xyz"):
            axes[2].plot(h["est_t"], c[:, k], color=f"C{k + 1}", lw=0.9, label=f"CoM {lab}")
            axes[2].axhline(truth_c[k], color=f"C{k + 1}", ls="--", lw=0.8)
        axes[2].set_ylim(float(np.min(truth_c)) - 0.1, float(np.max(truth_c)) + 0.1)
        axes[2].set_ylabel(f"CoM [m] ({st.frame} frame)")
        axes[2].set_title(f"{_what(st).capitalize()} CoM (dashed: truth)")
        for ax in axes[1:]:
            ax.set_xlabel("t [s]")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, out_dir, "thunder_headline.png", files)


# ============================================================================ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment thunder",
                                 description="Thunder Dynamics' adaptive backstepping on the MuJoCo Panda with an"
                                             " unmodelled hand: K_d and Gamma sweeps (Tables 6-7, Fig. 6-9),"
                                             " adaptive vs non-adaptive (Fig. 10), the link 7 + hand estimate"
                                             " (Table 8) from the adaptive_controller node over DDS (Fig. 12-13)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true",
                    help=f"short version for tests: {QUICK_SECONDS:g} s runs (targets are for the full run)")
    ap.add_argument("--seconds", type=float, default=None,
                    help=f"length of every run [s] (default {SECONDS:g}, --quick {QUICK_SECONDS:g})")
    add_robot_args(ap, ROBOT, plural=False,
                   extra_help="; panda: Thunder's Table 8 set-up, another arm: a 1 kg tool on its last link")
    ap.add_argument("--keep-bag", action="store_true", help="keep the headline run's bag in --out")
    ap.add_argument("--mode", default="both", choices=list(MODES),
                    help="project (the suite's law: log orientation error, posture pull, damped pseudo-inverse,"
                         " the tool's link alone adapted), paper (vect orientation error with its L mapping, no"
                         " posture pull, exact pseudo-inverse, every link adapted) or both (default): the JSON"
                         " carries project_mode / paper_mode (adaptive and non-adaptive at the middle gains)")
    ap.add_argument("--part", default="all", choices=["all", "runs"],
                    help="all (default): the in-process runs and the headline over DDS; runs: the in-process runs"
                         " alone (sweeps, non-adaptive, composite, --mode's), no node graph -- the JSON without the"
                         " headline's figures (table8, payload_*, headline, targets_met)")
    ap.add_argument("--runs-dir", default="", metavar="DIR",
                    help="keep every in-process run's arrays in DIR and read a run found there back instead of"
                         " running it again (the same robot, --seconds and setting): e.g. --part runs first, then"
                         " the headline on its runs")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the node graph's output")
    add_graph_argument(ap)
    args = ap.parse_args(argv)
    with graph_kind(args.graph):
        return _main(args, ap)


def _main(args, ap) -> int:
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    if not seconds >= 2 * PATH["period"]:
        raise SystemExit(f"--seconds must be at least two path periods ({2 * PATH['period']:g} s)")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    (robot,) = chosen_robots(args)
    st = make_setup(robot)
    model = RobotModel(robot)
    period = PATH["period"]
    core = core_runner(st, seconds, args.runs_dir)
    headline = args.part == "all"

    print(f"[thunder] sweeps: K_d x {KD_SCALES}, Gamma {GAMMAS}, non-adaptive; {seconds:g} s each ...", flush=True)
    settings = {f"kd_x{k:g}": (k, MIDDLE["gamma"]) for k in KD_SCALES}
    settings.update({f"gamma_{g:g}": (MIDDLE["kd_scale"], g) for g in GAMMAS})
    runs: dict[str, dict] = {}
    done: dict[tuple, dict] = {}
    for name, key in settings.items():
        if key not in done:
            done[key] = core(key[0], key[1], True)
        runs[name] = done[key]
    fixed = core(MIDDLE["kd_scale"], MIDDLE["gamma"], False)
    composite = core(MIDDLE["kd_scale"], MIDDLE["gamma"], True, law="composite")
    metrics = {name: error_metrics(r["t"], r["err"], period) for name, r in runs.items()}
    m_fixed = error_metrics(fixed["t"], fixed["err"], period)
    middle = f"kd_x{MIDDLE['kd_scale']:g}"
    ratio = metrics[middle]["steady_state_error"] / m_fixed["steady_state_error"]
    files: list[str] = []
    _plot_sweep(st, {f"K_d x {k:g}": runs[f"kd_x{k:g}"] for k in KD_SCALES}, f"Gamma = {MIDDLE['gamma']:g}",
                args.out, "kd", files)
    _plot_sweep(st, {f"Gamma {g:g}": runs[f"gamma_{g:g}"] for g in GAMMAS}, "K_d x 1", args.out, "gamma", files)
    _plot_compare(runs[middle], fixed, composite, args.out, files)
    for name, m in metrics.items():
        print(f"[thunder] {name}: steady-state |e| {m['steady_state_error']:.3g}, rise time {m['rise_time_s']} s",
              flush=True)

    true_m, true_c = st.mass_com(st.truth)
    if headline:
        print(f"[thunder] headline: the adaptive_controller node over DDS, {seconds:g} s in lockstep ...", flush=True)
        h = run_headline(st, args.out, seconds, echo=args.verbose, keep_bag=args.keep_bag)
        hm = error_metrics(h["t"], h["err"], period)
        mass, com = st.mass_com(h["final_block"])
        _plot_headline(st, h, args.out, files)
        init_m, init_c = st.mass_com(st.initial)
        table = {"true": {"mass": round(true_m, 5), "com": [round(float(c), 5) for c in true_c]},
                 "estimate": {"mass": round(mass, 4), "com": [round(float(c), 4) for c in com]},
                 "initial": {"mass": round(init_m, 5), "com": [round(float(c), 5) for c in init_c]}}
        if st.paper:
            table["paper_estimate"] = {"mass": PAPER_ESTIMATE[0], "com": list(PAPER_ESTIMATE[1])}
    c_m, c_c = st.mass_com(composite["est"][-1])
    m_comp = error_metrics(composite["t"], composite["err"], period)
    summary: dict[str, Any] = {
        "experiment": "thunder", "quick": bool(args.quick), "part": args.part, "robot": st.label, "seconds": seconds,
        "adapted_link": st.link, "com_frame": st.frame, "start_pose": [round(float(x), 4) for x in st.q0],
        "path": {"type": "lissajous3d", "size": st.size, "period": period}, "kp_task": KP_TASK,
        "kd_model_derived": [round(x, 4) for x in default_gains(model, armature=armature(st.robot, paper=True))["kd"]],
        "settings": {n: {"kd_scale": k, "gamma": g} for n, (k, g) in settings.items()},
        "steady_state_error": {n: round(m["steady_state_error"], 6) for n, m in metrics.items()},
        "rise_time_s": {n: (None if m["rise_time_s"] is None else round(m["rise_time_s"], 2))
                        for n, m in metrics.items()},
        "nonadaptive_steady_state_error": round(m_fixed["steady_state_error"], 6),
        "adaptive_vs_nonadaptive": round(ratio, 5),
    }
    if headline:
        summary.update({
            "table8": table,
            "payload_mass_rel_error": round(abs(mass - true_m) / true_m, 5),
            "payload_com_error_m": round(float(np.linalg.norm(com - true_c)), 5)})
    summary["composite"] = {"steady_state_error": round(m_comp["steady_state_error"], 6),
                            "payload_mass_rel_error": round(abs(c_m - true_m) / true_m, 5),
                            "payload_com_error_m": round(float(np.linalg.norm(c_c - true_c)), 5),
                            "estimate": {"mass": round(c_m, 4), "com": [round(float(c), 4) for c in c_c]}}
    if headline:
        summary["headline"] = {
            "steady_state_error": round(hm["steady_state_error"], 6),
            "rise_time_s": None if hm["rise_time_s"] is None else round(hm["rise_time_s"], 2),
            "states": h["states"], "wall_s": h["wall_s"], "sim_s_per_wall_s": h["sim_s_per_wall_s"],
            "node_task_error_rms": h["diagnostics"].get("adaptive_controller", {}).get("task_error_rms")}
    summary.update({
        "saturated_steps": {n: r["saturated_steps"] for n, r in runs.items()},
        "plots": [os.path.basename(f) for f in files],
        "runtime_s": round(time.perf_counter() - t_start, 1),
    })
    if headline:
        summary["targets_met"] = bool(summary["payload_mass_rel_error"] <= 0.03
                                      and summary["payload_com_error_m"] <= 0.01 and ratio <= 0.25)
    modes = ["project", "paper"] if args.mode == "both" else [args.mode]
    for m in modes:
        if m == "project":
            a_run, f_run = runs[middle], fixed
        else:
            print(f"[thunder] paper mode ({PAPER}): adaptive and non-adaptive, {seconds:g} s each ...", flush=True)
            a_run = core(MIDDLE["kd_scale"], MIDDLE["gamma"], True, mode="paper")
            f_run = core(MIDDLE["kd_scale"], MIDDLE["gamma"], False, mode="paper")
        ma, mf = error_metrics(a_run["t"], a_run["err"], period), error_metrics(f_run["t"], f_run["err"], period)
        pm, pc = st.mass_com(a_run["est"][-1])
        summary[f"{m}_mode"] = {
            "steady_state_error": round(ma["steady_state_error"], 6),
            "nonadaptive_steady_state_error": round(mf["steady_state_error"], 6),
            "adaptive_vs_nonadaptive": round(ma["steady_state_error"] / mf["steady_state_error"], 5),
            "payload_mass_rel_error": round(abs(pm - true_m) / true_m, 5),
            # every link adapted: the block can lose its mass (no centre of mass then)
            "payload_com_error_m": (round(float(np.linalg.norm(pc - true_c)), 5) if np.all(np.isfinite(pc))
                                    else None),
            "saturated_steps": a_run["saturated_steps"], **({"settings": dict(PAPER)} if m == "paper" else {})}
    return write_result(args.out, "thunder", summary)


if __name__ == "__main__":
    sys.exit(main())
