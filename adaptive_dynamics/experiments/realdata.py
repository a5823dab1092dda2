"""Realistic proxies for real-robot torque recordings: identification and residual
learners with their defaults, judged on held-out data inside **and outside** the
training region.

``adaptive-dynamics experiment realdata --out DIR [--quick] [--part offline|closed_loop|all]
[--seconds S] [--learners gmm,rbfn,gp,sgpol,pgpol,joint_local] [--robots panda,iiwa14|URDF,...]
[--closed-loop-reality proxy|config]``

Two parts: ``offline`` (the recordings below) and ``closed_loop``
(:mod:`~adaptive_dynamics.experiments.closed_loop_regions`: the composite controller with
the residual learner over DDS learns on one trajectory, then follows another in another
part of the workspace; RMSE with the residual over without it, on both).

Real recordings are not shipped, so MuJoCo arms are made to look like them.  Two proxies
made differently, so that no default is tuned to one simulator:

* **panda** (:data:`~.proxies.REALITY`): Stribeck-like sigmoid joint friction (viscous + Coulomb
  with a 0.05 rad/s ``tanh`` + a break-away term), a torque-sensor bias per joint and
  noise, velocity and position noise, no measured acceleration, stamps at 1 kHz with
  timing jitter, and an end effector 0.5 kg heavier than the URDF's hand;
* **iiwa14** (:data:`~.proxies.SECOND_PROXY`): the same sensor, another friction law (twice the
  viscous friction, no Stribeck term, a position ripple ``0.3 sin(6 q)`` N m) and a 1 kg
  payload off the flange axis that becomes 1.5 kg between the two runs.

Each proxy records two excitations (Modified Fourier, tracked by a PD controller on the
URDF's model): the **training run** around the middle of the joint ranges -- its first
half identifies and trains, its second half is the same-trajectory test -- and the
**other run**, half as long, with other Fourier coefficients around a centre moved by
:data:`OTHER_SHIFT` of each joint's half range.  Held-out samples are split by
:mod:`~adaptive_dynamics.evaluation.regions` (inside: a training joint position within
0.1 rad).

* ``id``: least squares on the base parameters + viscous/Coulomb friction + offsets
  (:func:`~adaptive_dynamics.dynamics.identification.identify`, the recording cut into
  segments, filtered forward-backward at 20 Hz, q̈ from the filtered velocity, as
  ``adaptive-dynamics identify`` does); ``id_consistent``: the physically consistent
  variant (SDP); ``nominal``: the URDF's model;
* ``id + <learner>``: each registered learner with its **defaults**
  (``make_learner(kind, input_dim=3n, output_dim=n, prior=offsets)``) streamed the
  training half's residual ``tau - Y theta`` (the identified model without its offsets,
  as the controller runs it; the offsets are the learner's prior, so where it falls back
  it *is* the identification) at 100 Hz in time order, then predicting both test sets --
  with the fall-back to the prior (the default) and raw (``raw=True``), for comparison;
* ``batch_far``: each learner of the torque itself (``prior="mean"``, as the
  ``model_update`` node's ``target: torque``), streamed the training torques in batches
  of 100 and asked, without hints, about the held-out states outside the region,
  against the training mean.

Another arm (``--robots path/to/arm.urdf``, :mod:`~adaptive_dynamics.experiments.robot_choice`)
gets :data:`REALITY` scaled to it: its parameter file's friction, the Panda's sensor
bias as fractions of its effort limits, its model-derived PD gains.

JSON (``realdata.json``, printed last; :data:`TARGETS`): ``out_of_region_vs_id_max``
(every learner and proxy: the largest per-joint ratio of learner + identification to
identification alone, nMSE outside the region; target <= 1.05),
``in_region_vs_id_max`` (the best learner's, inside; target <= 0.5),
``batch_far_vs_prior_max`` (target <= 1.0), ``sigmoid_vs_linear_wrist_max`` (the
identification with the smooth Gaz et al. sigmoid friction of ``identify --friction``:
its held-out nMSE over the linear friction's, worst wrist joint over both test sets and
the proxies whose joints have a Stribeck term (``smooth_friction``: the Panda's; the
iiwa's has a position ripple instead, reported in ``..._per_proxy``); target <= 0.5;
``friction_vs_linear_wrist_max`` adds the Stribeck model; per proxy
``friction_heldout_nmse`` and ``friction_vs_linear``), each ``..._per_learner`` and the raw
learners' figures beside them; per proxy (``proxies``) every table: per-joint nMSE
inside / outside / all per test set, the regions' statistics, the fraction of
predictions pulled back.  The first proxy's same-trajectory figures keep their keys
(``nominal_nmse``, ``id_nmse``, ``id_consistent_nmse``, ``semiparam_nmse``,
``semiparam_vs_id_max``).  The closed loop adds ``learned_region_vs_no_residual_max``
(target <= 0.5) and ``new_region_vs_no_residual_max`` (target <= 1.05) and its tables
under ``closed_loop``; ``targets_met`` covers the parts that ran.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from ..control import AdaptiveController
from ..dynamics import RobotModel
from ..dynamics.identification import identify, identify_consistent, nmse, segments
from ..dynamics.joint_friction import identify_friction
from ..evaluation.identify import prepared_pieces, split_prepared
from ..evaluation.regions import region_summary, split_nmse
from ..learning import make_learner
from ..learning.base import PULLED_BACK
from ..robots import friction
from ..sim.plant import MujocoPlant, RealityConfig
from ..trajectories import ModifiedFourier
from . import closed_loop_regions as cl, save_plot, write_result
from . import add_graph_argument
from ..launcher import graph_kind
from .proxies import REALITY, proxy_reality, torque_bias
from .robot_choice import add_robot_args, chosen_robots, gains, is_shipped, label

EXCITATION = {"amplitude": 0.4, "base_frequency": 0.1, "harmonics": 4}
#: the other excitation's centre: moved by this fraction of each joint's half range
OTHER_SHIFT = 0.05
PROXIES = ("panda", "iiwa14")
LEARN_RATE_HZ = 100.0
LEARNERS = ("gmm", "rbfn", "gp", "sgpol", "pgpol", "joint_local")
TARGETS = {"out_of_region_vs_id_max": 1.05, "in_region_vs_id_max": 0.5, "batch_far_vs_prior_max": 1.0}
#: the smooth friction models identified beside the linear one (``identify --friction``)
FRICTION_MODELS = ("sigmoid", "stribeck")
#: the wrist joints of a 7-joint arm (``sigmoid_vs_linear_wrist_max``); other arms: the last three
WRIST = slice(-3, None)
#: the sigmoid model's held-out nMSE over the linear model's, worst wrist joint, both test sets
FRICTION_TARGET = {"sigmoid_vs_linear_wrist_max": 0.5}
#: the closed loop's --quick: learning and evaluation [sim s] on a trajectory period of 1 / base_frequency
CLOSED_LOOP_QUICK = {"learn_s": 8.0, "eval_s": 4.0, "base_frequency": 0.25,
                     # the node's 10 s warm-up would outlast the 8 s: the learner starts after 2 s;
                     # it learns in lockstep: the same run learns the same on any machine, under any load
                     "learner": {"warmup": 400, "learn_in_lockstep": True}}


def record(seconds: float, seed: int = 0, robot: str = "panda", *, trajectory_seed=None,
           centre_shift: float = 0.0, reality: dict = None) -> dict:
    """An excitation run: ``t`` (jittered stamps [s]), ``q``, ``qd``, ``tau`` (measured).
    ``trajectory_seed`` draws the Fourier coefficients (default ``seed``); the centre is
    the middle of the joint range moved by ``centre_shift`` of its half-width;
    ``reality`` replaces :data:`REALITY`'s entries it names."""

    m = RobotModel(robot)
    fv, fc = friction(robot)
    r = {**REALITY, **(reality or {})}
    fv = r.get("viscous_scale", 1.0) * fv
    reality = RealityConfig(friction_viscous=fv, friction_coulomb=r["coulomb_scale"] * fc,
                            coulomb_smoothing=r["coulomb_smoothing"],
                            friction_stribeck=r["stribeck_ratio"] * r["coulomb_scale"] * fc,
                            stribeck_velocity=r["stribeck_velocity"], tau_bias=torque_bias(robot, m.effort_limit),
                            ripple_amplitude=r.get("ripple_amplitude", 0.0),
                            ripple_periods=r.get("ripple_periods", 1.0),
                            noise_std_tau=r["noise_std_tau"], noise_std_v=r["noise_std_v"],
                            noise_std_q=r["noise_std_q"], payload_mass=r["ee_extra_mass"],
                            payload_com=r["ee_extra_com"], payload_enabled=r["ee_extra_mass"] > 0, seed=seed)
    e = EXCITATION
    half = 0.5 * (m.upper - m.lower)
    centre = 0.5 * (m.lower + m.upper) + float(centre_shift) * half
    tseed = seed if trajectory_seed is None else int(trajectory_seed)
    traj = ModifiedFourier.random(m.n, np.random.default_rng(tseed), q_center=centre,
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


def _stream(L, X, Y, every: int, batch: int) -> None:
    """Feed ``L`` every ``every``-th row of (X, Y) in time order, ``batch`` rows a call."""
    Xs, Ys = X[::every], Y[::every]
    for i in range(0, len(Xs), batch):
        L.partial_fit(Xs[i:i + batch], Ys[i:i + batch])


def _ratio(num, den) -> float:
    """Largest per-joint ratio (None when either part is missing)."""
    if num is None or den is None:
        return None
    return round(float(np.max(np.asarray(num) / np.maximum(np.asarray(den), 1e-300))), 4)


def evaluate(recs: dict, learners, seed: int = 0, robot: str = "panda") -> dict:
    """Identification and every learner on one proxy: ``recs["train"]`` (the excitation
    whose first half identifies and trains; its second half is the same-trajectory test)
    and ``recs["other"]`` (another excitation: other coefficients, shifted centre)."""

    model = RobotModel(robot, friction=True)
    rec = recs["train"]
    t = rec["t"]
    (q, qd, qdd, tau), (qt, qdt, qddt, taut), counts = split_prepared(
        t, rec["q"], rec["qd"], rec["tau"], 0.5, 20.0, 0, where="realdata")
    o = recs["other"]
    pieces, counts["other"] = segments(o["t"], o["q"], o["qd"], o["tau"])
    qo, qdo, qddo, tauo = prepared_pieces(pieces, 20.0, 0)
    res: dict = {"counts": counts, "samples": {"train": int(len(q)), "test": int(len(qt)), "other": int(len(qo))}}
    res["nominal_nmse"] = nmse(taut, model.regressor_batch(qt, qdt, qddt) @ model.parameters)
    ls = identify(model, q, qd, qdd, tau, offset=True)
    t0 = time.perf_counter()
    cons = identify_consistent(model, q, qd, qdd, tau, weights=1.0 / np.maximum(ls.residual_rmse, 1e-9), offset=True)
    res["id_consistent_s"] = round(time.perf_counter() - t0, 2)
    res["id_consistent_nmse"] = nmse(taut, cons.torque(model, qt, qdt, qddt))
    res["offsets_identified"] = [round(float(x), 3) for x in ls.offset]
    # the residual of the model the controller runs (no offset column): the learner's
    # prior is the identified offsets, so where it falls back it is the identification
    base_tr = ls.torque(model, q, qd, qdd, offset=False)
    X, Y = np.hstack([q, qd, qdd]), tau - base_tr
    step = max(1, int(round(len(q) / (0.5 * (t.max() - t.min()) * LEARN_RATE_HZ))))
    tests = {"same": (qt, qdt, qddt, taut), "other": (qo, qdo, qddo, tauo)}
    parts, regions = {}, {}
    for name, (a, b, c, y) in tests.items():
        base = ls.torque(model, a, b, c, offset=False)
        reg = region_summary(q, a)
        regions[name] = {k: v for k, v in reg.items() if k != "inside"}
        parts[name] = (np.hstack([a, b, c]), y, base, base + ls.offset, reg["inside"])
    res["regions"] = regions
    res["id_nmse"] = nmse(taut, parts["same"][3])
    pooled = {k: np.concatenate([parts[n][i] for n in tests]) for k, i in (("X", 0), ("y", 1), ("base", 2),
                                                                              ("id", 3), ("inside", 4))}
    # the joints' friction as the proxies have it (smooth Coulomb, Stribeck): the smooth
    # models of `identify --friction`, identified the same way, on both test sets
    fr_base = model.base_parameters()
    res["friction_heldout_nmse"] = {"linear": {n: nmse(parts[n][1], parts[n][3]) for n in tests}}
    for kind in FRICTION_MODELS:
        # (ls fits every sample, as identify_friction's own start would: reused)
        fit = identify_friction(model, q, qd, qdd, tau, kind, offset=True, linear=ls, base=fr_base)
        res["friction_heldout_nmse"][kind] = {n: nmse(y, fit.torque(model, a, b, c))
                                              for n, (a, b, c, y) in tests.items()}
    lin = res["friction_heldout_nmse"]["linear"]
    res["friction_vs_linear"] = {k: {n: [round(float(x / max(y, 1e-300)), 4) for x, y in zip(v[n], lin[n])]
                                     for n in tests} for k, v in res["friction_heldout_nmse"].items() if k != "linear"}
    res["id_region_nmse"] = {n: split_nmse(parts[n][1], parts[n][3], parts[n][4]) for n in tests}
    res["id_region_nmse"]["pooled"] = split_nmse(pooled["y"], pooled["id"], pooled["inside"])
    far = ~pooled["inside"]
    res["semiparam_nmse"], res["learner_seconds"], res["learner_counters"] = {}, {}, {}
    res["semiparam_region_nmse"], res["semiparam_region_nmse_raw"] = {}, {}
    res["in_region_vs_id"], res["out_of_region_vs_id"], res["out_of_region_vs_id_raw"] = {}, {}, {}
    res["batch_far_vs_prior"], res["batch_far_vs_prior_raw"], res["pulled_back_fraction"] = {}, {}, {}
    idr = res["id_region_nmse"]["pooled"]
    for kind in learners:
        L = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1], prior=ls.offset)
        t0 = time.perf_counter()
        _stream(L, X, Y, step, 50)                       # in time order, as a node learns
        P = L.predict(pooled["X"])
        res["learner_seconds"][kind] = round(time.perf_counter() - t0, 2)
        s = L.support(pooled["X"])
        low = (s if s.ndim == 1 else s.min(axis=1)) < PULLED_BACK
        n_same = len(parts["same"][0])
        res["pulled_back_fraction"][kind] = {"same": round(float(np.mean(low[:n_same])), 4),
                                             "other": round(float(np.mean(low[n_same:])), 4)}
        res["semiparam_nmse"][kind] = nmse(taut, parts["same"][2] + P[:n_same])
        L.set_prediction(raw=True)
        P_raw = L.predict(pooled["X"])
        res["learner_counters"][kind] = {k: int(v) for k, v in L._counters().items()}
        for key, PP in (("semiparam_region_nmse", P), ("semiparam_region_nmse_raw", P_raw)):
            res[key][kind] = split_nmse(pooled["y"], pooled["base"] + PP, pooled["inside"])
        r, rr = res["semiparam_region_nmse"][kind], res["semiparam_region_nmse_raw"][kind]
        res["in_region_vs_id"][kind] = _ratio(r["inside"], idr["inside"])
        res["out_of_region_vs_id"][kind] = _ratio(r["outside"], idr["outside"])
        res["out_of_region_vs_id_raw"][kind] = _ratio(rr["outside"], idr["outside"])
        # a learner of the torque itself (target torque: the model_update node's other mode),
        # fed the stream in batches of 100 and asked, without hints, about the far states
        T = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1], prior="mean")
        _stream(T, X, tau, step, 100)
        if far.sum() >= 20:
            yf, mean_tr = pooled["y"][far], tau.mean(axis=0)
            prior_mse = np.mean((yf - mean_tr) ** 2, axis=0)
            res["batch_far_vs_prior"][kind] = _ratio(np.mean((yf - T.predict(pooled["X"][far])) ** 2, axis=0),
                                                     prior_mse)
            T.set_prediction(raw=True)
            res["batch_far_vs_prior_raw"][kind] = _ratio(np.mean((yf - T.predict(pooled["X"][far])) ** 2, axis=0),
                                                         prior_mse)
    ratios = {k: float(np.max(v / res["id_nmse"])) for k, v in res["semiparam_nmse"].items()}
    best = min(ratios, key=ratios.get) if ratios else None
    res["semiparam_vs_id_max_per_learner"] = {k: round(v, 4) for k, v in ratios.items()}
    res["best_learner"] = best
    res["semiparam_vs_id_max"] = None if best is None else round(ratios[best], 4)
    return res


