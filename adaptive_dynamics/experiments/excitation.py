"""Optimised excitation against the default Fourier trajectory, and the flange load.

``adaptive-dynamics experiment excitation --out DIR [--quick] [--robots panda,iiwa14,ur5,ur10]
[--payload-robots panda,iiwa14]``

**Whole arm.**  Per robot, ``excite``'s optimised periodic Fourier trajectory
(:func:`~adaptive_dynamics.trajectories.excitation.optimise_excitation`: condition number of
the stacked base regressor with viscous/Coulomb friction columns, joint position, velocity,
acceleration and effort limits, rest at the ends) against the trajectory node's default
excitation of the same period, harmonics and limits
(:func:`~adaptive_dynamics.trajectories.excitation.default_fourier`).  Each is tracked
for one period in MuJoCo (PD + the URDF's model, the robot's joint friction -- viscous +
smooth Coulomb -- and ``experiment realdata``'s torque-sensor bias and noise, velocity and
position noise; no drive armature, so the truth is the URDF's rigid body and the
configured friction) and identified the same way (``identify --min-velocity 0.05``:
filtered forward and backward at 20 Hz, least squares on the base parameters + friction +
offsets, each joint's samples slower than 0.05 rad/s left out).  Figures:
the condition number; the identified base parameters' error against the simulator's
truth, ``|theta - theta*| / |theta*|`` over the base parameters and friction; the
held-out torque nMSE per joint on a third trajectory (another Fourier excitation, other
coefficients and centre, not optimised).

**Flange load** (``--payload-robots``).  The arm's model fixed (the URDF + the proxy's
viscous and Coulomb friction; :func:`_payload_reality`: ``experiment realdata``'s joint
friction, Stribeck term included, and sensor), ``identify --payload`` on a wrist excitation
(``excite --payload``: the last three joints, :data:`PAYLOAD_SECONDS`) recorded with
tools of :data:`TOOLS` (0.2-3 kg, centres of mass off the flange axis, anisotropic
inertia), the same sensor; and, for comparison, on a recording of the direct adaptive
controller (from the URDF's model, adapting) tracking the whole-arm default excitation: a
motion made for nothing in particular.

JSON (``excitation.json``, printed last; :data:`TARGETS`): ``condition_vs_default_max``
(worst robot: optimised condition number over the default's; target <= 1/3),
``param_error_vs_default_max`` (worst robot: the optimised trajectory's parameter error
over the default's; target <= 1/3), ``heldout_nmse_vs_default_max``;
``payload_mass_rel_error_max`` (target <= 0.02) and ``payload_com_error_m_max`` (target
<= 0.005) over the tools and robots on the wrist excitation, and the same from the
whole-arm recording under ``payload_from_tracking``; per robot every figure.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from ..control import AdaptiveController
from ..dynamics import RobotModel
from ..dynamics.identification import identify, MIN_VELOCITY, nmse, prepare
from ..dynamics.payload import identify_payload
from ..robot_setup import resolve_robot
from ..robots import friction, ROBOT_NAMES
from ..sim.plant import MujocoPlant, RealityConfig
from ..trajectories import ModifiedFourier
from ..trajectories.excitation import (default_fourier, excitation_columns, optimise_excitation,
                                       payload_excitation_columns, trajectory_condition)
from . import save_plot, write_result
from .arms import ARMS, robots_dir
from .proxies import proxy_reality, REALITY, torque_bias
from .robot_choice import gains, label

TARGETS = {"condition_vs_default_max": 1.0 / 3.0, "param_error_vs_default_max": 1.0 / 3.0,
           "payload_mass_rel_error_max": 0.02, "payload_com_error_m_max": 0.005}
#: the whole-arm excitation: period [s], harmonics, optimiser starts, samples per period
FULL = {"duration": 20.0, "harmonics": 5, "starts": 4, "samples": 100}
QUICK = {"duration": 10.0, "harmonics": 3, "starts": 1, "samples": 48}
#: the held-out trajectory: the trajectory node's Fourier form, another seed, centre moved by
#: this fraction of each joint's half range
HELD_OUT = {"seed": 7, "amplitude": 0.4, "base_frequency": 0.1, "harmonics": 4, "centre_shift": 0.1,
            "seconds": 20.0}
#: the flange loads: mass [kg], centre of mass in the end-effector frame [m], inertia about
#: it (xx, xy, xz, yy, yz, zz) [kg m^2]
TOOLS = [
    {"mass": 0.2, "com": (0.01, -0.005, 0.03), "inertia": (2e-4, 1e-5, 0.0, 3e-4, 0.0, 1.5e-4)},
    {"mass": 1.0, "com": (0.02, 0.01, 0.05), "inertia": (4e-3, 2e-4, -1e-4, 5e-3, 1e-4, 3e-3)},
    {"mass": 3.0, "com": (-0.015, 0.02, 0.08), "inertia": (0.012, 5e-4, 3e-4, 0.015, -4e-4, 0.008)},
]
QUICK_TOOLS = TOOLS[1:2]
#: the wrist excitation's period [s] (``excite --payload``; at most 15 s)
PAYLOAD_SECONDS = 10.0
DEFAULT_ROBOTS = "panda,iiwa14,ur5,ur10"
#: samples per period the condition numbers are evaluated on (both trajectories alike)
CONDITION_SAMPLES = 400
#: the iiwa proxy's position ripple (0.3 sin(6 q) N m), left out of the flange-load runs: unmodelled,
#: it swamps a light tool's torques (measured: 0.2 kg +218 %, 1 kg +47 %, 3 kg +15 % in mass)
RIPPLE_NOTE = "the proxy's position ripple is left out (unmodelled, it swamps a light tool)"
#: the sensor of ``experiment realdata``'s proxies (no Stribeck term, no payload: the truth is defined)
SENSOR = {k: REALITY[k] for k in ("noise_std_tau", "noise_std_v", "noise_std_q")}


def robot_path(name: str) -> str:
    """A shipped robot's name as it is; an arm of :data:`~.arms.ARMS` (``ur5``) or a URDF
    file resolved to the locked URDF the other experiments use."""
    if name in ROBOT_NAMES:
        return name
    arms = {a[0]: a for a in ARMS}
    if name in arms:
        _, rel, joints, ee = arms[name]
        return resolve_robot(os.path.join(robots_dir(), rel), joints, ee).urdf
    if os.path.isfile(name):
        return resolve_robot(name, None, None).urdf
    raise SystemExit(f"robot {name!r}: a shipped robot {sorted(ROBOT_NAMES)}, one of {sorted(arms)} or a URDF file")


def _reality(robot: str, model, seed: int, tool: dict | None = None) -> RealityConfig:
    fv, fc = friction(robot)
    kw = {}
    if tool is not None:
        kw = {"payload_mass": tool["mass"], "payload_com": list(tool["com"]),
              "payload_inertia": list(tool["inertia"]), "payload_enabled": True}
    return RealityConfig(friction_viscous=fv, friction_coulomb=fc, tau_bias=torque_bias(robot, model.effort_limit),
                         seed=seed, **SENSOR, **kw)


def _payload_reality(robot: str, model, seed: int, tool: dict) -> tuple:
    """``(RealityConfig, arm friction)`` of the flange-load runs: ``experiment realdata``'s
    proxy friction of the arm (the Panda's 1.5x Coulomb with a Stribeck term and a 0.05
    rad/s smoothing; another arm's doubled viscous friction) and its sensor, the tool on
    the end effector -- without the proxy's heavier hand and position ripple (a cogging
    torque, not friction: :data:`RIPPLE_NOTE`); the arm friction ``identify --payload`` is
    given is the proxy's viscous + Coulomb part (its Stribeck term stays unmodelled)."""
    r, _ = proxy_reality(robot, model.effort_limit)
    fv, fc = friction(robot)
    fv, fc = r.get("viscous_scale", 1.0) * np.asarray(fv), r["coulomb_scale"] * np.asarray(fc)
    rc = RealityConfig(friction_viscous=fv, friction_coulomb=fc, coulomb_smoothing=r["coulomb_smoothing"],
                       friction_stribeck=r["stribeck_ratio"] * fc, stribeck_velocity=r["stribeck_velocity"],
                       tau_bias=r["tau_bias"], noise_std_tau=r["noise_std_tau"], noise_std_v=r["noise_std_v"],
                       noise_std_q=r["noise_std_q"], payload_mass=tool["mass"], payload_com=list(tool["com"]),
                       payload_inertia=list(tool["inertia"]), payload_enabled=True, seed=seed)
    return rc, (fv, fc)


