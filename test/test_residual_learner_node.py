"""residual_learner node over DDS: samples assembled by stamp and joint name, the update
applied where it arrived, residuals published ahead by stamp, the live switches, bad
input rejected, and the model saved/loaded.  The reference is the ROS-free core
(OnlineResidual) fed the same samples in-process."""
from __future__ import annotations

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_srvs.srv import Trigger

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import OnlineResidual
from adaptive_dynamics.nodes.residual_learner import ResidualLearnerNode
from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.params import to_parameters
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.ros.stamps import to_ns
from adaptive_dynamics.ros.qos import PUBLISHER_STREAM_QOS, REFERENCE_QOS
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

ROBOT = "planar2"
DT = 10_000_000   # 10 ms between samples: a wide motion in few messages
N = 240
LEAD = 0.035
CFG = '{"n_basis": 64, "width": 0.4}'


@pytest.fixture(scope="module")
def model():
    return RobotModel(ROBOT)


def motion(model, N=N):
    n = model.n
    t = np.arange(N + 20) * DT * 1e-9
    w = np.array([0.9, 1.4])[:n]
    Q = 0.7 * np.sin(np.outer(t, w))
    QD = 0.7 * w * np.cos(np.outer(t, w))
    QDD = -0.7 * w ** 2 * np.sin(np.outer(t, w))
    q = Q + 0.01 * np.cos(3 * t)[:, None]        # the robot lags the reference a little
    v = QD - 0.02 * np.sin(3 * t)[:, None]
    tau = 1.5 * v + 0.4 * np.tanh(v / 0.05) + np.sin(q)   # "measured" torque
    # (the first test's commanded torque: the measured one without a 0.3 N m sensor bias)
    pt = 0.3 * np.sin(q) + 0.1                             # the controller's Y pi_hat
    return Q, QD, QDD, q, v, tau, pt


class Probe:
    def __init__(self, ros, names):
        self.node = ros.node("rl_probe")
        self.names = list(names)
        self.rev = self.names[::-1]                 # publish in another joint order: matched by name
        self.state = self.node.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.ptorque = self.node.create_publisher(JointState, "adaptive/parametric_torque", PUBLISHER_STREAM_QOS)
        self.update = self.node.create_publisher(JointState, "adaptive/parameter_update", PUBLISHER_STREAM_QOS)
        self.cmd = self.node.create_publisher(JointState, "controller/tracking_error", PUBLISHER_STREAM_QOS)
        self.ref = self.node.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
        # the checks are exactly-once: a deep reader queue, so a test thread that is slow to
        # spin on a loaded machine cannot lose residuals in its own reader history
        self.res, self.mon = self.listen("feedforward/residual"), self.listen("residual_learner/prediction")

    def listen(self, topic: str) -> list:
        """The messages of ``topic`` as they arrive (a deep reliable reader)."""
        got: list = []
        self.node.create_subscription(JointState, topic, got.append,
                                      QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE))
        return got

    def send(self, k, q, v, tau, pt, cmd=None):
        r = slice(None, None, -1)
        if cmd is not None and k % 2:   # (a command may come before its state: it waits)
            self.cmd.publish(joint_state_msg(k * DT, self.rev, effort=cmd[r]))
        self.state.publish(joint_state_msg(k * DT, self.rev, q[r], v[r], tau[r]))
        self.ptorque.publish(joint_state_msg(k * DT, self.rev, effort=pt[r]))
        if cmd is not None and not k % 2:
            self.cmd.publish(joint_state_msg(k * DT, self.rev, effort=cmd[r]))


def by_stamp(msgs, names):
    out = {}
    for m in msgs:
        idx = [list(m.name).index(j) for j in names]
        out.setdefault(to_ns(m.header.stamp), []).append(np.array(m.effort)[idx])
    return out


