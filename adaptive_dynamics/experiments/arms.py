"""Any arm, with no tuning: composite adaptive control on the arms of example-robot-data.

Every arm chain of the ``example-robot-data`` package (:data:`ARMS`: each robot whose URDF
has a serial chain of five or more actuated joints; grippers, heads, torsos and wheels
locked; a dual-arm robot by one arm) goes through the path a user takes -- ``demo --robot
<URDF> --controller composite`` -- as processes over DDS:

* the robot resolved from its URDF (:func:`~adaptive_dynamics.robot_setup.resolve_robot`): the
  generated parameter file's model-derived gains (1 kHz, the assumed drive armature),
  friction columns, the simulator's joint friction (the URDF's ``<dynamics>``, else the
  default fraction of the effort limits);
* a payload on the end effector sized to the arm (:func:`payload_for`: :data:`PAYLOAD_SHARE`
  of what its weakest joint holds on top of what moving the arm itself along the
  reference takes -- gravity, inertia, the simulator's joint friction -- worst case over
  the trajectory), unknown to the controller;
* the trajectory node's default Fourier trajectory (0.4 rad) about the middle of the
  joint ranges, or, where the arm cannot hold itself there, about the pose in the middle
  half of the ranges where it holds the most (:func:`trajectory_centre`: a humanoid's
  arm hangs down), with a smaller amplitude where even that is not enough
  (:func:`trajectory_plan`);
* composite adaptive control started from the URDF's model (``initial_estimate: nominal``).

Per arm and joint: position RMSE over the last :data:`TAIL_S` s, the time the command
spent saturated (the controller's count of clipped cycles, 1 ms each, ``/diagnostics``)
and the controller's watchdog trips (``/diagnostics``).  An arm the suite cannot load is *refused* (the reason in the table).
Targets (JSON ``targets_met``): :data:`TARGETS`.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from ..control.gains import working_configuration
from ..dynamics import RobotModel
from ..dynamics.continuous import working_range
from ..evaluation.bags import controller_saturation, watchdog_trips
from ..launcher import graph_kind, run_to_end
from ..robot_setup import controller_gains, resolve_robot
from ..robots import armature, friction
from ..scenarios import build_graph, parse_overrides
from ..trajectories import ACCELERATION_LIMIT, ModifiedFourier
from . import save_plot, write_result
from . import add_graph_argument
from .closed_loop_regions import tracking

#: (label, URDF path under example-robot-data's robots/, joints to keep or None = all moving joints,
#:  end-effector frame or None = resolve_robot's: the link the last kept joint moves)
ARMS: list[tuple[str, str, Any, Any]] = [
    ("so100", "so_arm_description/urdf/so100.urdf", None, None),
    ("so101", "so_arm_description/urdf/so101.urdf", None, None),
    ("z1", "z1_description/urdf/z1.urdf", [f"joint{i}" for i in range(1, 7)], None),
    ("xarm7", "xarm_description/urdf/xarm7.urdf", None, None),
    ("panda", "panda_description/urdf/panda.urdf", [f"panda_joint{i}" for i in range(1, 8)], "panda_hand"),
    ("ur3", "ur_description/urdf/ur3_robot.urdf", None, None),
    ("ur5", "ur_description/urdf/ur5_robot.urdf", None, None),
    ("ur10", "ur_description/urdf/ur10_robot.urdf", None, None),
    ("kinova", "kinova_description/robots/kinova.urdf", [f"j2s6s200_joint_{i}" for i in range(1, 7)], None),
    ("baxter_left", "baxter_description/urdf/baxter.urdf",
     ["left_s0", "left_s1", "left_e0", "left_e1", "left_w0", "left_w1", "left_w2"], None),
    ("tiago_arm", "tiago_description/robots/tiago_no_hand.urdf", [f"arm_{i}_joint" for i in range(1, 8)], None),
    ("tiago_pro_left", "tiago_pro_description/robots/tiago_pro.urdf", [f"arm_left_{i}_joint" for i in range(1, 8)],
     None),
    ("pr2_right", "pr2_description/urdf/pr2.urdf",
     ["r_shoulder_pan_joint", "r_shoulder_lift_joint", "r_upper_arm_roll_joint", "r_elbow_flex_joint",
      "r_forearm_roll_joint", "r_wrist_flex_joint", "r_wrist_roll_joint"], None),
    ("centauro_arm", "centauro_description/urdf/centauro.urdf", [f"j_arm1_{i}" for i in range(1, 7)], None),
    ("hextilt_arm", "hextilt_description/urdf/hextilt_flying_arm_5.urdf", None, None),
    ("talos_left", "talos_data/robots/talos_reduced.urdf", [f"arm_left_{i}_joint" for i in range(1, 8)], None),
    ("romeo_left", "romeo_description/urdf/romeo_small.urdf",
     ["LShoulderPitch", "LShoulderYaw", "LElbowRoll", "LElbowYaw", "LWristRoll", "LWristYaw", "LWristPitch"], None),
    ("icub_left", "icub_description/robots/icub_reduced.urdf",
     ["l_shoulder_pitch", "l_shoulder_roll", "l_shoulder_yaw", "l_elbow", "l_wrist_prosup", "l_wrist_pitch",
      "l_wrist_yaw"], None),
    ("g1_left", "g1_description/urdf/g1_29dof_rev_1_0.urdf",
     ["left_shoulder_pitch_joint", "left_shoulder_roll_joint", "left_shoulder_yaw_joint", "left_elbow_joint",
      "left_wrist_roll_joint", "left_wrist_pitch_joint", "left_wrist_yaw_joint"], None),
    ("alex_left", "alex_description/urdf/alex_nub_hands.urdf",
     ["LeftShoulderPitch", "LeftShoulderRoll", "LeftShoulderYaw", "LeftElbowPitch", "LeftWristYaw", "LeftWristRoll"],
     None),
    ("simple_humanoid_left", "simple_humanoid_description/urdf/simple_humanoid.urdf",
     ["LARM_SHOULDER_P", "LARM_SHOULDER_R", "LARM_SHOULDER_Y", "LARM_ELBOW", "LARM_WRIST_Y", "LARM_WRIST_P",
      "LARM_WRIST_R"], None),
]
#: the quick version: one light, one medium, one heavy arm
QUICK_ARMS = ("so101", "xarm7", "ur10")
#: payload = this share of what the weakest joint holds beyond the arm's own gravity
PAYLOAD_SHARE = 0.25
#: the payload's centre of mass in the end-effector frame [m] (a tool 5 cm out along z: the
#: wrist joints whose axes cross the frame's origin carry it too)
PAYLOAD_COM = (0.0, 0.0, 0.05)
#: sim s per arm, the tail [s] the RMSE is taken over
DURATION_S, TAIL_S = 30.0, 10.0
QUICK_DURATION_S, QUICK_TAIL_S = 15.0, 5.0
#: the trajectory node's settings of config/sim.yaml (Modified Fourier series)
TRAJECTORY = {"seed": 0, "base_frequency": 0.1, "harmonics": 4}
#: trajectory amplitudes [rad] tried in turn (the first is the trajectory node's default)
AMPLITUDES = (0.4, 0.2, 0.1)
#: share of every joint's effort limit the plan keeps free of the motion itself (gravity,
#: inertia, friction along the reference): the feedback's headroom
HEADROOM = 0.2
#: the controller starts from the URDF's model
CONTROLLER = {"initial_estimate": "nominal"}
TARGETS = {"rmse_max_rad": 0.05, "saturated_ms_max": 100.0, "watchdog_trips": 0, "arms_refused": 0}


def robots_dir() -> str:
    """example-robot-data's ``robots/`` directory (installed with the ``example-robot-data``
    wheel under ``cmeel.prefix``)."""
    for base in sys.path + [sys.prefix]:
        for cand in (os.path.join(base, "cmeel.prefix", "share", "example-robot-data", "robots"),
                     os.path.join(base, "lib", "python3.11", "site-packages", "cmeel.prefix", "share",
                                  "example-robot-data", "robots")):
            if os.path.isdir(cand):
                return cand
    found = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "cmeel.prefix", "share",
                                   "example-robot-data", "robots"))
    if found:
        return found[0]
    raise FileNotFoundError("example-robot-data not found (pip install example-robot-data)")


def reference_samples(model, centre, amplitude: float, n: int = 256, derivatives: bool = False):
    """``n`` poses of the reference the trajectory node plays with :data:`TRAJECTORY` and
    ``amplitude`` about ``centre`` (its Modified Fourier series, seed 0; one period);
    ``derivatives``: ``(Q, V, A)``, the velocities and accelerations too."""
    import math

    t = TRAJECTORY
    traj = ModifiedFourier.random(model.n, np.random.default_rng(t["seed"]), q_center=centre, amplitude=amplitude,
                                  w_f=2 * math.pi * t["base_frequency"], L=t["harmonics"], lower=model.lower,
                                  upper=model.upper, vel_limit=model.velocity_limit,
                                  acc_limit=np.full(model.n, ACCELERATION_LIMIT), joint_names=model.joint_names)
    Q, V, A = traj.sample_many(np.linspace(0.0, 1.0 / t["base_frequency"], n, endpoint=False))
    return (Q, V, A) if derivatives else Q


def payload_for(model, Q, V=None, A=None, friction=None) -> dict:
    """The payload [kg], its centre of mass :data:`PAYLOAD_COM` in the end-effector frame:
    :data:`PAYLOAD_SHARE` of the smallest ``(tau_max,j - |tau_j|) / |J_c,j(q)^T g|`` (``J_c``:
    the Jacobian of that point) over the joints and the samples of the reference: the
    mass the weakest joint could still hold at the worst instant of the trajectory (0 when
    the arm cannot even move itself along it: ``capacity_kg`` < 0).  ``tau`` is the
    gravity torque at the poses ``Q``; with their velocities and accelerations ``V``,
    ``A`` the URDF model's inverse dynamics, plus the joint friction ``friction = (viscous,
    Coulomb)`` the simulator applies (``f_v v + f_c sgn v``), when given."""
    cap, joint = _capacity(model, Q, V, A, friction)
    return {"mass_kg": round(max(0.0, PAYLOAD_SHARE * cap), 3), "capacity_kg": round(cap, 3), "weakest_joint": joint,
            "com": list(PAYLOAD_COM)}


def _point_jacobian(model, q, offset) -> np.ndarray:
    """Linear Jacobian of the point ``offset`` (end-effector frame) in world axes."""
    J = model.jacobian(q)
    r = model.frame_pose(q)[:3, :3] @ np.asarray(offset, dtype=float)
    skew = np.array([[0.0, -r[2], r[1]], [r[2], 0.0, -r[0]], [-r[1], r[0], 0.0]])
    return J[:3] - skew @ J[3:]


def _capacity(model, Q, V=None, A=None, friction=None, share: float = 1.0) -> tuple[float, str]:
    """The payload [kg] at :data:`PAYLOAD_COM` the weakest joint holds within ``share`` of its
    effort limit beyond the motion's torque, at the worst sample; that joint."""
    worst, joint = np.inf, model.joint_names[0]
    gvec = np.array([0.0, 0.0, 9.81])
    fv, fc = (np.zeros(model.n), np.zeros(model.n)) if friction is None else \
        (np.asarray(friction[0], dtype=float), np.asarray(friction[1], dtype=float))
    for k, q in enumerate(Q):
        per_kg = np.abs(_point_jacobian(model, q, PAYLOAD_COM).T @ gvec)
        tau = model.gravity(q) if V is None else model.inverse_dynamics(q, V[k], A[k]) + fv * V[k] + fc * np.sign(V[k])
        spare = share * model.effort_limit - np.abs(tau)
        ok = per_kg > 1e-6
        if not np.any(ok):
            continue
        ratio = spare[ok] / per_kg[ok]
        if ratio.min() < worst:
            worst, joint = float(ratio.min()), model.joint_names[int(np.flatnonzero(ok)[np.argmin(ratio)])]
    return worst, joint


