"""The scqp_controller node over real DDS (nodes in-process, messages through the rmw).

* Closed loop in lockstep: the MuJoCo bridge (Panda with an unmodelled 0.5 kg payload),
  the trajectory node in task space (z_sine, the SCQP paper's task) and the controller
  at 200 Hz on a 1 kHz bridge (held torque in between): every state answered, no safe
  step, no QP fallback, the end effector tracks the task reference.
* ``~/end_episode`` refits the GP on a worker thread: the lockstep loop keeps stepping
  while it runs (no control-cycle stall), the new GP is swapped in and ``state_file``
  written; a restarted node loads the GP, the pending samples, the MRAC gains and the
  episode count from it.
* A task reference in another frame, with a NaN or with points out of order is refused
  with a log line on /rosout, and its instants are answered with the safe command at
  once; gains tuned live (the MRAC keeps what it adapted), bad values refused.
* A corrupt ``state_file`` is kept (renamed aside) and the node starts fresh.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
from adaptive_dynamics.nodes.scqp_controller import SCQPControllerNode
from adaptive_dynamics.nodes.trajectory import TrajectoryNode
from adaptive_dynamics.ros.commands import command_stamp
from adaptive_dynamics.ros.qos import RELIABLE_STREAM_QOS
from task_reference_faults import MS, fed_by_probe, refused_references_drill, rosout, send_state
from test_node_safety import param_setter

pytestmark = pytest.mark.ros


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec


def _scqp(ros, **params):
    base = dict(robot="panda", use_sim_time=True, reference_wait=20.0, state_timeout=30.0, diagnostics_period=0.2,
                gp_subsample=1)
    base.update(params)
    return ros.add(SCQPControllerNode, **base)


def _trigger(ros, node, client_node, service):
    cli = client_node.create_client(Trigger, f"{node.get_fully_qualified_name()}/{service}")
    return ros.call(cli, Trigger.Request())


def test_closed_loop_tracks_refits_without_stall_and_persists(ros, tmp_path):
    state_file = tmp_path / "scqp_state.npz"
    bridge = ros.add(MujocoBridgeNode, robot="panda", mode="lockstep", lockstep_timeout=30.0, wait_for_nodes=2,
                     wait_for_state_subscribers=1, clock_decimation=10)
    traj = ros.add(TrajectoryNode, robot="panda", use_sim_time=True, space="task", type="z_sine",
                   cartesian_size=0.05, cartesian_period=2.0, lookahead=0.2, publish_period=0.1)
    ctl = _scqp(ros, state_file=str(state_file), gp_max_points=3000)
    probe = ros.node("probe")
    states, commands = [], []
    probe.create_subscription(JointState, "joint_states", states.append, RELIABLE_STREAM_QOS)
    probe.create_subscription(Float64MultiArray, "effort_controller/commands", commands.append, RELIABLE_STREAM_QOS)
    model = RobotModel("panda")

    assert ros.spin_until(lambda: len(states) >= 2500, timeout=90.0), f"{len(states)} states: the loop stalled"
    # every state answered by a command stamped with it; nothing covered by the bridge's safe action
    c = bridge.counters.as_dict()
    assert c.get("lockstep_timeouts", 0) == 0 and c.get("safe_steps", 0) == 0 and c.get("rejected_commands", 0) == 0
    assert c["steps"] >= len(states) - 1              # lockstep: each step on the command stamped for its state
    answered = np.array([command_stamp(m) for m in commands])   # stamped with the state they answer
    assert np.all(np.diff(answered) > 0) and np.all(answered % MS == 0)
    # 200 Hz on the 1 kHz bridge: one control instant per 5 states, the torque held in between
    assert ctl.ctrl.qp.fallbacks == 0 and ctl.session.counts["computed_cycles"] >= len(states) // 5 - 2
    assert ctl.session.counts["held_cycles"] >= 3 * ctl.session.counts["computed_cycles"]
    # tracking: end-effector position against the trajectory's own task reference
    ts = np.array([_stamp(s) for s in states[200:]])
    P_ref, _, _ = traj.task.sample_many(ts * 1e-9)
    P = np.array([model.frame_pose(np.asarray(s.position))[:3, 3] for s in states[200:]])
    err = np.linalg.norm(P - P_ref, axis=1)
    # the start transient (the path moves from t = 0, the arm is at rest), then sub-millimetre
    assert np.sqrt(np.mean(err ** 2)) < 2e-3 and err[500:].max() < 1e-3, (np.sqrt(np.mean(err ** 2)),
                                                                         err[500:].max())
    assert np.ptp(P[:, 2]) > 0.08           # it moved: +-5 cm along z

    # end the episode: the refit runs on a worker thread while the lockstep loop keeps stepping
    assert ctl.session.in_episode and ctl.session.episode == 1
    with ctl._lock:   # 2800 more samples (the episode's own, jittered) so the refit takes a while
        X, Y = ctl.ctrl.residual.pending_arrays()
        assert X.shape[0] >= 400
        k = 2800 // X.shape[0] + 1
        rng = np.random.default_rng(0)
        ctl.ctrl.residual.restore_pending(np.tile(X, (k, 1))[:2800] + rng.normal(0, 1e-3, (2800, X.shape[1])),
                                          np.tile(Y, (k, 1))[:2800])
    expected = ctl.ctrl.residual.gp.max_points      # 3000 of the > 3200 samples: the newest
    client = ros.node("episodes")
    res = _trigger(ros, ctl, client, "end_episode")
    assert res.success and "background" in res.message, res.message
    progress = []   # (wall, bridge steps) while the refit runs
    t0 = time.monotonic()
    while ctl.session.refit_running and time.monotonic() - t0 < 60.0:
        ros.spin_for(0.01)
        progress.append((time.monotonic(), bridge.plant.steps))
    refit_wall = time.monotonic() - t0
    assert not ctl.session.refit_running
    assert ctl.ctrl.residual.n_points == expected and ctl.session.refits == 1
    w = np.array(progress)
    steps_during = w[-1, 1] - w[0, 1]
    moving = w[np.r_[True, np.diff(w[:, 1]) > 0], 0]           # walls at which the step count moved
    longest_still = np.diff(np.r_[moving, w[-1, 0]]).max()
    print(f"tracking RMS {np.sqrt(np.mean(err ** 2)) * 1e3:.3f} mm, after 0.7 s max {err[500:].max() * 1e3:.3f} mm;"
          f" refit of"
          f" {expected} points {refit_wall:.2f} s wall, {steps_during:.0f} lockstep steps meanwhile, longest"
          f" pause {longest_still * 1e3:.0f} ms")
    assert steps_during > 100, (refit_wall, steps_during)
    assert longest_still < max(0.25, 0.5 * refit_wall), (longest_still, refit_wall)
    assert not ctl.session.in_episode and ctl.ctrl.residual.pending == 0   # between episodes: no samples
    assert state_file.exists()
    # a second episode starts at the next control instant; the loop keeps tracking with the new GP
    res = _trigger(ros, ctl, client, "start_episode")
    assert res.success, res.message
    n0 = len(states)
    assert ros.spin_until(lambda: len(states) >= n0 + 300, timeout=60.0)
    assert ctl.session.in_episode and ctl.session.episode == 2 and ctl.ctrl.qp.fallbacks == 0
    ts = np.array([_stamp(s) for s in states[n0:]])
    P_ref, _, _ = traj.task.sample_many(ts * 1e-9)
    P = np.array([model.frame_pose(np.asarray(s.position))[:3, 3] for s in states[n0:]])
    err2 = np.linalg.norm(P - P_ref, axis=1)
    print(f"episode 2 (the refitted GP): max {err2.max() * 1e3:.3f} mm")
    assert err2.max() < 1e-3
    gains = {k: getattr(ctl.ctrl.mrac, k).copy() for k in ("psi_zeta", "psi_r", "psi_phi")}
    probe_x = (np.asarray(states[-1].position), np.asarray(states[-1].velocity), np.zeros(7))
    e_before = ctl.ctrl.residual.predict(*probe_x)[0]
    pending = ctl.ctrl.residual.pending

    # restart: the shutdown saves (GP, this episode's samples, MRAC gains); a new node loads them
    ros.executor.remove_node(ctl)
    ctl.destroy_node()
    ros.nodes.remove(ctl)
    again = _scqp(ros, state_file=str(state_file), gp_max_points=3000, auto_start_episode=False)
    assert again.session.episode == 2 and again.ctrl.residual.n_points == expected
    assert again.ctrl.residual.pending >= pending
    # reloaded GP: refactorised from the state file's arrays, BLAS may sum in another order (~n eps)
    np.testing.assert_allclose(again.ctrl.residual.predict(*probe_x)[0], e_before, rtol=1e-9, atol=1e-12)
    for k, v in gains.items():
        assert np.abs(getattr(again.ctrl.mrac, k) - v).max() < 0.05 * max(1.0, np.abs(v).max()), k
    assert again.counters.as_dict()["state_file"].startswith("loaded")


@pytest.fixture
def lone(ros, tmp_path):
    """The controller fed by a test probe (no bridge): good references for 0-99 ms."""
    logs = rosout(ros)
    ctl = _scqp(ros, use_sim_time=False, reference_wait=2.0, safe_mode="damping", safe_damping=3.0,
                state_file=str(tmp_path / "s.npz"))
    probe, pub, names, q0, p0, quat = fed_by_probe(ros, ctl)
    return ctl, probe, pub, logs, names, q0, p0, quat


def test_refused_task_references_get_the_safe_command_and_a_log_line(ros, lone):
    ctl, probe, pub, logs, names, q0, p0, quat = lone
    v = np.full(7, 0.1)
    good = send_state(ros, probe, 0, names, q0, v)          # a control instant with a good reference
    assert np.isfinite(good).all() and not np.allclose(good, -3.0 * v)
    held = send_state(ros, probe, 1 * MS, names, q0, v)     # between control instants: the held torque
    np.testing.assert_array_equal(held, good)

    def held_safe(what, ms):                                  # held safe: damping on the new state
        np.testing.assert_allclose(send_state(ros, probe, (ms + 5) * MS, names, q0, 2 * v), -6.0 * v, err_msg=what)

    refused_references_drill(ros, ctl, probe, pub, logs, names, q0, p0, quat, 3.0, after_each=held_safe)


def test_live_gains_keep_what_was_adapted_and_bad_values_are_refused(ros, lone):
    ctl, probe, pub, logs, names, q0, p0, quat = lone
    set_params = param_setter(ros, ctl)
    with ctl._lock:                               # "adapted" gains
        ctl.ctrl.mrac.psi_phi[:] = 0.01
        ctl.ctrl.mrac.psi_zeta += 0.5
        dev = ctl.ctrl.mrac.psi_zeta - ctl.ctrl.mrac.center["psi_zeta"]
    results = set_params(Parameter("kp_task", value=200.0), Parameter("w_orientation", value=0.5),
                         Parameter("rate_phi", value=[10.0]), Parameter("bound_r", value=0.5),
                         Parameter("kp_orientation", value=50.0))
    assert all(r.successful for r in results), [r.reason for r in results]
    m = ctl.ctrl.mrac
    np.testing.assert_array_equal(m.kp, [200.0] * 3)
    np.testing.assert_allclose(m.psi_phi, 0.01)
    np.testing.assert_allclose(m.psi_zeta - m.center["psi_zeta"], dev, atol=1e-12)
    assert ctl.ctrl.qp.weights["w_orientation"] == 0.5 and ctl.ctrl.qp.kp_orientation == 50.0
    np.testing.assert_array_equal(m.rates["rate_phi"], [10.0] * 3)
    np.testing.assert_array_equal(m.bounds["psi_r"], np.full((3, 3), 0.5))
    refused = {"rate": (Parameter("rate_zeta", value=[1.0, 2.0]), "1 or 3 values"),
               "bound": (Parameter("bound_phi", value=-0.5), "-1 (the default) or >= 0"),
               "weight": (Parameter("w_qdd", value=0.0), "w_qdd"),
               "mode": (Parameter("mode", value="mrac"), "read-only")}
    for what, (param, needle) in refused.items():
        (res,) = set_params(param)
        assert not res.successful and needle in res.reason, (what, res.reason)
    v = np.zeros(7)
    assert np.isfinite(send_state(ros, probe, 0, names, q0, v)).all()


def test_corrupt_state_file_is_kept_aside_and_the_node_starts_fresh(ros, tmp_path):
    logs = rosout(ros)
    path = tmp_path / "scqp_state.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    ctl = _scqp(ros, use_sim_time=False, state_file=str(path))
    kept = list(tmp_path.glob("scqp_state.npz.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"PK\x03\x04 not really a zip"   # nothing deleted
    assert not path.exists()
    assert ctl.session.episode == 0 and ctl.ctrl.residual.n_points == 0
    assert ctl.counters.as_dict()["state_file"].startswith("refused")
    assert ros.spin_until(lambda: any("refused" in m.msg and "kept as" in m.msg for m in logs), timeout=3.0)
    # it saves a fresh file where the corrupt one was
    res = _trigger(ros, ctl, ros.node("saver"), "save_state")
    assert res.success and path.exists(), res.message


def test_watchdog_trips_a_gain_set_the_loop_cannot_take_and_keeps_what_was_learned(ros, tmp_path):
    """Task and orientation gains far beyond what a 200 Hz loop with the torque held between instants can
    take (K_D dt = 50): the QP's torques bang between the effort limits; the watchdog
    trips within 100 ms of sim time, every command is finite, the safe command (damping)
    answers from then on with nothing computed, the GP samples collected before the
    trip are saved to ``state_file``, and ``~/reset_watchdog`` gives the law back."""
    state_file = tmp_path / "scqp_state.npz"
    ros.add(MujocoBridgeNode, robot="panda", mode="lockstep", lockstep_timeout=30.0, wait_for_nodes=2,
            wait_for_state_subscribers=1, clock_decimation=10)
    ros.add(TrajectoryNode, robot="panda", use_sim_time=True, space="task", type="z_sine", cartesian_size=0.05,
            cartesian_period=2.0, lookahead=0.2, publish_period=0.1)
    ctl = _scqp(ros, mode="gp_pid", kp_task=1e5, kd_task=1e4, kp_orientation=1e5, kd_orientation=1e4,
                state_file=str(state_file), gp_subsample=1)
    probe = ros.node("probe")
    commands = []
    probe.create_subscription(Float64MultiArray, "effort_controller/commands", commands.append, RELIABLE_STREAM_QOS)
    assert ros.spin_until(lambda: ctl.loop_watch.tripped, timeout=60.0), "the watchdog did not trip"
    w = ctl.loop_watch
    assert w.tripped_at <= 0.1 and "chattering" in w.reason, (w.tripped_at, w.reason)
    computed = ctl.session.counts["computed_cycles"]
    pending = ctl.ctrl.residual.pending
    assert pending > 0
    assert ros.spin_until(lambda: state_file.exists() and len(commands) > 400, timeout=30.0)
    assert ctl.session.counts["computed_cycles"] == computed        # the safe command: nothing computed
    assert ctl.counters.as_dict()["watchdog_cycles"] > 100
    assert all(np.all(np.isfinite(np.asarray(m.data))) for m in commands)
    with np.load(state_file) as f:
        assert f["pending_X"].shape[0] == pending                    # nothing learned before the trip lost
    res = _trigger(ros, ctl, probe, "reset_watchdog")
    assert res.success and not ctl.loop_watch.tripped
    assert ros.spin_until(lambda: ctl.session.counts["computed_cycles"] > computed, timeout=30.0)


def test_the_papers_settings_reach_the_controller_and_bad_bounds_are_refused(ros):
    """The node's parameters of the departures (docs/decisions.md) give the controller
    control.scqp.PAPER's settings; the defaults are PROJECT's."""
    from adaptive_dynamics.control.scqp import PAPER, PROJECT
    for settings, params in ((PAPER, dict(residual_inertia_bounds=[], mrac_reference="paper", mrac_basis="state",
                                          gp_prior_mean="zero", gp_target_acceleration="commanded")),
                             (PROJECT, {})):
        ctl = _scqp(ros, use_sim_time=False, **params).ctrl
        assert ctl.qp.residual_inertia_bounds == settings["qp"]["residual_inertia_bounds"]
        assert ctl.mrac.reference == settings["mrac"]["reference"]
        assert ctl.mrac.rbf_velocity == settings["mrac"]["rbf_velocity"]
        assert ctl.mrac.n_rbf == 3 ** (6 if settings["mrac"]["rbf_velocity"] else 3)
        assert ctl.residual.gp.prior_mean == settings["residual"]["prior_mean"]
        assert ctl.target_acceleration == settings["target_acceleration"]
    with pytest.raises(Exception, match="lo, hi"):
        _scqp(ros, use_sim_time=False, residual_inertia_bounds=[1.2, 0.8])
