"""The adaptive_controller node's task-space law (law: backstepping) over real DDS.

* Closed loop in lockstep: the MuJoCo bridge (Panda carrying a 0.8 kg tool off the flange
  axis that the model does not have), the trajectory node in task space (lissajous3d) and
  the controller adapting link 7 only: every state answered, nothing covered by the
  bridge's safe action, the end effector tracks the trajectory's own task reference, the
  estimate of link 7 moves towards the truth (URDF block + the bridge's payload) while the
  other links stay the URDF's, /diagnostics reports the task error and link 7's mass and
  centre of mass, and the estimate file keeps the adapted links.
* A task reference in another frame, with a NaN or with points out of order is refused
  with a log line and its instants get the safe command at once; switching to a joint-space
  law live is refused with the reason; kp_task and k_posture are tuned live (a wrong
  number of values refused); regressor_source topics is refused at start.
"""
from __future__ import annotations


import numpy as np
import pytest
from rclpy.parameter import Parameter

from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode
from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
from adaptive_dynamics.nodes.trajectory import TrajectoryNode
from adaptive_dynamics.ros.commands import command_stamp
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig
from task_reference_faults import MS, fed_by_probe, refused_references_drill, rosout, send_state
from test_node_safety import Probe, param_setter

pytestmark = pytest.mark.ros
TOOL = dict(payload_mass=0.8, payload_com=[0.05, 0.0, 0.15], payload_frame="panda_link7")


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec


def _controller(ros, **params):
    base = dict(robot="panda", law="backstepping", initial_estimate="nominal", adapted_links=["panda_link7"],
                adaptation="direct", gamma=[100.0], kp_task=[5.0], reference_wait=20.0, state_timeout=30.0,
                diagnostics_period=0.2, autosave_period=0.0)
    base.update(params)
    return ros.add(AdaptiveControllerNode, **base)


def test_closed_loop_tracks_and_estimates_the_tool(ros, tmp_path):
    estimate = tmp_path / "tool.npz"
    bridge = ros.add(MujocoBridgeNode, robot="panda", mode="lockstep", lockstep_timeout=30.0, wait_for_nodes=2,
                     wait_for_state_subscribers=1, clock_decimation=10, payload_enabled=True, **TOOL)
    traj = ros.add(TrajectoryNode, robot="panda", use_sim_time=True, space="task", type="lissajous3d",
                   cartesian_size=0.2, cartesian_period=4.0, lookahead=0.2, publish_period=0.1)
    ctl = _controller(ros, use_sim_time=True, estimate_file=str(estimate))
    probe = Probe(ros)
    states, commands = probe.states, probe.commands   # (its reliable joint_states and commands subscriptions)
    model = RobotModel("panda")
    truth = model.get_link_parameters("panda_link7") + \
        MujocoPlant("panda", reality=RealityConfig(payload_enabled=True, **TOOL)).payload_parameters()
    start = ctl.core.link_estimate("panda_link7")

    assert ros.spin_until(lambda: len(states) >= 4000, timeout=120.0), f"{len(states)} states: the loop stalled"
    c = bridge.counters.as_dict()
    assert c.get("lockstep_timeouts", 0) == 0 and c.get("safe_steps", 0) == 0 and c.get("rejected_commands", 0) == 0
    answered = np.array([command_stamp(m) for m in commands])
    assert np.all(np.diff(answered) > 0) and np.all(answered % MS == 0)
    # tracking: the end effector against the trajectory's own task reference
    ts = np.array([_stamp(s) for s in states])
    P_ref, _, _ = traj.task.sample_many(ts * 1e-9)
    P = np.array([model.frame_pose(np.asarray(s.position))[:3, 3] for s in states])
    err = np.linalg.norm(P - P_ref, axis=1)
    late = err[ts >= 3.0e9]
    print(f"task error: first second max {err[ts < 1e9].max() * 1e3:.2f} mm, after 3 s max"
          f" {late.max() * 1e3:.2f} mm")
    assert late.max() < 5e-3 and late.max() < 0.3 * err[ts < 1e9].max()
    assert np.ptp(P[:, 0]) > 0.15 and np.ptp(P[:, 2]) > 0.07     # it moved along the 3D path
    # the estimate: link 7 towards the truth, every other link the URDF's
    with ctl._lock:
        est = ctl.core.link_estimate("panda_link7")
        pi = ctl.core.pi
    assert abs(est["mass"] - truth[0]) < 0.3 * abs(start["mass"] - truth[0]), (start, est, truth[0])
    np.testing.assert_array_equal(pi[:60], model.parameters[:60])
    # /diagnostics: the task error and the adapted link's mass and centre of mass
    assert ros.spin_until(lambda: probe.diag_value("adaptive_controller", "panda_link7_mass") is not None,
                          timeout=5.0)
    assert abs(probe.diag_value("adaptive_controller", "panda_link7_mass") - est["mass"]) < 0.1
    # task_error_rms is the 6-D error of (27) (m and rad) over the last report: below the
    # worst 6-D error after the start transient, computed here from the states
    import pinocchio as pin
    R_d = traj.task.base.R_start
    e6 = [np.linalg.norm(np.r_[pr - model.frame_pose(np.asarray(s.position))[:3, 3],
                               pin.log3(R_d @ model.frame_pose(np.asarray(s.position))[:3, :3].T)])
          for s, pr, t in zip(states, P_ref, ts) if t >= 3.0e9]
    assert 0 < probe.diag_value("adaptive_controller", "task_error_rms") < 1.5 * max(e6)
    com = [st for arr in probe.diag for st in arr.status if "adaptive_controller" in st.name][-1]
    assert any(kv.key == "panda_link7_com" and kv.value.startswith("[") for kv in com.values)
    # the estimate file keeps the adapted links (and the fixed part)
    ros.executor.remove_node(ctl)
    ctl.destroy_node()
    ros.nodes.remove(ctl)
    saved = AdaptiveController.load(estimate, RobotModel("panda"))
    assert saved.adapted_links == ["panda_link7"]
    assert abs(saved.link_estimate("panda_link7")["mass"] - est["mass"]) < 0.05