def trajectory_centre(model, amplitude: float, candidates: int = 100, seed: int = 0,
                      friction=None) -> tuple[np.ndarray, float]:
    """The trajectory's centre and the arm's payload capacity along it (the model's inverse
    dynamics and the simulator's ``friction``, :func:`payload_for`): the middle of the
    joint ranges (the trajectory node's default), or -- when the arm cannot even move
    itself along that reference with :data:`HEADROOM` of every joint's effort to spare --
    the pose of ``candidates`` drawn from the middle half of each range whose reference it
    holds the largest payload along (a humanoid's arm raised to the middle of its ranges
    cannot hold itself; hanging down it can).  The capacity returned keeps the headroom."""
    lo, hi = working_range(model.lower, model.upper)
    mid = working_configuration(model)
    rng = np.random.default_rng(seed)
    share = 1.0 - HEADROOM
    best, best_cap = mid, _capacity(model, *reference_samples(model, mid, amplitude, 64, True), friction, share)[0]
    if best_cap > 0.0:                 # what a user gets: the trajectory node's default centre
        return mid, best_cap
    for _ in range(candidates):
        c = mid + rng.uniform(-0.25, 0.25, model.n) * (hi - lo)
        try:
            cap = _capacity(model, *reference_samples(model, c, amplitude, 64, True), friction, share)[0]
        except ValueError:             # the reference would leave the limits
            continue
        if cap > best_cap + 1e-9:
            best, best_cap = c, cap
    return best, best_cap