def track(robot: str, Q, V, A, reality: RealityConfig, dt: float = 1e-3, integrator: str = "implicitfast",
          adapt: bool = False) -> dict:
    """The MuJoCo arm following (Q, V, A) (rows at ``dt``) with PD + the URDF's model
    (``adapt``: the direct adaptive law from it, adapting as it tracks); returns the
    recording as the robot reports it and the saturation count."""
    m = RobotModel(robot)
    plant = MujocoPlant(robot, reality=reality, q0=Q[0], integrator=integrator)
    pd = AdaptiveController(m, "direct", pi0=m.parameters.copy(), **gains(robot))
    out = np.empty((len(Q), 3 * m.n))
    for k in range(len(Q)):
        _, q, v, tm = plant.state()
        out[k] = np.concatenate([q, v, tm])
        plant.step(pd.compute(q, v, Q[k], V[k], A[k], learn=adapt))
    n = m.n
    return {"t": np.arange(len(Q)) * dt, "q": out[:, :n], "qd": out[:, n:2 * n], "tau": out[:, 2 * n:],
            "saturated_steps": int(np.max(plant.saturation_count)),
            "payload_inertia": plant.payload_inertia.copy()}            # the truth, 3 x 3 about the CoM


def _samples(traj, seconds: float, dt: float = 1e-3):
    t = np.arange(0.0, seconds, dt)
    return traj.sample_many(t)