def test_learns_by_stamp_and_name_publishes_ahead_and_switches(ros, model):
    node = ros.add(ResidualLearnerNode, robot=ROBOT, learner="rbfn", learner_config=CFG, warmup=50,
                   learn_decimation=2, block_size=16, prediction_lead=LEAD, monitor_decimation=1,
                   diagnostics_period=0.2)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model)
    cmd = tau - 0.3   # target_torque commanded (the default): the sensor's bias never reaches the target
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(node.refs) == len(Q) and probe.state.get_subscription_count() > 0
                          and probe.ptorque.get_subscription_count() > 0 and probe.cmd.get_subscription_count() > 0,
                          timeout=10.0), (len(node.refs), node.refs.counters, node.counters.as_dict())
    ref_core = OnlineResidual(model, "rbfn", {"n_basis": 64, "width": 0.4}, learn_every=2, warmup=50,
                              threaded=False)
    d = 0.02 * np.abs(model.parameters) * np.cos(np.arange(model.n_params))
    for k in range(N):
        if k == 150:   # a parameter update between sample 149 and 150 (as the controller's stream has it)
            assert ros.spin_until(lambda: node.core.counters["samples_offered"] == 150, timeout=10.0), (node.core.diagnostics(), node.counters.as_dict())
            probe.update.publish(joint_state_msg(k * DT, model.parameter_names, q=d))
            assert ros.spin_until(lambda: node.core.counters["updates_received"] == 1, timeout=10.0)
            ref_core.add_parameter_update(d)
        probe.send(k, q[k], v[k], tau[k], pt[k], cmd[k])
        ref_core.add_sample(np.concatenate([q[k], v[k], QDD[k]]), cmd[k] - pt[k])
        # paced like a real stream (the 1 kHz subscriptions keep the latest 10, as for control)
        assert ros.spin_until(lambda: node.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert ros.spin_until(lambda: node.core.counters["samples_offered"] == N, timeout=20.0)
    assert node.core.flush(timeout=20.0)
    ref_core.process()
    c = node.core.diagnostics()
    assert c["samples_learned"] == N // 2 and c["transforms_applied"] == 1 and c["samples_rejected"] == 0
    # the fall-back to the parametric model is on by default and reported
    L = node.core.learner
    assert c["raw_prediction"] is False and not L.raw and 0 < c["n_predictions"] <= L.n_predictions
    assert c["pulled_back_fraction"] == pytest.approx(c["n_pulled_back"] / c["n_predictions"], abs=0.01)
    assert ros.spin_until(lambda: "pulled_back_fraction" in node.counters.as_dict(), timeout=5.0)
    X = np.hstack([Q, QD, QDD])
    np.testing.assert_allclose(node.core.predict(X), ref_core.predict(X), rtol=1e-7, atol=1e-9)

    # residuals: one per reference stamp up to the newest state + lead, each once, in order
    last_state = (N - 1) * DT
    last_res = last_state + (int(LEAD * 1e9) // DT) * DT
    assert ros.spin_until(lambda: probe.res and to_ns(probe.res[-1].header.stamp) >= last_res, timeout=10.0)
    ros.spin_for(0.2)  # nothing beyond the lead may follow
    stamps = [to_ns(m.header.stamp) for m in probe.res]
    assert stamps == list(range(0, last_res + 1, DT))

    # frozen model (learning off): the published residual is the model's prediction for the
    # *reference* state of that stamp; output off: zeros, while the monitor keeps predicting
    node.set_parameters(to_parameters({"learning": False}))
    probe.send(N, q[N], v[N], tau[N], pt[N], cmd[N])
    k_new = N + (int(LEAD * 1e9) // DT)
    assert ros.spin_until(lambda: to_ns(probe.res[-1].header.stamp) == k_new * DT, timeout=10.0)
    got = by_stamp(probe.res, names)
    # the node predicts the stamps up to its lead as one batch: another BLAS summation order (~n eps)
    np.testing.assert_allclose(got[k_new * DT][0], node.core.predict(X[k_new]), rtol=1e-9, atol=1e-12)
    node.set_parameters(to_parameters({"output": False}))
    probe.send(N + 1, q[N + 1], v[N + 1], tau[N + 1], pt[N + 1], cmd[N + 1])
    assert ros.spin_until(lambda: to_ns(probe.mon[-1].header.stamp) >= (k_new + 1) * DT if probe.mon else False,
                          timeout=10.0)
    ros.spin_for(0.2)
    got, mon = by_stamp(probe.res, names), by_stamp(probe.mon, names)
    assert np.all(got[(k_new + 1) * DT][0] == 0.0)
    # (as above: predicted in the node's batch of stamps, another BLAS summation order)
    np.testing.assert_allclose(mon[(k_new + 1) * DT][0], node.core.predict(X[k_new + 1]), rtol=1e-9, atol=1e-12)
    assert node.core.counters["samples_offered"] == N   # learning off: nothing more offered

    # a jump ahead (a late start, a stall): no residuals for the instants skipped
    before, lead_steps, k_jump = len(probe.res), int(LEAD * 1e9) // DT, N + 12
    probe.send(k_jump, q[k_jump], v[k_jump], tau[k_jump], pt[k_jump], cmd[k_jump])
    assert ros.spin_until(lambda: to_ns(probe.res[-1].header.stamp) == (k_jump + lead_steps) * DT, timeout=10.0)
    assert [to_ns(m.header.stamp) for m in probe.res[before:]] == \
        list(range(k_jump * DT, (k_jump + lead_steps) * DT + 1, DT))


def test_bad_input_is_rejected_and_counted(ros, model, tmp_path):
    path = tmp_path / "residual.npz"
    node = ros.add(ResidualLearnerNode, robot=ROBOT, learner="gmm", warmup=20, learn_decimation=1,
                   prediction_lead=0.0, model_file=str(path), target_torque="measured")
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, N=80)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(node.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0,
                          timeout=10.0)
    for k in range(60):
        probe.send(k, q[k], v[k], tau[k], pt[k])
        assert ros.spin_until(lambda: node.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert ros.spin_until(lambda: node.core.counters["samples_offered"] == 60, timeout=10.0)
    assert node.core.flush(timeout=10.0)
    X = np.hstack([Q, QD, QDD])
    before = node.core.predict(X)
    learned = node.core.counters["samples_learned"]
    assert learned == 60
    # wrong joint names, NaN torque, NaN parametric torque, wrong parameter names, NaN update
    probe.state.publish(joint_state_msg(60 * DT, ["a", "b"], q[60], v[60], tau[60]))
    probe.state.publish(joint_state_msg(61 * DT, names, q[61], v[61], [np.nan] * model.n))
    probe.ptorque.publish(joint_state_msg(62 * DT, names, effort=[np.nan] * model.n))
    probe.update.publish(joint_state_msg(62 * DT, ["x"] * model.n_params, q=np.zeros(model.n_params)))
    probe.update.publish(joint_state_msg(62 * DT, model.parameter_names, q=np.full(model.n_params, np.nan)))
    counters = node.counters

    def rejected():
        c = counters.as_dict()
        return (c.get("joint_states_rejected", 0), c.get("parametric_torque_rejected", 0),
                c.get("parameter_update_rejected", 0))
    assert ros.spin_until(lambda: rejected() == (2, 1, 2), timeout=10.0), rejected()
    assert node.core.flush(timeout=10.0)
    assert node.core.counters["samples_learned"] == learned and node.core.counters["transforms_applied"] == 0
    np.testing.assert_array_equal(node.core.predict(X), before)
    assert all(np.isfinite(m.effort).all() for m in probe.res)

    # save on the Trigger, load at start in a new node (the model survives a restart)
    cli = probe.node.create_client(Trigger, "/residual_learner/save_model")
    res = ros.call(cli, Trigger.Request())
    assert res.success and path.exists(), res.message
    again = ros.add(ResidualLearnerNode, robot=ROBOT, learner="gmm", model_file=str(path))
    assert again.core.ready
    # reloaded mixture: factors recomputed from the stored covariances, BLAS may sum in another order (~n eps)
    np.testing.assert_allclose(again.core.predict(X), before, rtol=1e-9, atol=1e-12)
    # and on shutdown
    path.unlink()
    ros.executor.remove_node(node)
    ros.nodes.remove(node)
    node.destroy_node()
    assert path.exists()
    saved = path.read_bytes()
    with pytest.raises(ValueError, match="holds a 'gmm' learner"):
        ros.add(ResidualLearnerNode, robot=ROBOT, learner="rbfn", model_file=str(path))
    assert path.read_bytes() == saved   # a node that refused the file never overwrites it


def test_publish_std_streams_the_predictive_std_by_stamp(ros, model):
    """publish_std: feedforward/residual_std, one per residual with its stamp and joint
    names, effort = sqrt of the learner's own predictive variance of the reference row
    (zeros before the learner exists, zeros with output off); never NaN."""
    node = ros.add(ResidualLearnerNode, robot=ROBOT, learner="rbfn", learner_config=CFG, warmup=60,
                   learn_decimation=1, prediction_lead=LEAD, target_torque="measured", publish_std=True)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    std = probe.listen("feedforward/residual_std")
    Q, QD, QDD, q, v, tau, pt = motion(model, N=80)
    X = np.hstack([Q, QD, QDD])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(node.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0
                          and node.output.pub_std.get_subscription_count() > 0, timeout=10.0)
    for k in range(60):
        probe.send(k, q[k], v[k], tau[k], pt[k])
        assert ros.spin_until(lambda: node.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert node.core.flush(timeout=20.0) and node.core.ready
    node.set_parameters(to_parameters({"learning": False}))   # the learner is fixed from here on
    lead = int(LEAD * 1e9) // DT
    for k in range(60, 64):
        probe.send(k, q[k], v[k], tau[k], pt[k])
    last = (63 + lead) * DT
    assert ros.spin_until(lambda: std and probe.res and to_ns(std[-1].header.stamp) == last
                          and to_ns(probe.res[-1].header.stamp) == last, timeout=10.0)
    ros.spin_for(0.2)
    assert [to_ns(m.header.stamp) for m in std] == [to_ns(m.header.stamp) for m in probe.res] \
        == list(range(0, last + 1, DT))
    assert all(list(m.name) == list(names) for m in std)
    assert all(np.isfinite(m.effort).all() for m in std)
    got, res = by_stamp(std, names), by_stamp(probe.res, names)
    assert np.all(got[0][0] == 0.0)                 # before the warm-up: no learner, zero residual and std
    L = node.core.learner
    for k in range(64, 63 + lead + 1):              # published from the fixed learner
        mean, var = L.predict(X[k], return_var=True)
        np.testing.assert_allclose(res[k * DT][0], mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[k * DT][0], np.sqrt(var), rtol=1e-9, atol=1e-12)
        assert np.all(got[k * DT][0] > 0)
    # output off: zeros on both streams
    node.set_parameters(to_parameters({"output": False}))
    probe.send(64, q[64], v[64], tau[64], pt[64])
    assert ros.spin_until(lambda: to_ns(std[-1].header.stamp) == (64 + lead) * DT, timeout=10.0)
    assert np.all(by_stamp(std, names)[(64 + lead) * DT][0] == 0.0)


def test_state_residual_is_the_prediction_at_each_measured_state(ros, model):
    """state_residual: residual/state, one per state with its stamp and joint names,
    effort = the learner's prediction at (q, qd measured, qdd_d of the state's stamp) --
    not at the reference the feed-forward takes --; zeros before the learner exists and
    with output off; nothing for a state the reference does not reach."""
    node = ros.add(ResidualLearnerNode, robot=ROBOT, learner="joint_local", warmup=40, learn_decimation=1,
                   prediction_lead=0.0, target_torque="measured", state_residual=True)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    got = probe.listen("residual/state")
    Q, QD, QDD, q, v, tau, pt = motion(model, N=80)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q[:70], QD[:70], QDD[:70]))
    assert ros.spin_until(lambda: len(node.refs) == 70 and probe.ptorque.get_subscription_count() > 0
                          and node.pub_state.get_subscription_count() > 0, timeout=10.0)
    for k in range(60):
        probe.send(k, q[k], v[k], tau[k], pt[k])
        assert ros.spin_until(lambda: node.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert node.core.flush(timeout=20.0) and node.core.ready
    node.set_parameters(to_parameters({"learning": False}))
    for k in range(60, 64):
        probe.send(k, q[k], v[k], tau[k], pt[k])
    assert ros.spin_until(lambda: got and to_ns(got[-1].header.stamp) == 63 * DT, timeout=10.0)
    ros.spin_for(0.2)
    assert [to_ns(m.header.stamp) for m in got] == list(range(0, 63 * DT + 1, DT))
    res = by_stamp(got, names)
    assert np.all(res[0][0] == 0.0)                  # before the warm-up: no learner, zero residual
    L = node.core.learner
    for k in range(60, 64):
        at_state = L.predict(np.concatenate([q[k], v[k], QDD[k]]))
        np.testing.assert_allclose(res[k * DT][0], at_state, rtol=1e-9, atol=1e-12)
        assert np.abs(at_state - L.predict(np.concatenate([Q[k], QD[k], QDD[k]]))).max() > 1e-6
    node.set_parameters(to_parameters({"output": False}))
    probe.send(64, q[64], v[64], tau[64], pt[64])
    assert ros.spin_until(lambda: to_ns(got[-1].header.stamp) == 64 * DT, timeout=10.0)
    assert np.all(by_stamp(got, names)[64 * DT][0] == 0.0)
    probe.send(75, q[75], v[75], tau[75], pt[75])    # beyond the reference: nothing, counted
    assert ros.spin_until(lambda: node.counters["state_residual_no_reference"] == 1, timeout=10.0)
    ros.spin_for(0.2)
    assert to_ns(got[-1].header.stamp) == 64 * DT


def test_learns_in_lockstep_until_a_stamp(ros, model):
    """learn_in_lockstep: the samples and the update are learnt on the stream's thread in
    stamp order, whole blocks of block_size once 5 newer states have come -- the core fed the
    same stamped stream in-process gives the same model at every state; learning_until: nothing stamped at or after it is learnt, the block before it is."""
    until_k = 200
    node = ros.add(ResidualLearnerNode, robot=ROBOT, learner="rbfn", learner_config=CFG, warmup=50,
                   learn_decimation=2, block_size=16, prediction_lead=LEAD, learn_in_lockstep=True,
                   learning_until=until_k * DT * 1e-9)
    assert node.core.lockstep and node.core._thread is None
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model)
    cmd = tau - 0.3
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(node.refs) == len(Q) and probe.state.get_subscription_count() > 0
                          and probe.ptorque.get_subscription_count() > 0 and probe.cmd.get_subscription_count() > 0,
                          timeout=10.0)
    ref_core = OnlineResidual(model, "rbfn", {"n_basis": 64, "width": 0.4}, learn_every=2, warmup=50, block_size=16,
                              lockstep=True, learn_until_ns=until_k * DT)
    d = 0.02 * np.abs(model.parameters) * np.cos(np.arange(model.n_params))
    for k in range(N):
        if k == 150:   # published with state 149's stamp: learnt after sample 149, before 150
            probe.update.publish(joint_state_msg(149 * DT, model.parameter_names, q=d))
            assert ros.spin_until(lambda: node.core.counters["updates_received"] + len(node.core._due) > 0
                                  and any(it[1] == 1 for it in node.core._due), timeout=10.0)
            ref_core.add_parameter_update(d, stamp=149 * DT)
        probe.send(k, q[k], v[k], tau[k], pt[k], cmd[k])
        ref_core.add_sample(np.concatenate([q[k], v[k], QDD[k]]), cmd[k] - pt[k], stamp=k * DT)
        ref_core.advance(k * DT)
        assert ros.spin_until(lambda: node.samples.newest_stamp == k * DT, timeout=10.0)
        # what the node has learnt by this state is what the in-process core has: whole blocks
        assert ros.spin_until(lambda: node.core.counters["samples_learned"] == ref_core.counters["samples_learned"],
                              timeout=10.0), (k, node.core.counters, ref_core.counters)
    assert ros.spin_until(lambda: node.core.counters["samples_after_until"] == N - until_k, timeout=10.0)
    c = node.core.diagnostics()
    # samples 0..199 before the freeze, every 2nd queued: 100, all learnt (the last part-block too)
    assert c["samples_learned"] == until_k // 2 and c["samples_after_until"] == N - until_k
    assert c["transforms_applied"] == 1 and c["lockstep_late"] == 0
    X = np.hstack([Q, QD, QDD])
    np.testing.assert_allclose(node.core.predict(X), ref_core.predict(X), rtol=1e-9, atol=1e-12)   # same blocks
