"""A realistic proxy for real-robot torque recordings: identification and residual
learners with their defaults, evaluated on held-out data.

``adaptive-dynamics experiment realdata --out DIR [--quick] [--seconds S] [--learners gmm,rbfn,gp]
[--robot panda|URDF]``

Real recordings are not shipped, so the MuJoCo Panda is made to look like one
(:data:`REALITY`): Stribeck-like sigmoid joint friction (viscous + Coulomb with a
0.05 rad/s ``tanh`` + a break-away term), a torque-sensor bias per joint (offsets) and
noise, velocity and position noise, no measured acceleration, stamps at 1 kHz with
timing jitter, and an end effector 0.5 kg heavier than the URDF's hand.  An excitation
run (Modified Fourier around the middle of the joint range, tracked by a PD controller
on the URDF's gravity) is recorded; the first half identifies, the second half is held
out:

* ``nominal``: the URDF's model (no friction);
* ``id``: least squares on the base parameters + viscous/Coulomb friction + offsets
  (:func:`~adaptive_dynamics.dynamics.identification.identify`, the recording cut into
  segments, filtered forward-backward at 20 Hz, q̈ from the filtered velocity, as
  ``adaptive-dynamics identify`` does);
* ``id_consistent``: the physically consistent identification (SDP);
* ``id + <learner>``: each residual learner with its **defaults**
  (``make_learner(kind, input_dim=3n, output_dim=n)``) trained on the identification
  half's residual ``tau - Y theta`` (the identified model without its offsets, as the
  controller runs it) at 100 Hz, in time order, then predicting the held-out half.

Another arm (``--robot path/to/arm.urdf``, :mod:`~adaptive_dynamics.experiments.robot_choice`)
gets the same departures scaled to it: its parameter file's friction, the Panda's sensor
bias as fractions of its effort limits, its model-derived PD gains.

JSON (``realdata.json``, printed last): per-joint held-out nMSE ``nominal_nmse``,
``id_nmse``, ``id_consistent_nmse``, ``semiparam_nmse`` (per learner), and
``semiparam_vs_id_max``: the best learner's largest ratio over the joints of its nMSE
to the identification's (target <= 0.5 with default settings), with the learner named.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from . import save_plot, write_result
from .robot_choice import add_robot_args, chosen_robots, is_shipped, label

#: the simulated robot's departures from the URDF (see the module docstring)
REALITY = {"coulomb_scale": 1.5, "coulomb_smoothing": 0.05, "stribeck_ratio": 0.5, "stribeck_velocity": 0.05,
           "tau_bias": [0.4, -0.6, 0.3, 0.5, -0.15, 0.1, 0.08], "noise_std_tau": 0.05, "noise_std_v": 0.003,
           "noise_std_q": 2e-5, "ee_extra_mass": 0.5, "ee_extra_com": [0.0, 0.0, 0.03], "stamp_jitter_s": 5e-5}
EXCITATION = {"amplitude": 0.4, "base_frequency": 0.1, "harmonics": 4}
LEARN_RATE_HZ = 100.0
LEARNERS = ("gmm", "rbfn", "gp")
TARGET = 0.5


def torque_bias(robot: str, effort_limit) -> list:
    """The sensor bias of :data:`REALITY` (the Panda's); another arm gets the same fractions
    of its effort limits, the Panda's seven cycled over its joints."""
    if robot == "panda":
        return list(REALITY["tau_bias"])
    from ..dynamics import RobotModel
    frac = np.asarray(REALITY["tau_bias"]) / RobotModel("panda").effort_limit
    lim = np.asarray(effort_limit, dtype=float)
    return [round(float(frac[j % frac.size] * lim[j]), 4) for j in range(lim.size)]


def record(seconds: float, seed: int = 0, robot: str = "panda") -> dict:
    """The excitation run: ``t`` (jittered stamps [s]), ``q``, ``qd``, ``tau`` (measured)."""
    from ..control import AdaptiveController
    from ..dynamics import RobotModel
    from ..robots import friction
    from ..sim.plant import MujocoPlant, RealityConfig
    from ..trajectories import ModifiedFourier
    from .robot_choice import gains

    m = RobotModel(robot)
    fv, fc = friction(robot)
    r = REALITY
    reality = RealityConfig(friction_viscous=fv, friction_coulomb=r["coulomb_scale"] * fc,
                            coulomb_smoothing=r["coulomb_smoothing"],
                            friction_stribeck=r["stribeck_ratio"] * r["coulomb_scale"] * fc,
                            stribeck_velocity=r["stribeck_velocity"], tau_bias=torque_bias(robot, m.effort_limit),
                            noise_std_tau=r["noise_std_tau"], noise_std_v=r["noise_std_v"],
                            noise_std_q=r["noise_std_q"], payload_mass=r["ee_extra_mass"],
                            payload_com=r["ee_extra_com"], payload_enabled=True, seed=seed)
    e = EXCITATION
    traj = ModifiedFourier.random(m.n, np.random.default_rng(seed), q_center=0.5 * (m.lower + m.upper),
                                  amplitude=e["amplitude"], w_f=2 * math.pi * e["base_frequency"], L=e["harmonics"],
                                  lower=m.lower, upper=m.upper, vel_limit=0.8 * m.velocity_limit,
                                  acc_limit=np.full(m.n, 10.0), margin=0.1)
    t = np.arange(0.0, seconds, 1e-3)
    Q, V, A = traj.sample_many(t)
    plant = MujocoPlant(robot, reality=reality, q0=Q[0])
    pd = AdaptiveController(m, "direct", pi0=m.parameters.copy(), **gains(robot))   # PD + the URDF's model
    out = np.empty((t.size, 3 * m.n))
    for k in range(t.size):
        _, q, v, tm = plant.state()
        out[k] = np.concatenate([q, v, tm])
        plant.step(pd.compute(q, v, Q[k], V[k], A[k], learn=False))
    jitter = np.random.default_rng(seed + 1).normal(0.0, r["stamp_jitter_s"], t.size)
    n = m.n
    return {"t": t + jitter, "q": out[:, :n], "qd": out[:, n:2 * n], "tau": out[:, 2 * n:],
            "joints": list(m.joint_names), "effort_limit": m.effort_limit.copy()}


def evaluate(rec: dict, learners, seed: int = 0, robot: str = "panda") -> dict:
    from ..dynamics import RobotModel
    from ..dynamics.identification import identify, identify_consistent, nmse
    from ..evaluation.identify import split_prepared
    from ..learning import make_learner

    model = RobotModel(robot, friction=True)
    t = rec["t"]
    (q, qd, qdd, tau), (qt, qdt, qddt, taut), counts = split_prepared(
        t, rec["q"], rec["qd"], rec["tau"], 0.5, 20.0, 0, where="realdata")
    res: dict = {"counts": counts, "samples": {"train": int(len(q)), "test": int(len(qt))}}
    res["nominal_nmse"] = nmse(taut, model.regressor_batch(qt, qdt, qddt) @ model.parameters)
    ls = identify(model, q, qd, qdd, tau, offset=True)
    base_te = ls.torque(model, qt, qdt, qddt, offset=False)      # the model the controller runs
    res["id_nmse"] = nmse(taut, base_te + ls.offset)
    t0 = time.perf_counter()
    cons = identify_consistent(model, q, qd, qdd, tau, weights=1.0 / np.maximum(ls.residual_rmse, 1e-9), offset=True)
    res["id_consistent_s"] = round(time.perf_counter() - t0, 2)
    res["id_consistent_nmse"] = nmse(taut, cons.torque(model, qt, qdt, qddt))
    base_tr = ls.torque(model, q, qd, qdd, offset=False)
    X, Y = np.hstack([q, qd, qdd]), tau - base_tr
    Xt = np.hstack([qt, qdt, qddt])
    step = max(1, int(round(len(q) / (0.5 * (t.max() - t.min()) * LEARN_RATE_HZ))))
    res["semiparam_nmse"], res["learner_seconds"], res["learner_counters"] = {}, {}, {}
    for kind in learners:
        L = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1])
        t0 = time.perf_counter()
        Xs, Ys = X[::step], Y[::step]
        for i in range(0, len(Xs), 50):       # in time order, as a node learns
            L.partial_fit(Xs[i:i + 50], Ys[i:i + 50])
        P = L.predict(Xt)
        res["learner_seconds"][kind] = round(time.perf_counter() - t0, 2)
        res["semiparam_nmse"][kind] = nmse(taut, base_te + P)
        res["learner_counters"][kind] = {k: int(v) for k, v in L._counters().items()}
    ratios = {k: float(np.max(v / res["id_nmse"])) for k, v in res["semiparam_nmse"].items()}
    best = min(ratios, key=ratios.get) if ratios else None
    res["semiparam_vs_id_max_per_learner"] = {k: round(v, 4) for k, v in ratios.items()}
    res["best_learner"] = best
    res["semiparam_vs_id_max"] = None if best is None else round(ratios[best], 4)
    res["target_met"] = bool(best is not None and ratios[best] <= TARGET)
    res["offsets_identified"] = [round(float(x), 3) for x in ls.offset]
    return res