def held_out(robot: str, model) -> tuple:
    h = HELD_OUT
    lo, hi = np.where(np.isfinite(model.lower), model.lower, -math.pi), np.where(np.isfinite(model.upper),
                                                                                  model.upper, math.pi)
    half = 0.5 * (hi - lo)
    centre = 0.5 * (lo + hi) + h["centre_shift"] * half * (-1.0) ** np.arange(model.n)
    traj = ModifiedFourier.random(model.n, np.random.default_rng(h["seed"]), q_center=centre,
                                  amplitude=h["amplitude"], w_f=2 * math.pi * h["base_frequency"], L=h["harmonics"],
                                  lower=lo, upper=hi, vel_limit=0.8 * model.velocity_limit,
                                  acc_limit=np.full(model.n, 8.0), margin=0.1)
    return _samples(traj, h["seconds"])


def arm_part(robot: str, cfg: dict, seed: int = 0) -> dict:
    """Condition number, parameter error and held-out nMSE of the optimised and the default
    excitation on one robot."""
    m = RobotModel(robot)
    mf = RobotModel(robot, friction=True)
    fv, fc = friction(robot)
    truth = mf.base_parameters().to_base(np.concatenate([m.parameters, fv, fc]))
    t0 = time.perf_counter()
    opt = optimise_excitation(m, duration=cfg["duration"], harmonics=cfg["harmonics"], starts=cfg["starts"],
                              samples=cfg["samples"], seed=seed)
    opt_s = time.perf_counter() - t0
    dflt = default_fourier(m, duration=cfg["duration"], harmonics=cfg["harmonics"])
    cols = excitation_columns(mf, np.arange(m.n), dflt.rest)   # the base parameters + friction
    Qh, Vh, Ah = held_out(robot, m)
    rec_h = track(robot, Qh, Vh, Ah, _reality(robot, m, seed + 3))
    test = prepare(rec_h["t"], rec_h["q"], rec_h["qd"], rec_h["tau"])
    out = {"optimise_s": round(opt_s, 1), "held_out_saturated_steps": rec_h["saturated_steps"]}
    for key, traj in (("optimised", opt), ("default", dflt)):
        Q, V, A = _samples(traj, cfg["duration"])
        rec = track(robot, Q, V, A, _reality(robot, m, seed + 1))
        ident = identify(mf, *prepare(rec["t"], rec["q"], rec["qd"], rec["tau"]), offset=True,
                         min_velocity=MIN_VELOCITY)
        err = float(np.linalg.norm(ident.theta - truth) / np.linalg.norm(truth))
        out[key] = {"condition": trajectory_condition(m, traj, cols, samples=CONDITION_SAMPLES),
                    "param_rel_error": err,
                    "heldout_nmse": [float(x) for x in nmse(test[3], ident.torque(mf, *test[:3]))],
                    "saturated_steps": rec["saturated_steps"],
                    "max_abs_qd": [float(x) for x in np.abs(V).max(0)]}
    o, d = out["optimised"], out["default"]
    out["condition_vs_default"] = o["condition"] / d["condition"]
    out["param_error_vs_default"] = o["param_rel_error"] / d["param_rel_error"]
    out["heldout_nmse_vs_default_max"] = float(np.max(np.asarray(o["heldout_nmse"])
                                                      / np.maximum(d["heldout_nmse"], 1e-12)))
    out["feasible"] = bool(opt.info.get("feasible", True))
    out["self_collision"] = opt.info.get("self_collision", {})
    return out


