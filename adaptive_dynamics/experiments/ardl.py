"""ARDL §4.1 reproduction: PD, computed torque, direct and composite adaptive control.

``adaptive-dynamics experiment ardl --out DIR [--robots panda,iiwa14|URDF] [--quick]
[--duration-scale S] [--jobs J]``

Set-up (Smith & Mistry 2021, §4.1, with Panda and KUKA iiwa 14 in MuJoCo):

* **Lockstep, in-process**: the MuJoCo plant (:class:`~adaptive_dynamics.sim.MujocoPlant`,
  1 kHz, ``implicitfast``) and the controller core are stepped in one Python loop --
  deterministic and fast.  (The DDS graph runs the same core inside the
  ``adaptive_controller`` node.)
* **Reference**: a Modified Fourier trajectory (Park 2006; 5 harmonics, period 8 s so
  every phase holds whole periods, amplitude up to 0.6 rad, 60 % of the velocity limits,
  seed 0), starting at rest where the plant starts: the middle of the joint ranges for
  the Panda; for the iiwa, whose range middle is the stretched-up pose (no gravity
  load, near-singular), the bent pose ``[0, 0.6, 0, -1.2, 0, 0.6, 0]``.
* **Reality**: a 1 kg payload (solid sphere, r = 2 cm, 5 cm beyond the end-effector
  frame) and joint friction (viscous + smooth Coulomb, ``adaptive_dynamics.robots.friction``);
  the controllers' models never see either.  A second, **friction-free and payload-free**
  reality is used for the parameter-convergence curves (there the true base parameters
  ``theta = K pi_URDF`` exist and convergence is provable under persistent excitation).
* **Nominal models**: ``zero`` -- pi_hat(0) = 0, as in ARDL (the adaptive controllers
  start as pure feedback); ``wrong50`` -- every link's 10 inertial parameters scaled by
  1.5 (odd links) or 0.5 (even links), i.e. 50 % wrong yet physically consistent, no
  friction.  Computed torque uses the nominal model as is (with ``zero`` it would
  command zero torque, so it is run with ``wrong50`` only).
* **Phases**: feedback only 0-16 s (learning off), learning 16-96 s, learning off
  96-112 s (times multiplied by ``--duration-scale``).
* **Controllers** share the feedback: Lambda and K_D below; PD is exactly the adaptive
  law's feedback ``-K_D s`` (``K_p = K_D Lambda``, ``K_d = K_D``, no gravity
  compensation); computed torque uses ``K_p = Lambda^2``, ``K_d = 2 Lambda`` (double pole
  at ``-Lambda``, the sliding surface's pole).  The adaptive controllers adapt the base
  parameters plus viscous and Coulomb friction columns (``coulomb_smoothing`` = the
  plant's 0.01 rad/s) in the payload+friction case, the inertial base parameters only
  in the friction-free case.

Gains (per robot, :data:`GAINS`) and why:

* ``lam`` = 10 1/s: the sliding-surface bandwidth; the reference has 0.125-0.6 Hz content,
  so qd_r follows it with little lag, and 10 1/s keeps ``K_D Lambda`` moderate.
* ``kd``: per joint, roughly proportional to the joint's inertia so that the proximal
  joints get stiffness ``K_D Lambda`` of a few hundred N m/rad while the small wrist
  motors (Panda 12 N m) stay far from saturation; PD alone then has errors of a few
  centi-radians (gravity sag + payload), a fair but beatable baseline.
* ``gamma`` = 1 (direct): Gamma = gamma * diag(scale_i^2) with scale_i the size of base
  parameter i in the 50 %-wrong nominal (:func:`direct_gamma`).  An isotropic Gamma let
  the iiwa's joint-7 inertia (0.001 kg m^2) wander to 75x its value and the sampled
  loop diverge (M_hat Lambda e_dot is velocity feedback); gamma = 10 still diverges on
  the iiwa, gamma = 1 tracks and keeps every run unsaturated or nearly so.
* composite: ``p0`` = 1, ``r`` = 10, ``lambda0`` = 0.5 1/s, ``k0`` = 200, ``k1`` = 100,
  ``filter_lambda`` = 20 rad/s.  ``p0`` sets the initial speed of both terms; ``r``
  weighs the torque prediction error against s (and scales the information W^T R W);
  the forgetting ``lambda0`` (a memory of ~2 s) keeps P from collapsing so the estimate
  keeps converging through the whole learning phase, and ``k1`` bounds P (forgetting
  stops above it: no gain blow-up in unexcited directions).  Tuned on the quick run:
  with ``r`` = 1, ``lambda0`` = 0.2 the Panda's parameter error after 20 s of learning
  was 11 %, with ``r`` = 10, ``lambda0`` = 0.5 it is 0.7 %.  ``filter_lambda``: well
  above the reference content, far below the 1 kHz rate.
* ``kd`` upper bounds come from the sampled loop: ``dt K_D / M_jj`` must stay well
  below 2 (iiwa joint 7: M_77 = 0.001 kg m^2, hence K_D = 0.2).

Any other arm: ``--robots path/to/arm.urdf`` (``--joints``, ``--ee-frame`` as for ``demo``)
runs with its model-derived ``lam``/``kd`` (:mod:`~adaptive_dynamics.control.gains`), the
other settings of :data:`GENERATED`, the reference around the middle of its joint ranges
and the friction of its parameter file (:mod:`~adaptive_dynamics.experiments.robot_choice`).

Computed torque with the 50 %-wrong model and no friction/payload knowledge is *worse*
than PD here (its feedback is scaled by the wrong M_hat); that is the point of adapting.

Outputs in ``--out``: ``ardl.json`` (printed as the LAST line of stdout), and PNG plots
per robot: ``<robot>_tracking_error.png`` (|e| of every controller, phases shaded),
``<robot>_torques.png`` (feed-forward Y theta_hat vs feedback -K_D s, direct and
composite, as ARDL Fig. 2b/3b), ``<robot>_parameter_error.png`` (friction-free case,
``|theta_hat - theta| / |theta|`` for direct and composite).

JSON: per robot and run the per-joint position [rad] and velocity [rad/s] RMSE per
phase; ``composite_vs_pd_rmse_ratio`` = mean over joints of (last-phase position RMSE
of composite, pi_hat(0) = 0) / (same joint's PD RMSE); ``base_param_rel_error`` =
final ``|theta_hat - theta| / |theta|`` of the composite law in the friction-free
case.  Top-level copies are the Panda's; targets: ratio <= 0.2, error < 0.05.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from ..control.adaptive import AdaptiveController
from ..control.baseline import ComputedTorqueController, PDController
from ..dynamics import RobotModel
from ..evaluation.metrics import phase_rmse
from ..robots import friction
from ..sim.plant import MujocoPlant, RealityConfig, SimulationDiverged
from ..trajectories import ModifiedFourier
from . import save_plot, write_result
from .robot_choice import add_robot_args, chosen_robots, gains, is_shipped, label

TARGETS = {"composite_vs_pd_rmse_ratio": 0.2, "base_param_rel_error": 0.05}
PHASES = (("feedback", 0.0, 16.0), ("learning", 16.0, 96.0), ("off", 96.0, 112.0))
PERIOD = 8.0
DT = 1e-3
COULOMB_EPS = 0.01
PAYLOAD = {"payload_mass": 1.0, "payload_com": (0.0, 0.0, 0.05), "payload_enabled": True}

#: per robot: shared feedback (lam, kd), direct (gamma), composite (p0, r, forgetting)
GAINS: dict[str, dict[str, Any]] = {
    "panda": {
        "lam": 10.0,
        "kd": [30.0, 30.0, 20.0, 20.0, 4.0, 4.0, 1.0],
        "gamma": 1.0,
        "p0": 1.0, "r": 10.0, "filter_lambda": 20.0, "lambda0": 0.5, "k0": 200.0, "k1": 100.0,
        "amplitude": 0.6, "vel_fraction": 0.6,
    },
    "iiwa14": {
        "lam": 10.0,
        "kd": [30.0, 30.0, 10.0, 30.0, 2.0, 2.0, 0.2],
        "gamma": 1.0,
        "p0": 1.0, "r": 10.0, "filter_lambda": 20.0, "lambda0": 0.5, "k0": 200.0, "k1": 100.0,
        "amplitude": 0.6, "vel_fraction": 0.6, "q_center": [0.0, 0.6, 0.0, -1.2, 0.0, 0.6, 0.0],
    },
    "planar2": {
        "lam": 10.0, "kd": [10.0, 5.0], "gamma": 1.0,
        "p0": 1.0, "r": 1.0, "filter_lambda": 20.0, "lambda0": 0.2, "k0": 200.0, "k1": 100.0,
        "amplitude": 0.6, "vel_fraction": 0.6,
    },
}

ADAPTIVE_KEYS = ("lam", "kd", "gamma", "p0", "r", "filter_lambda", "lambda0", "k0", "k1")
#: a URDF robot's settings besides its model-derived lam, kd (the shipped robots' values)
GENERATED = {"gamma": 1.0, "p0": 1.0, "r": 10.0, "filter_lambda": 20.0, "lambda0": 0.5, "k0": 200.0, "k1": 100.0,
             "amplitude": 0.6, "vel_fraction": 0.6}


def robot_gains(robot: str) -> dict:
    """:data:`GAINS` of a shipped robot; for a URDF robot its model-derived ``lam``/``kd``
    (:mod:`~adaptive_dynamics.experiments.robot_choice`) with :data:`GENERATED`, the
    reference around the middle of the joint ranges."""
    if robot in GAINS:
        return GAINS[robot]
    g = gains(robot)
    return {**GENERATED, "lam": float(g["lam"][0]), "kd": g["kd"]}


# ----------------------------------------------------------------------------- set-up
def phases(scale: float) -> list[tuple[str, float, float]]:
    return [(name, t0 * scale, t1 * scale) for name, t0, t1 in PHASES]


def reference(robot: str, scale: float, gains: dict):
    """The Modified Fourier reference (deterministic, seed 0) and its period."""

    m = RobotModel(robot)
    period = max(2.0, min(PERIOD, 16.0 * scale))  # the feedback phase holds >= 1 whole period
    lo, up = m.lower, m.upper
    qc = np.asarray(gains["q_center"], float) if gains.get("q_center") is not None else 0.5 * (lo + up)
    traj = ModifiedFourier.random(
        m.n, np.random.default_rng(0), q_center=qc, amplitude=gains["amplitude"],
        w_f=2 * math.pi / period, L=5, lower=lo, upper=up,
        vel_limit=gains["vel_fraction"] * m.velocity_limit, acc_limit=None, margin=0.1)
    return traj, period


def wrong_nominal(model) -> np.ndarray:
    """Link blocks scaled by 1.5 (odd links, 1-based) / 0.5 (even links); no friction."""
    pi = model.parameters[: model.n_inertial].copy()   # the URDF's links, end effector included
    for i in range(model.n):
        pi[10 * i: 10 * i + 10] *= 1.5 if i % 2 == 0 else 0.5
    return pi


def direct_gamma(ctl, model, g: dict) -> np.ndarray:
    """Per-parameter Gamma of the direct law: ``gamma * scale_i^2``.

    ``scale_i`` is the magnitude of base parameter i in the (50 %-wrong) nominal model
    (floored at ``gamma_floor`` times the largest one; friction entries: 1), i.e. a
    rough prior of each parameter's size.  With an isotropic Gamma the Lyapunov bound
    ``|theta_tilde|_Gamma^-1 <= const`` is dominated by the link masses and lets a tiny
    wrist inertia (iiwa joint 7: 0.001 kg m^2) wander to 100x its value; the
    feed-forward ``M_hat Lambda e_dot`` is velocity feedback, and the sampled loop
    (1 kHz) goes unstable once ``dt (K_D + M_hat_jj Lambda) / M_jj`` exceeds ~2.
    Scaling Gamma by the parameter sizes bounds every parameter relative to its own
    size instead.  (The composite law needs none of this: P normalises itself.)
    """
    pi_nom = wrong_nominal(model)  # model.link_parameters: the URDF's (the estimate lives in ctl)
    full = np.concatenate([pi_nom, np.zeros(model.n_params - pi_nom.size)])
    # friction entries: unknown to the nominal, O(1) N m (s/rad)
    return g["gamma"] * ctl.nominal_gamma_scale(full, g.get("gamma_floor", 1e-2))


def reality(robot: str, case: str):

    if case == "ideal":
        return RealityConfig()
    fv, fc = friction(robot)
    return RealityConfig(friction_viscous=fv, friction_coulomb=fc, coulomb_smoothing=COULOMB_EPS, **PAYLOAD)


# ----------------------------------------------------------------------------- one run
def simulate(spec: dict) -> dict:
    """One closed-loop run.  ``spec``: robot, case ("reality" | "ideal"), controller
    ("pd" | "computed_torque" | "direct" | "composite"), nominal ("zero" | "wrong50"),
    scale, gains.  Returns arrays for the metrics and plots."""

    robot, case, ctl_name, nominal = spec["robot"], spec["case"], spec["controller"], spec["nominal"]
    scale, g = spec["scale"], spec["gains"]
    traj, period = reference(robot, scale, g)
    ph = phases(scale)
    t_end = ph[-1][2]
    learn0, learn1 = ph[1][1], ph[1][2]
    N = int(round(t_end / DT))
    ts = np.arange(N) * DT
    Q, V, A = traj.sample_many(ts)

    plant = MujocoPlant(robot, reality=reality(robot, case), timestep=DT, q0=Q[0])
    base_model = RobotModel(robot)
    n = base_model.n
    kd = np.broadcast_to(np.asarray(g["kd"], float), (n,)).copy()
    lam = float(g["lam"])
    pi_nom = np.zeros(base_model.n_params) if nominal == "zero" else wrong_nominal(base_model)

    ctl = None
    if ctl_name == "pd":
        ctl = PDController(base_model, kp=kd * lam, kd=kd)
        compute = ctl.compute
    elif ctl_name == "computed_torque":
        base_model.set_parameters(pi_nom)
        ctl = ComputedTorqueController(base_model, kp=lam * lam, kd=2 * lam)
        compute = ctl.compute
    else:
        friction = case != "ideal"
        model = RobotModel(robot, friction=friction, coulomb_smoothing=COULOMB_EPS)
        pi0 = np.concatenate([pi_nom, np.zeros(model.n_params - pi_nom.size)])
        gains = {k: g[k] for k in ADAPTIVE_KEYS}
        ctl = AdaptiveController(model, ctl_name, dt=DT, pi0=pi0, **gains)
        if ctl_name == "direct":
            ctl.set_gains(gamma=direct_gamma(ctl, model, g))

    theta_true = None
    if case == "ideal" and ctl_name in ("direct", "composite"):
        theta_true = ctl.base.to_base(RobotModel(robot).parameters)
    dec = int(spec.get("log_every", 10))
    E = np.empty((N, n))
    ED = np.empty((N, n))
    FF = np.zeros((N // dec + 1, n))
    FB = np.zeros((N // dec + 1, n))
    perr_t, perr = [], []
    diverged = None
    t0 = time.perf_counter()
    adaptive = ctl_name in ("direct", "composite")
    for k in range(N):
        _, q, v, tau_m = plant.state()
        if adaptive:
            tau = ctl.compute(q, v, Q[k], V[k], A[k], tau_m, learn=learn0 <= ts[k] < learn1)
        else:
            tau = compute(q, v, Q[k], V[k], A[k])
        E[k] = Q[k] - q
        ED[k] = V[k] - v
        if k % dec == 0:
            j = k // dec
            if adaptive:
                FF[j] = ctl.parametric_torque
                FB[j] = ctl.feedback_torque
            else:
                FF[j] = tau
            if theta_true is not None and k % (10 * dec) == 0:
                perr_t.append(ts[k])
                perr.append(float(np.linalg.norm(ctl.theta_base - theta_true) / np.linalg.norm(theta_true)))
        try:
            plant.step(tau)
        except SimulationDiverged as exc:
            diverged = f"t={ts[k]:.3f} s: {exc}"
            E[k + 1:] = np.nan
            ED[k + 1:] = np.nan
            break
    wall = time.perf_counter() - t0
    out = {"spec": {k: v for k, v in spec.items() if k != "gains"}, "E": E, "ED": ED, "FF": FF, "FB": FB,
           "dec": dec, "wall_s": wall, "steps": N, "diverged": diverged,
           "saturation": plant.saturation_count.tolist()}
    if theta_true is not None:
        out["perr_t"] = np.array(perr_t)
        out["perr"] = np.array(perr)
        out["param_rel_error"] = float(np.linalg.norm(ctl.theta_base - theta_true) / np.linalg.norm(theta_true))
    if adaptive:
        out["p_norm"] = ctl.p_norm
        out["updates"] = ctl.updates
    return out


# ----------------------------------------------------------------------------- metrics, plots
def phase_table(res: dict, scale: float) -> dict:

    ts = np.arange(res["steps"]) * DT
    win = {name: (t0, t1) for name, t0, t1 in phases(scale)}
    pos = phase_rmse(ts, res["E"], win)
    vel = phase_rmse(ts, res["ED"], win)
    return {name: {"position": _r(pos[name]), "velocity": _r(vel[name])} for name in win}


def _r(a, nd=6):
    a = np.asarray(a, dtype=float)
    return [None if not math.isfinite(x) else round(float(x), nd) for x in a.reshape(-1)]


def _shade(ax, scale):
    for name, t0, t1 in phases(scale):
        if name != "learning":
            ax.axvspan(t0, t1, color="0.9", zorder=0)


def plot_robot(robot: str, runs: dict, scale: float, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    # tracking error norm
    fig, ax = plt.subplots(figsize=(9, 4))
    for key, res in runs.items():
        if res["spec"]["case"] != "reality":
            continue
        E = res["E"]
        ts = np.arange(len(E)) * DT
        en = np.linalg.norm(E, axis=1)
        step = 20
        ax.semilogy(ts[::step], np.maximum(en[::step], 1e-7), lw=0.8, label=key)
    _shade(ax, scale)
    ax.set_xlabel("t [s]")
    ax.set_ylabel("|q_d - q| [rad]")
    ax.set_title(f"{robot}: tracking error (grey: learning off)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_plot(fig, out_dir, f"{robot}_tracking_error.png", files)

    # feed-forward vs feedback torques (ARDL Fig. 2b / 3b), joints 1 and 2
    keys = [k for k in ("direct/zero", "composite/zero") if k in runs]
    if keys:
        fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.2 * len(keys)), squeeze=False)
        for r, key in enumerate(keys):
            res = runs[key]
            tt = np.arange(len(res["FF"])) * DT * res["dec"]
            for c, j in enumerate((0, 1)):
                ax = axes[r, c]
                ax.plot(tt, res["FF"][:, j], lw=0.6, label="feed-forward Y theta_hat")
                ax.plot(tt, res["FB"][:, j], lw=0.6, label="feedback -K_D s")
                _shade(ax, scale)
                ax.set_title(f"{robot} {key}: joint {j + 1}")
                ax.set_xlabel("t [s]")
                ax.set_ylabel("torque [N m]")
                ax.legend(fontsize=7)
        fig.tight_layout()
        save_plot(fig, out_dir, f"{robot}_torques.png", files)

    # parameter error (friction-free)
    ideal = {k: v for k, v in runs.items() if "perr" in v}
    if ideal:
        fig, ax = plt.subplots(figsize=(8, 4))
        for key, res in ideal.items():
            ax.semilogy(res["perr_t"], res["perr"], label=key)
        _shade(ax, scale)
        ax.axhline(TARGETS["base_param_rel_error"], color="k", ls=":", lw=0.8, label="5 %")
        ax.set_xlabel("t [s]")
        ax.set_ylabel("|theta_hat - theta| / |theta|")
        ax.set_title(f"{robot}: base-parameter error, friction- and payload-free")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_plot(fig, out_dir, f"{robot}_parameter_error.png", files)
    return files


# ----------------------------------------------------------------------------- driver
def run_specs(robot: str, quick: bool) -> list[tuple[str, str, str]]:
    """(case, controller, nominal) triples."""
    if quick:
        return [("reality", "pd", "zero"), ("reality", "composite", "zero"), ("ideal", "composite", "zero")]
    return [("reality", "pd", "zero"), ("reality", "computed_torque", "wrong50"),
            ("reality", "direct", "zero"), ("reality", "direct", "wrong50"),
            ("reality", "composite", "zero"), ("reality", "composite", "wrong50"),
            ("ideal", "direct", "zero"), ("ideal", "composite", "zero")]


def run_key(case: str, controller: str, nominal: str) -> str:
    key = controller if controller == "pd" else f"{controller}/{nominal}"
    return key if case == "reality" else f"ideal:{key}"


def summarise(robot: str, runs: dict, scale: float) -> dict:
    table, sat, wall = {}, {}, 0.0
    for key, res in runs.items():
        table[key] = phase_table(res, scale)
        sat[key] = res["saturation"]
        wall += res["wall_s"]
    out: dict[str, Any] = {"rmse": table, "saturation_count": sat,
                           "diverged": {k: r["diverged"] for k, r in runs.items() if r["diverged"]},
                           "sim_wall_s": round(wall, 1), "steps_per_run": next(iter(runs.values()))["steps"]}
    last = PHASES[-1][0]

    def ratio(key):
        if key not in table or "pd" not in table:
            return None
        a = np.array(table[key][last]["position"], dtype=float)
        b = np.array(table["pd"][last]["position"], dtype=float)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            return None
        return round(float(np.mean(a / b)), 5)

    out["composite_vs_pd_rmse_ratio"] = ratio("composite/zero")
    out["ratios_vs_pd"] = {k: ratio(k) for k in table if k != "pd" and not k.startswith("ideal:")}
    out["mean_position_rmse"] = {k: {ph: round(float(np.mean(np.array(v[ph]["position"], float))), 6)
                                     for ph in v} for k, v in table.items()}
    for key, res in runs.items():
        if "param_rel_error" in res:
            out.setdefault("param_rel_error", {})[key] = round(res["param_rel_error"], 6)
    pe = out.get("param_rel_error", {})
    out["base_param_rel_error"] = pe.get("ideal:composite/zero")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment ardl",
                                 description="ARDL §4.1: PD / computed torque / direct / composite adaptive "
                                             "control in MuJoCo (lockstep, in-process)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    add_robot_args(ap, None, extra_help="; default panda,iiwa14, --quick: panda")
    ap.add_argument("--quick", action="store_true",
                    help="short version for tests: duration scale 0.25, PD + composite only")
    ap.add_argument("--duration-scale", type=float, default=None,
                    help="multiply every phase time (default 1; --quick 0.25)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel simulation processes (default: CPU count, max 4)")
    args = ap.parse_args(argv)

    args.robots = args.robots or ("panda" if args.quick else "panda,iiwa14")
    robots = chosen_robots(args, allowed=GAINS)
    scale = args.duration_scale if args.duration_scale is not None else (0.25 if args.quick else 1.0)
    if not scale > 0:
        ap.error("--duration-scale must be > 0")
    os.makedirs(args.out, exist_ok=True)
    jobs = args.jobs or min(4, os.cpu_count() or 1)

    t_start = time.perf_counter()
    specs = []
    for r in robots:
        for case, ctl, nom in run_specs(r, args.quick):
            specs.append({"robot": r, "case": case, "controller": ctl, "nominal": nom, "scale": scale,
                          "gains": robot_gains(r)})
    # longest runs first (adaptive > baselines) for a better schedule
    order = sorted(range(len(specs)), key=lambda i: specs[i]["controller"] in ("pd", "computed_torque"))
    results: list[Any] = [None] * len(specs)
    if jobs > 1 and len(specs) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futs = {i: pool.submit(simulate, specs[i]) for i in order}
            for i, f in futs.items():
                results[i] = f.result()
    else:
        for i in order:
            results[i] = simulate(specs[i])

    summary: dict[str, Any] = {"experiment": "ardl", "quick": bool(args.quick), "duration_scale": scale,
                               "dt": DT, "phases": {n: [a, b] for n, a, b in phases(scale)},
                               "targets": TARGETS, "robots": {}, "plots": []}
    for r in robots:
        runs = {run_key(s["case"], s["controller"], s["nominal"]): res
                for s, res in zip(specs, results) if s["robot"] == r}
        rs = summarise(r, runs, scale)
        rs["gains"] = {k: robot_gains(r)[k] for k in ADAPTIVE_KEYS}
        rs["meets_targets"] = bool(
            rs["composite_vs_pd_rmse_ratio"] is not None and rs["base_param_rel_error"] is not None
            and rs["composite_vs_pd_rmse_ratio"] <= TARGETS["composite_vs_pd_rmse_ratio"]
            and rs["base_param_rel_error"] < TARGETS["base_param_rel_error"])
        name = label(r)
        if not is_shipped(r):
            rs["urdf"] = r
        summary["robots"][name] = rs
        summary["plots"] += [os.path.basename(f) for f in plot_robot(name, runs, scale, args.out)]
        _print_table(name, rs)
    ref = "panda" if "panda" in summary["robots"] else label(robots[0])
    summary["composite_vs_pd_rmse_ratio"] = summary["robots"][ref]["composite_vs_pd_rmse_ratio"]
    summary["base_param_rel_error"] = summary["robots"][ref]["base_param_rel_error"]
    summary["reference_robot"] = ref
    summary["meets_targets"] = all(v["meets_targets"] for v in summary["robots"].values())
    summary["runtime_s"] = round(time.perf_counter() - t_start, 1)
    return write_result(args.out, "ardl", summary)


def _print_table(robot: str, rs: dict) -> None:
    print(f"\n{robot}: mean position RMSE over joints [rad] per phase")
    print(f"  {'run':28s} {'feedback':>10s} {'learning':>10s} {'off':>10s}")
    for k, v in rs["mean_position_rmse"].items():
        print(f"  {k:28s} " + " ".join(f"{v[p]:10.5f}" for p, _, _ in PHASES))
    print(f"  composite/PD last-phase ratio {rs['composite_vs_pd_rmse_ratio']}, "
          f"base-parameter error {rs['base_param_rel_error']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
