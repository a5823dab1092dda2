"""Scripted external forces on the simulated robot (``MujocoPlant.add_push``, the
``mujoco_bridge`` node's ``push_*`` parameters, ``~/push`` and ``external_torque/truth``).

* core: the joint torques a push applies are ``J(q)^T F`` with ``J`` pinocchio's frame
  Jacobian at the pushed point (a frame added at the point's offset in the link's frame),
  the direction in world or link axes; the acceleration is the forward dynamics with them;
  a push acts for exactly its duration; the link-frame wrench reported maps to the same
  torques through the link's Jacobian; the momentum observer on the plant recovers them;
  bad schedules are refused naming the list or the link;
* node (over DDS, lockstep): a scheduled push shows up on ``external_torque/truth`` stamped
  like ``joint_states`` for exactly its steps, equal to ``J^T F`` at the state the step
  started from; ``~/push`` fires the ``push_now_*`` push from the current step; an unknown
  ``push_now_link`` is refused; a bad schedule stops the node at start with the reason.
"""
from __future__ import annotations

import math

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.control.momentum_observer import MomentumObserver
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.sim.plant import ExternalPush, MujocoPlant, push_schedule

DT = 1e-3


def point_jacobian(rm: RobotModel, q, link: str, offset):
    """Pinocchio's translational Jacobian (world axes) of the point ``offset`` of ``link``
    and the link's rotation, from a frame added at that point (independent of MuJoCo)."""
    pm = rm.model.copy()
    fid = pm.getFrameId(link)
    f = pm.frames[fid]
    pm.addFrame(pin.Frame("probe_point", f.parentJoint, fid, f.placement * pin.SE3(np.eye(3), np.asarray(offset)),
                          pin.FrameType.OP_FRAME))
    pd = pm.createData()
    pid = pm.getFrameId("probe_point")
    J = pin.computeFrameJacobian(pm, pd, q, pid, pin.ReferenceFrame.LOCAL_WORLD_ALIGNED)
    pin.updateFramePlacements(pm, pd)
    return J[:3], pd.oMf[fid].rotation.copy()


@pytest.mark.parametrize("robot,link", [("panda", "panda_link4"), ("panda", "panda_hand_tcp"),
                                        ("iiwa14", "iiwa_link_3"), ("iiwa14", "iiwa_link_ee")])
@pytest.mark.parametrize("frame", ["world", "link"])
def test_push_applies_the_jacobian_transpose_of_the_force(robot, link, frame):
    plant = MujocoPlant(robot)
    rm = RobotModel(robot)
    rng = np.random.default_rng(3)
    for _ in range(4):
        q = rng.uniform(plant.lower, plant.upper)
        v = rng.uniform(-0.5, 0.5, plant.n)
        tau = rng.uniform(-0.2, 0.2, plant.n) * plant.effort_limit
        offset = rng.uniform(-0.08, 0.08, 3)
        direction = rng.normal(size=3)
        plant.clear_pushes()
        plant.reset(q, v)
        push = plant.add_push(link, direction, 17.0, point=offset, frame=frame, duration=DT)
        plant.step(tau)
        J, R = point_jacobian(rm, q, link, offset)
        d = direction / np.linalg.norm(direction)
        F = 17.0 * (R @ d if frame == "link" else d)
        expected = J.T @ F
        np.testing.assert_allclose(plant.external_torque, expected, rtol=0, atol=1e-9 * max(1.0, np.abs(expected).max()))
        # it acted: MuJoCo's acceleration is the forward dynamics with it (reality off)
        a = pin.aba(rm.model, rm.data, q, v, tau + expected)
        np.testing.assert_allclose(plant.acceleration, a, rtol=0, atol=1e-7 * max(1.0, np.abs(a).max()))
        # the reported forces: world force, and the link wrench through the link's own Jacobian
        (f,) = plant.external_forces
        assert f["push"] is push
        np.testing.assert_allclose(f["force"], F, atol=1e-12)
        J_link = rm.jacobian(q, link, "local")
        np.testing.assert_allclose(J_link.T @ f["wrench_link"], expected, rtol=0, atol=1e-9 * max(1.0, np.abs(expected).max()))
        # the measured torque does not contain it
        np.testing.assert_allclose(plant.state()[3], tau, atol=1e-12)