def payload_part(robot: str, tools, seconds: float, cfg: dict, seed: int = 0) -> dict:
    """Each tool identified from the wrist excitation and from the whole-arm default excitation."""
    m = RobotModel(robot)
    wrist = optimise_excitation(m, duration=seconds, harmonics=cfg["harmonics"], starts=cfg["starts"],
                                samples=cfg["samples"], seed=seed, payload=True)
    Qw, Vw, Aw = _samples(wrist, seconds)
    dflt = default_fourier(m, duration=cfg["duration"], harmonics=cfg["harmonics"])
    pcols = payload_excitation_columns(m)[0]
    Qd, Vd, Ad = _samples(dflt, cfg["duration"])
    rows = []
    for i, tool in enumerate(tools):
        row = {"mass": tool["mass"], "com": list(tool["com"])}
        for key, (Q, V, A) in (("wrist", (Qw, Vw, Aw)), ("tracking", (Qd, Vd, Ad))):
            reality, fr = _payload_reality(robot, m, seed + 10 + i, tool)
            rec = track(robot, Q, V, A, reality, adapt=key == "tracking")
            est = identify_payload(m, *prepare(rec["t"], rec["q"], rec["qd"], rec["tau"]), friction=fr)
            row[key] = {"mass": float(est.mass), "com": [float(x) for x in est.com],
                        "mass_rel_error": abs(est.mass - tool["mass"]) / tool["mass"],
                        "com_error_m": float(np.linalg.norm(np.asarray(est.com) - tool["com"])),
                        "inertia_error_rel": float(np.linalg.norm(est.inertia - rec["payload_inertia"])
                                                   / np.linalg.norm(rec["payload_inertia"])),
                        "mass_std": float(est.mass_std), "saturated_steps": rec["saturated_steps"],
                        "seconds": float(len(Q) * 1e-3)}
        rows.append(row)
    moving = [m.joint_names.index(j) for j in wrist.info["moving_joints"]]     # the rows the fit keeps
    return {"wrist_condition": trajectory_condition(m, wrist, pcols, samples=CONDITION_SAMPLES, rows=moving),
            "tracking_condition": trajectory_condition(m, dflt, pcols, samples=CONDITION_SAMPLES),
            "wrist_seconds": seconds,
            "wrist_joints": list(wrist.info.get("moving_joints", [])), "tools": rows}


