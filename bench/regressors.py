#!/usr/bin/env python3
"""Regressor benchmark: our regressors against pinocchio's computeJointTorqueRegressor.

Times, in one process and interleaved pass by pass (so CPU frequency changes hit every
candidate alike), on the Panda at 64 random in-limit states: pinocchio's standard
regressor, our standard, Slotine-Li and filtered (W + filtered torque, one sample)
regressors, and the state derivatives d(Y dpi)/d(q, v, a) of the consistency transform
(``derivatives``: one dpi over all states, as a transform applies one dpi to every
point; ``derivatives_new_dpi``: a different dpi at every call).  A pass calls a
candidate once at every state; its per-call time is one sample; each figure is the
median over passes (``*_us``), also in machine units (``*_units``, see
``bench/machine_unit.py``: pinocchio's regressor on the Panda at random states, measured
in the same run).  Then the scaling with chain length (1, 2, 4, 8 Panda arms stacked into
one serial chain with pinocchio.appendModel, as ARDL Fig. 1 does with the LWR IV), as
ratios to pinocchio's regressor on the same chain.

Targets (machine units): standard <= 1.2, Slotine-Li <= 2.5, filtered <= 3,
derivatives <= 15.  Last line of output: one JSON object.
Usage: ./dev bench regressors [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pinocchio as pin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_unit import MachineUnit  # noqa: E402

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.robots import urdf_path

TARGETS = {"standard_units": 1.2, "slotine_li_units": 2.5, "filtered_units": 3.0, "derivatives_units": 15.0}


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


def measure(rm: RobotModel, passes: int, with_extras: bool, n_states: int = 64) -> dict:
    """Median per-call time [us] of every candidate over ``passes`` passes of the states."""
    rng = np.random.default_rng(0)
    states = [rm.random_state(rng) for _ in range(n_states)]
    refs = [(rng.standard_normal(rm.n), rng.standard_normal(rm.n)) for _ in range(n_states)]
    taus = [rm.inverse_dynamics(q, v, a) for q, v, a in states]
    dpis = [rng.standard_normal(rm.n_params) for _ in range(n_states)]
    ref_model = rm.model.copy()
    ref_data = ref_model.createData()
    reg = pin.computeJointTorqueRegressor
    F = rm.filtered_regressor(lam=20.0, dt=1e-3)
    F.update(*states[0][:2], taus[0])
    dpi = dpis[0]
    cands = {
        "pinocchio_standard": lambda q, v, a, k: reg(ref_model, ref_data, q, v, a),
        "standard": lambda q, v, a, k: rm.regressor(q, v, a),
        "slotine_li": lambda q, v, a, k: rm.slotine_li_regressor(q, v, *refs[k]),
        "filtered": lambda q, v, a, k: F.update(q, v, taus[k]),
    }
    if with_extras:
        cands["derivatives"] = lambda q, v, a, k: rm.regressor_derivatives(q, v, a, dpi)
        cands["derivatives_new_dpi"] = lambda q, v, a, k: rm.regressor_derivatives(q, v, a, dpis[k])
    seq = [(q, v, a, k) for k, (q, v, a) in enumerate(states)]
    samples = {k: [] for k in cands}
    clock = time.perf_counter_ns
    for name, f in cands.items():  # warm-up
        for x in seq[:8]:
            f(*x)
    for _ in range(passes):
        for name, f in cands.items():
            t0 = clock()
            for x in seq:
                f(*x)
            samples[name].append((clock() - t0) / 1e3 / len(seq))
    med = {k: float(np.median(v)) for k, v in samples.items()}
    out = {f"{k}_us": round(t, 3) for k, t in med.items()}
    ref = med["pinocchio_standard"]
    for k in cands:
        if k != "pinocchio_standard":
            out[f"{k}_ratio"] = round(med[k] / ref, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, noisier)")
    args = ap.parse_args(argv)
    passes = 15 if args.quick else 150

    unit = MachineUnit()
    panda = RobotModel("panda")
    res = measure(panda, passes, with_extras=True)
    unit.sample()
    # (the compiled Slotine-Li kernel is loaded/compiled and exercised when a RobotModel
    # is built, so no compilation is timed)
    print(f"panda ({panda.n} DoF, {panda.n_params} parameters;"
          f" Slotine-Li implementation: {panda.slotine_li_implementation},"
          f" filtered: {panda.filtered_regressor(1.0, 1e-3).implementation};"
          f" machine unit {unit.us:.3f} us):")
    unit.add_units(res)
    for k, val in res.items():
        print(f"  {k:28s} {val}")

    scaling = {}
    for k in (1, 2, 4, 8):
        rm = RobotModel(stacked_panda(k))
        r = measure(rm, max(5, passes // (4 * k)), with_extras=False, n_states=32)
        scaling[str(rm.n)] = r
        print(f"stack of {k} ({rm.n} DoF): " + ", ".join(f"{a}={b}" for a, b in r.items()))
    unit.sample()

    result = {"robot": "panda", "dof": panda.n, **unit.report()}
    names = ("pinocchio_standard", "standard", "slotine_li", "filtered", "derivatives", "derivatives_new_dpi")
    result.update({f"{k}_units": unit.units(res[f"{k}_us"]) for k in names})
    result.update({f"{k}_us": res[f"{k}_us"] for k in names})
    result.update({f"{k}_ratio": res[f"{k}_ratio"] for k in names[1:]})
    result.update({"slotine_li_implementation": panda.slotine_li_implementation,
                   "filtered_implementation": panda.filtered_regressor(1.0, 1e-3).implementation,
                   "scaling": scaling, "targets": TARGETS})
    result["meets_targets"] = all(result[k] <= v for k, v in TARGETS.items())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