@pytest.mark.parametrize("integrator", ["implicitfast", "rk4"])
def test_push_acts_for_its_duration_and_pushes_add_up(integrator):
    plant = MujocoPlant("panda", integrator=integrator)
    rm = RobotModel("panda")
    tau = rm.gravity(plant.q0)
    a = plant.add_push("panda_hand_tcp", (0, 0, -1), 10.0, start=0.005, duration=0.004)
    b = plant.add_push("panda_link5", (1, 0, 0), 5.0, point=(0.0, 0.05, 0.0), start=0.007, duration=0.003)
    on, seen = [], []
    for k in range(14):
        t0 = plant.time
        q0, _ = plant.true_state()
        plant.step(tau)
        ext = plant.external_torque
        on.append(round(t0 * 1e3))
        seen.append(tuple(f["push"] for f in plant.external_forces))
        want = np.zeros(plant.n)
        for p in (a, b):
            if p.start - 1e-9 <= t0 < p.end - 1e-9:
                J, R = point_jacobian(rm, q0, p.link, p.point)
                want += J.T @ p.force(R)
        np.testing.assert_allclose(ext, want, atol=1e-9)
    assert [len(x) for x in seen] == [0] * 5 + [1, 1, 2, 2, 1] + [0] * 4
    assert plant.pushes == ()   # over: dropped
    assert plant.diagnostics()["pushes_added"] == 2


def test_clear_and_reset():
    plant = MujocoPlant("planar2")
    plant.add_push("link2", (0, 0, 1), 3.0)            # from now, until cleared
    plant.step(np.zeros(2))
    assert np.abs(plant.external_torque).max() > 0
    plant.reset()
    assert np.all(plant.external_torque == 0) and len(plant.pushes) == 1   # reset keeps the schedule
    plant.step(np.zeros(2))
    assert np.abs(plant.external_torque).max() > 0
    assert plant.clear_pushes() == 1
    plant.step(np.zeros(2))
    assert np.all(plant.external_torque == 0) and plant.external_forces == ()


def test_observer_recovers_the_push_on_the_plant():
    plant = MujocoPlant("panda")
    rm = RobotModel("panda")
    ob = MomentumObserver(rm, gains=100.0)
    plant.add_push("panda_link5", (0.0, 1.0, -0.3), 15.0, point=(0.0, 0.05, 0.0), start=0.2, duration=0.3)
    q_hold = plant.q0.copy()
    R, truth = [], []
    t, q, v, tau = plant.state()
    ob.update(t, q, v, tau)
    for _ in range(600):
        cmd = rm.gravity(q) + 200.0 * (q_hold - q) - 30.0 * v
        plant.step(cmd)
        t, q, v, tau = plant.state()
        R.append(ob.update(t, q, v, tau))
        truth.append(plant.external_torque)
    R, truth = np.array(R), np.array(truth)
    settled = slice(300, 500)
    assert np.abs(R[:200]).max() < 0.05
    assert np.abs(R[settled] - truth[settled]).max() < 0.02 * np.abs(truth[settled]).max() + 0.05


def test_schedule_from_parallel_lists_and_its_errors():
    assert push_schedule([""], [0.0], [10.0], [0.0], [0.2]) == []
    pushes = push_schedule(["a", "b"], [0, 0, 2, 1, 0, 0], [10.0], [1.0, 2.5], [0.2, 0.1],
                           points=[0.0], frames=["link"])
    assert [p.link for p in pushes] == ["a", "b"]
    assert pushes[0].direction == (0.0, 0.0, 1.0) and pushes[1].magnitude == 10.0
    assert pushes[1].duration == 0.1 and pushes[1].start == 2.5 and pushes[0].frame == "link"
    assert pushes[0].point == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="push_directions: 3 values for 2 pushes"):
        push_schedule(["a", "b"], [0, 0, 1], [10.0], [1.0, 2.0], [0.2])
    with pytest.raises(ValueError, match="push_starts: 1 values for 2 pushes"):
        push_schedule(["a", "b"], [0, 0, 1] * 2, [10.0], [1.0], [0.2])
    with pytest.raises(ValueError, match="push_points: 4 values"):
        push_schedule(["a", "b"], [0, 0, 1] * 2, [10.0], [1.0, 2.0], [0.2], points=[0, 0, 0, 1])
    with pytest.raises(ValueError, match="push_magnitudes: 3 values"):
        push_schedule(["a", "b"], [0, 0, 1] * 2, [1.0, 2.0, 3.0], [1.0, 2.0], [0.2])
    with pytest.raises(ValueError, match="push 1 .b.: push direction must be a non-zero"):
        push_schedule(["a", "b"], [0, 0, 1, 0, 0, 0], [10.0], [1.0, 2.0], [0.2])
    with pytest.raises(ValueError, match="magnitude must be >= 0"):
        push_schedule(["a"], [0, 0, 1], [-1.0], [1.0], [0.2])
    with pytest.raises(ValueError, match="frame must be one of"):
        push_schedule(["a"], [0, 0, 1], [1.0], [1.0], [0.2], frames=["tool"])
    with pytest.raises(ValueError, match="duration must be > 0"):
        ExternalPush("a", (0, 0, 1), 1.0, duration=0.0)
    plant = MujocoPlant("planar2")
    with pytest.raises(ValueError, match=r"push link: 'link9' is not a link of the robot; links: \['base_link'"):
        plant.add_push("link9", (0, 0, 1), 1.0)
    assert plant.add_push(None, (0, 0, 1), 1.0, start=1.0, duration=math.inf).link == plant.ee_frame