@pytest.fixture
def lone(ros):
    """The controller fed by a test probe (no bridge): references held still for 0-99 ms."""
    logs = rosout(ros)
    ctl = _controller(ros, use_sim_time=False, reference_wait=2.0, safe_mode="damping", safe_damping=3.0)
    probe, pub, names, q0, p0, quat = fed_by_probe(ros, ctl)
    return ctl, probe, pub, logs, names, q0, p0, quat


def test_refused_task_references_get_the_safe_command_and_a_log_line(ros, lone):
    ctl, probe, pub, logs, names, q0, p0, quat = lone
    v = np.full(7, 0.1)
    good = send_state(ros, probe, 0, names, q0, v)
    assert np.isfinite(good).all() and not np.allclose(good, -3.0 * v)
    assert np.linalg.norm(ctl.bs.ref.e) < 1e-12               # at the reference pose
    theta = ctl.core.theta.copy()

    def nothing_learned(what, ms):                              # a refused instant teaches nothing
        np.testing.assert_array_equal(ctl.core.theta, theta, err_msg=what)

    refused_references_drill(ros, ctl, probe, pub, logs, names, q0, p0, quat, 3.0, after_each=nothing_learned)


def test_live_gains_and_refusals(ros, lone):
    ctl, probe, pub, logs, names, q0, p0, quat = lone
    set_params = param_setter(ros, ctl)
    results = set_params(Parameter("kp_task", value=[4.0, 4.0, 4.0, 2.0, 2.0, 2.0]),
                         Parameter("k_posture", value=0.5), Parameter("adaptation", value="composite"),
                         Parameter("kd", value=[3.0]), Parameter("gamma", value=[50.0]))
    assert all(r.successful for r in results), [r.reason for r in results]
    np.testing.assert_array_equal(ctl.bs.ref.kp, [4, 4, 4, 2, 2, 2])
    assert ctl.bs.ref.k_posture == 0.5 and ctl.core.law == "composite"
    np.testing.assert_array_equal(ctl.bs.core.kd, 3.0 * np.eye(7))
    np.testing.assert_allclose(np.diag(ctl.bs.core.gamma), 50.0 * ctl.laws.gamma_scale)     # gamma_scaling: nominal
    refused = {"kp_task": (Parameter("kp_task", value=[1.0, 2.0]), "1 or 6 values"),
               "law": (Parameter("law", value="composite"), "chosen at start"),
               "links": (Parameter("adapted_links", value=["panda_link6"]), "read-only")}
    for what, (param, needle) in refused.items():
        (res,) = set_params(param)
        assert not res.successful and needle in res.reason, (what, res.reason)
    assert ctl.p["law"] == "backstepping" and ctl.core.adapted_links == ["panda_link7"]
    assert np.isfinite(send_state(ros, probe, 0, names, q0, np.zeros(7))).all()


def test_backstepping_refuses_the_regressor_topics(ros):
    with pytest.raises(Exception, match="regressor_source: inprocess"):
        _controller(ros, regressor_source="topics")


def test_adapted_links_start_from_a_file_and_keep_the_urdf_elsewhere(ros, tmp_path):
    """initial_estimate: file with adapted_links (a joint-space law here): the adapted link
    starts from the file (a state file, or a Thunder parameter file), every other link
    holds the URDF's values even where the file says otherwise."""
    m = RobotModel("panda")
    urdf = m.parameters
    pi = 1.3 * urdf                                    # every link differs from the URDF
    state = AdaptiveController(m, "direct", pi0=pi, adapted_links=["panda_link7"]).save(tmp_path / "start")
    other = RobotModel("panda")
    other.set_link_parameters("panda_link7", 1.7 * other.get_link_parameters("panda_link7"))
    other.set_link_parameters("panda_link2", 0.5 * other.get_link_parameters("panda_link2"))
    thunder = other.save_thunder_yaml(tmp_path / "panda_inertial_REG.yaml")
    for src, want in ((state, pi), (thunder, other.parameters)):
        node = ros.add(AdaptiveControllerNode, robot="panda", law="direct", adapted_links=["panda_link7"],
                       initial_estimate="file", initial_estimate_file=str(src), autosave_period=0.0)
        est = node.core.pi
        np.testing.assert_allclose(est[60:70], want[60:70], rtol=1e-9, err_msg=str(src))
        np.testing.assert_array_equal(est[:60], urdf[:60])
        np.testing.assert_array_equal(node.model.parameters, urdf)     # the node's model stays the URDF's
