"""Residual learning in closed loop, judged where it learned and where it never was.

The graph is the one ``adaptive-dynamics launch sim controller:=composite learner:=gmm``
starts (MuJoCo bridge in lockstep -- on the robot's realistic proxy by default, ``reality``
below; Modified Fourier reference; composite ``adaptive_controller``
with its defaults, started from the URDF's model (:data:`CONTROLLER`);
``residual_learner`` with its defaults; recorder), as separate processes over DDS.  Per robot, four runs:

==================  ===============  ====================================================
run                 trajectory       what happens
==================  ===============  ====================================================
learn, residual     A                controller adapts and the learner learns for
                                     ``learn_s``; then both freeze (``learning: false``
                                     through ``SetParameters``, what rqt does) and A is
                                     followed ``eval_s`` more: the *learned region*
learn, none         A                the same without the residual learner
new, residual       B                from the saved estimate and learner
                                     (``estimate_file``, ``model_file``), learning off,
                                     ``eval_s``: the *new region*
new, none           B                from the saved estimate, no learner
==================  ===============  ====================================================

``reality`` "proxy" (default) gives the bridge ``experiment realdata``'s proxy of the robot
(Stribeck friction or a position ripple, sensor bias and noise, a payload;
:func:`bridge_reality`) and the controller friction columns (:data:`PROXY_CONTROLLER`), as
the robots' parameter files set them: what the learners are judged on offline, a plant
the suite's models do not express; "config" is the simulator ``launch sim`` starts, with
the controller (and the learner) without friction columns (:data:`CONFIG_CONTROLLER`): the
joints' friction is what the parametric model lacks.

B has other Fourier coefficients (seed + :data:`OTHER_SEED`) and its centre moved by
:data:`CENTRE_SHIFT` of each joint's half range, alternately up and down: another part
of the workspace (the JSON gives the fraction of B's states farther than the region
radius from every state of A's learning segment).

Figures (per joint: position RMSE with the residual / without):
``learned_region_vs_no_residual_max`` (target <= 0.5: learning pays where it learned)
and ``new_region_vs_no_residual_max`` (target <= 1.05: it never makes things worse
elsewhere -- the learner falls back to the parametric model, ``docs/learners.md``), max
over joints and robots.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from ..dynamics import RobotModel
from ..evaluation.regions import nearest_distance, REGION_RADIUS
from ..evaluation.streams import read_streams
from ..launcher import run_to_end
from ..robots import friction, robot_config, robot_label
from ..scenarios import build_graph
from . import save_plot
from .clock_follower import PhaseDirector
from .proxies import proxy_reality

#: sim s of learning on trajectory A, then of evaluation on A and on B
LEARN_S, EVAL_S = 30.0, 10.0
#: trajectory B: the centre moved by this fraction of each joint's half range (+, -, +, ...)
CENTRE_SHIFT = 0.3
#: trajectory B's seed = trajectory A's + this
OTHER_SEED = 1000
#: the controller starts from the URDF's model (what a user with a URDF does; ARDL's zero start is
#: ``experiment ardl``'s question)
CONTROLLER = {"initial_estimate": "nominal"}
#: reality "config": the controller without friction columns (whatever the robot's file says),
#: so that the simulator's joint friction is what the parametric model lacks and the residual
#: has something to learn; with them the parametric model expresses that simulator entirely
CONFIG_CONTROLLER = {"friction": False}
#: reality "proxy": the controller also estimates viscous + Coulomb friction (the proxy's
#: Stribeck term, ripple and sensor bias are what it cannot express)
PROXY_CONTROLLER = {"friction": True}
#: residual_learner parameters beyond its defaults (none: the defaults are what is judged)
LEARNER: dict = {}
REALITIES = ("config", "proxy")
#: the controller (lockstep) waits up to this many wall s for the residual stamped for each
#: state, so that no cycle runs without it on a loaded machine (as ``experiment pgpol``)
RESIDUAL_WAIT = 0.25
#: a learner that learns in lockstep (``learn_in_lockstep``) holds the loop for each block's fit:
#: then the controller waits this long for a state's residual and the bridge this long for its
#: command [wall s], so that no cycle runs without them however loaded the machine is
LOCKSTEP_RESIDUAL_WAIT, LOCKSTEP_TIMEOUT = 5.0, 10.0
TARGETS = {"learned_region_vs_no_residual_max": 0.5, "new_region_vs_no_residual_max": 1.05}
RECORDED = ["joint_states", "reference", "residual_learner/prediction"]


def trajectory_b(robot: str, seed: int) -> dict:
    """Trajectory-node parameters of B (seed and centre) for ``robot``."""
    m = RobotModel(robot)
    half = 0.5 * (m.upper - m.lower)
    signs = np.where(np.arange(m.n) % 2 == 0, 1.0, -1.0)
    centre = 0.5 * (m.lower + m.upper) + CENTRE_SHIFT * signs * half
    return {"seed": int(seed) + OTHER_SEED, "q_center": [float(x) for x in centre]}


def bridge_reality(robot: str) -> dict:
    """``mujoco_bridge`` parameters of the robot's realistic proxy (``experiment realdata``'s
    training reality: friction beyond viscous + Coulomb, sensor bias and noise, a payload)."""
    r, _ = proxy_reality(robot, RobotModel(robot).effort_limit)
    fv, fc = friction(robot)
    coulomb = r["coulomb_scale"] * fc
    return {"friction_viscous": [float(x) for x in r.get("viscous_scale", 1.0) * fv],
            "friction_coulomb": [float(x) for x in coulomb], "coulomb_smoothing": float(r["coulomb_smoothing"]),
            "friction_stribeck": [float(x) for x in r["stribeck_ratio"] * coulomb],
            "stribeck_velocity": float(r["stribeck_velocity"]),
            "ripple_amplitude": [float(r.get("ripple_amplitude", 0.0))],
            "ripple_periods": float(r.get("ripple_periods", 10.0)),
            "tau_bias": [float(x) for x in r["tau_bias"]], "noise_std_tau": [float(r["noise_std_tau"])],
            "noise_std_v": [float(r["noise_std_v"])], "noise_std_q": [float(r["noise_std_q"])],
            "payload_mass": float(r["ee_extra_mass"]), "payload_com": [float(x) for x in r["ee_extra_com"]],
            "payload_enabled": r["ee_extra_mass"] > 0}


def _run(robot: str, learner: str, bag: str, duration: float, overrides: dict, freeze_at: float | None,
         echo: bool, timeout: float, scheduled: bool = False) -> dict:
    """One run; ``freeze_at`` [sim s]: learning off there -- set over the nodes' parameter
    services (what rqt does) or, ``scheduled``, their ``learning_until`` (at the same state
    on any machine: the lockstep learner's runs)."""
    if freeze_at is not None and scheduled:
        overrides = {**overrides, "adaptive_controller": {**overrides.get("adaptive_controller", {}),
                                                          "learning_until": float(freeze_at)}}
        if learner != "none":
            overrides["residual_learner"] = {**overrides.get("residual_learner", {}),
                                             "learning_until": float(freeze_at)}
    nodes = build_graph("sim", robot=robot, controller="composite", learner=learner, duration=duration,
                        record=True, bag=bag, overrides=overrides)
    if freeze_at is not None and scheduled:
        wall = run_to_end(nodes, timeout=timeout, echo=echo, what="the closed loop failed").wall_s
        return {"wall_s": round(wall, 1), "sim_s": duration, "frozen_at_s": float(freeze_at),
                "freeze": "learning_until"}
    director = None
    if freeze_at is not None:
        frozen = {"adaptive_controller": {"learning": False}}
        if learner != "none":
            frozen["residual_learner"] = {"learning": False}
        director = PhaseDirector([freeze_at], settings={1: {}, 2: frozen})
    wall = run_to_end(nodes, timeout=timeout, companions=[director] if director else [], echo=echo,
                      what="the closed loop failed").wall_s
    return {"wall_s": round(wall, 1), "sim_s": duration,
            **({"frozen_at_s": director.switches[0]["clock_s"]} if director is not None else {})}


def tracking(bag: str, names: list[str], t_from: float = 0.0) -> dict:
    """Position errors ``q_d - q`` of a recorded run from sim time ``t_from`` on, the
    positions, and the learner's published prediction (if recorded)."""
    rec = read_streams(bag, names, joints=["/joint_states", "/residual_learner/prediction"])
    st, ref = rec.referenced()
    out = {"t": st.t, "q": st.position, "e": ref.q - st.position}
    pred = rec.joint["/residual_learner/prediction"]
    if len(pred.t_ns):   # (no learner in this run: none)
        out["t_f"], out["f"] = pred.t, pred.effort
    out["rmse"] = np.sqrt(np.mean(out["e"][out["t"] >= t_from] ** 2, axis=0))
    return out


#: what a call of :func:`run_robot` runs: the four runs, A's two (learn, freeze, evaluate on A)
#: or B's two, from what A's left in the same ``work`` directory
STAGES = ("all", "learn", "new")


def run_robot(robot: str, learner: str = "gmm", learn_s: float = LEARN_S, eval_s: float = EVAL_S,
              seed: int = 0, out_dir: str = ".", trajectory: dict | None = None, keep_bags: bool = False,
              echo: bool = False, timeout: float = 3600.0, reality: str = "proxy",
              learner_settings: dict | None = None, stage: str = "all", work: str | None = None) -> dict:
    """The four runs of one robot; per-joint RMSE, ratios, region figures and traces.
    ``learner_settings``: residual_learner parameters beyond :data:`LEARNER` (the quick
    version's shorter warm-up).
    ``reality``: "proxy" (:func:`bridge_reality`, and :data:`PROXY_CONTROLLER`) or "config"
    (the simulator of ``launch sim``: ``config/<robot>.yaml``'s joint friction;
    :data:`CONFIG_CONTROLLER`).
    ``stage`` (:data:`STAGES`): all four runs, or A's (``learn``: the learned region's
    figures) or B's (``new``: from the estimate, learner and recordings A's left in
    ``work``; every figure).  ``work``: the directory of the runs' files and bags (kept;
    default a temporary one, removed unless ``keep_bags``); ``learn`` and ``new`` need it."""
    if reality not in REALITIES:
        raise ValueError(f"reality must be one of {REALITIES}, got {reality!r}")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if stage != "all" and not work:
        raise ValueError(f"stage {stage!r} needs the work directory A's runs share with B's")

    names = robot_config(robot)["joint_names"]
    name = robot_label(robot)
    own_work = work is None
    if own_work:
        work = tempfile.mkdtemp(prefix=f"closed_loop_{name}_")
    os.makedirs(work, exist_ok=True)
    traj_a = {"seed": int(seed), **(trajectory or {})}
    traj_b = {**traj_a, **trajectory_b(robot, seed)}
    bridge = bridge_reality(robot) if reality == "proxy" else {}
    controller = {**CONTROLLER, **(PROXY_CONTROLLER if reality == "proxy" else CONFIG_CONTROLLER)}
    lockstep = bool((learner_settings or {}).get("learn_in_lockstep"))
    wait = LOCKSTEP_RESIDUAL_WAIT if lockstep else RESIDUAL_WAIT
    runs_file = os.path.join(work, "runs_learn.json")
    runs, data = {}, {}
    if stage == "new":
        if not os.path.exists(runs_file):
            raise ValueError(f"{work} holds no learning runs (run stage 'learn' there first)")
        with open(runs_file, encoding="utf-8") as fh:
            runs.update(json.load(fh))
    try:
        for res in ("residual", "none"):
            lrn = learner if res == "residual" else "none"
            est = os.path.join(work, f"estimate_{res}.npz")
            files = {"adaptive_controller": {**controller, "estimate_file": est, "autosave_period": 0.0,
                                             **({"residual_wait": wait} if lrn != "none" else {})}}
            if lrn != "none":   # the learner's model has the controller's friction columns
                files["residual_learner"] = {**LEARNER, **(learner_settings or {}), "model_file": os.path.join(work, "learner.npz"),
                                             "friction": controller["friction"]}
            rec = {"recorder": {"topics": RECORDED if lrn != "none" else RECORDED[:2],
                                "wait_for_publishers": ["reference"]}}
            # A: learn, freeze, evaluate
            bag = os.path.join(work, f"bag_learn_{res}")
            bridge_run = {**bridge, "lockstep_timeout": LOCKSTEP_TIMEOUT} if lockstep and lrn != "none" else bridge
            if stage != "new":
                runs[f"learn_{res}"] = _run(robot, lrn, bag, learn_s + eval_s,
                                            {**files, **rec, "trajectory": dict(traj_a), "mujoco_bridge": bridge_run},
                                            learn_s, echo, timeout, scheduled=lockstep)
                for path in [est] + ([files["residual_learner"]["model_file"]] if lrn != "none" else []):
                    if not os.path.exists(path):
                        raise RuntimeError(f"the learning run did not save {path}")
            data[f"learned_{res}"] = tracking(bag, names, runs[f"learn_{res}"]["frozen_at_s"])
            data[f"learning_{res}"] = tracking(bag, names)
            if stage == "learn":
                continue
            # B: from what A left, nothing learned
            frozen = {"adaptive_controller": {**files["adaptive_controller"], "learning": False}}
            if lrn != "none":
                frozen["residual_learner"] = {**files["residual_learner"], "learning": False}
            bag = os.path.join(work, f"bag_new_{res}")
            runs[f"new_{res}"] = _run(robot, lrn, bag, eval_s,
                                      {**frozen, **rec, "trajectory": dict(traj_b),
                                       "mujoco_bridge": {**bridge_run, "q0": traj_b["q_center"]}}, None, echo,
                                      timeout)
            data[f"new_{res}"] = tracking(bag, names)
        if stage == "learn":
            with open(runs_file, "w", encoding="utf-8") as fh:
                json.dump(runs, fh)
    finally:
        if keep_bags:
            shutil.copytree(work, os.path.join(out_dir, f"closed_loop_{name}"), dirs_exist_ok=True)
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    learned = data["learned_residual"]["rmse"] / data["learned_none"]["rmse"]
    out = {
        "robot": name, "learner": learner, "reality": reality, "stage": stage,
        "learner_settings": {**LEARNER, **(learner_settings or {})}, **({"bridge": bridge} if bridge else {}),
        "controller": controller, "trajectory_a": traj_a, "trajectory_b": traj_b,
        "learned_rmse": {"residual": data["learned_residual"]["rmse"].tolist(),
                         "none": data["learned_none"]["rmse"].tolist()},
        "learned_vs_no_residual": learned.tolist(), "learned_vs_no_residual_max": float(learned.max()),
        "runs": runs, "traces": data,
    }
    # the learner's mean output where it is judged: A after the freeze, all of B
    f_mean = {k: float(np.mean(np.abs(data[k]["f"][data[k]["t_f"] >= t_from])))
              for k, t_from in (("learned_residual", learn_s), ("new_residual", 0.0)) if k in data and "f" in data[k]}
    out["residual_mean_abs_nm"] = f_mean
    if stage == "learn":
        return out
    new = data["new_residual"]["rmse"] / data["new_none"]["rmse"]
    a = data["learning_residual"]
    train_q = a["q"][a["t"] < learn_s]
    dist = nearest_distance(train_q, data["new_residual"]["q"])
    out.update({
        "new_rmse": {"residual": data["new_residual"]["rmse"].tolist(), "none": data["new_none"]["rmse"].tolist()},
        "new_vs_no_residual": new.tolist(), "new_vs_no_residual_max": float(new.max()),
        "new_region_outside_fraction": float(np.mean(dist > REGION_RADIUS)),
        "new_region_distance_median_rad": float(np.median(dist)),
    })
    return out


def plot(res: dict, out_dir: str, files: list, learn_s: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = res["traces"]
    n = len(res["learned_vs_no_residual"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ax = axes[0]
    def trace(ax, key, label, c):   # from 0.1 s: the start (zero error) would set the log axis
        m = d[key]["t"] >= 0.1
        ax.plot(d[key]["t"][m], np.linalg.norm(d[key]["e"][m], axis=1), lw=0.6, color=c, label=label)

    for key, label, c in (("learning_none", "no residual", "C0"), ("learning_residual", "+ residual", "C1")):
        trace(ax, key, label, c)
    ax.axvline(learn_s, color="k", lw=0.8, ls="--")
    ax.text(learn_s, 0.98, " learning frozen", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.set_title(f"{res['robot']} ({res['reality']}): trajectory A (learned region)", fontsize=9)
    ax.set_xlabel("sim time [s]")
    ax.set_ylabel("|q_d - q| [rad]")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax = axes[1]
    for key, label, c in (("new_none", "no residual", "C0"), ("new_residual", "+ residual (falls back)", "C1")):
        trace(ax, key, label, c)
    ax.set_title(f"trajectory B (new region, {100 * res['new_region_outside_fraction']:.0f} % of it outside A's)",
                 fontsize=9)
    ax.set_xlabel("sim time [s]")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax = axes[2]
    x = np.arange(1, n + 1)
    ax.bar(x - 0.18, res["learned_vs_no_residual"], width=0.36, label="learned region (A)")
    ax.bar(x + 0.18, res["new_vs_no_residual"], width=0.36, label="new region (B)")
    ax.axhline(TARGETS["learned_region_vs_no_residual_max"], color="C0", ls=":", lw=1)
    ax.axhline(TARGETS["new_region_vs_no_residual_max"], color="C1", ls=":", lw=1)
    ax.set_xticks(x)
    ax.set_xlabel("joint")
    ax.set_ylabel("RMSE with residual / without")
    ax.set_title(f"{res['learner'].upper()} residual: per-joint ratio (dotted: targets)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    suffix = "" if res["reality"] == "config" else f"_{res['reality']}"
    save_plot(fig, out_dir, f"closed_loop_regions_{res['robot']}{suffix}.png", files)


def run(robots=("panda", "iiwa14"), learner: str = "gmm", learn_s: float = LEARN_S, eval_s: float = EVAL_S,
        seed: int = 0, out_dir: str = ".", trajectory: dict | None = None, keep_bags: bool = False,
        echo: bool = False, reality: str = "proxy", learner_settings: dict | None = None,
        stage: str = "all", work: str | None = None) -> dict:
    """Every robot's runs (``stage``, ``work``: :func:`run_robot`'s; a robot's work directory
    is ``work/<robot>``); the JSON-able summary (traces dropped) and the plots (of a stage
    that has both regions)."""
    files: list = []
    per_robot: dict[str, Any] = {}
    for robot in robots:
        res = run_robot(robot, learner, learn_s, eval_s, seed, out_dir, trajectory, keep_bags, echo,
                        reality=reality, learner_settings=learner_settings, stage=stage,
                        work=None if work is None else os.path.join(work, robot_label(robot)))
        if stage != "learn":
            plot(res, out_dir, files, learn_s)
        res.pop("traces")
        per_robot[res["robot"]] = res
    summary = {
        "learner": learner, "reality": reality, "learn_s": learn_s, "eval_s": eval_s, "centre_shift": CENTRE_SHIFT,
        "stage": stage,
        "learned_region_vs_no_residual_max": max(r["learned_vs_no_residual_max"] for r in per_robot.values()),
        **({"new_region_vs_no_residual_max": max(r["new_vs_no_residual_max"] for r in per_robot.values())}
           if stage != "learn" else {}),
        "robots": per_robot, "plots": [os.path.basename(f) for f in files],
    }
    summary["targets_met"] = {k: bool(summary[k] <= v) for k, v in TARGETS.items() if k in summary}
    return summary