def trajectory_plan(model, friction=None) -> tuple[np.ndarray, float]:
    """Centre and amplitude of the arm's trajectory: :data:`AMPLITUDES` in turn, the first
    whose reference (:func:`trajectory_centre`) the arm can move itself along against
    gravity, its inertia and the simulator's ``friction`` with :data:`HEADROOM` to spare (the PR2's arms, counterbalanced
    by springs its URDF does not have, need a smaller one; iCub's wrist, 1 N m s/rad of
    damping in its URDF against 0.65 N m of effort, a slower one); the smallest when none."""
    for amp in AMPLITUDES:
        centre, cap = trajectory_centre(model, amp, friction=friction)
        if cap > 0.0:
            break
    return centre, amp


def run_arm(label: str, urdf: str, joints, ee_frame, duration: float, tail: float, work: str,
            echo: bool = False, extra: dict | None = None) -> dict:
    """One arm through ``demo``'s graph; its row of the table (or ``refused`` with why)."""

    try:
        spec = resolve_robot(urdf, joints=joints, ee_frame=ee_frame)
        model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    except (ValueError, FileNotFoundError) as exc:
        return {"arm": label, "refused": str(exc)}
    fr = friction(spec.urdf)
    centre, amplitude = trajectory_plan(model, fr)
    payload = payload_for(model, *reference_samples(model, centre, amplitude, derivatives=True), friction=fr)
    bag = os.path.join(work, f"bag_{label}")
    stats = os.path.join(work, f"bridge_{label}.json")
    overrides = {"mujoco_bridge": {"payload_mass": payload["mass_kg"], "payload_enabled": payload["mass_kg"] > 0,
                                   "payload_com": list(PAYLOAD_COM),
                                   "stats_file": stats, "q0": [float(x) for x in centre]},   # starts on the reference
                 "adaptive_controller": dict(CONTROLLER),
                 "trajectory": {"amplitude": amplitude, "q_center": [float(x) for x in centre]}}
    for node, params in (extra or {}).items():
        overrides.setdefault(node, {}).update(params)
    nodes = build_graph("sim", robot=spec.urdf, controller="composite", duration=duration, record=True, bag=bag,
                        overrides=overrides)
    t0 = time.monotonic()
    try:
        run_to_end(nodes, timeout=max(300.0, 20 * duration), echo=echo, what="the closed loop failed")
    except RuntimeError as exc:
        return {"arm": label, "failed": str(exc)[-3000:], "wall_s": round(time.monotonic() - t0, 1)}
    tr = tracking(bag, spec.joint_names, t_from=duration - tail)
    with open(stats, encoding="utf-8") as fh:
        st = json.load(fh)
    # clipped commands: the controller clips at the effort limits before the simulator sees them
    # (its count, 1 kHz cycles = ms), the simulator's own count for anything else that reached it
    ctl = controller_saturation(bag) or [0] * model.n
    sat_ms = np.asarray(ctl, dtype=float) + np.asarray(st.get("saturation_count", [0] * model.n), dtype=float)
    trips = watchdog_trips(bag)
    return {"arm": label, "joints": spec.joint_names, "dof": model.n, "effort_limit": model.effort_limit.tolist(),
            "armature": armature(spec.urdf).tolist(), "kd": controller_gains(spec.urdf).get("kd"), "payload": payload,
            "amplitude_rad": amplitude,
            "centre_moved": bool(np.any(np.abs(centre - working_configuration(model)) > 1e-9)),
            "rmse_rad": [round(float(x), 5) for x in tr["rmse"]], "rmse_max_rad": round(float(tr["rmse"].max()), 5),
            "saturated_ms": sat_ms.tolist(), "saturated_ms_max": float(sat_ms.max()), "watchdog_trips": trips,
            "wall_s": round(time.monotonic() - t0, 1), "_trace": (tr["t"], tr["e"])}


