"""The online 4-phase experiment of Smith & Mistry 2020 §IV-B, in closed loop over DDS.

The graph is the one ``adaptive-dynamics launch sim controller:=composite
learner:=gmm record:=true`` starts (mujoco_bridge in lockstep with "reality": joint
friction and the 1 kg payload of ``config/<robot>.yaml``; trajectory = Modified Fourier;
adaptive_controller with the composite law from a 50 %-wrong nominal model,
``initial_estimate: scaled``; residual_learner; recorder), as separate processes.  A
*phase director* in this process watches ``/clock`` and switches the phases through
the nodes' live parameters (``rcl_interfaces/SetParameters``, what rqt does):

==========  =======================  ========================  ==================
phase       parametric (controller)  non-parametric learning   NP output
==========  =======================  ========================  ==================
1           frozen                   on                        off
2           frozen                   on                        on
3           adapting                 off (transform only)      on
4           adapting                 on (+ transform)          on
==========  =======================  ========================  ==================

Run twice: with the consistency transform and without it (``transform: false`` in
the residual learner: every Delta pi_hat is ignored), as in the paper's Fig. 4a/4b.

Metrics per phase (over the phase's samples, per joint): RMSE of the position error
``q_d - q`` and the velocity error, and of the torque prediction error ``tau_measured
- (Y pi_hat + f_hat)`` -- the torque the semi-parametric model failed to predict (with
the NP output on it equals the feedback torque; f_hat is the learner's prediction from
``residual_learner/prediction``, published whether or not it is output).

``four_phase_ratio``: position RMSE over phases 3-4 / phase 2 (means over joints), with
the transform; target <= 1.5.  ``four_phase_ratio_no_transform`` the same without it
(it rises: the two models then both learn the same torque).

The phase switch lands a few sim-milliseconds after the nominal boundary (a service
call while the lockstep loop runs); the JSON records when each switch was acknowledged.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from ..evaluation.metrics import rmse
from ..evaluation.streams import read_streams
from ..launcher import run_to_end
from ..robots import paper_config, robot_config, robot_label
from ..ros.params import load_param_file
from ..scenarios import build_graph, config_path
from . import save_plot
from .clock_follower import PhaseDirector

# phase -> parameter changes at its start (phase 1's are the nodes' start parameters)
PHASE_SETTINGS = {
    1: {"adaptive_controller": {"learning": False}, "residual_learner": {"learning": True, "output": False}},
    2: {"residual_learner": {"output": True}},
    3: {"adaptive_controller": {"learning": True}, "residual_learner": {"learning": False}},
    4: {"residual_learner": {"learning": True}},
}
PHASE_NAMES = {1: "NP learns, no output", 2: "NP learns + outputs", 3: "parametric adapts, NP transformed only",
               4: "both learn (+ transform)"}
#: residual_learner's learn_decimation here (100 Hz at the bridge's 1 kHz)
LEARN_DECIMATION = 10
#: composite-law gains of this experiment (the rest from config/<robot>.yaml)
CONTROLLER: dict[str, Any] = {}
RECORDED = ["joint_states", "reference", "adaptive/parametric_torque", "residual_learner/prediction"]


def learner_settings(learner: str, phases: list[float], trajectory: dict | None) -> dict:
    """Per-learner residual_learner settings of this experiment.

    The RBFN places its basis functions in the box its warm-up samples span: with the
    200 samples of the paper's runs (2 s at this experiment's 100 Hz learning rate,
    :data:`LEARN_DECIMATION`; every learner here starts after them) that box covers a fifth
    of the default 10 s trajectory period and the network predicts ~0 outside it.  Its
    warm-up here is one trajectory period (at most 80 % of phase 1), and the network is
    ARDL's plain one (no bias feature, raw targets).  The GMM keeps the ``beta`` novelty
    level at its size cap (``full_novelty: null``), as these runs were made."""
    # the paper's phases start the learner at once: 100 Hz and a 200-sample warm-up, as these
    # runs were made (the node's defaults hold it back 10 s for the parametric estimate)
    base = {"learn_decimation": LEARN_DECIMATION, "warmup": 200}
    if learner == "gmm":   # the novelty level at the size cap these runs were made with
        return {**base, "learner_config": json.dumps({"full_novelty": None})}
    if learner != "rbfn":
        return base
    sim = config_path("sim.yaml")   # the rate the graph runs at
    rate = load_param_file(sim, "mujoco_bridge")["rate_hz"] / LEARN_DECIMATION
    traj = load_param_file(sim, "trajectory")
    period = 1.0 / float((trajectory or {}).get("base_frequency", traj["base_frequency"]))
    # ARDL's plain network (no bias feature, raw targets), as the paper's
    return {**base, "warmup": int(max(200, min(period, 0.8 * phases[0]) * rate)),
            "learner_config": json.dumps({"bias": False, "standardize": False})}


def run_graph_once(robot: str, learner: str, transform: bool, phases: list[float], bag: str,
                   learner_config: str = "", timeout: float = 3600.0, echo: bool = False,
                   controller: dict | None = None, trajectory: dict | None = None) -> dict:
    """One closed-loop run; returns the director's switch log and the run's wall time."""

    duration = float(sum(phases))
    boundaries = list(np.cumsum(phases)[:3])
    # the paper's residual of the measured torque (the node's default learns the commanded one)
    lrn = {"learner": learner, "transform": bool(transform), "monitor_decimation": 10, "target_torque": "measured",
           **learner_settings(learner, phases, trajectory), **PHASE_SETTINGS[1]["residual_learner"]}
    if learner_config:   # on top of the experiment's own settings
        import json
        lrn["learner_config"] = json.dumps({**json.loads(lrn.get("learner_config") or "{}"),
                                            **json.loads(learner_config)})
    overrides = {
        "adaptive_controller": {"initial_estimate": "scaled", "nominal_scale": 0.5, **CONTROLLER,
                                **(controller or {}), **PHASE_SETTINGS[1]["adaptive_controller"]},
        "residual_learner": lrn,
        "trajectory": dict(trajectory or {}),
        "recorder": {"topics": RECORDED, "wait_for_publishers": ["reference", "adaptive/parametric_torque"]},
    }
    nodes = build_graph("sim", robot=robot, controller="composite", learner=learner, duration=duration,
                        record=True, bag=bag, overrides=overrides, param_files=paper_config(robot))
    director = PhaseDirector(boundaries, PHASE_SETTINGS)
    wall = run_to_end(nodes, timeout=timeout, companions=[director], echo=echo, what="the closed loop failed").wall_s
    return {"switches": director.switches, "wall_s": round(wall, 1), "sim_s": duration,
            "sim_s_per_wall_s": round(duration / wall, 3)}


def analyse(bag: str, names: list[str], phases: list[float]) -> dict:
    """Per-phase RMSE of position, velocity and torque-prediction errors, plus traces."""
    rec = read_streams(bag, names, joints=["/joint_states", "/adaptive/parametric_torque",
                                           "/residual_learner/prediction"])
    st, ref = rec.referenced()
    ts, tau = st.t_ns, st.effort
    tp, pt = rec.joints("/adaptive/parametric_torque").t_ns, rec.joints("/adaptive/parametric_torque").effort
    tf, fhat = rec.joints("/residual_learner/prediction").t_ns, rec.joints("/residual_learner/prediction").effort
    eq, ev = ref.q - st.position, ref.qd - st.velocity
    # torque prediction on the monitor's stamps (every 10th): tau - (Y pi_hat + f_hat)
    idx_s = {t: i for i, t in enumerate(ts)}
    idx_p = {t: i for i, t in enumerate(tp)}
    both = [(idx_s[t], idx_p[t], k) for k, t in enumerate(tf) if t in idx_s and t in idx_p]
    if not both:
        raise ValueError("no stamps common to joint_states, parametric_torque and the prediction")
    i_s, i_p, i_f = (np.array(x) for x in zip(*both))
    tt = ts[i_s]
    etau = tau[i_s] - (pt[i_p] + fhat[i_f])
    edges = np.concatenate([[0.0], np.cumsum(phases)]) * 1e9
    res: dict[str, Any] = {"phases": {}}
    for k in range(4):
        a, b = edges[k], edges[k + 1]
        m = (ts >= a) & (ts < b)
        mt = (tt >= a) & (tt < b)
        res["phases"][str(k + 1)] = {
            "t_s": [round(a * 1e-9, 3), round(b * 1e-9, 3)], "samples": int(m.sum()),
            "q_rmse": rmse(eq[m]).tolist(), "qd_rmse": rmse(ev[m]).tolist(), "tau_rmse": rmse(etau[mt]).tolist()}
    m34 = ts >= edges[2]
    m2 = (ts >= edges[1]) & (ts < edges[2])
    res["q_rmse_phase34"] = rmse(eq[m34]).tolist()
    res["ratio"] = float(np.mean(rmse(eq[m34])) / np.mean(rmse(eq[m2])))
    res["traces"] = {"t": tt * 1e-9, "tau": tau[i_s], "parametric": pt[i_p], "nonparametric": fhat[i_f],
                     "t_state": ts * 1e-9, "eq": eq, "ev": ev}
    return res


def plot(results: dict, phases: list[float], robot: str, out_dir: str, joint: int = 1,
         learner: str = "gmm") -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    edges = np.concatenate([[0.0], np.cumsum(phases)])
    shades = ["#f2f2f2", "#dde8f5", "#f5eadd", "#e2f2dd"]
    files = []

    def background(ax):
        for k in range(4):
            ax.axvspan(edges[k], edges[k + 1], color=shades[k], zorder=0)
            ax.text(0.5 * (edges[k] + edges[k + 1]), 0.98, f"phase {k + 1}", ha="center", va="top",
                    transform=ax.get_xaxis_transform(), fontsize=8)

    # Fig. 5: torque contributions of joint `joint` (0-based), with and without the transform
    fig, axes = plt.subplots(2, 2, figsize=(13, 7), sharex=True)
    for col, key in enumerate(("transform", "no_transform")):
        tr = results[key]["traces"]
        ax = axes[0, col]
        background(ax)
        ax.plot(tr["t"], tr["tau"][:, joint], color="0.6", lw=0.6, label="measured torque")
        ax.plot(tr["t"], tr["parametric"][:, joint], lw=1.0, label="parametric Y pi_hat")
        ax.plot(tr["t"], tr["nonparametric"][:, joint], lw=1.0, label="non-parametric f_hat")
        ax.plot(tr["t"], tr["parametric"][:, joint] + tr["nonparametric"][:, joint], lw=0.8, ls="--",
                label="sum")
        ax.set_title(f"{robot} ({learner.upper()}) joint {joint + 1}: torque contributions, "
                     f"{'with' if key == 'transform' else 'WITHOUT'} the consistency transform", fontsize=9)
        ax.set_ylabel("N m")
        ax.legend(fontsize=7, loc="lower left")
        ax = axes[1, col]
        background(ax)
        ax.plot(tr["t_state"], tr["eq"][:, joint], lw=0.7, label="position error [rad]")
        ax.plot(tr["t_state"], 0.1 * tr["ev"][:, joint], lw=0.7, label="0.1 x velocity error [rad/s]")
        ax.set_xlabel("sim time [s]")
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    save_plot(fig, out_dir, f"consistency_online_{robot}_{learner}_contributions.png", files)

    # Fig. 4: per-phase RMSE (mean over joints), both runs, log scale
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, metric, label in zip(axes, ("q_rmse", "qd_rmse", "tau_rmse"),
                                 ("position RMSE [rad]", "velocity RMSE [rad/s]", "torque prediction RMSE [N m]")):
        x = np.arange(1, 5)
        for off, key in ((-0.18, "transform"), (0.18, "no_transform")):
            vals = [np.mean(results[key]["phases"][str(k)][metric]) for k in x]
            ax.bar(x + off, vals, width=0.36, label="transform" if key == "transform" else "no transform")
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([f"phase {k}" for k in x], fontsize=8)
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{robot}, {learner.upper()}: online 4-phase experiment (mean over joints)", fontsize=10)
    fig.tight_layout()
    save_plot(fig, out_dir, f"consistency_online_{robot}_{learner}_phases.png", files)
    return files


#: the two runs of :func:`run`
RUNS = ("transform", "no_transform")


def run(robot: str = "panda", learner: str = "gmm", phases=(20.0, 20.0, 30.0, 30.0), out_dir: str = ".",
        learner_config: str = "", echo: bool = False, keep_bags: bool = True,
        trajectory: dict | None = None, only: str | None = None) -> dict:
    """Both runs (with / without the transform), metrics, plots; JSON-able summary.
    ``only`` (one of :data:`RUNS`): run that one; the other is read back from ``out_dir``
    (its bag and run record, kept by an earlier call) or, if it is not there, left out
    (the summary then has that run's figures alone: ``only``)."""
    import json
    import shutil

    if only is not None and (only not in RUNS or not keep_bags):
        raise ValueError(f"only: one of {RUNS}, with the bags kept")
    phases = [float(p) for p in phases]
    names = robot_config(robot)["joint_names"]
    name = robot_label(robot)
    results: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    bag_root = out_dir if keep_bags else tempfile.mkdtemp(prefix="consistency_online_")
    try:
        for key, transform in (("transform", True), ("no_transform", False)):
            bag = os.path.join(bag_root, f"bag_online_{name}_{learner}_{key}")
            record = os.path.join(bag_root, f"run_online_{name}_{learner}_{key}.json")
            if only is not None and key != only:   # the other run: an earlier call's, if it is there
                if os.path.exists(record) and os.path.exists(bag):
                    with open(record, encoding="utf-8") as fh:
                        runs[key] = json.load(fh)
                    results[key] = analyse(bag, names, phases)
                continue
            if os.path.exists(bag):
                shutil.rmtree(bag)
            runs[key] = run_graph_once(robot, learner, transform, phases, bag, learner_config, echo=echo,
                                       trajectory=trajectory)
            results[key] = analyse(bag, names, phases)
            if keep_bags:
                with open(record, "w", encoding="utf-8") as fh:
                    json.dump(runs[key], fh)
    finally:
        if not keep_bags:
            shutil.rmtree(bag_root, ignore_errors=True)
    if len(results) < 2:   # one run of two: its figures, nothing compared
        (key,) = results
        return {"robot": name, "learner": learner, "phases_s": phases, "only": key, "runs": runs,
                key: {p: {m: [round(x, 6) for x in v] if isinstance(v, list) else v for m, v in d.items()}
                      for p, d in results[key]["phases"].items()},
                f"four_phase_ratio{'' if key == 'transform' else '_no_transform'}": round(results[key]["ratio"], 4)}
    files = plot(results, phases, name, out_dir, learner=learner)
    summary = {
        "robot": name, **({} if name == robot else {"urdf": robot}), "learner": learner, "phases_s": phases, "phase_names": PHASE_NAMES,
        "controller": dict(CONTROLLER, initial_estimate="scaled", nominal_scale=0.5),
        "trajectory": dict(trajectory or {}),
        "four_phase_ratio": round(results["transform"]["ratio"], 4),
        "four_phase_ratio_no_transform": round(results["no_transform"]["ratio"], 4),
        "target_ratio": 1.5,
        "runs": runs,
        "plots": [os.path.basename(f) for f in files],
    }
    for key in ("transform", "no_transform"):
        summary[key] = {p: {m: [round(x, 6) for x in v] if isinstance(v, list) else v for m, v in d.items()}
                        for p, d in results[key]["phases"].items()}
    summary["meets_target"] = bool(summary["four_phase_ratio"] <= 1.5
                                   and summary["four_phase_ratio_no_transform"] > summary["four_phase_ratio"])
    return summary
