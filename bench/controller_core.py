#!/usr/bin/env python3
"""Controller-core benchmark (issue 4 §5): per-cycle compute of the adaptive controller.

One cycle = :meth:`AdaptiveController.compute` with learning on: input validation,
sliding variables, Slotine-Li regressor, base projection, Y theta_hat - K_D s, the
filtered regressor + filtered torque update, the bounded-gain-forgetting covariance
update and the parameter update (state in -> torque out).  Inputs follow a Modified
Fourier trajectory (a different state every cycle, as in the loop), each cycle is
timed with ``time.perf_counter_ns``, and the candidates are interleaved round by
round (so CPU-frequency changes and other load hit all alike).  p50/p99 over all
timed cycles of each candidate.

``measure_core(robot="panda", n=...)`` is imported by ``bench/controller.py`` (which
adds the node path); run alone, the last line of output is one JSON object, every
figure also in machine units (``bench/machine_unit.py``).  Target: core p99 <= 30 units.
Usage: ./dev bench controller_core [--quick] [--robot panda]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_unit import MachineUnit  # noqa: E402

CANDIDATES = {
    # name: (law, friction columns)
    "composite": ("composite", True),
    "composite_nofriction": ("composite", False),
    "direct": ("direct", True),
    # Thunder's task-space adaptive backstepping (control/backstepping.py): the task-space
    # reference generator in front of the same core; direct adaptation is the paper's (34)
    "backstepping": ("direct", True),
    "backstepping_composite": ("composite", True),
}
#: candidates fed end-effector references (pose, twist, acceleration) instead of joint ones
TASK_CANDIDATES = ("backstepping", "backstepping_composite")


def _inputs(model, n_states: int, seed: int = 0):
    from adaptive_dynamics.trajectories import ModifiedFourier

    traj = ModifiedFourier.random(model.n, np.random.default_rng(seed), amplitude=0.5,
                                  w_f=2 * math.pi / 8.0, lower=model.lower, upper=model.upper,
                                  vel_limit=0.6 * model.velocity_limit, margin=0.1)
    ts = np.arange(n_states) * 1e-3
    Q, V, A = traj.sample_many(ts)
    rng = np.random.default_rng(seed + 1)
    q = Q + 1e-3 * rng.standard_normal(Q.shape)
    v = V + 1e-2 * rng.standard_normal(V.shape)
    tau = np.array([model.inverse_dynamics(q[k], v[k], A[k]) for k in range(n_states)])
    return q, v, Q, V, A, tau


def _task_inputs(model, n_states: int, seed: int = 0) -> list:
    """Per state: (q, v, p_d, R_d, v_d, a_d, tau) with the end-effector reference of the
    same joint trajectory (forward kinematics, J qd_d, J qdd_d + J_dot qd_d)."""
    q, v, Q, V, A, tau = _inputs(model, n_states, seed)
    out = []
    for k in range(n_states):
        T = model.frame_pose(Q[k])
        J = model.jacobian(Q[k])
        out.append((q[k], v[k], T[:3, 3].copy(), T[:3, :3].copy(), J @ V[k],
                    J @ A[k] + model.jacobian_dot(Q[k], V[k]) @ V[k], tau[k]))
    return out


def measure_core(robot: str = "panda", n: int = 20000, rounds: int = 20, candidates=None) -> dict:
    """p50 / p99 [us] of one controller-core cycle for ``robot``.

    ``n`` timed cycles per candidate in total, split over ``rounds`` interleaved
    rounds.  Returns ``core_p50_us``/``core_p99_us`` (the composite law with base
    parameters and friction columns, the heaviest default configuration) plus the
    per-candidate figures.
    """
    from adaptive_dynamics.control.adaptive import AdaptiveController
    from adaptive_dynamics.control.backstepping import BacksteppingController
    from adaptive_dynamics.dynamics import RobotModel

    names = list(candidates or CANDIDATES)
    per_round = max(1, n // rounds)
    ctls, data = {}, {}
    for name in names:
        law, fr = CANDIDATES[name]
        model = RobotModel(robot, friction=fr, coulomb_smoothing=0.01)
        gains = dict(kd=20.0, gamma=0.5, p0=1.0, r=10.0, lambda0=0.5, k0=200.0, k1=100.0)
        if name in TASK_CANDIDATES:
            ctls[name] = BacksteppingController(model, law, kp_task=5.0, **gains)
            data[name] = _task_inputs(model, per_round + 1)
            ctls[name].ref.set_posture(data[name][0][0])
        else:
            ctls[name] = AdaptiveController(model, law, lam=10.0, **gains)
            data[name] = list(zip(*_inputs(model, per_round + 1)))
    samples = {name: np.empty(per_round * rounds) for name in names}
    clock = time.perf_counter_ns
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for name in names:  # warm-up (first-call allocations, filter start)
            c, args = ctls[name], data[name]
            for k in range(min(50, per_round)):
                c.compute(*args[k])
        for r in range(rounds):
            for name in names:
                args, out = data[name], samples[name]
                base = r * per_round
                compute = ctls[name].compute
                for k in range(per_round):
                    a = args[k]
                    t0 = clock()
                    compute(*a)
                    out[base + k] = clock() - t0
    finally:
        if gc_was:
            gc.enable()
    res = {"robot": robot, "dof": model.n, "cycles": per_round * rounds}
    for name in names:
        us = samples[name] / 1e3
        res[name] = {"p50_us": round(float(np.percentile(us, 50)), 2),
                     "p99_us": round(float(np.percentile(us, 99)), 2),
                     "mean_us": round(float(us.mean()), 2),
                     "n_params": getattr(ctls[name], "core", ctls[name]).n_adapted}
    main = "composite" if "composite" in names else names[0]
    res["core_p50_us"] = res[main]["p50_us"]
    res["core_p99_us"] = res[main]["p99_us"]
    res["core_config"] = f"{main}: base parameters" + (" + friction" if CANDIDATES[main][1] else "")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cycles (a smoke run, noisier)")
    ap.add_argument("--robot", default="panda")
    args = ap.parse_args(argv)
    n, rounds = (2000, 5) if args.quick else (20000, 20)
    unit = MachineUnit()
    res = measure_core(args.robot, n=n, rounds=rounds)
    unit.sample()
    res.update(unit.report())
    for name in CANDIDATES:
        unit.add_units(res[name], ("p50_us", "p99_us", "mean_us"))
    unit.add_units(res, ("core_p50_us", "core_p99_us"))
    res["target_core_p99_units"] = 30.0
    res["meets_target"] = res["core_p99_units"] <= 30.0
    for name in CANDIDATES:
        print(f"{name:22s} p50 {res[name]['p50_units']:6.1f} units ({res[name]['p50_us']:7.1f} us)"
              f"  p99 {res[name]['p99_units']:6.1f} units ({res[name]['p99_us']:7.1f} us)"
              f"  ({res[name]['n_params']} parameters)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