def plot(row: dict, out_dir: str, files: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t, e = row["_trace"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(t, e, lw=0.7)
    ax.set_xlabel("sim time [s]")
    ax.set_ylabel("q_d - q [rad]")
    ax.legend(row["joints"], fontsize=6, ncol=4, loc="upper right")
    ax.set_title(f"{row['arm']}: composite + friction from the URDF model, payload {row['payload']['mass_kg']} kg;"
                 f" RMSE (tail) max {row['rmse_max_rad']:.4f} rad", fontsize=9)
    fig.tight_layout()
    save_plot(fig, out_dir, f"arm_{row['arm']}.png", files)


def plot_summary(rows: list, out_dir: str, files: list) -> None:
    """One bar per arm: the worst joint's tail RMSE (log scale) against the target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ran = [r for r in rows if "rmse_max_rad" in r]
    if not ran:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(ran) + 2), 3.8))
    x = np.arange(len(ran))
    ax.bar(x, [r["rmse_max_rad"] for r in ran], color="tab:blue")
    ax.axhline(TARGETS["rmse_max_rad"], color="tab:red", ls="--", lw=1, label="target")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['arm']}\n{r['payload']['mass_kg']:g} kg" for r in ran], rotation=60, fontsize=7,
                  ha="right")
    ax.set_ylabel("worst joint's RMSE [rad]")
    ax.set_title("composite + friction from the URDF model, payload sized to each arm; tail RMSE", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, out_dir, "arms_summary.png", files)


def table(rows: list) -> str:
    """The result rows as a Markdown table (what ``docs/arms.md`` shows)."""
    out = ["| arm | DoF | effort limits [N m] | armature [kg m²] | payload [kg] | trajectory | RMSE max [rad] (joint) |"
           " saturated [ms] | watchdog |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "rmse_max_rad" not in r:
            out.append(f"| {r['arm']} | | | | | | {'refused' if 'refused' in r else 'failed'}: "
                       f"{(r.get('refused') or r.get('failed', ''))[:80]} | | |")
            continue
        j = int(np.argmax(r["rmse_rad"]))
        lim, ia = r["effort_limit"], r["armature"]
        out.append(f"| {r['arm']} | {r['dof']} | {min(lim):g}–{max(lim):g} | {min(ia):g}–{max(ia):g} |"
                   f" {r['payload']['mass_kg']:g} | ±{r['amplitude_rad']:g} rad"
                   f"{', moved centre' if r['centre_moved'] else ''} | {r['rmse_max_rad']:.4f} ({r['joints'][j]}) |"
                   f" {r['saturated_ms_max']:g} | {r['watchdog_trips']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment arms", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help=f"arms {', '.join(QUICK_ARMS)}, {QUICK_DURATION_S:g} s each"
                    f" (RMSE over the last {QUICK_TAIL_S:g} s)")
    ap.add_argument("--arms", default=None, metavar="A,B,...", help="these arms of the list only: "
                    + ", ".join(a[0] for a in ARMS))
    ap.add_argument("--duration", type=float, default=None, help=f"sim s per arm (default {DURATION_S:g})")
    ap.add_argument("--keep-bags", action="store_true", help="keep the bags in --out")
    ap.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                    help="parameter override for every arm's graph, as for launch (YAML value)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the nodes' output")
    add_graph_argument(ap)
    args = ap.parse_args(argv)
    with graph_kind(args.graph):
        return _main(args, ap)


def _main(args, ap) -> int:
    os.makedirs(args.out, exist_ok=True)
    names = [a[0] for a in ARMS]
    chosen = args.arms.split(",") if args.arms else (list(QUICK_ARMS) if args.quick else names)
    unknown = [a for a in chosen if a not in names]
    if unknown:
        ap.error(f"unknown arms {unknown}; choose from {names}")
    duration = args.duration or (QUICK_DURATION_S if args.quick else DURATION_S)
    tail = min(QUICK_TAIL_S if args.quick else TAIL_S, duration / 2)
    extra = parse_overrides(args.set)
    base = robots_dir()
    work = args.out if args.keep_bags else tempfile.mkdtemp(prefix="ad_arms_")
    rows, files = [], []
    t0 = time.monotonic()
    try:
        for label, rel, joints, ee in ARMS:
            if label not in chosen:
                continue
            row = run_arm(label, os.path.join(base, rel), joints, ee, duration, tail, work, echo=args.verbose,
                          extra=extra)
            if "_trace" in row:
                plot(row, args.out, files)
                row.pop("_trace")
            rows.append(row)
            print(f"{label:12s} " + (f"refused: {row['refused']}" if "refused" in row else
                                     f"failed: {row['failed'][:200]}" if "failed" in row else
                                     f"RMSE max {row['rmse_max_rad']:.4f} rad, saturated {row['saturated_ms_max']:.0f}"
                                     f" ms, watchdog {row['watchdog_trips']}, payload {row['payload']['mass_kg']} kg,"
                                     f" {row['wall_s']:.0f} s wall"), flush=True)
    finally:
        if not args.keep_bags:
            shutil.rmtree(work, ignore_errors=True)
    ran = [r for r in rows if "rmse_max_rad" in r]
    print(table(rows), flush=True)
    plot_summary(rows, args.out, files)
    summary = {
        "arms": rows, "duration_s": duration, "tail_s": tail, "payload_share": PAYLOAD_SHARE,
        "rmse_max_rad": max((r["rmse_max_rad"] for r in ran), default=None),
        "saturated_ms_max": max((r["saturated_ms_max"] for r in ran), default=None),
        "watchdog_trips": sum(r["watchdog_trips"] for r in ran),
        "arms_refused": sum(1 for r in rows if "refused" in r),
        "arms_failed": sum(1 for r in rows if "failed" in r),
        "targets": TARGETS, "plots": files, "wall_s": round(time.monotonic() - t0, 1),
    }
    summary["targets_met"] = bool(ran) and summary["arms_failed"] == 0 and all(
        summary[k] is not None and summary[k] <= v for k, v in TARGETS.items())
    return write_result(args.out, "arms", summary)
