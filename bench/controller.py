#!/usr/bin/env python3
"""Controller benchmark (issue 4 §5): the core and the node, Panda, composite law.

* **core** -- :func:`bench.controller_core.measure_core`: one
  :meth:`AdaptiveController.compute` (state in -> torque out, with the Slotine-Li and
  filtered regressors and the composite update), p50/p99.
* **node** -- message in -> message out through the ``adaptive_controller`` node's own
  code path: a ``sensor_msgs/JointState`` goes into the node's joint_states callback
  (called directly, so DDS transport is not part of the figure), which matches joints
  by name, picks the stamped reference, runs the core, saturates, and publishes the
  command, the parametric torque and (every 10th cycle) the accumulated parameter
  update.  Timed from the callback's entry to its return (all publishes done).
* **dds_round_trip** (informational) -- the same node spun by its executor with a
  probe publishing joint_states and waiting for the command: what a separate process
  adds (transport + executor wake-ups).

* **backstepping** -- Thunder's task-space adaptive backstepping
  (:class:`~adaptive_dynamics.control.backstepping.BacksteppingController`, issue 19):
  end-effector reference in -> torque out, its reference generator (pose error, damped
  pseudo-inverse, q_dot_r, q_ddot_r) in front of the same core with the paper's direct
  update (34), and with the composite update (informational).
  ``backstepping_core_p99_units`` and ``backstepping_vs_composite_p99``: its p99 over
  the joint-space composite law's p99, same run (target <= 1.5).

Every figure is also given in machine units (``*_units``, ``bench/machine_unit.py``:
pinocchio's regressor on the Panda at random states, measured in the same run).
Targets (machine units): core p99 <= 30, node p99 <= 60; backstepping <= 1.5 x the
composite core step.  Last line: one JSON object.
Usage: ./dev bench controller [--quick]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from controller_core import measure_core  # noqa: E402
from machine_unit import MachineUnit  # noqa: E402

TARGETS = {"core_p99_units": 30.0, "node_p99_units": 60.0, "backstepping_vs_composite_p99": 1.5}


def measure_node(n: int = 5000, round_trips: int = 1000) -> dict:
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from std_msgs.msg import Float64MultiArray

    from adaptive_dynamics.dynamics import RobotModel
    from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode
    from adaptive_dynamics.ros import joint_state_msg
    from adaptive_dynamics.ros.references import reference_batch_msg
    from adaptive_dynamics.ros.qos import COMMAND_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory
    from adaptive_dynamics.trajectories import ModifiedFourier

    ctx = Context()
    rclpy.init(context=ctx)
    m = RobotModel("panda")
    names = list(m.joint_names)
    params = dict(robot="panda", law="composite", lam=[10.0], kd=[30.0, 30.0, 20.0, 20.0, 4.0, 4.0, 1.0],
                  p0=[1.0], r=[10.0], lambda0=0.5, k0=200.0, k1=100.0, autosave_period=0.0,
                  state_timeout=60.0, hot_path_thread=False, friction=True)
    node = AdaptiveControllerNode(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    total = n + round_trips + 10
    traj = ModifiedFourier.random(m.n, np.random.default_rng(0), amplitude=0.5, w_f=2 * np.pi / 8.0,
                                  lower=m.lower, upper=m.upper, vel_limit=0.6 * m.velocity_limit, margin=0.1)
    Q, V, A = traj.sample_many(np.arange(total) * 1e-3)
    tau = np.array([m.inverse_dynamics(Q[k], V[k], A[k]) for k in range(total)])
    for k0 in range(0, total, 500):  # references, straight into the node's buffer
        k1 = min(total, k0 + 500)
        node.refs.add(reference_batch_msg(k0 * 10 ** 6, 10 ** 6, names, Q[k0:k1], V[k0:k1], A[k0:k1]))
    msgs = [joint_state_msg(k * 10 ** 6, names, Q[k] + 1e-3, V[k], tau[k]) for k in range(total)]
    out = np.empty(n)
    clock = time.perf_counter_ns
    for k in range(10):
        node._on_state(msgs[k])
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(n):
            t0 = clock()
            node._on_state(msgs[10 + i])
            out[i] = clock() - t0
    finally:
        if gc_was:
            gc.enable()
    us = out / 1e3
    res = {"node_p50_us": round(float(np.percentile(us, 50)), 1),
           "node_p99_us": round(float(np.percentile(us, 99)), 1),
           "node_cycles": n}

    # informational: a DDS round trip to the spinning node (probe in the same process)
    probe = rclpy.create_node("bench_probe", context=ctx)
    got = []
    probe.create_subscription(Float64MultiArray, "effort_controller/commands", got.append, COMMAND_QOS)
    pub = probe.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
    probe.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(probe)
    deadline = time.monotonic() + 5
    while pub.get_subscription_count() < 1 and time.monotonic() < deadline:
        ex.spin_once(timeout_sec=0.01)
    rt = []
    base = 10 + n
    for i in range(round_trips):
        before = len(got)
        t0 = clock()
        pub.publish(msgs[base + i])
        t_end = time.monotonic() + 1.0
        while len(got) == before and time.monotonic() < t_end:
            ex.spin_once(timeout_sec=0.01)
        if len(got) > before:
            rt.append((clock() - t0) / 1e3)
    if rt:
        res["dds_round_trip_p50_us"] = round(float(np.percentile(rt, 50)), 1)
        res["dds_round_trip_p99_us"] = round(float(np.percentile(rt, 99)), 1)
    ex.shutdown(timeout_sec=1.0)
    probe.destroy_node()
    node.destroy_node()
    rclpy.try_shutdown(context=ctx)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cycles (a smoke run, noisier)")
    args = ap.parse_args(argv)
    unit = MachineUnit()
    core = measure_core("panda", n=2000 if args.quick else 20000, rounds=5 if args.quick else 20)
    unit.sample()
    node = measure_node(n=1000 if args.quick else 5000, round_trips=200 if args.quick else 1000)
    unit.sample()
    res = {"robot": "panda", "law": "composite", **unit.report(), "core_p50_us": core["core_p50_us"],
           "core_p99_us": core["core_p99_us"], "core_config": core["core_config"], **node,
           "backstepping_core_p50_us": core["backstepping"]["p50_us"],
           "backstepping_core_p99_us": core["backstepping"]["p99_us"],
           "backstepping_config": "Thunder's law (direct update (34)), link parameters + friction (base), Panda",
           "backstepping_vs_composite_p99": round(core["backstepping"]["p99_us"] / core["composite"]["p99_us"], 3),
           "backstepping_vs_composite_p50": round(core["backstepping"]["p50_us"] / core["composite"]["p50_us"], 3),
           "backstepping_composite_vs_composite_p99": round(core["backstepping_composite"]["p99_us"]
                                                            / core["composite"]["p99_us"], 3),
           "per_candidate": {k: unit.add_units(dict(core[k]), ("p50_us", "p99_us"))
                             for k in ("composite", "composite_nofriction", "direct", "backstepping",
                                       "backstepping_composite") if k in core}}
    unit.add_units(res, [k for k in list(res) if k.endswith("_us")])
    res["targets"] = TARGETS
    res["meets_targets"] = all(res[k] <= v for k, v in TARGETS.items())
    print(f"machine unit {res['machine_unit_us']:.3f} us")
    print(f"core  p50 {res['core_p50_units']:6.1f} units ({res['core_p50_us']:7.1f} us)"
          f"  p99 {res['core_p99_units']:6.1f} units ({res['core_p99_us']:7.1f} us)  ({res['core_config']})")
    print(f"node  p50 {res['node_p50_units']:6.1f} units ({res['node_p50_us']:7.1f} us)"
          f"  p99 {res['node_p99_units']:6.1f} units ({res['node_p99_us']:7.1f} us)  (message in -> message out)")
    print(f"backstepping core  p99 {res['backstepping_core_p99_units']:6.1f} units"
          f" ({res['backstepping_core_p99_us']:7.1f} us) = {res['backstepping_vs_composite_p99']:.2f} x the composite"
          f" core step (with the composite update: {res['backstepping_composite_vs_composite_p99']:.2f} x)")
    if "dds_round_trip_p50_us" in res:
        print(f"DDS round trip to the node  p50 {res['dds_round_trip_p50_us']:.1f} us"
              f"  p99 {res['dds_round_trip_p99_us']:.1f} us (informational)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
