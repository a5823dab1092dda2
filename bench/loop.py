#!/usr/bin/env python3
"""Closed-loop benchmark (issue 3, section 6): the bridge, trajectory and controller
nodes as separate processes over DDS (started like `adaptive-dynamics launch sim`).

(a) Real time, 1 kHz, ~10 s of control (``mode:=realtime``).  The bridge measures:
    * cycle latency: the time from publishing the state of step k to the bridge's DDS
      layer receiving the command that answers it (commands carry the stamp of their
      state; the reception time is the message info's ``received_timestamp``), over
      every answered cycle: ``realtime_p50_ms``, ``realtime_p99_ms``, ``realtime_max_ms``;
    * deadline misses: a cycle misses when the command answering its state was
      received (its DDS reception stamp) after the bridge's next tick was due, or never
      (the controller skipped that state); the bridge's ``deadline_misses`` counter.  The bridge steps as soon as the
      answer arrives and only publishes at the tick, so the controller's budget is the
      period less the tick's wake-up lateness (``realtime_tick_late_p99_ms``).
      ``deadline_miss_rate`` = misses / cycles, where the cycles are the steps after
      the first command arrived (the start-up steps before the controller is up are
      not counted; they are reported as ``realtime_startup_steps``); periods the
      bridge's loop slept through and gave up when it resynchronised
      (``realtime_skipped_periods``) count as cycles and as misses.
      ``realtime_late_commands`` (received more than a period after their state) and
      ``realtime_unanswered`` (never received) break the misses down;
    * ``realtime_late_steps``: steps at which the bridge's own 1 kHz loop was more
      than a period behind its schedule (the simulator, not the loop, was late);
      ``realtime_command_timeouts``: steps run with the safe action because no command
      arrived for ``command_timeout`` (50 ms).
    As ``adaptive-dynamics launch sim mode:=realtime`` does, the bridge and the
    controller run SCHED_FIFO (``scenarios.REALTIME_PRIORITY``; ``realtime_sched``
    says whether it was permitted).
    The controller subscribes ``joint_states`` best effort with depth 1 here, the
    real-time setting the README documents (``config/sim.yaml`` sets
    ``reliable_streams: true`` for lockstep; a reliable depth-10 queue turns any backlog
    into ~10 ms of latency): ``--realtime-reliable`` measures that instead.
(b) Lockstep throughput, ~10 s of sim time, three nodes (no recorder):
    ``lockstep_sim_s_per_wall_s`` = sim time / wall time from the first to the last
    step, as measured by the bridge; ``lockstep_wall_s``, ``lockstep_step_us`` (wall
    per step), ``lockstep_timeouts``.  If the run exceeds its wall budget it is stopped
    and the figures cover the part that ran (``lockstep_sim_s`` says how much).

(c) Platform floor, measured in the same run: two bare rclpy processes, no simulation
    and no control law, play the same 1 kHz exchange (a JointState of the robot's joints
    out as bytes, a stamped command back, with the real-time graph's QoS; the pinger takes
    answers between its ticks like the bridge, the echo answers on a hot thread like the
    controller), both with the loop's scheduling (``floor_sched``): ``floor_p50_ms``,
    ``floor_p99_ms``, ``floor_deadline_miss_rate`` (answer received after the next tick
    was due, or never, as the bridge counts).  What this machine's
    DDS and scheduler allow before any of our work: the loop's miss rate cannot be
    expected below it.

``realtime_vm_steal_pct`` / ``lockstep_vm_steal_pct``: the share of the machine's CPU time
the hypervisor took (``/proc/stat`` steal) while the graph was stepping.  On a shared VM
a run with more than ~1 % steal measures the host, not this code (a 1 kHz exchange
misses whenever a vCPU is taken away for a millisecond).

``realtime_cpu_ms_per_step`` / ``lockstep_cpu_ms_per_step``: CPU time each node process
used per simulation step from the moment the bridge started stepping (start-up
excluded), sampled from /proc every 0.1 s.  In lockstep the bridge and the controller
work one after the other, so their sum (plus two DDS hops) bounds the step time: a
1 kHz lockstep loop at >= 1 sim-s/wall-s needs that sum well below 1 ms.

``floor_cpu_ms_per_step``: CPU time per step of the floor's two processes (``ping`` plays
the bridge, ``echo`` the controller); ``realtime_cpu_vs_floor``: the bridge's and the
controller's real-time CPU per step over the floor process playing their part -- the
work our nodes add to the bare exchange, as a same-run ratio.

``--repeat N`` runs (a), (b) and (c) N times: ``deadline_miss_rate_median`` /
``_max`` / ``_each``, ``lockstep_sim_s_per_wall_s_median`` / ``_min`` / ``_each``, the
CPU figures' medians and the ratio's worst (``realtime_cpu_vs_floor_max``), the largest
VM steal and whether every run was quiet; each run's full figures under ``each_run``.
The machine (CPU model, kernel), the scheduling each part actually got
(``realtime_sched``, ``floor_sched``) and the steal are in the JSON.

Targets (issue 16): deadline misses <= 1 % in every run (``deadline_miss_rate_max``),
lockstep >= 1.5 sim-s per wall-s (median), bridge and controller each <= 2x the floor's
CPU per step (median run; the worst is reported beside it).  ``host_quiet``: the VM
lost < 1 % of its CPU time to the hypervisor in every part and the bare exchange (c)
met the miss target, i.e. the machine itself could hold the deadline during this run;
a run that is not quiet measures the host, not this code.  The machine's 1-min load average is reported too: on
a shared 2-core VM other processes take CPU time from the three Python nodes.

Every time figure (``*_ms``, ``*_us``) is also given in machine units (``*_units``,
``bench/machine_unit.py``: pinocchio's regressor on the Panda at random states, measured
in the same run); rates and sim-s per wall-s are ratios already.

Last line of output: one JSON object.
Usage: ./dev bench loop [--repeat 5] [--realtime-s 10] [--lockstep-s 10] [--robot panda] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_unit import MachineUnit  # noqa: E402

from adaptive_dynamics.scenarios import build_graph  # noqa: E402
from adaptive_dynamics.launcher import GraphFailed, GraphProcess, run_to_end  # noqa: E402

#: issue 16: misses <= 1 % in every run, lockstep >= 1.5 sim-s/wall-s (median over the runs),
#: bridge and controller each <= 2x the CPU per step of the floor process playing their part
TARGETS = {"lockstep_sim_s_per_wall_s": 1.5, "deadline_miss_rate": 0.01, "cpu_vs_floor": 2.0}
STARTUP_SLACK_S = 4.0  # real time: sim seconds added for the nodes to come up
VERBOSE = False


def _cpu_s(pid: int) -> float | None:
    """user + system CPU seconds of a live process (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _steal_s() -> float | None:
    """CPU time the hypervisor took from this VM so far (all CPUs; /proc/stat 'steal')."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _steal_pct(start: tuple, end: tuple) -> float | None:
    """Share [%] of the machine's CPU time the hypervisor took between two
    ``(monotonic wall, _steal_s())`` readings (None when /proc/stat was unreadable)."""
    (w0, s0), (w1, s1) = start, end
    if s0 is None or s1 is None:
        return None
    return round(100 * (s1 - s0) / max(1e-9, (w1 - w0) * (os.cpu_count() or 1)), 2)


class CpuSampler(threading.Thread):
    """CPU time of each node process, sampled every 0.1 s while the graph runs: the last
    value seen, and the value when the bridge started stepping (start-up excluded); and
    the VM's steal time over the same window.  A companion of ``run_to_end``."""

    def __init__(self):
        super().__init__(daemon=True)
        self.graph, self.cpu, self.at_start, self.done = None, {}, None, threading.Event()
        self.steal = None  # (wall, steal) when stepping started, and the latest

    def attach(self, graph: GraphProcess) -> None:
        self.graph = graph
        self.start()

    def close(self) -> None:
        self.done.set()
        if self.graph is not None:
            self.join()

    def run(self):
        while not self.done.is_set():
            for name, p in self.graph.procs.items():
                c = _cpu_s(p.pid)
                if c is not None:
                    self.cpu[name] = c
            if self.at_start is None and any("started after" in ln for ln in self.graph.logs["mujoco_bridge"]):
                self.at_start = dict(self.cpu)
                self.steal = [(time.monotonic(), _steal_s())] * 2
            elif self.steal is not None:
                self.steal[1] = (time.monotonic(), _steal_s())
            self.done.wait(0.1)

    def steal_pct(self) -> float | None:
        """Share [%] of the machine's CPU time the hypervisor took while stepping: on a
        shared VM, a run with a few % of steal is not a measurement of this code."""
        return None if self.steal is None else _steal_pct(*self.steal)

    def per_step_ms(self, steps: int) -> dict:
        """CPU ms per step of each node from the start of stepping to its last sample."""
        if not steps or self.at_start is None:
            return {}
        return {k: round(1e3 * (v - self.at_start.get(k, v)) / steps, 3) for k, v in self.cpu.items()}


def run_graph(mode: str, sim_s: float, robot: str, budget: float,
              overrides: dict | None = None) -> tuple[dict, float, str]:
    fd, stats_file = tempfile.mkstemp(prefix=f"bench_loop_{mode}_", suffix=".json")
    os.close(fd)
    nodes = build_graph("sim", robot=robot, mode=mode, duration=sim_s,
                        overrides={**(overrides or {}), "mujoco_bridge": {
                            **(overrides or {}).get("mujoco_bridge", {}), "stats_file": stats_file}})
    sampler = CpuSampler()
    try:
        run = run_to_end(nodes, timeout=budget, companions=[sampler], timeout_ok=True, tail=8)
    except GraphFailed as exc:
        os.unlink(stats_file)
        logs = "\n".join(f"[{k}] {ln}" for k, v in exc.logs.items() for ln in v)
        raise SystemExit(f"bench/loop: {mode} run failed ({exc.why}):\n{logs}")
    wall, rc, why = run.wall_s, run.code, run.why
    logs = "\n".join(f"[{k}] {ln}" for k, v in run.logs.items() for ln in v)
    try:
        with open(stats_file) as fh:
            stats = json.load(fh)
    except (OSError, ValueError):
        raise SystemExit(f"bench/loop: {mode} run wrote no statistics ({why}):\n{logs}")
    finally:
        os.unlink(stats_file)
    if rc == 124 or VERBOSE:
        print(f"bench/loop: {mode} run: {why}; last log lines:\n{logs}", file=sys.stderr, flush=True)
    stats["_cpu_ms_per_step"] = sampler.per_step_ms(int(stats.get("plant_steps", 0)))
    stats["_steal_pct"] = sampler.steal_pct()
    return stats, wall, why


def realtime(seconds: float, robot: str, reliable: bool) -> dict:
    stats, wall, why = run_graph("realtime", seconds + STARTUP_SLACK_S, robot, budget=seconds + 40,
                                 overrides={"controller": {"reliable_streams": reliable}})
    startup = int(stats.get("startup_steps", 0))
    skipped = int(stats.get("skipped_periods", 0))      # periods a stalled bridge never ran: missed
    cycles = int(stats.get("plant_steps", 0)) - startup + skipped
    answered = int(stats.get("latency_samples", 0))
    misses = int(stats.get("deadline_misses", 0)) + skipped
    late = int(stats.get("late_commands", 0))
    never = max(0, cycles - skipped - answered)
    return {
        "realtime_controller_qos": "reliable, depth 10" if reliable else "best effort, depth 1",
        "realtime_p50_ms": round(stats.get("latency_p50_ms", float("nan")), 4),
        "realtime_p99_ms": round(stats.get("latency_p99_ms", float("nan")), 4),
        "realtime_max_ms": round(stats.get("latency_max_ms", float("nan")), 3),
        "deadline_miss_rate": round(misses / cycles, 5) if cycles > 0 else 1.0,
        "realtime_cycles": cycles,
        "realtime_deadline_misses": misses,
        "realtime_late_commands": late,
        "realtime_unanswered": never,
        "realtime_late_steps": int(stats.get("late_steps", 0)),
        "realtime_skipped_periods": skipped,
        "realtime_tick_late_p99_ms": round(stats.get("tick_late_p99_ms", float("nan")), 4),
        "realtime_command_timeouts": int(stats.get("command_timeouts", 0)),
        "realtime_overload_episodes": int(stats.get("overload_episodes", 0)),
        "realtime_overload_longest_ms": stats.get("overload_longest_ms", 0.0),
        "realtime_startup_steps": startup,
        "realtime_sim_per_wall": round(stats.get("sim_per_wall", 0.0), 4),
        "realtime_run_wall_s": round(wall, 2),
        "realtime_cpu_ms_per_step": stats["_cpu_ms_per_step"],
        "realtime_sched": stats.get("sched", "normal"),
        "realtime_vm_steal_pct": stats["_steal_pct"],
        "n_joints": len(stats.get("saturation_count", [])) or 9,
    }


FLOOR_TOPICS = ("bench_loop/state", "bench_loop/command")


def _floor_qos(which: str):
    """The QoS of the real-time graph: state published reliably (deep history), read best
    effort depth 1 by the controller; commands published reliable depth 1 and read as the
    bridge reads them (``REALTIME_COMMAND_QOS``)."""
    from adaptive_dynamics.ros.qos import COMMAND_QOS, REALTIME_COMMAND_QOS, PUBLISHER_STREAM_QOS, stream_qos
    return {"state_pub": PUBLISHER_STREAM_QOS, "state_sub": stream_qos(False), "command": COMMAND_QOS,
            "bridge_command": REALTIME_COMMAND_QOS}[which]


def floor_echo(seconds: float, n_joints: int, out: str | None = None) -> int:
    """Child process of (c): answer every state with a command stamped like it, on a
    HotPath thread as the controller does.  ``out``: where to write its CPU time per
    answered state (process CPU from the first state to the last) when it stops."""
    import signal

    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from adaptive_dynamics.ros.commands import encode_stamped_command
    from adaptive_dynamics.ros.joint_states import state_stamp
    from adaptive_dynamics.ros.node_base import HotPath
    rclpy.init()
    node = rclpy.create_node("bench_loop_echo")
    pub = node.create_publisher(Float64MultiArray, FLOOR_TOPICS[1], _floor_qos("command"))
    zeros = [0.0] * n_joints
    cpu = [None, 0.0, 0]          # process CPU s at the first state, at the latest, states answered
    process_time = time.process_time

    def answer(raw):
        pub.publish(encode_stamped_command(zeros, state_stamp(raw)))
        now = process_time()
        if cpu[0] is None:
            cpu[0] = now
        cpu[1] = now
        cpu[2] += 1

    io = HotPath(node)
    io.node.create_subscription(JointState, FLOOR_TOPICS[0], answer, _floor_qos("state_sub"), raw=True)
    io.start()
    _floor_sched()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        time.sleep(seconds)
    finally:
        io.stop()
        node.destroy_node()
        rclpy.try_shutdown()
        if out:
            with open(out, "w") as fh:
                json.dump({"echo_cpu_ms_per_step": round(1e3 * (cpu[1] - cpu[0]) / max(1, cpu[2] - 1), 4)
                           if cpu[0] is not None else None}, fh)
    return 0


def _floor_sched() -> str:
    """Both floor processes get the loop's scheduling (scenarios.REALTIME_PRIORITY)."""
    from adaptive_dynamics.scenarios import REALTIME_PRIORITY
    from adaptive_dynamics.realtime import set_fifo_priority
    ok, _msg = set_fifo_priority(REALTIME_PRIORITY)
    return f"SCHED_FIFO {REALTIME_PRIORITY}" if ok else "normal (SCHED_FIFO not permitted)"


def floor(seconds: float, n_joints: int) -> dict:
    """(c): the bare 1 kHz exchange between two processes (see the module docstring), both
    children of this one (their real-time scheduling must not outlive them)."""
    import subprocess
    args = ["--floor-joints", str(n_joints)]
    fd, echo_out = tempfile.mkstemp(prefix="bench_loop_echo_", suffix=".json")
    os.close(fd)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--floor-echo", str(seconds + 8.0),
                              "--floor-out", echo_out] + args)
    steal0 = (time.monotonic(), _steal_s())
    try:
        ping = subprocess.run([sys.executable, os.path.abspath(__file__), "--floor-ping", str(seconds)] + args,
                              capture_output=True, text=True, timeout=seconds + 60)
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    lines = ping.stdout.strip().splitlines()
    if ping.returncode != 0 or not lines:
        raise SystemExit(f"bench/loop: the floor exchange failed (exit {ping.returncode}):\n{ping.stderr[-2000:]}")
    res = json.loads(lines[-1])
    res["floor_vm_steal_pct"] = _steal_pct(steal0, (time.monotonic(), _steal_s()))
    try:
        with open(echo_out) as fh:
            echo = json.load(fh)
    except (OSError, ValueError):
        echo = {"echo_cpu_ms_per_step": None}
    finally:
        os.unlink(echo_out)
    res["floor_cpu_ms_per_step"] = {"ping": res.pop("floor_ping_cpu_ms_per_step"),
                                    "echo": echo["echo_cpu_ms_per_step"]}
    return res