# ---------------------------------------------------------------- the bridge node over DDS


@pytest.mark.ros
def test_bridge_scheduled_push_triggered_push_and_truth(ros):
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import Trigger

    from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
    from adaptive_dynamics.ros.commands import stamped_command_msg
    from adaptive_dynamics.ros.qos import COMMAND_QOS, RELIABLE_STREAM_QOS

    bridge = ros.add(MujocoBridgeNode, robot="planar2", mode="lockstep", wait_for_nodes=0,
                     wait_for_state_subscribers=1, push_links=["link2", "ee"],
                     push_directions=[0.0, 0.0, 1.0, 1.0, 0.0, 0.0], push_points=[0.1, 0.0, 0.0, 0.0, 0.0, 0.0],
                     push_frames=["world", "link"], push_magnitudes=[8.0, 5.0], push_starts=[0.010, 0.030],
                     push_durations=[0.005])
    rm = RobotModel("planar2")
    node = ros.node("push_probe")
    pub = node.create_publisher(Float64MultiArray, "effort_controller/commands", COMMAND_QOS)
    states, truth = {}, {}

    def stamp_of(msg):
        return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec

    def answer(msg):
        states[stamp_of(msg)] = np.array(msg.position)
        pub.publish(stamped_command_msg(rm.gravity(np.array(msg.position)), stamp_of(msg)))

    node.create_subscription(JointState, "joint_states", answer, RELIABLE_STREAM_QOS)
    node.create_subscription(JointState, "external_torque/truth", lambda m: truth.__setitem__(stamp_of(m),
                             np.array(m.effort)), RELIABLE_STREAM_QOS)
    ms = 1_000_000
    assert ros.spin_until(lambda: len(truth) >= 45, timeout=20.0), (len(states), len(truth))
    on = sorted(s for s, e in truth.items() if np.abs(e).max() > 0)
    # a push over [start, start + duration) acts on those steps: the states after them carry it
    assert on == [s * ms for s in (11, 12, 13, 14, 15, 31, 32, 33, 34, 35)], on
    pushes = push_schedule(["link2", "ee"], [0, 0, 1, 1, 0, 0], [8.0, 5.0], [0.010, 0.030], [0.005],
                           [0.1, 0, 0, 0, 0, 0], ["world", "link"])
    for s in on:
        q = states[s - ms]        # the step started from the previous state
        p = pushes[0] if s < 20 * ms else pushes[1]
        J, R = point_jacobian(rm, q, p.link, p.point)
        np.testing.assert_allclose(truth[s], J.T @ p.force(R), atol=1e-9)

    # ~/push fires the push_now_* push from the current step; an unknown link is refused
    setter = ros.node("push_tuner").create_client(SetParameters, "/mujoco_bridge/set_parameters")

    def set_params(*params):
        return ros.call(setter, SetParameters.Request(parameters=[p.to_parameter_msg() for p in params])).results

    (bad,) = set_params(Parameter("push_now_link", value="link9"))
    assert not bad.successful and "link9" in bad.reason and "link2" in bad.reason
    assert all(r.successful for r in set_params(Parameter("push_now_link", value="link1"),
                                                Parameter("push_now_point", value=[0.2, 0.0, 0.0]),
                                                Parameter("push_now_direction", value=[0.0, 0.0, -2.0]),
                                                Parameter("push_now_magnitude", value=6.0),
                                                Parameter("push_now_duration", value=0.003)))
    trig = ros.node("push_caller").create_client(Trigger, "/mujoco_bridge/push")
    res = ros.call(trig, Trigger.Request())
    assert res.success and "6 N" in res.message and "link1" in res.message, res.message
    assert ros.spin_until(lambda: sum(np.abs(e).max() > 0 for e in truth.values()) >= 13, timeout=10.0)
    fired = sorted(s for s, e in truth.items() if np.abs(e).max() > 0 and s > 40 * ms)
    assert len(fired) == 3 and fired == [fired[0] + k * ms for k in range(3)]
    for s in fired:
        J, _ = point_jacobian(rm, states[s - ms], "link1", (0.2, 0.0, 0.0))
        np.testing.assert_allclose(truth[s], J.T @ np.array([0.0, 0.0, -6.0]), atol=1e-9)
    assert bridge.counters.as_dict()["pushes_fired"] == 1


@pytest.mark.ros
@pytest.mark.parametrize("params,match", [
    ({"push_links": ["link9"], "push_directions": [0.0, 0.0, 1.0], "push_starts": [0.1]}, "'link9' is not a link"),
    ({"push_links": ["link2", "ee"], "push_directions": [0.0, 0.0, 1.0], "push_starts": [0.1, 0.2]},
     "push_directions: 3 values for 2 pushes"),
])
def test_bridge_refuses_a_bad_schedule(ros, params, match):
    from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
    with pytest.raises(ValueError, match=match):
        ros.add(MujocoBridgeNode, robot="planar2", mode="lockstep", wait_for_nodes=0, **params)
