"""Smith & Mistry 2020: the semi-parametric consistency transform.

``adaptive-dynamics experiment consistency --out DIR [--part virtual|online|all]
[--robots panda,iiwa14|URDF] [--quick] [--amplitude A] [--seed S] [--no-sweep] [--jobs J]``

Any other arm: ``--robots`` / ``--online-robots`` take URDF files too (``--joints``,
``--ee-frame`` as for ``demo``): the trajectories then start from the middle of its joint
ranges, the online runs use its generated parameter file (model-derived gains, friction)
-- :mod:`~adaptive_dynamics.experiments.robot_choice`.

Part ``virtual`` -- the virtual-model experiment (paper §IV-A, Table I)
-----------------------------------------------------------------------

* **Data**: seven Modified Fourier trajectories (Park 2006; 5 harmonics, period 10 s,
  first-harmonic amplitude 0.1 rad -- with Park's quintic correction each joint still
  sweeps 1-1.7 rad at up to 0.5 rad/s; seed 0) appended to each other -- they all start
  and end at rest at the same pose, so the chain is C2 -- executed once each by the
  simulated robot: the MuJoCo plant (:class:`~adaptive_dynamics.sim.MujocoPlant`,
  1 kHz, reality off: no friction, payload or noise) under computed-torque control with
  the nominal model.  Recorded per step: the state (q, qd) at the step start, the
  acceleration MuJoCo computed for the step and the applied torque.
  *Why MuJoCo and not the rigid-body model directly*: the data then comes from the
  simulated robot in closed loop (actual, not desired, states), and the torque is not
  produced by the pinocchio code whose regressor the transform uses; with reality off
  MuJoCo's dynamics equal ``Y(q, qd, qdd) pi`` to rounding (the JSON reports the
  largest ``|tau - Y pi|``, ~1e-13 N m), which is the paper's "perfect virtual model".
* **Start pose**: the middle of the joint limits for the Panda (elbow bent); for the
  iiwa the middle of the limits is the stretched-up singular pose, where the joint-1
  torque is second order in the motion, so a bent pose is used (:data:`START_POSE`).
* **Protocol**: the learner is trained on ``tau - Y (0 pi) = tau`` with every 3rd
  sample, in time order (the online setting: the IGMM sees a trajectory stream); the
  parametric model is then set to ``0.5 pi``.  Per joint, the torque RMSE over *all*
  samples of (a) the learner alone before the change, (b) parametric + learner without
  the transform, (c) parametric + learner after ``apply_parameter_update(0.5 pi)``.
* **Learners**: :class:`~adaptive_dynamics.learning.IncrementalGMM` (64 components
  max, library defaults) and :class:`~adaptive_dynamics.learning.RBFNetwork` (512
  Gaussians, width 0.5 of the input box = the training data's range + 5 %, carrying
  dW/dpi).
* **Target**: (c) <= 0.15 (b) on every joint, both learners, every robot.  JSON keys
  ``gmm_transform_ratio_max`` / ``rbfn_transform_ratio_max``: max over joints of
  (c)/(b) for the Panda (``*_all``: max over robots); ``virtual_meets_target``.
* **Robustness** (full run only, ``--no-sweep`` skips it): the same for seeds 1 and 2
  and for amplitudes 0.15 and 0.2 rad (JSON ``virtual.sensitivity``).

What limits the GMM: its transform is first order (eq. 18) around each component's
input mean, so (c) is the learner's error plus the second-order Taylor remainder of
``Y(x) dpi`` over a component's extent.  64 components over 70 s of trajectory means
~1 s of motion per component, so the ratio grows with the amplitude (roughly linearly
on the inertia-dominated joints: joint 1 of both arms, joint 7 of the iiwa), and a
batch EM fit with the same 64 components does no better (checked offline: 0.13 vs 0.15
for the IGMM at 0.25 rad) -- it is the mixture's resolution, not the incremental
learning.  The RBF network's transform is exact for what it has learnt (RLS is linear
in its targets), so its (c) is half its (a) error.

``--quick`` (the test): Panda only, plant at 500 Hz (half the samples), no sweep.

Part ``online`` -- the 4-phase closed-loop experiment (paper §IV-B)
--------------------------------------------------------------------

Over DDS with the composite adaptive controller and the ``residual_learner`` node; see
:mod:`adaptive_dynamics.experiments.consistency_online` for the protocol and metrics.
``--phases`` sets the four phase lengths (default 20,20,30,30 s of sim time; the
Modified Fourier reference has a 10 s period), ``--online-robots`` (default
panda,iiwa14), ``--learners`` (default gmm,rbfn): by default every run the README shows
(eight closed-loop runs, ~30 min here).  JSON keys ``four_phase_ratio`` (phase 3-4
position RMSE / phase 2, with the transform, of the first robot and learner; target
<= 1.5), ``four_phase_ratio_no_transform``, ``four_phase_ratio_max`` (the worst over all
robots and learners) and per run ``online.<robot>_<learner>``.  ``--quick``: Panda and
GMM only, phases 4,4,4,4 s on a 4 s trajectory period.

Outputs in ``--out``: ``consistency.json`` (printed as the LAST line of stdout), per
robot and learner ``consistency_online_<robot>_<learner>_contributions.png`` (Fig. 5: parametric vs
non-parametric torque of joint 2 and the tracking errors, with and without the
transform), ``consistency_online_<robot>_<learner>_phases.png`` (Fig. 4: per-phase RMSE), the
runs' bags (``--keep-bags``), ``consistency_virtual_<robot>.png`` (Table I as bars per joint, log scale, GMM
and RBFN) and ``consistency_virtual_traces_<robot>.png`` (joint 1 and 2 torque over the
first trajectory: measured, parametric + learner without and with the transform).
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

from adaptive_dynamics.control.baseline import ComputedTorqueController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.evaluation.metrics import rmse
from adaptive_dynamics.learning import IncrementalGMM, RBFNetwork
from adaptive_dynamics.sim.plant import MujocoPlant
from adaptive_dynamics.trajectories import ModifiedFourier
from . import consistency_online as co, save_plot, write_result
from . import add_graph_argument
from ..launcher import graph_kind
from .robot_choice import add_robot_args, chosen_robots, is_shipped, label

TARGET_RATIO = 0.15
#: start (and end) pose of the trajectories; default the middle of the joint limits
START_POSE = {"iiwa14": [0.0, 0.6, 0.0, -1.2, 0.0, 0.9, 0.0]}
N_TRAJ = 7
PERIOD = 10.0
AMPLITUDE = 0.1
HARMONICS = 5
TRAIN_EVERY = 3
KP, KD = 400.0, 40.0
#: the geometry and novelty of the mixture these tables were made with (first batch; the
#: beta level at the size cap: IncrementalGMM.LEGACY_CONFIG)
GMM_CONFIG = {"max_components": 64, "warmup": 0, "full_novelty": None}
#: ARDL's plain network: Gaussians only, raw targets (the learner's default adds a bias
#: feature and standardises the targets)
RBFN_CONFIG = {"n_basis": 512, "width": 0.5, "reg": 1e-3, "bias": False, "standardize": False}
BOX_MARGIN = 0.05


def _threads1() -> None:
    """One BLAS thread: the learners' linear algebra is small and a loaded 2-core VM
    makes threaded OpenBLAS orders of magnitude slower (thread thrashing)."""
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except Exception:  # pragma: no cover - threadpoolctl missing
        pass


def simulate(robot: str, *, dt: float, period: float, amplitude: float, seed: int) -> dict:
    """Run the seven trajectories on the MuJoCo plant; arrays (T, n)."""

    model = RobotModel(robot)
    n = model.n
    q0 = np.asarray(START_POSE.get(robot, 0.5 * (model.lower + model.upper)), dtype=float)
    plant = MujocoPlant(robot, timestep=dt, q0=q0)
    ctl = ComputedTorqueController(model, kp=KP, kd=KD)
    rng = np.random.default_rng(seed)
    trajs = [ModifiedFourier.random(n, rng, q_center=q0, amplitude=amplitude, w_f=2 * math.pi / period,
                                    L=HARMONICS, lower=model.lower, upper=model.upper,
                                    vel_limit=model.velocity_limit) for _ in range(N_TRAJ)]
    steps = int(round(period / dt))
    T = N_TRAJ * steps
    Q, V, A, TAU, QD = (np.empty((T, n)) for _ in range(5))
    plant.reset(q0, np.zeros(n))
    k = 0
    for tr in trajs:
        qd, vd, ad = tr.sample_many(np.arange(steps) * dt)
        for s in range(steps):
            q, v = plant.true_state()
            plant.step(ctl.compute(q, v, qd[s], vd[s], ad[s]))
            Q[k], V[k], A[k], TAU[k], QD[k] = q, v, plant.acceleration, plant.applied_torque, qd[s]
            k += 1
    return {"t": np.arange(T) * dt, "q": Q, "v": V, "a": A, "tau": TAU, "q_des": QD, "q0": q0}


def run_robot(spec: dict) -> dict:
    """Simulate, train both learners, evaluate (a), (b), (c).  Returns JSON-able results
    plus a few traces for the plots."""
    _threads1()

    robot = spec["robot"]
    t0 = time.perf_counter()
    data = simulate(robot, dt=spec["dt"], period=spec["period"], amplitude=spec["amplitude"], seed=spec["seed"])
    t_sim = time.perf_counter() - t0
    model = RobotModel(robot)
    n = model.n
    pi = model.parameters.copy()
    X = np.hstack([data["q"], data["v"], data["a"]])
    tau = data["tau"]
    Ntot = X.shape[0]

    # the perfect virtual model: tau = Y pi (checked on a subsample)
    sub = np.arange(0, Ntot, max(1, Ntot // 2000))
    rb_res = max(float(np.abs(model.inverse_dynamics(data["q"][i], data["v"][i], data["a"][i]) - tau[i]).max())
                 for i in sub)

    # parametric model at 0 pi, then 0.5 pi (tau_param(0.5 pi) = Y (0.5 pi))
    model.set_parameters(0.5 * pi)
    tau_half = np.array([model.inverse_dynamics(data["q"][i], data["v"][i], data["a"][i]) for i in range(Ntot)])
    model.set_parameters(pi)
    dpi = 0.5 * pi - 0.0 * pi

    train = np.arange(0, Ntot, TRAIN_EVERY)
    lo, hi = X[train].min(axis=0), X[train].max(axis=0)
    span = np.maximum(hi - lo, 1e-6)
    learners = {
        "gmm": IncrementalGMM(3 * n, n, **spec["gmm"]),
        "rbfn": RBFNetwork(3 * n, n, low=lo - BOX_MARGIN * span, high=hi + BOX_MARGIN * span,
                           n_params=model.n_params, **spec["rbfn"]),
    }
    out: dict[str, Any] = {"n_samples": int(Ntot), "n_train": int(train.size), "simulate_s": round(t_sim, 2),
                           "rigid_body_residual_max": rb_res, "tau_rms": _r(rmse(tau)),
                           "start_pose": _r(data["q0"], 4), "learners": {}}
    traces: dict[str, Any] = {"t": data["t"][: int(round(spec["period"] / spec["dt"]))], "tau": None}
    nt = traces["t"].size
    traces["tau"] = tau[:nt, :2]
    for name, L in learners.items():
        t1 = time.perf_counter()
        L.partial_fit(X[train], tau[train], model=model)   # target tau - Y(0 pi) = tau
        t_fit = time.perf_counter() - t1
        f_old = L.predict(X)
        t2 = time.perf_counter()
        L.apply_parameter_update(dpi, model)
        t_tr = time.perf_counter() - t2
        f_new = L.predict(X)
        e_a = rmse(f_old - tau)
        e_b = rmse(tau_half + f_old - tau)
        e_c = rmse(tau_half + f_new - tau)
        ratio = e_c / e_b
        res = {"rmse_learner_0pi": _r(e_a), "rmse_no_transform": _r(e_b), "rmse_transform": _r(e_c),
               "ratio": _r(ratio, 4), "ratio_max": round(float(ratio.max()), 4),
               "meets_target": bool(np.all(ratio <= TARGET_RATIO)),
               "fit_s": round(t_fit, 2), "fit_us_per_sample": round(1e6 * t_fit / train.size, 1),
               "transform_ms": round(1e3 * t_tr, 3), "memory_bytes": L.memory_bytes(),
               "n_updates": L.n_updates, "n_rejected": L.n_rejected}
        if name == "gmm":
            res.update(n_components=L.n_components, n_created=L.n_created, n_removed=L.n_removed,
                       n_merged=L.n_merged, min_eig_scaled=float(L.min_eigenvalues().min()))
        else:
            res.update(n_basis=L.n_basis)
        out["learners"][name] = res
        traces[name] = {"no_transform": (tau_half + f_old)[:nt, :2], "transform": (tau_half + f_new)[:nt, :2]}
    out["runtime_s"] = round(time.perf_counter() - t0, 1)
    return {"robot": robot, "result": out, "traces": traces}


def _r(a, nd: int = 5):
    return [float(f"{x:.{nd}g}") for x in np.asarray(a, dtype=float).ravel()]


# ------------------------------------------------------------------ plots
def plot_robot(robot: str, res: dict, traces: dict, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, name in zip(axes, ("gmm", "rbfn")):
        r = res["learners"][name]
        n = len(r["rmse_learner_0pi"])
        x = np.arange(1, n + 1)
        w = 0.27
        ax.bar(x - w, r["rmse_learner_0pi"], w, label="(a) learner alone, 0 pi")
        ax.bar(x, r["rmse_no_transform"], w, label="(b) 0.5 pi + learner, no transform")
        ax.bar(x + w, r["rmse_transform"], w, label="(c) 0.5 pi + learner, transform")
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xlabel("joint")
        ax.set_title(f"{robot} {name.upper()}: max (c)/(b) = {r['ratio_max']:.3f}")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("torque RMSE [N m]")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, out_dir, f"consistency_virtual_{robot}.png", files)

    fig, axes = plt.subplots(2, 2, figsize=(12, 6), sharex=True)
    t = traces["t"]
    for col, name in enumerate(("gmm", "rbfn")):
        for row in range(2):
            ax = axes[row, col]
            ax.plot(t, traces["tau"][:, row], "k", lw=1.5, label="measured tau")
            ax.plot(t, traces[name]["no_transform"][:, row], "r--", lw=1, label="0.5 pi + learner, no transform")
            ax.plot(t, traces[name]["transform"][:, row], "b", lw=1, label="0.5 pi + learner, transform")
            ax.set_ylabel(f"joint {row + 1} [N m]")
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(f"{robot} {name.upper()} (first trajectory)")
        axes[1, col].set_xlabel("t [s]")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, out_dir, f"consistency_virtual_traces_{robot}.png", files)
    return files


# ------------------------------------------------------------------ parts
#: robustness runs of the full experiment: (seed, amplitude) besides the main one
SWEEP = ((1, None), (2, None), (0, 0.15), (0, 0.2))


def run_virtual(args) -> dict:
    robots = args.robots
    spec_common = {"dt": args.dt, "period": PERIOD, "amplitude": args.amplitude, "seed": args.seed,
                   "gmm": dict(GMM_CONFIG), "rbfn": dict(RBFN_CONFIG)}
    specs = [dict(spec_common, robot=r) for r in robots]
    if args.sweep:
        specs += [dict(spec_common, robot=r, seed=seed, amplitude=amp or args.amplitude, sweep=True)
                  for r in robots for seed, amp in SWEEP
                  if (seed, amp or args.amplitude) != (args.seed, args.amplitude)]
    jobs = max(1, min(args.jobs or (os.cpu_count() or 1), len(specs)))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            outs = list(pool.map(run_robot, specs))
    else:
        outs = [run_robot(s) for s in specs]
    virtual: dict[str, Any] = {
        "setup": {"data": "MuJoCo plant, reality off, computed torque (kp=%g, kd=%g)" % (KP, KD),
                  "dt": args.dt, "trajectories": N_TRAJ, "period_s": PERIOD, "harmonics": HARMONICS,
                  "amplitude_rad": args.amplitude, "seed": args.seed, "train_every": TRAIN_EVERY,
                  "parameters": "learn at 0 pi, evaluate at 0.5 pi (delta_pi = 0.5 pi)",
                  "gmm": spec_common["gmm"], "rbfn": dict(spec_common["rbfn"], box="training range + 5 %"),
                  "target_ratio": TARGET_RATIO},
        "robots": {}, "plots": []}
    sweep = []
    for spec, o in zip(specs, outs):
        res = o["result"]
        name = label(o["robot"])
        if spec.get("sweep"):
            entry = {"robot": name, "seed": spec["seed"], "amplitude_rad": spec["amplitude"]}
            for name, lr in res["learners"].items():
                entry[f"{name}_ratio_max"] = lr["ratio_max"]
                entry[f"{name}_worst_joint"] = int(np.argmax(lr["ratio"])) + 1
            sweep.append(entry)
            continue
        if not is_shipped(o["robot"]):
            res["urdf"] = o["robot"]
        virtual["robots"][name] = res
        virtual["plots"] += [os.path.basename(f) for f in plot_robot(name, res, o["traces"], args.out)]
        _print_table(name, res)
    if sweep:
        virtual["sensitivity"] = sweep
        print("\nsensitivity (max over joints of (c)/(b)):")
        for e in sweep:
            print(f"  {e['robot']:7s} seed {e['seed']} amplitude {e['amplitude_rad']:.2f}:"
                  f" GMM {e['gmm_ratio_max']:.3f} (joint {e['gmm_worst_joint']}),"
                  f" RBFN {e['rbfn_ratio_max']:.4f}")
    ref = "panda" if "panda" in virtual["robots"] else label(robots[0])
    summary = {"virtual": virtual, "reference_robot": ref}
    for name in ("gmm", "rbfn"):
        summary[f"{name}_transform_ratio_max"] = virtual["robots"][ref]["learners"][name]["ratio_max"]
        summary[f"{name}_transform_ratio_max_all"] = max(
            v["learners"][name]["ratio_max"] for v in virtual["robots"].values())
    summary["virtual_meets_target"] = all(
        lr["meets_target"] for v in virtual["robots"].values() for lr in v["learners"].values())
    return summary


def run_online(args) -> dict:
    """The 4-phase closed-loop runs over DDS (see :mod:`.consistency_online`)."""
    traj = {"base_frequency": 0.25, "harmonics": 3} if args.quick else {}
    out: dict[str, Any] = {"online": {}}
    for robot in args.online_robots:
        for learner in args.learners:
            print(f"\nonline 4-phase run: {robot}, {learner}, phases {args.phases} s (twice: with and without"
                  f" the transform)", flush=True)
            res = co.run(robot, learner, args.phases, args.out, keep_bags=args.keep_bags or bool(args.online_run),
                         trajectory=traj, only=args.online_run)
            out["online"][f"{label(robot)}_{learner}"] = res
            if "only" not in res:
                _print_online(res)
    first = out["online"][f"{label(args.online_robots[0])}_{args.learners[0]}"]
    if any("only" in r for r in out["online"].values()):   # one run of two (--online-run): no comparison
        return out
    out["four_phase_ratio"] = first["four_phase_ratio"]
    out["four_phase_ratio_no_transform"] = first["four_phase_ratio_no_transform"]
    out["four_phase_ratio_max"] = float(np.max([r["four_phase_ratio"] for r in out["online"].values()]))  # NaN wins
    out["online_meets_target"] = all(r["meets_target"] for r in out["online"].values())
    return out


def _print_online(res: dict) -> None:
    print(f"{res['robot']} / {res['learner']}: per-phase RMSE, mean over joints")
    print(f"  {'':14s} {'position [rad]':>30s} {'velocity [rad/s]':>30s} {'torque [N m]':>30s}")
    for key in ("transform", "no_transform"):
        cells = []
        for metric in ("q_rmse", "qd_rmse", "tau_rmse"):
            cells.append(" ".join(f"{np.mean(res[key][str(k)][metric]):7.3g}" for k in range(1, 5)))
        print(f"  {key:14s} " + " ".join(f"{c:>30s}" for c in cells))
    print(f"  four_phase_ratio (phases 3-4 / phase 2, position): {res['four_phase_ratio']:.3f} with the transform,"
          f" {res['four_phase_ratio_no_transform']:.3f} without (target <= 1.5 with)")
    sys.stdout.flush()


def _print_table(robot: str, res: dict) -> None:
    print(f"\n{robot}: torque RMSE per joint [N m] (Table I)")
    for name, r in res["learners"].items():
        print(f"  {name.upper()}")
        for label, key in (("(a) learner, 0 pi", "rmse_learner_0pi"), ("(b) 0.5 pi, no transform", "rmse_no_transform"),
                           ("(c) 0.5 pi, transform", "rmse_transform"), ("(c)/(b)", "ratio")):
            print(f"    {label:26s} " + " ".join(f"{x:9.4g}" for x in r[key]))
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment consistency",
                                 description="Smith & Mistry 2020: consistency transform -- virtual-model table "
                                             "(Table I) and the online 4-phase run")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--part", choices=("virtual", "online", "all"), default="all",
                    help="which part to run (default all)")
    ap.add_argument("--phases", default=None,
                    help="online: the four phase lengths in sim seconds (default 20,20,30,30; --quick 4,4,4,4)")
    ap.add_argument("--online-robots", default=None,
                    help="online: comma-separated robots or URDF files (default panda,iiwa14; --quick: panda)")
    ap.add_argument("--learners", default=None, help="online: comma-separated learners, gmm and/or rbfn"
                    " (default gmm,rbfn; --quick: gmm)")
    ap.add_argument("--keep-bags", action="store_true", help="online: keep the runs' bags in --out")
    ap.add_argument("--online-run", choices=["transform", "no_transform"], default=None,
                    help="online: run this one of the two runs, its bag kept in --out; the other is read back"
                         " from --out if an earlier invocation left it there (then everything is compared), else"
                         " left out (the JSON has this run's figures alone)")
    add_robot_args(ap, None, extra_help="; default panda,iiwa14, --quick: panda")
    ap.add_argument("--quick", action="store_true",
                    help="short version for tests: Panda only, plant at 500 Hz (half the samples)")
    ap.add_argument("--amplitude", type=float, default=AMPLITUDE,
                    help=f"first-harmonic amplitude of the trajectories [rad] (default {AMPLITUDE})")
    ap.add_argument("--seed", type=int, default=0, help="trajectory seed (default 0)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel robot processes (default: CPU count)")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false",
                    help="skip the robustness runs (seeds 1, 2 and amplitudes 0.15, 0.2 rad; never with --quick)")
    add_graph_argument(ap)
    args = ap.parse_args(argv)
    with graph_kind(args.graph):
        return _main(args, ap)


def _main(args, ap) -> int:
    args.robots = args.robots or ("panda" if args.quick else "panda,iiwa14")
    robots = chosen_robots(args)
    if not args.amplitude > 0:
        ap.error("--amplitude must be > 0")
    args.robots = robots
    try:
        args.phases = [float(x) for x in (args.phases or ("4,4,4,4" if args.quick else "20,20,30,30")).split(",")]
    except ValueError:
        ap.error("--phases takes four numbers, e.g. 20,20,30,30")
    if len(args.phases) != 4 or min(args.phases) <= 0:
        ap.error("--phases takes four positive numbers")
    args.online_robots = chosen_robots(argparse.Namespace(
        robots=args.online_robots or ("panda" if args.quick else "panda,iiwa14"), joints=args.joints,
        ee_frame=args.ee_frame))
    args.learners = [x.strip() for x in (args.learners or ("gmm" if args.quick else "gmm,rbfn")).split(",")
                     if x.strip()]
    for x in args.learners:
        if x not in ("gmm", "rbfn"):
            ap.error(f"unknown learner {x!r}; choose gmm or rbfn")
    args.dt = 2e-3 if args.quick else 1e-3
    args.sweep = args.sweep and not args.quick
    os.makedirs(args.out, exist_ok=True)
    _threads1()

    t0 = time.perf_counter()
    summary: dict[str, Any] = {"experiment": "consistency", "part": args.part, "quick": bool(args.quick)}
    if args.part in ("virtual", "all"):
        summary.update(run_virtual(args))
    if args.part in ("online", "all"):
        summary.update(run_online(args))
    summary["runtime_s"] = round(time.perf_counter() - t0, 1)
    return write_result(args.out, "consistency", summary)


if __name__ == "__main__":
    sys.exit(main())