def _plot(res: dict, out_dir: str, files: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    robots = list(res["robots"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = np.arange(len(robots))
    for ax, key, title in ((axes[0], "condition", "condition number of W"),
                           (axes[1], "param_rel_error", "base-parameter error |θ-θ*|/|θ*|")):
        for j, (which, colour) in enumerate((("default", "tab:grey"), ("optimised", "tab:blue"))):
            ax.bar(x + 0.38 * (j - 0.5), [res["robots"][r][which][key] for r in robots], 0.38, color=colour,
                   label=which)
        ax.set_yscale("log")
        ax.set_xticks(x, robots)
        ax.set_title(title)
        ax.legend()
    ax = axes[2]
    for j, (which, colour) in enumerate((("default", "tab:grey"), ("optimised", "tab:blue"))):
        ax.bar(x + 0.38 * (j - 0.5), [max(res["robots"][r][which]["heldout_nmse"]) for r in robots], 0.38,
               color=colour, label=which)
    ax.set_yscale("log")
    ax.set_xticks(x, robots)
    ax.set_title("held-out torque nMSE, worst joint")
    ax.legend()
    fig.suptitle("optimised excitation against the default Fourier trajectory (same period and limits)")
    fig.tight_layout()
    save_plot(fig, out_dir, "excitation_arms.png", files)
    if res.get("payload"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for robot, p in res["payload"].items():
            masses = [t["mass"] for t in p["tools"]]
            for key, style in (("wrist", "-o"), ("tracking", "--s")):
                axes[0].plot(masses, [100 * t[key]["mass_rel_error"] for t in p["tools"]], style,
                             label=f"{robot}, {key}")
                axes[1].plot(masses, [1000 * t[key]["com_error_m"] for t in p["tools"]], style,
                             label=f"{robot}, {key}")
        axes[0].axhline(100 * TARGETS["payload_mass_rel_error_max"], color="k", lw=0.8, ls=":")
        axes[1].axhline(1000 * TARGETS["payload_com_error_m_max"], color="k", lw=0.8, ls=":")
        axes[0].set(xlabel="tool mass [kg]", ylabel="mass error [%]", yscale="log", title="identified tool mass")
        axes[1].set(xlabel="tool mass [kg]", ylabel="centre-of-mass error [mm]", yscale="log",
                    title="identified centre of mass")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        save_plot(fig, out_dir, "excitation_payload.png", files)


def summarise(res: dict) -> dict:
    arms = res["robots"]
    out = {"condition_vs_default_max": max(r["condition_vs_default"] for r in arms.values()),
           "param_error_vs_default_max": max(r["param_error_vs_default"] for r in arms.values()),
           "heldout_nmse_vs_default_max": max(r["heldout_nmse_vs_default_max"] for r in arms.values())}
    if res.get("payload"):
        tools = [t for p in res["payload"].values() for t in p["tools"]]
        out["payload_mass_rel_error_max"] = max(t["wrist"]["mass_rel_error"] for t in tools)
        out["payload_com_error_m_max"] = max(t["wrist"]["com_error_m"] for t in tools)
        out["payload_from_tracking"] = {"mass_rel_error_max": max(t["tracking"]["mass_rel_error"] for t in tools),
                                        "com_error_m_max": max(t["tracking"]["com_error_m"] for t in tools)}
    out["targets"] = {k: v for k, v in TARGETS.items() if k in out}
    out["targets_met"] = {k: bool(out[k] <= v) for k, v in out["targets"].items()}
    return out


def _round(o):
    if isinstance(o, float):
        return float(f"{o:.5g}")
    if isinstance(o, dict):
        return {k: _round(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_round(v) for v in o]
    return o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment excitation", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true",
                    help="short version for tests: the Panda, a 10 s period with 3 harmonics and one start, one tool")
    ap.add_argument("--robots", default=None,
                    help=f"comma-separated: panda, iiwa14, an arm of example-robot-data ({', '.join(a[0] for a in ARMS)})"
                         f" or a URDF file (default {DEFAULT_ROBOTS}; --quick: panda)")
    ap.add_argument("--payload-robots", default=None,
                    help="comma-separated robots for the flange-load part (default panda,iiwa14; --quick: panda;"
                         " 'none' skips it)")
    ap.add_argument("--seed", type=int, default=0, help="optimiser and sensor-noise seed")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cfg = QUICK if args.quick else FULL
    robots = [robot_path(r.strip()) for r in (args.robots or ("panda" if args.quick else DEFAULT_ROBOTS)).split(",")
              if r.strip()]
    pl = args.payload_robots or ("panda" if args.quick else "panda,iiwa14")
    payload_robots = [] if pl == "none" else [robot_path(r.strip()) for r in pl.split(",") if r.strip()]
    res: dict = {"config": {**cfg, "held_out": HELD_OUT, "sensor": SENSOR}, "robots": {}, "payload": {}}
    t0 = time.perf_counter()
    for robot in robots:
        print(f"[excitation] {label(robot)}: optimising and tracking ...", flush=True)
        res["robots"][label(robot)] = arm_part(robot, cfg, args.seed)
        r = res["robots"][label(robot)]
        print(f"[excitation]   cond {r['optimised']['condition']:.3g} vs {r['default']['condition']:.3g},"
              f" parameter error {r['optimised']['param_rel_error']:.3g} vs {r['default']['param_rel_error']:.3g}",
              flush=True)
    tools = QUICK_TOOLS if args.quick else TOOLS
    for robot in payload_robots:
        print(f"[excitation] {label(robot)}: flange loads ...", flush=True)
        res["payload"][label(robot)] = payload_part(robot, tools, PAYLOAD_SECONDS, cfg, args.seed)
    files: list = []
    _plot(res, args.out, files)
    summary = {**summarise(res), **_round(res), "plots": files, "wall_s": round(time.perf_counter() - t0, 1)}
    return write_result(args.out, "excitation", summary)


if __name__ == "__main__":
    raise SystemExit(main())
