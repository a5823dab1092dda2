#!/usr/bin/env python3
"""Regressor benchmark (issue 2): our regressors vs pinocchio's computeJointTorqueRegressor.

Times, in one process and interleaved round by round (so CPU frequency changes hit
every candidate alike), pinocchio's standard regressor and our standard, Slotine-Li,
filtered (W + filtered torque update) regressors and the three state derivatives, on
the Panda; then the scaling with chain length (1, 2, 4, 8 Panda arms stacked into one
serial chain with pinocchio.appendModel, as ARDL Fig. 1 does with the LWR IV).
Each figure is the best (minimum) per-call time over the rounds; each ratio is our
time / pinocchio's standard time measured in the same run.

Last line of output: one JSON object.  Usage: ./dev bench regressors [--quick]
"""
from __future__ import annotations

import argparse
import json
import sys
import timeit

import numpy as np
import pinocchio as pin

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.robots import urdf_path

TARGETS = {"standard_ratio": 1.2, "slotine_li_ratio": 2.5, "filtered_ratio": 4.0}


def stacked_panda(k: int) -> pin.Model:
    """k Panda arms in one serial chain: arm i+1's base fixed to arm i's flange."""
    base = pin.buildModelFromUrdf(urdf_path("panda"))
    model = base
    for i in range(1, k):
        flange = model.getFrameId("panda_link8") if i == 1 else model.getFrameId(f"a{i - 1}_panda_link8")
        nxt = base.copy()
        for j in range(1, nxt.njoints):
            nxt.names[j] = f"a{i}_{nxt.names[j]}"
        for f in nxt.frames:
            f.name = f"a{i}_{f.name}"
        model = pin.appendModel(model, nxt, flange, pin.SE3.Identity())
    return model


def measure(rm: RobotModel, rounds: int, number: int, with_extras: bool) -> dict:
    rng = np.random.default_rng(0)
    q, v, a = rm.random_state(rng)
    vr, ar = rng.standard_normal(rm.n), rng.standard_normal(rm.n)
    tau = rm.inverse_dynamics(q, v, a)
    ref_model = rm.model.copy()
    ref_data = ref_model.createData()
    reg = pin.computeJointTorqueRegressor
    F = rm.filtered_regressor(lam=20.0, dt=1e-3)
    F.update(q, v, tau)
    dpi = rng.standard_normal(rm.n_params)
    cands = {
        "pinocchio_standard": lambda: reg(ref_model, ref_data, q, v, a),
        "standard": lambda: rm.regressor(q, v, a),
        "slotine_li": lambda: rm.slotine_li_regressor(q, v, vr, ar),
        "filtered": lambda: F.update(q, v, tau),
    }
    if with_extras:
        cands["derivatives"] = lambda: rm.regressor_derivatives(q, v, a, dpi)
    best = {k: float("inf") for k in cands}
    for _ in range(rounds):
        for k, f in cands.items():
            n = number if k != "derivatives" else max(1, number // 5)
            best[k] = min(best[k], timeit.timeit(f, number=n) / n * 1e6)
    out = {f"{k}_us": round(t, 3) for k, t in best.items()}
    ref = best["pinocchio_standard"]
    for k in cands:
        if k != "pinocchio_standard":
            out[f"{k}_ratio"] = round(best[k] / ref, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, noisier)")
    args = ap.parse_args(argv)
    rounds, number = (5, 200) if args.quick else (40, 400)

    panda = RobotModel("panda")
    res = measure(panda, rounds, number, with_extras=True)
    # (the compiled Slotine-Li kernel is loaded/compiled and exercised when a RobotModel
    # is built, so no compilation is timed)
    print(f"panda ({panda.n} DoF, {panda.n_params} parameters;"
          f" Slotine-Li implementation: {panda.slotine_li_implementation}):")
    for k, val in res.items():
        print(f"  {k:28s} {val}")

    scaling = {}
    for k in (1, 2, 4, 8):
        rm = RobotModel(stacked_panda(k))
        r = measure(rm, max(3, rounds // 4), max(20, number // (2 * k)), with_extras=False)
        scaling[str(rm.n)] = r
        print(f"stack of {k} ({rm.n} DoF): " + ", ".join(f"{a}={b}" for a, b in r.items()))

    result = {"robot": "panda", "dof": panda.n,
              "pinocchio_standard_us": res["pinocchio_standard_us"],
              "standard_us": res["standard_us"], "slotine_li_us": res["slotine_li_us"],
              "filtered_us": res["filtered_us"], "derivatives_us": res["derivatives_us"],
              "standard_ratio": res["standard_ratio"], "slotine_li_ratio": res["slotine_li_ratio"],
              "filtered_ratio": res["filtered_ratio"], "derivatives_ratio": res["derivatives_ratio"],
              "slotine_li_implementation": panda.slotine_li_implementation,
              "scaling": scaling, "targets": TARGETS}
    result["meets_targets"] = all(result[k] <= v for k, v in TARGETS.items())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