def floor_ping(seconds: float, n_joints: int) -> int:
    """(c)'s measuring process: plays the bridge's real-time loop -- take answers as they
    arrive until the tick (``HotPath.spin_once``), publish the next state at the tick,
    one FIFO priority above its process -- and prints its figures as one JSON line.
    As the bridge counts: a miss is an answer whose DDS reception stamp is after the
    tick that needed it (or none); latency is that stamp minus the state's publication
    time."""
    import numpy as np
    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from adaptive_dynamics.ros.commands import command_stamp
    from adaptive_dynamics.realtime import raise_thread_priority
    from adaptive_dynamics.ros.node_base import HotPath
    from adaptive_dynamics.wire import JointStateEncoder

    n = int(seconds * 1000)
    clock, period = time.perf_counter_ns, 1_000_000
    sent = np.zeros(n, dtype=np.int64)      # CLOCK_REALTIME ns, the clock of the reception stamps
    due = np.zeros(n, dtype=np.int64)       # the tick after each state (CLOCK_REALTIME ns)
    lat = np.full(n, np.inf)
    answered = np.zeros(n, dtype=bool)      # received by the tick after the state

    def on_answer(raw, info):
        st = command_stamp(raw)
        if st is not None and 0 <= st < n:
            arrived = info.get("received_timestamp") or time.time_ns()
            lat[st] = arrived - sent[st]
            answered[st] = arrived <= due[st]

    rclpy.init()
    node = rclpy.create_node("bench_loop_ping")
    pub = node.create_publisher(JointState, FLOOR_TOPICS[0], _floor_qos("state_pub"))
    io = HotPath(node)
    sub = io.node.create_subscription(Float64MultiArray, FLOOR_TOPICS[1], on_answer, _floor_qos("bridge_command"),
                                      raw=True)
    sched = _floor_sched()
    HotPath.shorten_switch_interval()
    raise_thread_priority(1)
    deadline = time.monotonic() + 6.0
    while (pub.get_subscription_count() < 1 or sub.get_publisher_count() < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    enc = JointStateEncoder([f"joint{i}" for i in range(n_joints)])
    q = np.zeros(n_joints)
    nxt = clock() + period
    cpu0 = time.process_time()
    for k in range(n + 1):
        while (rem := nxt - clock()) > 0:      # take answers until the tick
            io.spin_once(rem)
        nxt += period
        if k < n:
            sent[k] = time.time_ns()
            due[k] = nxt + (sent[k] - clock())
            pub.publish(enc.encode(k, q, q, q))
    cpu_ms = 1e3 * (time.process_time() - cpu0) / n
    t_end = clock() + 50_000_000
    while (rem := t_end - clock()) > 0:       # answers after the last tick: their latency counts
        io.spin_once(rem)
    io.release()
    io.stop()
    node.destroy_node()
    rclpy.try_shutdown()
    ok = lat[np.isfinite(lat)] * 1e-6
    print(json.dumps({
        "floor_p50_ms": round(float(np.percentile(ok, 50)), 4) if ok.size else None,
        "floor_p99_ms": round(float(np.percentile(ok, 99)), 4) if ok.size else None,
        "floor_deadline_miss_rate": round(float(np.mean(~answered)), 5),
        "floor_cycles": n,
        "floor_sched": sched,
        "floor_ping_cpu_ms_per_step": round(cpu_ms, 4),
    }), flush=True)
    return 0


def lockstep(seconds: float, robot: str, budget: float) -> dict:
    stats, wall, why = run_graph("lockstep", seconds, robot, budget=budget)
    steps = int(stats.get("plant_steps", 0))
    return {
        "lockstep_sim_s_per_wall_s": round(stats.get("sim_per_wall", 0.0), 4),
        "lockstep_sim_s": round(stats.get("sim_time", 0.0), 3),
        "lockstep_wall_s": round(stats.get("wall_time", 0.0), 3),
        "lockstep_step_us": round(1e6 * stats.get("wall_time", 0.0) / steps, 1) if steps else None,
        "lockstep_timeouts": int(stats.get("lockstep_timeouts", 0)),
        "lockstep_stale_commands": int(stats.get("stale_commands", 0)),
        "lockstep_run_wall_s": round(wall, 2),
        "lockstep_complete": why.endswith("finished"),
        "lockstep_cpu_ms_per_step": stats["_cpu_ms_per_step"],
        "lockstep_vm_steal_pct": stats["_steal_pct"],
    }


def one_run(a, unit: MachineUnit) -> dict:
    """(a), (b) and (c) once; the figures of that run."""
    res = {"robot": a.robot}
    res.update(realtime(a.realtime_s, a.robot, a.realtime_reliable))
    print(f"(a) real time: latency p50 {res['realtime_p50_ms']:.3f} ms, p99 {res['realtime_p99_ms']:.3f} ms,"
          f" max {res['realtime_max_ms']:.1f} ms; deadline misses {100 * res['deadline_miss_rate']:.2f} %"
          f" ({res['realtime_deadline_misses']} of {res['realtime_cycles']} cycles; commands received"
          f" > 1 ms after their state {res['realtime_late_commands']}, never {res['realtime_unanswered']});"
          f" bridge late steps {res['realtime_late_steps']}, tick lateness p99"
          f" {res['realtime_tick_late_p99_ms']} ms,"
          f" command timeouts {res['realtime_command_timeouts']}; {res['realtime_sched']};"
          f" VM steal {res['realtime_vm_steal_pct']} %;"
          f" CPU ms/step {res['realtime_cpu_ms_per_step']}", flush=True)
    unit.sample(10)
    res.update(lockstep(a.lockstep_s, a.robot, a.lockstep_budget))
    print(f"(b) lockstep: {res['lockstep_sim_s']:.2f} s sim in {res['lockstep_wall_s']:.2f} s wall ="
          f" {res['lockstep_sim_s_per_wall_s']:.3f} sim-s/wall-s ({res['lockstep_step_us']} us/step),"
          f" timeouts {res['lockstep_timeouts']}; CPU ms/step {res['lockstep_cpu_ms_per_step']};"
          f" VM steal {res['lockstep_vm_steal_pct']} %", flush=True)
    if a.floor_s > 0:
        res.update(floor(a.floor_s, res["n_joints"]))
        fc = res["floor_cpu_ms_per_step"]
        cpu = res["realtime_cpu_ms_per_step"]
        # each hot node against the floor process playing its part (same exchange, no work)
        res["realtime_cpu_vs_floor"] = {
            node: (round(cpu[node] / fc[part], 2) if cpu.get(node) and fc.get(part) else None)
            for node, part in (("mujoco_bridge", "ping"), ("controller", "echo"))}
        print(f"(c) platform floor (bare two-process exchange, no work): p50 {res['floor_p50_ms']} ms,"
              f" p99 {res['floor_p99_ms']} ms, misses {100 * res['floor_deadline_miss_rate']:.2f} %"
              f" ({res['floor_sched']}; VM steal {res['floor_vm_steal_pct']} %); CPU ms/step {fc};"
              f" real-time CPU / floor's {res['realtime_cpu_vs_floor']}", flush=True)
    unit.sample(10)
    # the machine itself could hold the deadline: the hypervisor took (almost) no CPU and
    # the bare exchange (c) met the target; otherwise the run measures the host
    steal = [res.get(k) for k in ("realtime_vm_steal_pct", "lockstep_vm_steal_pct", "floor_vm_steal_pct")]
    res["host_quiet"] = all(x is not None and x < 1.0 for x in steal) and \
        res.get("floor_deadline_miss_rate", 0.0) <= TARGETS["deadline_miss_rate"]
    return res


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(float(statistics.median(xs)), 5) if xs else None


def summarise_runs(runs: list) -> dict:
    """The figures the targets are stated on, over the repeated runs: medians, the worst
    and each run's value (in run order)."""
    miss = [r["deadline_miss_rate"] for r in runs]
    lock = [r["lockstep_sim_s_per_wall_s"] for r in runs]
    out = {"runs": len(runs),
           "deadline_miss_rate_median": _median(miss), "deadline_miss_rate_max": max(miss),
           "deadline_miss_rate_each": miss,
           "lockstep_sim_s_per_wall_s_median": _median(lock), "lockstep_sim_s_per_wall_s_min": min(lock),
           "lockstep_sim_s_per_wall_s_each": lock,
           "realtime_p99_ms_median": _median([r["realtime_p99_ms"] for r in runs]),
           "floor_deadline_miss_rate_max": max((r.get("floor_deadline_miss_rate", 0.0) for r in runs)),
           "vm_steal_pct_max": max((x for r in runs for x in (r.get("realtime_vm_steal_pct"),
                                                             r.get("lockstep_vm_steal_pct"),
                                                             r.get("floor_vm_steal_pct")) if x is not None),
                                   default=None),
           "host_quiet_all": all(r["host_quiet"] for r in runs)}
    for key in ("realtime_cpu_ms_per_step", "lockstep_cpu_ms_per_step", "floor_cpu_ms_per_step",
                "realtime_cpu_vs_floor"):
        nodes = sorted({k for r in runs for k in (r.get(key) or {})})
        out[f"{key}_median"] = {k: _median([(r.get(key) or {}).get(k) for r in runs]) for k in nodes}
        if key == "realtime_cpu_vs_floor":
            out[f"{key}_max"] = {k: max((x for r in runs if (x := (r.get(key) or {}).get(k)) is not None),
                                        default=None) for k in nodes}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--realtime-s", type=float, default=10.0, help="seconds of real-time control (default 10)")
    ap.add_argument("--lockstep-s", type=float, default=10.0, help="sim seconds in lockstep (default 10)")
    ap.add_argument("--lockstep-budget", type=float, default=25.0, help="wall budget of the lockstep run [s]")
    ap.add_argument("--robot", default="panda")
    ap.add_argument("--realtime-reliable", action="store_true",
                    help="real time: the controller subscribes joint_states reliably (depth 10) as in lockstep;"
                    " default best effort depth 1, the real-time setting the README documents")
    ap.add_argument("--quick", action="store_true", help="3 s each")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run (a), (b) and (c) this many times (the README's figures: --repeat 5, ~3 min);"
                         " the JSON gives the medians, the worst and every run's figures")
    ap.add_argument("--floor-s", type=float, default=8.0, help="seconds of the platform-floor exchange (c);"
                    " 0 skips it (default 8)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the nodes' last log lines")
    ap.add_argument("--floor-echo", type=float, help=argparse.SUPPRESS)   # (c)'s child processes
    ap.add_argument("--floor-ping", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--floor-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--floor-joints", type=int, default=9, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.floor_echo is not None:
        return floor_echo(a.floor_echo, a.floor_joints, a.floor_out)
    if a.floor_ping is not None:
        return floor_ping(a.floor_ping, a.floor_joints)
    global VERBOSE
    VERBOSE = a.verbose
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    if a.quick:
        a.realtime_s, a.lockstep_s, a.lockstep_budget, a.floor_s = 3.0, 3.0, 15.0, 2.0
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    print(f"bench/loop: {a.robot}; (a) real time {a.realtime_s:g} s at 1 kHz, (b) lockstep {a.lockstep_s:g} s"
          f" sim, (c) floor {a.floor_s:g} s; x{a.repeat}; load average {load0:.2f} on {os.cpu_count()} CPUs",
          flush=True)
    unit = MachineUnit()
    runs = []
    for i in range(a.repeat):
        if a.repeat > 1:
            print(f"-- run {i + 1} of {a.repeat}", flush=True)
        runs.append(one_run(a, unit))
    res = dict(runs[-1]) if a.repeat == 1 else {"robot": a.robot, "each_run": runs}
    res.update(summarise_runs(runs))
    unit.add_units(res, [k for k in list(res) if k.endswith(("_ms", "_us")) and not isinstance(res[k], bool)])
    res.update(unit.report())
    res["machine"]["kernel"] = platform.release()
    res["loadavg_1min"] = round(max(load0, os.getloadavg()[0]), 2)
    res["cpus"] = os.cpu_count()
    res["targets"] = TARGETS
    # misses: every run; throughput and CPU: the median run (the floor's own CPU per step
    # varies by +-20 % between runs, so one run's ratio carries that noise: the worst is
    # reported beside it, realtime_cpu_vs_floor_max)
    ratios = res.get("realtime_cpu_vs_floor_median") or {}
    res["meets_targets"] = {
        "lockstep": (res["lockstep_sim_s_per_wall_s_median"] or 0.0) >= TARGETS["lockstep_sim_s_per_wall_s"],
        "deadline_misses": res["deadline_miss_rate_max"] <= TARGETS["deadline_miss_rate"],
        "cpu_vs_floor": bool(ratios) and all(x is not None and x <= TARGETS["cpu_vs_floor"]
                                             for x in ratios.values()),
    }
    res["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
