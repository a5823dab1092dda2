"""The adaptive_controller node over real DDS (node in-process, messages through the rmw).

A test-side MuJoCo plant (planar2, no friction) closes the loop through the node's
topics: commands are finite and saturated, the composite estimate moves towards the
true base parameters, the published parameter updates add up to the estimate's change
(nothing lost), the parametric torque is stamped with the state it answers; gains and
law are tuned live through SetParameters (non-SPD refused with the reason); a NaN state
is answered with the safe command and leaves the estimate untouched; the estimate
survives a restart (estimate_file) and a layout mismatch is refused; autosave writes it
without holding the cycle's locks; in franka mode
(robot_compensates_gravity) the command omits exactly the model's gravity.
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode
from adaptive_dynamics.ros import joint_state_msg
from adaptive_dynamics.ros.commands import command_stamp
from adaptive_dynamics.ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, RELIABLE_STREAM_QOS
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig
from adaptive_dynamics.trajectories import ModifiedFourier

pytestmark = pytest.mark.ros
MS = 1_000_000
ROBOT = "planar2"


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec


def make_node(ros, **params):
    base = dict(robot=ROBOT, law="composite", lam=[10.0], kd=[10.0, 5.0], p0=[1.0], r=[1.0],
                lambda0=0.2, k0=200.0, k1=100.0, state_timeout=5.0, reference_wait=2.0,
                update_decimation=10, parameters_decimation=50, autosave_period=0.0)
    base.update(params)
    return ros.add(AdaptiveControllerNode, **base)


class LoopProbe:
    """The test side's node: test_node_safety.Probe's state and reference publishers and
    commands subscription, without what no test here reads -- its command publisher and
    its joint_states and /diagnostics subscriptions (the joint_states one took every state
    the loop itself published: one more callback per step in the executor)."""

    def __init__(self, ros):
        self.node = ros.node("probe")
        self.commands = []
        self.state = self.node.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.ref = self.node.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
        self.node.create_subscription(Float64MultiArray, "effort_controller/commands", self.commands.append,
                                      RELIABLE_STREAM_QOS)


class Loop:
    """Plant + reference on the test side; the node answers each state."""

    def __init__(self, ros, node, seconds):
        self.ros, self.node = ros, node
        self.probe = LoopProbe(ros)
        self.ptorque, self.updates = [], []
        self.probe.node.create_subscription(JointState, "adaptive/parametric_torque", self.ptorque.append,
                                            RELIABLE_STREAM_QOS)
        self.probe.node.create_subscription(JointState, "adaptive/parameter_update", self.updates.append,
                                            RELIABLE_STREAM_QOS)
        m = RobotModel(ROBOT)
        self.names = list(m.joint_names)
        self.plant = MujocoPlant(ROBOT, reality=RealityConfig(), timestep=1e-3)
        _, q0, _, _ = self.plant.state()
        traj = ModifiedFourier.random(m.n, np.random.default_rng(1), q_center=q0, amplitude=0.5,
                                      w_f=2 * np.pi / 2.0, L=3, lower=m.lower, upper=m.upper,
                                      vel_limit=m.velocity_limit, acc_limit=None)
        k = int(seconds * 1000) + 1
        t = np.arange(k) * 1e-3
        Q, QD, QDD = traj.sample_many(t)
        self.Q = Q
        self.probe.ref.publish(reference_batch_msg(0, MS, self.names, Q, QD, QDD))
        assert ros.spin_until(lambda: len(node.refs) >= k, timeout=10.0)
        assert ros.spin_until(lambda: node.pub_cmd.get_subscription_count() >= 1
                              and self.probe.state.get_subscription_count() >= 1, timeout=5.0)

    def run(self, steps):
        errors = []
        for _ in range(steps):
            t, q, v, tau = self.plant.state()
            stamp = int(round(t * 1e9))
            before = len(self.probe.commands)
            self.probe.state.publish(joint_state_msg(stamp, self.names, q, v, tau))
            assert self.ros.spin_until(lambda: len(self.probe.commands) > before, timeout=3.0)
            cmd = self.probe.commands[-1]
            assert command_stamp(cmd) == stamp
            u = np.asarray(cmd.data)
            assert np.all(np.isfinite(u))
            self.plant.step(u)
            errors.append(self.Q[stamp // MS] - q)
        return np.asarray(errors)


def test_composite_learns_in_the_loop_and_publishes_every_update(ros):
    node = make_node(ros)
    loop = Loop(ros, node, seconds=4.0)
    theta0 = node.core.theta.copy()
    E = loop.run(3000)
    theta = node.core.theta.copy()
    assert node.core.updates > 2500
    # the estimate moved towards the true base parameters (planar2's URDF is the plant)
    true = node.core.base.to_base(RobotModel(ROBOT).parameters)
    assert np.linalg.norm(theta - true) < 0.7 * np.linalg.norm(theta0 - true)
    # tracking in the last second better than in the first (learning pays)
    assert np.sqrt(np.mean(E[-1000:] ** 2)) < np.sqrt(np.mean(E[:1000] ** 2))
    # every update reached the topic: their sum (full coordinates) maps to the change
    ros.spin_for(0.3)
    total = np.sum([np.asarray(m.position) for m in loop.updates], axis=0)
    assert list(loop.updates[0].name) == node.core.full_parameter_names
    pending = node.core.base.to_base(node.session._dpi_acc)
    np.testing.assert_allclose(node.core.base.to_base(total) + pending, theta - theta0, atol=1e-9)
    # the parametric torque is published per state with the state's stamp
    assert len(loop.ptorque) >= 2900
    assert _stamp(loop.ptorque[-1]) == 2999 * MS
    # the estimate is latched for late joiners
    late = ros.node("late")
    got = []
    late.create_subscription(JointState, "adaptive/parameters", got.append, LATCHED_QOS)
    assert ros.spin_until(lambda: len(got) >= 1, timeout=5.0)
    assert list(got[-1].name) == node.core.parameter_names


def test_learning_until_freezes_the_estimate_at_that_stamp(ros):
    """learning_until: the estimate adapts on the states stamped before it, never after --
    at the same state in every run (a SetParameters call lands when it lands)."""
    node = make_node(ros, learning_until=0.3)
    loop = Loop(ros, node, seconds=1.0)
    loop.run(300)                                   # states 0 .. 299 ms: all before the freeze
    moved = node.core.theta.copy()
    updates = node.core.updates
    assert updates > 250 and node.p["learning"] is True
    loop.run(200)                                   # 300 .. 499 ms: at or after it
    assert node.core.updates == updates
    np.testing.assert_array_equal(node.core.theta, moved)   # not one more update: the very same array


def test_live_tuning_law_switch_and_nan_state(ros):
    node = make_node(ros)
    loop = Loop(ros, node, seconds=1.0)
    loop.run(200)
    tuner = ros.node("rqt_like")
    cli = tuner.create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")

    def set_params(*params):
        req = SetParameters.Request(parameters=[p.to_parameter_msg() for p in params])
        return ros.call(cli, req).results

    refused = {
        "negative Lambda": (Parameter("lam", value=[-1.0]), "not positive definite"),
        "wrong K_D size": (Parameter("kd", value=[1.0, 2.0, 3.0]), "kd"),
        "non-symmetric R": (Parameter("r", value=[1.0, 0.5, 0.0, 1.0]), "not symmetric"),
        "unknown law": (Parameter("law", value="bogus"), "not one of"),
        "read-only layout": (Parameter("friction", value=True), "read-only"),
    }
    for what, (param, needle) in refused.items():
        (res,) = set_params(param)
        assert not res.successful, what
        assert needle in res.reason, (what, res.reason)
    (res,) = set_params(Parameter("kd", value=[12.0, 6.0]))
    assert res.successful, res.reason
    np.testing.assert_array_equal(np.diag(node.core.kd), [12.0, 6.0])
    np.testing.assert_array_equal(np.diag(node.laws.fixed["sliding_pd"].kd), [12.0, 6.0])

    # law sliding_pd: exactly -K_D s, the estimate untouched
    (res,) = set_params(Parameter("law", value="sliding_pd"))
    assert res.successful, res.reason
    theta = node.core.theta.copy()
    t, q, v, tau = loop.plant.state()
    stamp = int(round(t * 1e9))
    k = stamp // MS
    before = len(loop.probe.commands)
    loop.probe.state.publish(joint_state_msg(stamp, loop.names, q, v, tau))
    assert ros.spin_until(lambda: len(loop.probe.commands) > before)
    ref = node.refs.lookup(stamp, 0, max_staleness_ns=-1)
    s = v - (ref.qd + 10.0 * (ref.q - q))
    np.testing.assert_allclose(loop.probe.commands[-1].data, -np.array([12.0, 6.0]) * s, rtol=1e-10)
    np.testing.assert_array_equal(node.core.theta, theta)

    # feedforward/residual: the one stamped for the state is added (by joint name)
    res_pub = loop.probe.node.create_publisher(JointState, "feedforward/residual", RELIABLE_STREAM_QOS)
    assert ros.spin_until(lambda: res_pub.get_subscription_count() >= 1)
    r = np.array([0.25, -0.5])
    res_pub.publish(joint_state_msg(stamp + MS, loop.names[::-1], effort=r[::-1]))
    res_pub.publish(joint_state_msg(stamp + 5 * MS, loop.names, effort=np.array([np.nan, 1.0])))
    assert ros.spin_until(lambda: stamp + MS in node.residuals
                          and node.counters.as_dict().get("residual_rejected", 0) == 1)
    before = len(loop.probe.commands)
    loop.probe.state.publish(joint_state_msg(stamp + MS, loop.names, q, v, tau))
    assert ros.spin_until(lambda: len(loop.probe.commands) > before)
    ref = node.refs.lookup(stamp + MS, 0, max_staleness_ns=-1)
    s = v - (ref.qd + 10.0 * (ref.q - q))
    np.testing.assert_allclose(loop.probe.commands[-1].data, -np.array([12.0, 6.0]) * s + r, rtol=1e-10)
    stamp += MS

    # a NaN state: safe command, estimate untouched
    (res,) = set_params(Parameter("law", value="composite"))
    assert res.successful
    before = len(loop.probe.commands)
    loop.probe.state.publish(joint_state_msg(stamp + MS, loop.names, np.array([np.nan, 0.0]), v, tau))
    assert ros.spin_until(lambda: len(loop.probe.commands) > before)
    assert np.all(np.isfinite(loop.probe.commands[-1].data))
    np.testing.assert_array_equal(node.core.theta, theta)
    assert k >= 0


def test_estimate_survives_restart_and_layout_mismatch_is_refused(ros, tmp_path):
    path = str(tmp_path / "est.npz")
    node = make_node(ros, estimate_file=path)
    loop = Loop(ros, node, seconds=1.0)
    loop.run(300)
    theta = node.core.theta.copy()
    assert np.linalg.norm(theta) > 0
    ros.executor.remove_node(node)
    node.destroy_node()  # saves on shutdown
    ros.nodes.remove(node)
    again = make_node(ros, estimate_file=path)
    np.testing.assert_array_equal(again.core.theta, theta)
    with pytest.raises(ValueError, match="parameter layout differs"):
        make_node(ros, estimate_file=path, friction=True)


def test_initial_estimate_file_is_read_and_never_written(ros, tmp_path):
    """initial_estimate=file (e.g. `adaptive-dynamics identify`'s estimate): the start
    estimate, the reset target and the prior forgetting returns to; the file itself is not touched, estimate_file still
    resumes over it; a missing file is a clear error."""
    import os
    src = str(tmp_path / "ident.npz")
    first = make_node(ros, estimate_file=src)
    Loop(ros, first, seconds=1.0).run(300)
    first.save_estimate()
    theta = first.core.theta.copy()
    mtime = os.stat(src).st_mtime_ns
    node = make_node(ros, initial_estimate="file", initial_estimate_file=src)
    np.testing.assert_array_equal(node.core.theta, theta)
    # ... and the estimate forgetting returns to (the file's own prior was the URDF's)
    assert node.core.forget_to == "prior"
    np.testing.assert_array_equal(node.core.theta_prior, theta)
    assert not np.array_equal(first.core.theta_prior, theta)
    Loop(ros, node, seconds=1.0).run(300)
    assert not np.array_equal(node.core.theta, theta)        # it adapts from there
    ros.executor.remove_node(node)
    node.destroy_node()
    ros.nodes.remove(node)
    assert os.stat(src).st_mtime_ns == mtime
    with pytest.raises(ValueError, match="initial_estimate_file"):
        make_node(ros, initial_estimate="file", initial_estimate_file=str(tmp_path / "missing.npz"))


def test_friction_model_file_is_the_fixed_friction_feed_forward(ros, tmp_path):
    """friction_model_file (identify --friction's friction_<kind>.json) becomes the core's
    fixed friction; a file for another joint count, or not JSON, is a clear error."""
    import json
    from adaptive_dynamics.dynamics.joint_friction import SigmoidFriction
    good, bad, junk = (str(tmp_path / f) for f in ("f2.json", "f3.json", "junk.json"))
    for path, n in ((good, 2), (bad, 3)):
        with open(path, "w") as fh:
            json.dump(SigmoidFriction([0.1] * n, [0.5] * n, [8.0] * n, [0.02] * n).to_dict(), fh)
    (tmp_path / "junk.json").write_text("{not json")
    node = make_node(ros, friction_model_file=good)
    v = np.array([[0.3, -0.2]])
    np.testing.assert_allclose(node.core.fixed_friction.torque(v), SigmoidFriction(
        [0.1] * 2, [0.5] * 2, [8.0] * 2, [0.02] * 2).torque(v))
    for path, what in ((bad, "has 3 joints"), (junk, "not JSON")):
        with pytest.raises(ValueError, match=what):
            make_node(ros, friction_model_file=path)


def test_a_loaded_estimate_that_cannot_hold_the_arm_is_reported_at_start(ros, tmp_path):
    """An estimate file whose gravity exceeds the effort limits somewhere in the joint
    ranges (3x the URDF's planar2: 71 N m on the shoulder, limit 50) is named at start
    (``estimate_over_limit_joints``); the URDF's own parameters are not."""
    from adaptive_dynamics.control import AdaptiveController
    m = RobotModel(ROBOT)
    for scale, over in ((3.0, 1), (1.0, None)):
        src = str(tmp_path / f"x{scale:g}.npz")
        AdaptiveController(m, "composite", pi0=scale * m.parameters, base_parameters=True).save(src)
        node = make_node(ros, initial_estimate="file", initial_estimate_file=src, base_parameters=True)
        assert node.counters.as_dict().get("estimate_over_limit_joints") == over, scale


def test_autosave_writes_the_estimate_outside_the_callback_lock(ros, tmp_path):
    """autosave_period: the estimate is written while learning, from the watchdog timer,
    with a snapshot taken under the core lock and the file written with neither the
    callback lock nor the core lock held (a save never delays a control cycle)."""
    from adaptive_dynamics.control.law import read_npz
    path = str(tmp_path / "auto.npz")
    node = make_node(ros, estimate_file=path, autosave_period=0.2, diagnostics_period=0.05)
    held = []
    save = node.core.save

    def spy(p, state=None):
        held.append((node._cb_lock._is_owned(), node._lock.locked()))
        return save(p, state)

    node.core.save = spy
    loop = Loop(ros, node, seconds=1.0)
    loop.run(300)
    ros.spin_for(0.6)
    assert held and not any(a or b for a, b in held), held
    theta = node.core.theta.copy()
    saved = read_npz(path, "an adaptive-controller state file")
    np.testing.assert_array_equal(saved["theta"], theta)  # nothing learned after the last save
    assert int(saved["updates"]) == node.core.updates
    # a failed write leaves the estimate marked unsaved: the next period retries
    node.session.dirty = True

    def broken(p, state=None):
        raise OSError("disk full")

    node.core.save = broken
    with pytest.raises(OSError):
        node.save_estimate()
    assert node.session.dirty


def test_franka_mode_leaves_gravity_to_the_robot(ros):
    node = make_node(ros, law="slotine_li", robot_compensates_gravity=True)
    loop = Loop(ros, node, seconds=1.0)
    loop.run(50)
    t, q, v, tau = loop.plant.state()
    stamp = int(round(t * 1e9))
    before = len(loop.probe.commands)
    loop.probe.state.publish(joint_state_msg(stamp, loop.names, q, v, tau))
    assert ros.spin_until(lambda: len(loop.probe.commands) > before)
    ref = node.refs.lookup(stamp, 0, max_staleness_ns=-1)
    m = RobotModel(ROBOT)
    vr = ref.qd + 10.0 * (ref.q - q)
    ar = ref.qdd + 10.0 * (ref.qd - v)
    s = v - vr
    expected = m.mass_matrix(q) @ ar + m.coriolis_matrix(q, v) @ vr - np.array([10.0, 5.0]) * s
    np.testing.assert_allclose(loop.probe.commands[-1].data, expected, rtol=1e-8, atol=1e-10)


def test_residual_wait_holds_the_state_until_its_residual_arrives(ros):
    """residual_wait (lockstep): once residuals come, a state is answered only with the
    residual stamped for it (up to residual_wait wall s); not when a newer one already
    came (it was lost: residuals come in stamp order); after the wait, the staleness rule."""
    import time as _time

    node = make_node(ros, law="sliding_pd", residual_wait=0.8, residual_staleness=0.0)
    loop = Loop(ros, node, seconds=1.0)
    res_pub = loop.probe.node.create_publisher(JointState, "feedforward/residual", RELIABLE_STREAM_QOS)
    assert ros.spin_until(lambda: res_pub.get_subscription_count() >= 1)
    t, q, v, tau = loop.plant.state()
    names = loop.names

    def state(stamp):
        before = len(loop.probe.commands)
        loop.probe.state.publish(joint_state_msg(stamp, names, q, v, tau))
        return before

    def pd_command(stamp):
        ref = node.refs.lookup(stamp, 0, max_staleness_ns=-1)
        return -np.array([10.0, 5.0]) * (v - (ref.qd + 10.0 * (ref.q - q)))

    # no residual ever received: no waiting
    before = state(0)
    assert ros.spin_until(lambda: len(loop.probe.commands) > before, timeout=3.0)
    # the first residual arms the wait; the next state waits for its own
    res_pub.publish(joint_state_msg(0, names, effort=np.zeros(2)))
    assert ros.spin_until(lambda: 0 in node.residuals)
    before = state(MS)
    ros.spin_for(0.3)
    assert len(loop.probe.commands) == before, "answered without its residual"
    r = np.array([0.5, -0.25])
    res_pub.publish(joint_state_msg(MS, names, effort=r))
    assert ros.spin_until(lambda: len(loop.probe.commands) > before, timeout=3.0)
    assert command_stamp(loop.probe.commands[-1]) == MS
    np.testing.assert_allclose(loop.probe.commands[-1].data, pd_command(MS) + r, rtol=1e-10)
    # a newer residual already here: the state's own was lost, no wait (and no residual)
    res_pub.publish(joint_state_msg(3 * MS, names, effort=r))
    assert ros.spin_until(lambda: 3 * MS in node.residuals)
    before = state(2 * MS)
    assert ros.spin_until(lambda: len(loop.probe.commands) > before, timeout=0.5)
    np.testing.assert_allclose(loop.probe.commands[-1].data, pd_command(2 * MS), rtol=1e-10)
    # never arrives: answered after residual_wait without it
    res_pub.publish(joint_state_msg(3 * MS, names, effort=r))
    t0 = _time.monotonic()
    before = state(4 * MS)
    assert ros.spin_until(lambda: len(loop.probe.commands) > before, timeout=5.0)
    assert _time.monotonic() - t0 > 0.7
    np.testing.assert_allclose(loop.probe.commands[-1].data, pd_command(4 * MS), rtol=1e-10)
    c = node.counters.as_dict()
    assert c["residual_waited"] == 2 and c["residual_wait_expired"] == 1


def test_parametric_torque_state_is_the_estimate_at_the_learners_input(ros):
    """parametric_torque: state -- adaptive/parametric_torque carries Y(q, qd, qdd_d) pi_hat
    of each state (the estimate its torque used), pinocchio's RNEA at the URDF's estimate
    on the first state; the command is the law's as with law."""
    node = make_node(ros, parametric_torque="state", initial_estimate="nominal")
    assert node.core.state_torque
    loop = Loop(ros, node, seconds=1.0)
    m = RobotModel(ROBOT)
    pm = pin.buildModelFromUrdf(m.urdf_path)
    pd = pm.createData()
    sent = []
    for _ in range(5):
        t, q, v, _tau = loop.plant.state()
        sent.append((int(round(t * 1e9)), q.copy(), v.copy(), node.core.pi.copy()))
        loop.run(1)
    assert loop.ros.spin_until(lambda: len(loop.ptorque) >= 5, timeout=5.0)
    got = {_stamp(msg): np.asarray(msg.effort) for msg in loop.ptorque}
    refs = node.refs
    for i, (stamp, q, v, pi) in enumerate(sent):
        qdd_d = refs.lookup(stamp, 0, 0).qdd
        want = m.regressor(q, v, qdd_d) @ pi
        np.testing.assert_allclose(got[stamp], want, rtol=1e-9, atol=1e-9)
        if i == 0:
            np.testing.assert_allclose(got[stamp], pin.rnea(pm, pd, q, v, qdd_d), rtol=1e-9, atol=1e-9)