def _plot(res: dict, joints: list, out_dir: str, files: list, name: str = "panda") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [("URDF", res["nominal_nmse"]), ("identified (LS)", res["id_nmse"]),
            ("identified, consistent", res["id_consistent_nmse"])]
    rows += [(f"LS + {k}", v) for k, v in res["semiparam_nmse"].items()]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    w = 0.8 / len(rows)
    x = np.arange(len(joints))
    for i, (label, vals) in enumerate(rows):
        ax.bar(x + (i - (len(rows) - 1) / 2) * w, vals, w, label=label)
    ax.set_yscale("log")
    prefix = os.path.commonprefix(list(joints)) if len(joints) > 1 else ""
    ax.set_xticks(x, [j[len(prefix):] or j for j in joints])
    ax.set_ylabel("held-out nMSE")
    ax.set_title(f"Realistic {name} recording: best semi-parametric / LS-ID (max over joints)"
                 f" {res['semiparam_vs_id_max']} ({res['best_learner']})", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    save_plot(fig, out_dir, "realdata_nmse.png", files)


def _round(o):
    if isinstance(o, dict):
        return {k: _round(v) for k, v in o.items()}
    if isinstance(o, np.ndarray):
        return [float(f"{x:.4g}") for x in o]
    return o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment realdata",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="short version for tests: 30 s recording")
    ap.add_argument("--seconds", type=float, default=120.0, help="length of the excitation recording [s]")
    ap.add_argument("--learners", default=",".join(LEARNERS), help="comma-separated residual learners")
    ap.add_argument("--seed", type=int, default=0)
    add_robot_args(ap, "panda", plural=False)
    args = ap.parse_args(argv)
    robots = chosen_robots(args)
    if len(robots) != 1:
        ap.error("--robot takes one robot")
    robot = robots[0]
    seconds = 30.0 if args.quick else args.seconds
    learners = [k for k in args.learners.split(",") if k]
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rec = record(seconds, args.seed, robot)
    res = evaluate(rec, learners, args.seed, robot)
    files: list = []
    _plot(res, rec["joints"], args.out, files, label(robot))
    out = {"experiment": "realdata", "robot": label(robot), **({} if is_shipped(robot) else {"urdf": robot}),
           "quick": bool(args.quick), "seconds": seconds,
           "reality": {**REALITY, "tau_bias": torque_bias(robot, rec["effort_limit"])},
           "excitation": EXCITATION, "learners": learners, **_round(res), "target": TARGET,
           "plots": [os.path.basename(f) for f in files], "runtime_s": round(time.perf_counter() - t0, 1)}
    return write_result(args.out, "realdata", out)


if __name__ == "__main__":
    sys.exit(main())
