"""The README's main job (``./dev demo``): what learning the dynamics while controlling
buys, shown in one run of the graph over DDS.

The simulated arm carries a tool its URDF does not have (:data:`TOOL`: 1.5 kg, off-centre
on the flange) and the joint friction of its parameter file.  One trajectory (the
trajectory node's Fourier excitation at :data:`BASE_FREQUENCY`), two phases in one run of
``launch sim --controller composite --learner gmm``, switched through ``SetParameters``
at sim time :data:`BASELINE_PERIODS` periods:

1. **baseline** -- ``adaptive_controller`` with ``law: slotine_li``: the same
   Slotine-Li feedback (``lam``, ``kd``) on the URDF's model, nothing learned, no
   feed-forward of the residual learner;
2. **learning** -- ``law: composite`` from the same URDF model: the last link's block
   (where the tool sits: ``adapted_links``) and the joints' viscous + Coulomb friction
   (``friction: true``) adapt, and the residual learner (GMM) learns and feeds forward
   what the parametric model still misses.

Per joint: the baseline's position RMSE over its period, the learning controller's over
the last period, their ratio; the tool's mass and centre of mass estimated (the adapted
block minus the URDF's) against the truth.  Writes ``learning.png`` (tracking error of
both phases over time on one axis; the estimated tool mass converging),
``tracking.png`` and ``errors_torques.png`` (as the one-controller demo), ``demo.json`` and the bag to ``--out``; prints the table and the JSON
as its last line.  Target (JSON ``targets``): :data:`TARGETS`.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from ..dynamics import RobotModel
from ..dynamics.inertial import from_mass_com_inertia
from ..evaluation.streams import read_streams
from ..launcher import run_to_end
from ..robot_setup import resolve_robot
from ..scenarios import build_graph
from .clock_follower import PhaseDirector

__all__ = ["TOOL", "BASE_FREQUENCY", "BASELINE_PERIODS", "LEARNING_PERIODS", "TARGETS", "run", "tool_truth",
           "tracking_plots"]

#: the unmodelled tool: mass [kg], centre of mass [m] in the end-effector frame's axes
TOOL = {"mass": 1.5, "com": [0.03, -0.02, 0.06]}
#: trajectory: the trajectory node's Fourier excitation, period 1 / BASE_FREQUENCY
BASE_FREQUENCY = 0.2
BASELINE_PERIODS = 1
LEARNING_PERIODS = 3
LEARNER = "gmm"
TARGETS = {"learned_vs_baseline_rmse_max": 0.3}


def tool_truth(robot: str, link: str) -> dict:
    """Mass [kg] and centre of mass [m] (``link``'s frame) of the tool alone and of the
    block ``link`` + end effector + tool, from the URDF model with the simulator's
    payload attached (``RobotModel.set_payload``, the frame the bridge puts it on)."""

    m = RobotModel(robot)
    i = m.link_block(link)
    urdf = np.asarray(m.parameters[10 * i: 10 * i + 10], dtype=float).copy()
    # mass and centre of mass do not depend on the tool's rotational inertia
    m.set_payload(from_mass_com_inertia(TOOL["mass"], TOOL["com"], np.zeros((3, 3))), check=False)
    full = np.asarray(m.parameters[10 * i: 10 * i + 10], dtype=float)
    tool = full - urdf
    return {"urdf_block": urdf, "block": full, "tool_mass": float(tool[0]), "tool_com": (tool[1:4] / tool[0]).tolist()}


def _params_over_time(bag: str, link: str):
    """(t [s], [k x 4]: mass and first moments m, mx, my, mz of ``link``'s block) from
    ``/adaptive/parameters``."""
    keys = ["m", "mx", "my", "mz"]
    ts, rows = [], []
    for stamp, names, values in read_streams(bag, [], joints=[], reference=None,
                                             vectors=["/adaptive/parameters"]).vectors["/adaptive/parameters"]:
        idx = [names.index(f"{link}.{k}") if f"{link}.{k}" in names else -1 for k in keys]
        if min(idx) < 0:
            continue
        ts.append(stamp * 1e-9)
        rows.append([values[k] for k in idx])
    return np.asarray(ts), np.asarray(rows).reshape(-1, 4)


def run(robot: str = "panda", out: str = "out/demo", *, learner: str = LEARNER, learning_periods: int = LEARNING_PERIODS,
        overrides: dict | None = None, echo: bool = False, joints=None, ee_frame: str | None = None) -> dict:
    """The two phases in one run of the graph; the summary (also ``out/demo.json``)."""

    t0 = time.monotonic()
    os.makedirs(out, exist_ok=True)
    spec = resolve_robot(robot, joints, ee_frame)
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    link = model.link_names[model.link_block(model.link_names[-1])]
    period = 1.0 / BASE_FREQUENCY
    t_switch = BASELINE_PERIODS * period
    duration = t_switch + learning_periods * period
    bag = os.path.join(out, time.strftime("bag_%Y%m%d_%H%M%S"))
    stats_file = os.path.join(out, "bridge_stats.json")
    ov = {"mujoco_bridge": {"payload_mass": TOOL["mass"], "payload_com": list(TOOL["com"]), "payload_enabled": True,
                            "stats_file": stats_file},
          "trajectory": {"base_frequency": BASE_FREQUENCY},
          "adaptive_controller": {"law": "slotine_li", "initial_estimate": "nominal", "friction": True,
                                  "adapted_links": [link], "feedforward": False},
          "residual_learner": {"learning": False, "friction": True}}
    for node, params in (overrides or {}).items():
        ov.setdefault(node, {}).update(params)
    nodes = build_graph("sim", robot=robot, joints=joints, ee_frame=ee_frame, controller="composite", learner=learner,
                        duration=duration, record=True, bag=bag, overrides=ov)
    print(f"demo: {spec.label}, an unmodelled {TOOL['mass']:g} kg tool + joint friction; {t_switch:g} s the URDF's"
          f" model (Slotine-Li, not adapted), then {duration - t_switch:g} s composite adaptive control + {learner}"
          f" residual, lockstep over DDS; nodes {[s.name for s in nodes]}", flush=True)
    director = PhaseDirector([t_switch], settings={
        1: {}, 2: {"adaptive_controller": {"law": "composite", "feedforward": True},
                   "residual_learner": {"learning": True}}})
    run_to_end(nodes, timeout=max(300.0, 20 * duration), companions=[director], echo=echo,
               what="the closed loop failed")
    names = list(spec.joint_names)
    st, ref = read_streams(bag, names).referenced()
    tr = {"t": st.t, "q": st.position, "e": ref.q - st.position, "tau": st.effort}
    t, e = tr["t"], tr["e"]
    base = (t < t_switch)
    last = (t >= duration - period)
    rate = 1.0 / np.median(np.diff(t))
    coverage = float(min(base.sum() / (t_switch * rate), last.sum() / (period * rate)))
    if coverage < 0.9:
        print(f"demo: the recording covers {100 * coverage:.0f} % of a compared period (a recorder behind on a"
              " loaded machine): the figures are over what it holds", file=sys.stderr)
    rmse_base = np.sqrt(np.mean(e[base] ** 2, axis=0))
    rmse_learned = np.sqrt(np.mean(e[last] ** 2, axis=0))
    ratio = rmse_learned / np.maximum(rmse_base, 1e-12)
    truth = tool_truth(spec.urdf if not spec.shipped else spec.label, link)
    tp, blk = _params_over_time(bag, link)
    u = truth["urdf_block"]
    est_mass = blk[:, 0] - u[0] if len(blk) else np.array([np.nan])
    est_first = blk[-1, 1:4] - u[1:4] if len(blk) else np.full(3, np.nan)
    est_com = (est_first / est_mass[-1]).tolist()
    mass_err = abs(est_mass[-1] - truth["tool_mass"]) / truth["tool_mass"]
    com_err = float(np.linalg.norm(np.asarray(est_com) - truth["tool_com"]))

    print(f"\n{'joint':16s} {'baseline RMSE':>14s} {'learned RMSE':>13s} {'ratio':>7s}   [rad]")
    for j, nm in enumerate(names):
        print(f"{nm:16s} {rmse_base[j]:14.5f} {rmse_learned[j]:13.5f} {ratio[j]:7.3f}")
    print(f"\ntool on {link}: mass {est_mass[-1]:.3f} kg (true {truth['tool_mass']:.3f}, error {100 * mass_err:.1f} %),"
          f" centre of mass {np.round(est_com, 3).tolist()} m (true {np.round(truth['tool_com'], 3).tolist()},"
          f" error {1000 * com_err:.1f} mm)")
    plots = _plots(out, spec.label, names, tr, t_switch, duration, period, tp, est_mass, truth["tool_mass"], ratio)
    wall = time.monotonic() - t0   # set-up, the graph, the analysis and the plots
    summary = {"robot": spec.label, "tool_kg": TOOL["mass"], "learner": learner, "period_s": period,
               "switch_s": t_switch, "sim_time_s": duration, "wall_s": round(wall, 1),
               "baseline_rmse_rad": dict(zip(names, np.round(rmse_base, 6).tolist())),
               "learned_rmse_rad": dict(zip(names, np.round(rmse_learned, 6).tolist())),
               "learned_vs_baseline_rmse": dict(zip(names, np.round(ratio, 4).tolist())),
               "learned_vs_baseline_rmse_max": round(float(ratio.max()), 4),
               "tool_mass_kg": round(float(est_mass[-1]), 4), "tool_mass_true_kg": round(truth["tool_mass"], 4),
               "tool_mass_rel_error": round(float(mass_err), 4),
               "tool_com_m": np.round(est_com, 4).tolist(), "tool_com_true_m": np.round(truth["tool_com"], 4).tolist(),
               "tool_com_error_m": round(com_err, 4), "adapted_link": link,
               "recorded_coverage": round(coverage, 4), "phase_switches": director.switches, "bag": bag, "plots": plots, "targets": TARGETS}
    summary["targets_met"] = {k: summary[k] <= v for k, v in TARGETS.items()}
    summary["target_met"] = all(summary["targets_met"].values())
    with open(os.path.join(out, "demo.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    return summary


def _plots(out, label, names, tr, t_switch, duration, period, tp, est_mass, true_mass, ratio) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, e = tr["t"], tr["e"]
    fig, ax = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    worst = int(np.argmax(np.sqrt(np.mean(e[t < t_switch] ** 2, axis=0))))
    ax[0].plot(t, np.abs(e[:, worst]), lw=0.8, color="C3", label=f"|q_d - q|, {names[worst]} (largest baseline error)")
    ax[0].plot(t, np.sqrt(np.mean(e ** 2, axis=1)), lw=0.8, color="C0", label="RMS over the joints")
    ax[0].axvspan(0, t_switch, color="0.85", lw=0)
    ax[0].axvspan(duration - period, duration, color="C2", alpha=0.12, lw=0)
    ax[0].text(0.1, 0.03, "baseline:\nURDF model\n(not adapted)", transform=ax[0].get_xaxis_transform(),
               va="bottom", fontsize=8)
    ax[0].text(t_switch + 0.2, 0.03, "learning: composite adaptive control + residual", va="bottom", fontsize=8,
               transform=ax[0].get_xaxis_transform())
    ax[0].set_yscale("log")
    ax[0].set_ylim(1e-5, None)
    ax[0].set_ylabel("tracking error [rad]")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[0].set_title(f"{label} with an unmodelled tool: learned / baseline RMSE max {ratio.max():.3f}"
                    f" (last period, green)")
    if len(tp):
        ax[1].plot(np.r_[t_switch, tp], np.r_[0.0, est_mass], color="C1", label="estimated tool mass")
    ax[1].axhline(true_mass, color="k", ls="--", lw=1, label="true")
    ax[1].axvspan(0, t_switch, color="0.85", lw=0)
    ax[1].set_ylabel("tool mass [kg]")
    ax[1].set_xlabel("sim time [s]")
    ax[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    p1 = os.path.join(out, "learning.png")
    fig.savefig(p1, dpi=100)
    plt.close(fig)
    p2, p3 = tracking_plots(out, f"{label}: joint positions [rad]; the grey line: baseline -> learning", names, t,
                            tr["q"], tr["q"] + e, tr["tau"], switch=t_switch)
    return [p1, p2, p3]


def tracking_plots(out: str, title: str, names, t, q, q_ref, tau, switch: float | None = None) -> list[str]:
    """The demos' two plots: ``tracking.png`` (reference and measured position per joint)
    and ``errors_torques.png`` (``q_ref - q`` and the measured torque over time); a grey
    line at ``switch`` [s] when given.  Their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(names)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.4 * n + 1), sharex=True)
    for j, a in enumerate(np.atleast_1d(axes)):
        a.plot(t, q_ref[:, j], "k--", lw=1, label="reference")
        a.plot(t, q[:, j], lw=1, label="measured")
        if switch is not None:
            a.axvline(switch, color="0.5", lw=0.8)
        a.set_ylabel(names[j].split("_")[-1], fontsize=8)
    np.atleast_1d(axes)[0].legend(loc="upper right", fontsize=7)
    np.atleast_1d(axes)[-1].set_xlabel("sim time [s]")
    fig.suptitle(title)
    fig.tight_layout()
    p1 = os.path.join(out, "tracking.png")
    fig.savefig(p1, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax[0].plot(t, q_ref - q, lw=0.8)
    ax[0].set_ylabel("q_d - q [rad]")
    ax[0].legend(names, fontsize=6, ncol=4)
    ax[1].plot(t, tau, lw=0.8)
    ax[1].set_ylabel("measured torque [Nm]")
    ax[1].set_xlabel("sim time [s]")
    if switch is not None:
        for a in ax:
            a.axvline(switch, color="0.5", lw=0.8)
    fig.tight_layout()
    p2 = os.path.join(out, "errors_torques.png")
    fig.savefig(p2, dpi=100)
    plt.close(fig)
    return [p1, p2]