def _plot(res: dict, joints: list, out_dir: str, files: list, name: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    learners = list(res["semiparam_region_nmse"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    prefix = os.path.commonprefix(list(joints)) if len(joints) > 1 else ""
    x = np.arange(len(joints))
    for ax, part in zip(axes, ("inside", "outside")):
        rows = [("identified (LS)", res["id_region_nmse"]["pooled"][part])]
        rows += [(f"LS + {k}", res["semiparam_region_nmse"][k][part]) for k in learners]
        rows += [(f"LS + {k}, raw", res["semiparam_region_nmse_raw"][k][part]) for k in learners]
        rows = [(lab, v) for lab, v in rows if v is not None]
        w = 0.8 / max(1, len(rows))
        for i, (lab, vals) in enumerate(rows):
            hatch = "//" if lab.endswith("raw") else None
            ax.bar(x + (i - (len(rows) - 1) / 2) * w, vals, w, label=lab, hatch=hatch,
                   color=None if i < 1 + len(learners) else f"C{1 + (i - 1) % len(learners)}",
                   alpha=0.45 if hatch else 1.0)
        ax.set_yscale("log")
        ax.set_xticks(x, [j[len(prefix):] or j for j in joints])
        reg = res["regions"]
        ax.set_title(f"{part} the training region ({reg['same']['radius_rad']} rad)", fontsize=9)
    axes[0].set_ylabel("held-out nMSE")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.suptitle(f"{name}: identification alone vs + residual learners (defaults; raw = without the fall-back)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_plot(fig, out_dir, f"realdata_regions_{name}.png", files)


def _round(o):
    if isinstance(o, dict):
        return {k: _round(v) for k, v in o.items()}
    if isinstance(o, np.ndarray):
        return [float(f"{x:.4g}") for x in o]
    if isinstance(o, list) and o and isinstance(o[0], float):
        return [float(f"{x:.4g}") for x in o]
    return o


def _max(values) -> float:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def summarise(per_proxy: dict) -> dict:
    """The targets' keys over every proxy (module docstring)."""
    learners = sorted({k for r in per_proxy.values() for k in r["out_of_region_vs_id"]})
    out_l = {k: _max(r["out_of_region_vs_id"].get(k) for r in per_proxy.values()) for k in learners}
    in_l = {k: _max(r["in_region_vs_id"].get(k) for r in per_proxy.values()) for k in learners}
    far_l = {k: _max(r["batch_far_vs_prior"].get(k) for r in per_proxy.values()) for k in learners}
    best = min((k for k in learners if in_l[k] is not None), key=in_l.get, default=None)
    s = {"out_of_region_vs_id_max": _max(out_l.values()), "out_of_region_vs_id_max_per_learner": out_l,
         "in_region_vs_id_max": None if best is None else in_l[best], "in_region_best_learner": best,
         "in_region_vs_id_max_per_learner": in_l,
         "batch_far_vs_prior_max": _max(far_l.values()), "batch_far_vs_prior_max_per_learner": far_l,
         "out_of_region_vs_id_raw_max_per_learner": {
             k: _max(r["out_of_region_vs_id_raw"].get(k) for r in per_proxy.values()) for k in learners},
         "batch_far_vs_prior_raw_max_per_learner": {
             k: _max(r["batch_far_vs_prior_raw"].get(k) for r in per_proxy.values()) for k in learners}}
    met = {"out_of_region_vs_id_max": s["out_of_region_vs_id_max"] is not None
           and s["out_of_region_vs_id_max"] <= TARGETS["out_of_region_vs_id_max"],
           "in_region_vs_id_max": s["in_region_vs_id_max"] is not None
           and s["in_region_vs_id_max"] <= TARGETS["in_region_vs_id_max"],
           "batch_far_vs_prior_max": s["batch_far_vs_prior_max"] is not None
           and s["batch_far_vs_prior_max"] <= TARGETS["batch_far_vs_prior_max"]}
    # the target is the proxies whose joints have friction beyond viscous + Coulomb (a
    # Stribeck term); the others are reported beside it
    wrist, per = {}, {}
    for k in FRICTION_MODELS:
        per[k] = {name: _max(max(r["friction_vs_linear"][k][n][WRIST]) for n in r["friction_vs_linear"][k])
                  for name, r in per_proxy.items() if k in r.get("friction_vs_linear", {})}
        wrist[k] = _max(per[k][name] for name, r in per_proxy.items()
                        if name in per[k] and r.get("smooth_friction"))
    s["sigmoid_vs_linear_wrist_max"] = wrist.get("sigmoid")
    s["friction_vs_linear_wrist_max"] = wrist
    s["friction_vs_linear_wrist_max_per_proxy"] = per
    met["sigmoid_vs_linear_wrist_max"] = (s["sigmoid_vs_linear_wrist_max"] is not None
                                          and s["sigmoid_vs_linear_wrist_max"]
                                          <= FRICTION_TARGET["sigmoid_vs_linear_wrist_max"])
    return {**s, "targets": {**TARGETS, **FRICTION_TARGET}, "targets_met": met, "target_met": all(met.values())}


def offline(args, robots) -> tuple:
    """The recordings part (both test sets, every learner): ``(summary, plot files)``."""
    seconds = 30.0 if args.quick else args.seconds
    learners = [k for k in args.learners.split(",") if k]
    files: list = []
    per_proxy, realities = {}, {}
    for robot in robots:
        lim = RobotModel(robot).effort_limit
        reality, test_reality = proxy_reality(robot, lim)
        recs = {"train": record(seconds, args.seed, robot, reality=reality),
                "other": record(0.5 * seconds, args.seed + 1, robot, trajectory_seed=args.seed + 1000,
                                centre_shift=OTHER_SHIFT, reality=test_reality)}
        res = evaluate(recs, learners, args.seed, robot)
        res["smooth_friction"] = bool({**REALITY, **reality}["stribeck_ratio"] > 0)   # (the friction target's proxies)
        name = label(robot)
        _plot(res, recs["train"]["joints"], args.out, files, name)
        per_proxy[name] = _round(res)
        realities[name] = {"train": reality, "other": test_reality}
    first = next(iter(per_proxy.values()))
    out = {"seconds": seconds, "reality": realities[next(iter(realities))]["train"],
           "realities": realities, "excitation": EXCITATION, "other_excitation_shift": OTHER_SHIFT,
           "learners": learners, **summarise(per_proxy),
           # the first proxy's same-trajectory split, as the table in docs/learners.md
           **{k: first[k] for k in ("nominal_nmse", "id_nmse", "id_consistent_nmse", "semiparam_nmse",
                                    "semiparam_vs_id_max", "semiparam_vs_id_max_per_learner", "best_learner",
                                    "offsets_identified", "counts")},
           "proxies": per_proxy}
    return out, files


def closed_loop(args, robots) -> tuple:
    """The closed-loop part (:mod:`.closed_loop_regions`): ``(summary, plot files)``."""
    learn_s, eval_s = (CLOSED_LOOP_QUICK["learn_s"], CLOSED_LOOP_QUICK["eval_s"]) if args.quick else \
        (args.learn_seconds, args.eval_seconds)
    traj = {"base_frequency": CLOSED_LOOP_QUICK["base_frequency"]} if args.quick else None
    if args.closed_loop_stage != "all" and not args.closed_loop_work:
        raise SystemExit(f"--closed-loop-stage {args.closed_loop_stage} needs --closed-loop-work DIR")
    res = cl.run(robots, args.closed_loop_learner, learn_s, eval_s, args.seed, args.out, traj,
                 keep_bags=args.keep_bags, reality=args.closed_loop_reality,
                 learner_settings=CLOSED_LOOP_QUICK["learner"] if args.quick else None,
                 stage=args.closed_loop_stage, work=args.closed_loop_work)
    files = [os.path.join(args.out, f) for f in res["plots"]]
    return res, files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics experiment realdata",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="short version for tests: 30 s training recording;"
                    f" closed loop {CLOSED_LOOP_QUICK['learn_s']:g} s learning, {CLOSED_LOOP_QUICK['eval_s']:g} s"
                    f" evaluations on a {1 / CLOSED_LOOP_QUICK['base_frequency']:g} s trajectory period")
    ap.add_argument("--part", choices=["offline", "closed_loop", "all"], default="all",
                    help="offline: the recordings (learners judged on held-out data, ~2 min); closed_loop:"
                         " the composite controller + residual learner over DDS, learned and new region"
                         " (~5 min per robot); all (default): both")
    ap.add_argument("--seconds", type=float, default=120.0, help="length of the training excitation [s] (its"
                    " first half identifies and trains; the other excitation is half as long)")
    ap.add_argument("--learners", default=",".join(LEARNERS), help="comma-separated residual learners"
                    f" (default {','.join(LEARNERS)})")
    ap.add_argument("--closed-loop-learner", default="gmm", help="closed loop: the residual learner (default"
                    " gmm, the launch graph's)")
    ap.add_argument("--closed-loop-reality", choices=list(cl.REALITIES), default="proxy",
                    help="closed loop: proxy (default: this experiment's proxy of the robot in the bridge --"
                         " Stribeck friction or ripple, sensor bias and noise, a payload -- and friction columns in"
                         " the controller) or config (the simulator of `launch sim`, the robot's joint friction, the"
                         " controller without friction columns)")
    ap.add_argument("--learn-seconds", type=float, default=cl.LEARN_S, help="closed loop: sim s of learning on"
                    f" trajectory A (default {cl.LEARN_S:g})")
    ap.add_argument("--eval-seconds", type=float, default=cl.EVAL_S, help="closed loop: sim s of each"
                    f" evaluation, on A and on B (default {cl.EVAL_S:g})")
    ap.add_argument("--keep-bags", action="store_true", help="closed loop: keep the recordings and the saved"
                    " estimate / learner in DIR/closed_loop_<robot>")
    ap.add_argument("--closed-loop-stage", choices=cl.STAGES, default="all",
                    help="closed loop: all four runs (default), learn (A's two: learn, freeze, evaluate on A; the"
                         " learned region's figures) or new (B's two, from what a learn stage left in"
                         " --closed-loop-work; every figure)")
    ap.add_argument("--closed-loop-work", default=None, metavar="DIR",
                    help="closed loop: the directory the stages share (estimates, learner, bags; kept)")
    ap.add_argument("--seed", type=int, default=0)
    add_robot_args(ap, ",".join(PROXIES), extra_help="; each is one proxy (the iiwa 14: the second proxy's"
                   " friction law and payload change)")
    add_graph_argument(ap)
    args = ap.parse_args(argv)
    with graph_kind(args.graph):
        return _main(args, ap)


def _main(args, ap) -> int:
    robots = chosen_robots(args)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    out = {"experiment": "realdata", "part": args.part, "robots": [label(r) for r in robots],
           **({"urdf": [r for r in robots if not is_shipped(r)]} if not all(map(is_shipped, robots)) else {}),
           "quick": bool(args.quick)}
    files: list = []
    targets, met = {}, {}
    if args.part in ("offline", "all"):
        res, f = offline(args, robots)
        files += f
        targets.update(res.pop("targets"))
        met.update(res.pop("targets_met"))
        res.pop("target_met")
        out.update(res)
    if args.part in ("closed_loop", "all"):
        res, f = closed_loop(args, robots)
        files += f
        targets.update({k: v for k, v in cl.TARGETS.items() if k in res})
        met.update(res.pop("targets_met"))
        out.update({k: res[k] for k in cl.TARGETS if k in res})
        out["closed_loop"] = {k: v for k, v in res.items() if k not in cl.TARGETS and k != "plots"}
    out.update({"targets": targets, "targets_met": met, "target_met": all(met.values()),
                "plots": [os.path.basename(f) for f in files], "runtime_s": round(time.perf_counter() - t0, 1)})
    return write_result(args.out, "realdata", out)

if __name__ == "__main__":
    sys.exit(main())
