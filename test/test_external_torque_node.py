"""external_torque node over DDS: joint_states of a free motion, then with an external
torque, give the stamped external torque the ROS-free observer computes, the wrench and
the contact flag; the thresholds calibrated from the free motion; bad states refused and
nothing NaN published; the adaptive controller's estimate and the learned residual used."""
from __future__ import annotations

import numpy as np
from rclpy.parameter import Parameter
import pinocchio as pin
import pytest
from geometry_msgs.msg import WrenchStamped
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState

from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.control.contact import (ContactDetector, ThresholdCalibration, calibrate_change,
                                              calibrate_residual_joints, calibrate_whitening)
from adaptive_dynamics.control.momentum_observer import EstimateLayout, MomentumObserver, observer_model
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.external_torque import ExternalTorqueNode
from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS
from adaptive_dynamics.ros.stamps import to_ns

pytestmark = pytest.mark.ros

ROBOT = "planar2"
DT = 1e-3
T0 = 5_000_000_000          # the stream's first stamp [ns]


def simulate(model, K, ext=None, friction=None, seed=0):
    """Computed-torque tracking of a sine on pinocchio's forward dynamics (RK4, the torque
    and the external torque held over each 1 ms step); the measured torque with 0.01 N m
    noise.  Returns stamps [ns], q, v, measured torque (model order)."""
    pm, pd = model.model, model.model.createData()
    n = model.n
    w = np.array([1.1, 1.7])
    rng = np.random.default_rng(seed)

    def ref(t):
        return 0.6 * np.sin(w * t), 0.6 * w * np.cos(w * t), -0.6 * w * w * np.sin(w * t)

    q, v, _ = ref(0.0)
    S, Q, V, TAU = [T0], [q], [v], [np.zeros(n)]
    h = DT / 4
    for k in range(K):
        t = k * DT
        qd, vd, ad = ref(t)
        tau = pin.rnea(pm, pd, q, v, ad + 100.0 * (qd - q) + 20.0 * (vd - v)).copy()
        e = tau + (0.0 if ext is None else ext(t))

        def acc(q, v):
            return pin.aba(pm, pd, q, v, e - (0.0 if friction is None else friction(q, v))).copy()

        for _ in range(4):
            k1 = acc(q, v)
            k2 = acc(q + 0.5 * h * v, v + 0.5 * h * k1)
            k3 = acc(q + 0.5 * h * (v + 0.5 * h * k1), v + 0.5 * h * k2)
            k4 = acc(q + h * (v + 0.5 * h * k2), v + h * k3)
            q, v = (q + h * v + h * h / 6 * (k1 + k2 + k3),
                    v + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4))
        S.append(T0 + (k + 1) * 1_000_000)
        Q.append(q)
        V.append(v)
        TAU.append(tau + 0.01 * rng.standard_normal(n))
    return np.array(S), np.array(Q), np.array(V), np.array(TAU)


class Probe:
    def __init__(self, ros, names):
        self.node = ros.node("et_probe")
        self.names = list(names)
        self.state = self.node.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.estimate = self.node.create_publisher(JointState, "adaptive/parameters", LATCHED_QOS)
        self.residual = self.node.create_publisher(JointState, "feedforward/residual", PUBLISHER_STREAM_QOS)
        self.state_residual = self.node.create_publisher(JointState, "residual/state", PUBLISHER_STREAM_QOS)
        self.residual_std = self.node.create_publisher(JointState, "feedforward/residual_std", PUBLISHER_STREAM_QOS)
        deep = QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE)
        self.torque, self.contact, self.wrench = [], [], []
        self.node.create_subscription(JointState, "external_torque", self.torque.append, deep)
        self.node.create_subscription(JointState, "contact", self.contact.append, deep)
        self.node.create_subscription(WrenchStamped, "external_wrench", self.wrench.append, deep)

    def send(self, stamp, q, v, tau, names=None):
        r = slice(None, None, -1)        # another joint order than the model's: matched by name
        names = self.names[r] if names is None else names
        self.state.publish(joint_state_msg(int(stamp), names, q[r], v[r], None if tau is None else tau[r]))


def by_stamp(msgs, names):
    out = {}
    for m in msgs:
        idx = [list(m.name).index(j) for j in names]
        out[to_ns(m.header.stamp)] = np.array(m.effort)[idx]
    return out


def connected(ros, node, probe):
    assert ros.spin_until(lambda: probe.state.get_subscription_count() > 0 and all(
        p.get_subscription_count() > 0 for p in (node.pub_torque, node.pub_contact, node.pub_wrench)), timeout=10.0)


def feed(ros, node, probe, S, Q, V, TAU, *, before=None):
    """Publish the states one at a time, each once the node has taken the previous one."""
    for k in range(len(S)):
        if before is not None:
            before(k)
        probe.send(S[k], Q[k], V[k], TAU[k])
        assert ros.spin_until(lambda: node.counters["states"] == k + 1, timeout=10.0), node.counters.as_dict()


def test_external_torque_calibration_contact_and_bad_states(ros):
    model = RobotModel(ROBOT)
    names = model.joint_names
    push = np.array([1.5, -1.0])
    S, Q, V, TAU = simulate(model, 500, ext=lambda t: push if t >= 0.3 - 1e-9 else 0.0)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[60.0], calibrate=0.15, diagnostics_period=0.2)
    probe = Probe(ros, names)
    connected(ros, node, probe)
    assert not node.detector.configured

    def bad(k):
        if k != 100:
            return
        q = Q[k].copy()
        q[1] = np.nan
        probe.send(S[k] - 500_000, q, V[k], TAU[k])                       # NaN
        probe.send(S[k] - 400_000, Q[k], V[k], TAU[k], names=["a", "b"])  # unknown joints
        probe.send(S[k] - 300_000, Q[k], V[k], None)                      # no measured torque
        probe.send(S[k - 50], Q[k - 50], V[k - 50], TAU[k - 50])          # older than the last
        assert ros.spin_until(lambda: node.counters["joint_states_rejected"] == 3
                              and node.counters["out_of_order"] == 1, timeout=10.0), node.counters.as_dict()

    feed(ros, node, probe, S, Q, V, TAU, before=bad)
    assert ros.spin_until(lambda: len(probe.torque) == len(probe.contact) == len(probe.wrench) == len(S),
                          timeout=10.0), (len(probe.torque), len(probe.contact), len(probe.wrench))
    # the observer's output, stamp by stamp: the core fed the same states
    ref = MomentumObserver(model, gains=60.0).run((S - S[0]) * 1e-9, Q, V, TAU)
    got = by_stamp(probe.torque, names)
    assert sorted(got) == S.tolist()
    R = np.array([got[s] for s in S])
    assert np.abs(R - ref).max() < 1e-9
    assert all(np.all(np.isfinite(m.effort)) for m in probe.torque)
    # calibrated on the first 0.15 s (free motion): 1.5 x max |r|, then the parameter holds them
    cal = ThresholdCalibration(model.n)
    for s, r in zip(S, ref):
        cal.add((s - S[0]) * 1e-9, r)
        if cal.duration >= 0.15:
            break
    thr = cal.thresholds("max", margin=1.5)
    assert np.allclose(node.p["thresholds"], thr, rtol=1e-9) and node.p["calibrate"] == 0.0
    # ... and the whitening (whiten, the default) from the same states: the noise model and
    # z's thresholds of calibrate_whitening on the core's r and inertia
    Ms = np.array([model.mass_matrix(q) for q in Q])      # the URDF's inertia (no armature set)
    w, thr_z = calibrate_whitening(ref[:cal.count], Ms[:cal.count], "max", margin=1.5)
    np.testing.assert_allclose(node.p["whitening_white"], w.white, rtol=1e-6)
    np.testing.assert_allclose(node.p["whitening_slow"], w.slow, rtol=1e-6)
    np.testing.assert_allclose(node.p["whitened_thresholds"], thr_z, rtol=1e-6)
    assert node.detector.whitening is not None
    # ... and d's (change_window, the default): calibrate_change on the same states, where d is
    # watched -- not in the first 3 / K_O (r rising from 0 to the model's level) nor window states after
    D = node.p["change_window"]
    first = ((S - S[0]) * 1e-9 <= 3.0 / 60.0)[:cal.count]
    valid = ~np.convolve(first.astype(int), np.ones(D, int))[:cal.count].astype(bool)
    thr_d = calibrate_change(ref[:cal.count], Ms[:cal.count], w, D, "max", margin=1.5, valid=valid)
    np.testing.assert_allclose(node.p["change_thresholds"], thr_d, rtol=1e-6)
    assert node.detector.change_window == node.p["change_window"] and node.detector.change_thresholds is not None
    node._diagnostics()
    assert node.counters["whitening"] == "on"
    # no contact in free motion; the push (> 10 x the thresholds) flags both joints within ms
    contact = {to_ns(m.header.stamp): list(m.name) for m in probe.contact}
    t = (S - S[0]) * 1e-9
    assert not any(contact[s] for s, tt in zip(S, t) if tt <= 0.3)
    first = min(s for s in S if contact[s])
    assert 0 < (first - S[0]) * 1e-9 - 0.3 <= 0.005, (first - S[0]) * 1e-9
    assert all(sorted(contact[s]) == sorted(names) for s, tt in zip(S, t) if tt >= 0.33)
    assert np.abs(R[-1] - push).max() < 0.05
    # the wrench at the end effector (planar: the force in the plane, in the TCP's axes)
    w = probe.wrench[-1]
    assert w.header.frame_id == model.ee_frame and to_ns(w.header.stamp) == S[-1]
    F = np.array([w.wrench.force.x, w.wrench.force.y, w.wrench.force.z,
                  w.wrench.torque.x, w.wrench.torque.y, w.wrench.torque.z])
    assert np.allclose(model.jacobian(Q[-1], None, "local").T @ F, R[-1], atol=1e-6)
    c = node.counters.as_dict()
    assert c["states"] == len(S) and c["joint_states_rejected"] == 3 and c["out_of_order"] == 1
    assert c["nonfinite_output"] == 0 and c["calibration"] == "done"


def test_whitening_off_and_set_live(ros):
    """whiten false: a calibration sets the thresholds only (r alone); the whitening's
    three parameters set live switch z on, [0] switches it off; a bad set is refused;
    change_thresholds set live switch d on (change_hold live; another change_window sets
    them back to [0]: they were calibrated for the window; 0 off)."""
    model = RobotModel(ROBOT)
    S, Q, V, TAU = simulate(model, 150, seed=4)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, calibrate=0.1, whiten=False, publish_wrench=False)
    probe = Probe(ros, model.joint_names)
    connected(ros, node, probe)
    feed(ros, node, probe, S, Q, V, TAU)
    assert node.detector.configured and node.counters["calibration"] == "done"
    assert list(node.p["whitened_thresholds"]) == [0.0] and node.detector.whitening is None
    node._diagnostics()
    assert node.counters["whitening"] == "off (whiten false)"
    for name, value in (("whitening_white", [0.1, 0.2]), ("whitening_slow", [0.01, 0.02]),
                        ("whitened_thresholds", [3.0, 4.0])):
        assert node.set_parameters([Parameter(name, value=value)])[0].successful
    assert np.allclose(node.detector.whitening.white, [0.1, 0.2]) and np.allclose(node.detector.whitened_thresholds,
                                                                                   [3.0, 4.0])
    bad = node.set_parameters([Parameter("whitened_thresholds", value=[3.0, 0.0])])[0]
    assert not bad.successful and np.allclose(node.detector.whitened_thresholds, [3.0, 4.0])
    # d: its thresholds set live switch it on (the whitening's white part), change_window 0 off
    assert node.detector.change_thresholds is None
    assert node.set_parameters([Parameter("change_thresholds", value=[2.0, 2.5])])[0].successful
    assert np.allclose(node.detector.change_thresholds, [2.0, 2.5]) and node.detector.change_window == 10
    assert node.set_parameters([Parameter("change_hold", value=7)])[0].successful
    assert node.detector.change_hold == 7 and np.allclose(node.detector.change_thresholds, [2.0, 2.5])
    # another window: the thresholds were another's -- d off, change_thresholds back to [0] with the next state
    assert node.set_parameters([Parameter("change_window", value=4)])[0].successful
    assert node.detector.change_thresholds is None
    probe.send(S[-1] + 1_000_000, Q[-1], V[-1], TAU[-1])
    assert ros.spin_until(lambda: list(node.p["change_thresholds"]) == [0.0], timeout=10.0)
    assert node.set_parameters([Parameter("change_thresholds", value=[2.0, 2.5])])[0].successful
    assert node.detector.change_window == 4 and node.detector.change_thresholds is not None
    assert node.set_parameters([Parameter("change_window", value=0)])[0].successful
    assert node.detector.change_thresholds is None
    assert node.set_parameters([Parameter("whitening_white", value=[0.0])])[0].successful
    assert node.detector.whitening is None


def test_second_low_pass_set_live(ros):
    """filter_gains (the observer's second low pass) from the start and changed through the
    parameter mid-run: the node's r equals the core's fed the same states with the same
    change at the same sample."""
    model = RobotModel(ROBOT)
    names = model.joint_names
    S, Q, V, TAU = simulate(model, 300, ext=lambda t: np.array([1.0, -0.5]) if t >= 0.1 - 1e-9 else 0.0)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], filter_gains=[150.0])
    probe = Probe(ros, names)
    connected(ros, node, probe)
    ref = MomentumObserver(model, gains=40.0, filter_gains=150.0)
    T = (S - S[0]) * 1e-9
    want = []
    for k in range(len(S)):
        if k == 200:
            ref.set_filter_gains([80.0, 0.0])
        want.append(ref.update(T[k], Q[k], V[k], TAU[k]))

    def change(k):
        if k == 200:
            node.set_parameters([Parameter("filter_gains", value=[80.0, 0.0])])

    feed(ros, node, probe, S, Q, V, TAU, before=change)
    assert ros.spin_until(lambda: len(probe.torque) == len(S), timeout=10.0)
    got = by_stamp(probe.torque, names)
    R = np.array([got[s] for s in S])
    assert np.abs(R - np.array(want)).max() < 1e-9
    assert np.abs(R[199] - np.array([1.0, -0.5])).max() < 0.05    # 0.1 s (4 / K_O) after the push


@pytest.mark.parametrize("residual_input", ["reference", "state"])
def test_the_estimate_and_the_residual(ros, residual_input):
    base = RobotModel(ROBOT)
    model = RobotModel(ROBOT, friction=True)
    names = model.joint_names
    fv = np.array([0.8, 0.5])

    def ripple(q):   # what the rigid body + friction cannot express: the learner's part
        return 0.3 * np.sin(3.0 * q)

    S, Q, V, TAU = simulate(base, 300, friction=lambda q, v: fv * v + ripple(q))
    node = ros.add(ExternalTorqueNode, robot=ROBOT, friction=True, model_source="estimate", use_residual=True,
                   thresholds=[0.2], residual_input=residual_input)
    probe = Probe(ros, names)
    connected(ros, node, probe)
    # the residual_input's topic is taken, the other one ignored
    taken, other = ((probe.residual, probe.state_residual) if residual_input == "reference"
                    else (probe.state_residual, probe.residual))
    assert ros.spin_until(lambda: taken.get_subscription_count() > 0, timeout=10.0)
    assert other.get_subscription_count() == 0
    # the adaptive controller's estimate (base parameters): the URDF's rigid body + the viscous friction
    core = AdaptiveController(model, "composite", pi0=np.concatenate([base.parameters, fv, np.zeros(2)]))
    probe.estimate.publish(joint_state_msg(S[0], ["bogus"] * core.n_adapted, q=core.theta))
    assert ros.spin_until(lambda: node.counters["estimate_rejected"] == 1, timeout=10.0)
    probe.estimate.publish(joint_state_msg(S[0], core.parameter_names, q=core.theta))
    assert ros.spin_until(lambda: node.counters["estimates_applied"] == 1, timeout=10.0), node.counters.as_dict()
    F = np.array([ripple(q) for q in Q])

    def residual(k):   # the learner's stream: stamped for the instant, published ahead of its state
        taken.publish(joint_state_msg(int(S[k]), names, effort=F[k]))
        assert ros.spin_until(lambda: int(S[k]) in node.residuals, timeout=10.0)

    feed(ros, node, probe, S, Q, V, TAU, before=residual)
    assert ros.spin_until(lambda: len(probe.torque) == len(S), timeout=10.0)
    pi = EstimateLayout(model).to_pi(core.parameter_names, core.theta)
    ref = MomentumObserver(observer_model(model, pi), gains=50.0).run((S - S[0]) * 1e-9, Q, V, TAU, residuals=F)
    got = by_stamp(probe.torque, names)
    R = np.array([got[s] for s in S])
    assert np.abs(R - ref).max() < 1e-9
    assert node.counters["residual_missing"] == 0
    # the friction and the ripple explained: what is left is the sensor noise through the low pass
    assert np.abs(R).max() < 0.05
    urdf = MomentumObserver(base, gains=50.0).run((S - S[0]) * 1e-9, Q, V, TAU)
    assert np.abs(urdf).max() > 0.3                     # the URDF's model alone would call it contact
    assert not any(m.name for m in probe.contact)


def test_calibration_keeps_the_residual_where_it_helps(ros):
    """use_residual + calibrate (residual_select, the default): the node calibrates r with
    and without the residual over the same free motion, keeps the residual on joint 1 (where
    it is the plant's ripple) and drops it on joint 2 (where it is wrong): residual_joints
    and the thresholds as the core computes them from the same stream; from then on joint
    2's r is the one without the residual.  A residual_joints naming no joint is refused."""
    model = RobotModel(ROBOT)
    names = model.joint_names

    def ripple(q):
        return 0.3 * np.sin(3.0 * q)

    S, Q, V, TAU = simulate(model, 300, friction=lambda q, v: ripple(q))
    F = np.array([ripple(q) for q in Q])
    F[:, 1] = 0.4 * np.sin(20.0 * (S - S[0]) * 1e-9)          # wrong on joint 2
    node = ros.add(ExternalTorqueNode, robot=ROBOT, use_residual=True, calibrate=0.2, min_samples=2,
                   publish_wrench=False)
    probe = Probe(ros, names)
    assert ros.spin_until(lambda: probe.state.get_subscription_count() > 0
                          and node.pub_torque.get_subscription_count() > 0, timeout=10.0)
    assert not node.set_parameters([Parameter("residual_joints", value=["elbow"])])[0].successful
    assert list(node.p["residual_joints"]) == ["all"]

    def residual(k):
        probe.residual.publish(joint_state_msg(int(S[k]), names, effort=F[k]))
        assert ros.spin_until(lambda: int(S[k]) in node.residuals, timeout=10.0)

    feed(ros, node, probe, S, Q, V, TAU, before=residual)
    assert ros.spin_until(lambda: len(probe.torque) == len(S), timeout=10.0)
    ref = MomentumObserver(model, gains=50.0)
    cw, cwo = ThresholdCalibration(2, min_samples=2), ThresholdCalibration(2, min_samples=2)
    T = (S - S[0]) * 1e-9
    W, WO = [], []
    for k in range(len(S)):
        ref.update(T[k], Q[k], V[k], TAU[k], F[k])
        W.append(ref.r_with_residual)
        WO.append(ref.r_without_residual)
        if cw.duration < 0.2:
            cw.add(T[k], W[-1])
            cwo.add(T[k], WO[-1])
    thr, keep = calibrate_residual_joints(cw, cwo, "max", margin=1.5)
    assert keep.tolist() == [True, False]
    assert list(node.p["residual_joints"]) == [names[0]]
    assert np.allclose(node.p["thresholds"], thr, rtol=1e-9) and node.counters["calibration"] == "done"
    got = by_stamp(probe.torque, names)
    R = np.array([got[s] for s in S])
    done = np.flatnonzero(T > 0.2 + 2e-3)
    assert np.abs(R[done, 0] - np.array(W)[done, 0]).max() < 1e-9
    assert np.abs(R[done, 1] - np.array(WO)[done, 1]).max() < 1e-9


def test_a_live_change_cancels_a_running_calibration(ros):
    """uncertainty_gain changed while a calibration runs: it is cancelled (it was taken under
    the old value), calibrate goes back to 0, no thresholds set."""
    model = RobotModel(ROBOT)
    S, Q, V, TAU = simulate(model, 150)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, calibrate=0.12, publish_wrench=False)
    probe = Probe(ros, model.joint_names)
    assert ros.spin_until(lambda: probe.state.get_subscription_count() > 0, timeout=10.0)

    def change(k):
        if k == 60:
            assert node.set_parameters([Parameter("uncertainty_gain", value=1.0)])[0].successful

    feed(ros, node, probe, S, Q, V, TAU, before=change)
    assert node.counters["calibration"] == "cancelled (uncertainty_gain changed)"
    assert node.p["calibrate"] == 0.0 and not node.detector.configured and list(node.p["thresholds"]) == [0.0]


def test_calibration_under_the_learner_std(ros):
    """use_residual_std with uncertainty_gain k_u: the calibration takes each base under
    the term it will sit below (the excess |r| - k_u std with the residual, |r| without it),
    as the core computes it from the same stream."""
    model = RobotModel(ROBOT)
    names = model.joint_names

    def ripple(q):
        return 0.3 * np.sin(3.0 * q)

    S, Q, V, TAU = simulate(model, 300, friction=lambda q, v: ripple(q),
                            ext=lambda t: np.array([0.0, 0.5]) if t >= 0.24 - 1e-9 else 0.0)   # a push on joint 2
    T = (S - S[0]) * 1e-9
    F = np.array([ripple(q) for q in Q])
    F[:, 1] = 0.4 * np.sin(20.0 * T)                           # wrong on joint 2
    D = np.column_stack([0.05 + 0.05 * np.abs(np.sin(5.0 * T)), np.full(len(T), 0.3)])
    node = ros.add(ExternalTorqueNode, robot=ROBOT, use_residual=True, use_residual_std=True, uncertainty_gain=2.0,
                   calibrate=0.2, min_samples=2, publish_wrench=False, change_window=0)   # (r's term: d off)
    probe = Probe(ros, names)
    assert ros.spin_until(lambda: probe.state.get_subscription_count() > 0
                          and probe.residual_std.get_subscription_count() > 0
                          and node.pub_torque.get_subscription_count() > 0, timeout=10.0)

    def residual(k):
        probe.residual_std.publish(joint_state_msg(int(S[k]), names, effort=D[k]))
        probe.residual.publish(joint_state_msg(int(S[k]), names, effort=F[k]))
        assert ros.spin_until(lambda: int(S[k]) in node.residuals and int(S[k]) in node.residual_stds, timeout=10.0)

    feed(ros, node, probe, S, Q, V, TAU, before=residual)
    ref = MomentumObserver(model, gains=50.0)
    cw, cwo = ThresholdCalibration(2, min_samples=2, margin=1.5), ThresholdCalibration(2, min_samples=2, margin=1.5)
    for k in range(len(S)):
        ref.update(T[k], Q[k], V[k], TAU[k], F[k])
        if cw.duration < 0.2:
            cw.add(T[k], ref.r_with_residual, 2.0 * D[k])
            cwo.add(T[k], ref.r_without_residual, np.zeros(2))
    thr, keep = calibrate_residual_joints(cw, cwo, "max")
    assert keep.tolist() == [True, False] and list(node.p["residual_joints"]) == [names[0]]
    assert np.allclose(node.p["thresholds"], thr, rtol=1e-9)
    assert node.observer.residual_mask.tolist() == [True, False]
    # the std counts on the kept joint only: the node's contact flags are the core detector's
    # fed the masked std (joint 2's threshold without it)
    det = ContactDetector(np.maximum(thr, 1e-9), uncertainty_gain=2.0, min_samples=2)   # (the node floors a base at 1e-9)
    assert ros.spin_until(lambda: len(probe.contact) == len(S) and len(probe.torque) == len(S), timeout=10.0)
    got = {to_ns(m.header.stamp): list(m.name) for m in probe.contact}
    R = by_stamp(probe.torque, names)
    calibrated = [k for k in range(len(S)) if T[k] > 0.2 + 2e-3]
    for k in calibrated:
        _, joints = det.update(R[S[k]], np.where(keep, D[k], 0.0))
        assert [names[i] for i in np.flatnonzero(joints)] == got[S[k]], k
    # the push on joint 2 is seen: with the learner's std there (0.6 N m more) it would not be
    assert any(names[1] in got[S[k]] for k in calibrated)
    assert max(R[S[k]][1] for k in calibrated) < thr[1] + 2.0 * 0.3


@pytest.mark.parametrize("use_std", [True, False])
def test_the_residual_std_raises_the_thresholds(ros, use_std):
    """use_residual_std: the learner's predictive std (feedforward/residual_std, stamped like
    the residual) enters the thresholds as thresholds + k_u sqrt(model_std^2 + std^2): a
    push above the static threshold but below that on the joint the learner is unsure
    about is no contact there; without it, it is."""
    model = RobotModel(ROBOT)
    names = model.joint_names
    push = np.array([0.8, 0.8])
    S, Q, V, TAU = simulate(model, 300, ext=lambda t: push if t >= 0.15 - 1e-9 else 0.0)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, use_residual=True, use_residual_std=use_std,
                   thresholds=[0.3], uncertainty_gain=1.0, publish_wrench=False)
    probe = Probe(ros, names)
    assert ros.spin_until(lambda: probe.state.get_subscription_count() > 0
                          and node.pub_contact.get_subscription_count() > 0
                          and (not use_std or probe.residual_std.get_subscription_count() > 0), timeout=10.0)
    std = np.array([2.0, 0.0])     # the learner is unsure of joint 1: 0.3 + 2.0 > 0.8 > 0.3

    def residual(k):
        if k == 100:   # NaN, unknown joints: rejected, counted, never used
            probe.residual_std.publish(joint_state_msg(int(S[k]) - 1, names, effort=[np.nan, 0.0]))
            probe.residual_std.publish(joint_state_msg(int(S[k]) - 1, ["a", "b"], effort=std))
            if use_std:
                assert ros.spin_until(lambda: node.counters["residual_std_rejected"] == 2, timeout=10.0)
        probe.residual.publish(joint_state_msg(int(S[k]), names, effort=np.zeros(2)))
        if k != 200:   # one missing: the newest within residual_staleness stands in
            probe.residual_std.publish(joint_state_msg(int(S[k]), names, effort=std))
        assert ros.spin_until(lambda: int(S[k]) in node.residuals and (
            not use_std or k == 200 or int(S[k]) in node.residual_stds), timeout=10.0)

    feed(ros, node, probe, S, Q, V, TAU, before=residual)
    assert ros.spin_until(lambda: len(probe.contact) == len(S), timeout=10.0)
    contact = {to_ns(m.header.stamp): list(m.name) for m in probe.contact}
    t = (S - S[0]) * 1e-9
    assert not any(contact[s] for s, tt in zip(S, t) if tt <= 0.15)
    late = [contact[s] for s, tt in zip(S, t) if tt >= 0.25]
    assert all(names[1] in c for c in late)
    if use_std:
        assert not any(names[0] in c for c in contact.values())
        assert node.counters["residual_std_missing"] == 0
    else:
        assert all(names[0] in c for c in late)
        assert node.counters["residual_std_rejected"] == 0   # no subscription: nothing read
    assert node.counters["residual_missing"] == 0


def test_every_model_node_takes_the_friction_smoothing(ros):
    """friction_smoothing: the Coulomb column tanh(qd / eps) of every node's model with
    friction columns (controller, regressor, learners, observer: one shape); 0 = sgn."""
    from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode
    from adaptive_dynamics.nodes.model_update import ModelUpdateNode
    from adaptive_dynamics.nodes.regressor import RegressorNode
    from adaptive_dynamics.nodes.residual_learner import ResidualLearnerNode

    for cls in (AdaptiveControllerNode, RegressorNode, ResidualLearnerNode, ModelUpdateNode, ExternalTorqueNode):
        node = ros.add(cls, robot=ROBOT, friction=True, friction_smoothing=0.02)
        model = getattr(node, "model", None)
        assert model is not None and model.friction and model.coulomb_smoothing == 0.02, cls.__name__
    plain = ros.add(ExternalTorqueNode, robot=ROBOT, friction=True)
    assert plain.model.coulomb_smoothing == 0.0


def test_monitor_joins_the_graph():
    """monitor (launch monitor:=true, CLI --monitor): the external_torque node on the adaptive
    controller's estimate (its friction and adapted_links, no armature) with the learner's
    residual at the measured state (the controller's parametric torque at the learner's
    input), else on the URDF's model; the lockstep bridge waits for it too."""
    import ast
    import pathlib

    from adaptive_dynamics.cli import _graph_from_args, build_parser
    from adaptive_dynamics.scenarios import build_graph

    plain = {s.name: s for s in build_graph("sim", controller="composite", learner="gmm")}
    graph = {s.name: s for s in build_graph("sim", controller="composite", learner="gmm", monitor=True,
                                            overrides={"adaptive_controller": {"adapted_links": ["panda_link7"]}})}
    assert set(graph) - set(plain) == {"external_torque"}
    mon = graph["external_torque"]
    assert mon.executable == "external_torque" and mon.param_files == graph["adaptive_controller"].param_files
    assert mon.params["model_source"] == "estimate" and mon.params["use_residual"] is True
    assert mon.params["use_residual_std"] is True and graph["residual_learner"].params["publish_std"] is True
    assert "publish_std" not in plain["residual_learner"].params
    split = {s.name: s for s in build_graph("sim", controller="composite", learner="gmm", learner_split=True,
                                            monitor=True)}
    assert split["prediction"].params["publish_std"] is True and "publish_std" not in split["model_update"].params
    assert mon.params["adapted_links"] == ["panda_link7"] and mon.params["friction"] is True
    assert mon.params["friction_smoothing"] == 0.03      # the Coulomb shape of config/panda.yaml's /**
    # the learners take the controller's friction columns and their shape (a --set on it too)
    assert graph["residual_learner"].params["friction_smoothing"] == 0.03
    eps = {s.name: s for s in build_graph("sim", controller="composite", learner="gmm", monitor=True,
                                          overrides={"adaptive_controller": {"friction_smoothing": 0.05}})}
    assert eps["residual_learner"].params["friction_smoothing"] == eps["external_torque"].params[
        "friction_smoothing"] == 0.05
    # the residual as a function of the state, taken at the measured state; no armature on the estimate
    assert graph["adaptive_controller"].params["parametric_torque"] == "state"
    assert graph["residual_learner"].params["state_residual"] is True and mon.params["residual_input"] == "state"
    assert "armature" not in mon.params          # the robot's: the node adds none to the estimate itself
    # a calibration first holds the graph's learning nodes
    assert mon.params["hold_learning"] == ["adaptive_controller", "residual_learner"]
    assert split["external_torque"].params["hold_learning"] == ["adaptive_controller", "model_update"]
    # --record with --monitor: the monitor's outputs and the residual it takes are recorded too
    rec = {s.name: s for s in build_graph("sim", controller="composite", learner="joint_local", monitor=True,
                                          record=True)}["recorder"]
    assert rec.params["extra_topics"] == ["external_torque", "contact", "external_wrench", "residual/state"]
    assert "parametric_torque" not in plain["adaptive_controller"].params
    assert "parametric_torque" not in split["adaptive_controller"].params
    assert "residual_input" not in split["external_torque"].params
    kept = {s.name: s for s in build_graph("sim", controller="composite", learner="gmm", monitor=True,
                                           overrides={"adaptive_controller": {"parametric_torque": "law"}})}
    assert kept["adaptive_controller"].params["parametric_torque"] == "law"     # --set wins
    for key in ("wait_for_nodes", "wait_for_state_subscribers"):
        assert graph["mujoco_bridge"].params[key] == plain["mujoco_bridge"].params[key] + 1
    mon = {s.name: s for s in build_graph("real", controller="computed_torque", monitor=True)}["external_torque"]
    assert mon.params["model_source"] == "urdf" and mon.params["use_residual"] is False
    assert "hold_learning" not in mon.params      # nothing learns
    assert mon.params["use_residual_std"] is False
    args = build_parser().parse_args(["launch", "sim", "--controller", "pd", "--monitor"])
    assert "external_torque" in {s.name for s in _graph_from_args(args, "sim")}
    root = pathlib.Path(__file__).resolve().parents[1]
    helper = ast.parse((root / "launch" / "_graph_launch.py").read_text())
    call = next(n for n in ast.walk(helper) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "build_graph")
    assert "monitor" in {kw.arg for kw in call.keywords}
    assert "external_torque" in (root / "setup.py").read_text()


def test_the_drives_armature_on_the_urdf_not_on_the_estimate(ros):
    """armature (the robot's drive inertia): added to the URDF's M in the observer, not to the
    adaptive estimate's (the controller's regressor has none); the whitening's inertia is the
    URDF's M plus it either way (physical: an estimate's M need not be positive definite)."""
    model = RobotModel(ROBOT)
    q = np.array([0.3, -0.4])
    for source, want in (("urdf", [0.1, 0.2]), ("estimate", [0.0, 0.0])):
        node = ros.add(ExternalTorqueNode, robot=ROBOT, model_source=source, armature=[0.1, 0.2])
        assert np.allclose(node.observer.armature, want), source
        np.testing.assert_allclose(node.model.mass_matrix(q) + node._drive_inertia,
                                   model.mass_matrix(q) + np.diag([0.1, 0.2]))


def test_a_calibration_holds_learning_first(ros):
    """hold_learning: a calibration first sets `learning` false on the named nodes (over their
    parameter services) and takes no state until every one answered -- or hold_timeout ran
    out -- and HOLD_SETTLE_S more of states passed; the thresholds are then the core's on
    exactly that segment.  A node without `learning` refuses, one that is not there does
    not answer: both reported.  `learning` set true again on a held node: /diagnostics warns
    that the thresholds may be stale."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

    from adaptive_dynamics.nodes.external_torque import HOLD_SETTLE_S

    model = RobotModel(ROBOT)
    S, Q, V, TAU = simulate(model, 700, seed=3)
    learner = ros.node("fake_learner")
    learner.declare_parameter("learning", True)
    other = ros.node("fake_controller")          # no `learning` parameter
    names = [learner.get_name(), other.get_name(), "nobody_here"]
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibrate=0.1, hold_learning=names,
                   hold_timeout=1.0, publish_wrench=False, diagnostics_period=0.1)
    for bad in (["bad-name"], ["a/"], ["~"]):     # not node names: refused, the old value kept
        assert not node.set_parameters([Parameter("hold_learning", value=bad)])[0].successful, bad
    assert list(node.p["hold_learning"]) == names
    probe = Probe(ros, model.joint_names)
    diags = []
    probe.node.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 50)
    connected(ros, node, probe)
    feed(ros, node, probe, S[:50], Q[:50], V[:50], TAU[:50])
    assert ros.spin_until(lambda: learner.get_parameter("learning").value is False, timeout=10.0)
    assert node.counters["calibration"] == f"holding learning on {names}" and not node.detector.configured
    ros.spin_until(lambda: False, timeout=1.1)   # "nobody_here" never answers: hold_timeout runs out
    for k in range(50, len(S)):
        probe.send(S[k], Q[k], V[k], TAU[k])
        assert ros.spin_until(lambda: node.counters["states"] == k + 1, timeout=10.0)
    assert node.detector.configured and node.counters["calibration"] == "done"
    hold = node.counters["hold"]
    assert hold.startswith(f"learning held on {[learner.get_name()]}; NOT on {other.get_name()} (")
    assert "nobody_here (no answer in 1 s)" in hold
    # the calibration's states: from HOLD_SETTLE_S after the state that closed the hold (the 51st)
    R = MomentumObserver(model, gains=40.0).run((S - S[0]) * 1e-9, Q, V, TAU)
    t = (S - S[0]) * 1e-9
    cal = ThresholdCalibration(model.n)
    for k in np.flatnonzero(t >= t[50] + HOLD_SETTLE_S - 1e-9):
        cal.add(t[k], R[k])
        if cal.duration >= 0.1:
            break
    np.testing.assert_allclose(node.p["thresholds"], cal.thresholds("max", margin=1.5), rtol=1e-9)

    def last():
        st = [s for m in diags for s in m.status if s.name.startswith("external_torque")]
        return st[-1] if st else None

    # calibrated: /diagnostics WARNs about the nodes that did not hold
    assert ros.spin_until(lambda: last() is not None and "learning not held on " + other.get_name() in last().message,
                          timeout=10.0)
    assert last().level == DiagnosticStatus.WARN
    learner.set_parameters([Parameter("learning", value=True)])      # learning resumed: stale thresholds
    assert ros.spin_until(lambda: "learning resumed on " + learner.get_name() in last().message, timeout=10.0), \
        node.counters["hold"]
    assert last().level == DiagnosticStatus.WARN and node.counters["hold"].startswith("learning resumed on")
    node.set_parameters([Parameter("thresholds", value=[1.0, 1.0])])   # set by hand: the user's call
    assert ros.spin_until(lambda: last().level == DiagnosticStatus.OK, timeout=10.0), last().message


def test_calibration_file_keeps_the_calibration(ros, tmp_path):
    """calibration_file: a calibration writes what it set (thresholds, residual_joints, the
    whitening, d's thresholds) and what it holds for (joints, model, residual, d's window) under the node's name,
    keeping the file's other sections; a node started with it is calibrated alike (same
    thresholds, same z), values given at launch winning.  A corrupt file, one of other
    joints or another model, or one without the node's section leaves the node
    uncalibrated and says why; the next calibration rewrites it (a corrupt one moved aside)."""
    import yaml

    from adaptive_dynamics.ros.params import load_param_file

    model = RobotModel(ROBOT)
    S, Q, V, TAU = simulate(model, 300, seed=4)
    path = tmp_path / "calibration.yaml"
    path.write_text("/someone_else:\n  ros__parameters:\n    gains: [10.0]\n")      # another node's section
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibrate=0.2, min_samples=2,
                   calibration_file=str(path), publish_wrench=False)
    assert node.counters["calibration_file"].startswith(f"{path}: not used (no section for")
    probe = Probe(ros, model.joint_names)
    connected(ros, node, probe)
    feed(ros, node, probe, S, Q, V, TAU)
    assert node.detector.configured and node.detector.whitening is not None
    assert node.counters["calibration_file"] == f"{path} (written)"
    kept = load_param_file(str(path), node.get_fully_qualified_name())
    assert set(kept) == {"thresholds", "residual_joints", "whitening_white", "whitening_slow", "whitened_thresholds",
                         "change_thresholds", "calibration_joints", "calibration_model", "calibration_residual",
                         "calibration_change_window"}
    assert kept["calibration_change_window"] == node.p["change_window"] and len(kept["change_thresholds"]) == 2
    assert kept["calibration_joints"] == list(model.joint_names) and kept["calibration_model"] == "urdf"
    np.testing.assert_array_equal(kept["thresholds"], node.p["thresholds"])
    assert yaml.safe_load(path.read_text())["/someone_else"] == {"ros__parameters": {"gains": [10.0]}}
    again = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibration_file=str(path))
    assert again.counters["calibration_file"] == f"{path} (read)" and again.detector.configured
    np.testing.assert_array_equal(again.detector.thresholds, node.detector.thresholds)
    np.testing.assert_array_equal(again.detector.whitened_thresholds, node.detector.whitened_thresholds)
    np.testing.assert_array_equal(again.detector.change_thresholds, node.detector.change_thresholds)
    # d's thresholds are their window's: another window reads the rest, not them
    other_window = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibration_file=str(path),
                           change_window=node.p["change_window"] + 5)
    assert other_window.detector.configured and other_window.detector.whitening is not None
    assert other_window.detector.change_thresholds is None and list(other_window.p["change_thresholds"]) == [0.0]
    M = model.mass_matrix(Q[-1])
    np.testing.assert_allclose(again.detector.whitening.transform(TAU[-1], M),
                               node.detector.whitening.transform(TAU[-1], M), rtol=1e-12)
    # thresholds given at launch win over the file's; the rest comes from it
    given = ros.add(ExternalTorqueNode, robot=ROBOT, thresholds=[2.0, 3.0], calibration_file=str(path))
    assert list(given.p["thresholds"]) == [2.0, 3.0] and given.detector.whitening is not None
    assert given.counters["calibration_file"].endswith("given at launch: ['thresholds']")
    # what is not used: not YAML, another joint count, another model, no section for this node
    text = path.read_text()
    bad = {"garbage.yaml": "a: [1, 2\n",
           "other.yaml": "/external_torque:\n  ros__parameters:\n    thresholds: [1.0, 1.0, 1.0]\n",
           "model.yaml": text.replace("calibration_model: urdf", "calibration_model: estimate"),
           "foreign.yaml": "/someone_else:\n  ros__parameters:\n    thresholds: [1.0, 1.0]\n"}
    for name, content in bad.items():
        (tmp_path / name).write_text(content)
        n3 = ros.add(ExternalTorqueNode, robot=ROBOT, calibration_file=str(tmp_path / name))
        assert not n3.detector.configured, name
        assert n3.counters["calibration_file"].startswith(f"{tmp_path / name}: not used ("), name
    # the next calibration rewrites a corrupt file (the old one moved aside)
    n4 = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibrate=0.2, min_samples=2,
                 calibration_file=str(tmp_path / "garbage.yaml"), publish_wrench=False)
    probe4 = Probe(ros, model.joint_names)
    connected(ros, n4, probe4)
    feed(ros, n4, probe4, S, Q, V, TAU)
    assert n4.counters["calibration_file"] == f"{tmp_path / 'garbage.yaml'} (written)"
    assert (tmp_path / "garbage.yaml.unreadable").read_text() == "a: [1, 2\n"
    np.testing.assert_array_equal(load_param_file(str(tmp_path / "garbage.yaml"),
                                                  n4.get_fully_qualified_name())["thresholds"], n4.p["thresholds"])


def test_the_change_statistic_waits_while_the_residual_comes_and_goes(ros):
    """A residual that skips states moves r by the model's change, not the arm's: d is not
    watched from the switch until 3 / K_O after it (``change_suspended``; from the first
    state alike: r rises from 0), and the calibration's thresholds on d are
    calibrate_change's over the states where it is -- the core's r fed the same residuals
    (zero where none came)."""
    model = RobotModel(ROBOT)
    names = model.joint_names

    def ripple(q):
        return 0.3 * np.sin(3.0 * q)

    S, Q, V, TAU = simulate(model, 400, friction=lambda q, v: ripple(q), seed=8)
    F = np.array([ripple(q) for q in Q])
    gap = set(range(100, 130))      # 30 states without a residual: the last one covers 10 ms (residual_staleness)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[60.0], use_residual=True, residual_select=False,
                   residual_joints=["all"], residual_wait=0.0, calibrate=0.3, min_samples=2, publish_wrench=False)
    probe = Probe(ros, names)
    connected(ros, node, probe)
    assert ros.spin_until(lambda: probe.residual.get_subscription_count() > 0, timeout=10.0)

    def residual(k):
        if k not in gap:
            probe.residual.publish(joint_state_msg(int(S[k]), names, effort=F[k]))
            assert ros.spin_until(lambda: int(S[k]) in node.residuals, timeout=10.0)

    feed(ros, node, probe, S, Q, V, TAU, before=residual)
    T = (S - S[0]) * 1e-9
    missing = np.array([k in gap and T[k] - T[99] > node.p["residual_staleness"] + 1e-12 for k in range(len(S))])
    off, on = np.flatnonzero(missing)[[0, -1]] + [0, 1]            # the residual went, came back
    settle = 3.0 / 60.0
    suspended = (T <= settle + 1e-12) | \
                ((T >= T[off] - 1e-12) & (T <= T[off] + settle + 1e-12)) | \
                ((T >= T[on] - 1e-12) & (T <= T[on] + settle + 1e-12))     # (from the first state: r rises)
    assert node.counters["residual_missing"] == int(missing.sum()) == 20
    assert node.counters["change_suspended"] == int(suspended.sum())
    # the calibration (its first 0.3 s): d's thresholds where the detector watches d
    held = np.array([F[99] if k in gap else F[k] for k in range(len(S))])    # what the node took
    R = MomentumObserver(model, gains=60.0).run(T, Q, V, TAU, np.where(missing[:, None], 0.0, held))
    K = int(np.flatnonzero(T >= 0.3 - 1e-12)[0]) + 1
    Ms = np.array([model.mass_matrix(q) for q in Q[:K]])
    w, _ = calibrate_whitening(R[:K], Ms, "max", min_samples=2, margin=1.5)
    D = node.p["change_window"]
    valid = ~np.convolve(suspended[:K].astype(int), np.ones(D, int))[:K].astype(bool)   # d watched again D states on
    thr_d = calibrate_change(R[:K], Ms, w, D, "max", min_samples=2, margin=1.5, valid=valid)
    np.testing.assert_allclose(node.p["change_thresholds"], thr_d, rtol=1e-6)
    everywhere = calibrate_change(R[:K], Ms, w, D, "max", min_samples=2, margin=1.5)
    assert np.all(everywhere >= thr_d - 1e-12) and np.any(everywhere > 1.2 * thr_d)   # the switch's own change
    # residual_joints set (r steps between its two estimates): the next states wait alike
    before = node.counters["change_suspended"]
    assert node.set_parameters([Parameter("residual_joints", value=[names[0]])])[0].successful
    probe.residual.publish(joint_state_msg(int(S[-1]) + 1_000_000, names, effort=F[-1]))
    probe.send(S[-1] + 1_000_000, Q[-1], V[-1], TAU[-1])
    assert ros.spin_until(lambda: node.counters["states"] == len(S) + 1, timeout=10.0)
    assert node.counters["change_suspended"] == before + 1


def test_calibrate_after_lets_the_start_pass(ros):
    """calibrate with calibrate_after (both at start, as a launch sets them): the states of the
    first calibrate_after seconds pass untaken, the next calibrate seconds set the thresholds --
    those of the core calibrated on exactly that segment."""
    model = RobotModel(ROBOT)
    S, Q, V, TAU = simulate(model, 400, seed=6)
    node = ros.add(ExternalTorqueNode, robot=ROBOT, gains=[40.0], calibrate=0.1, calibrate_after=0.15,
                   publish_wrench=False)
    probe = Probe(ros, model.joint_names)
    connected(ros, node, probe)
    assert node.counters["calibration"] == "waiting 0.15 s, then 0.1 s"
    feed(ros, node, probe, S[:100], Q[:100], V[:100], TAU[:100])
    assert not node.detector.configured and node.p["calibrate"] == 0.1      # still waiting
    for k in range(100, len(S)):
        probe.send(S[k], Q[k], V[k], TAU[k])
        assert ros.spin_until(lambda: node.counters["states"] == k + 1, timeout=10.0)
    assert node.detector.configured and node.p["calibrate"] == 0.0 and node.counters["calibration"] == "done"
    R = MomentumObserver(model, gains=40.0).run((S - S[0]) * 1e-9, Q, V, TAU)
    t = (S - S[0]) * 1e-9
    cal = ThresholdCalibration(model.n)
    for k in np.flatnonzero(t >= 0.15 - 1e-9):
        cal.add(t[k], R[k])
        if cal.duration >= 0.1:
            break
    np.testing.assert_allclose(node.p["thresholds"], cal.thresholds("max", margin=1.5), rtol=1e-9)


def test_a_state_waits_for_its_residual(ros):
    """use_residual with residual_input state: the learner's residual/state comes after its
    state (later when it lags) -- the state waits for it (residual_wait, states in order) and
    is taken with it, as the core with the residual gives; a state the learner skipped is
    taken once a newer residual came, with the newest older one within residual_staleness; one whose
    residual never comes is taken once residual_wait has passed."""
    model = RobotModel(ROBOT)
    names = model.joint_names
    S, Q, V, TAU = simulate(model, 40, seed=8)
    F = np.array([0.2 * np.sin(3.0 * q) for q in Q])
    node = ros.add(ExternalTorqueNode, robot=ROBOT, use_residual=True, residual_input="state", residual_wait=0.5,
                   residual_staleness=0.0015, publish_wrench=False)
    probe = Probe(ros, names)
    connected(ros, node, probe)
    assert ros.spin_until(lambda: probe.state_residual.get_subscription_count() > 0, timeout=10.0)
    n = len(S)
    skipped = n - 3
    for k in range(n - 1):   # each state first, its residual after (none for the skipped one)
        probe.send(S[k], Q[k], V[k], TAU[k])
        ros.spin_for(0.02)
        assert node.counters["states"] == (k if k != skipped + 1 else k - 1), k   # waiting
        if k == skipped:
            continue
        probe.state_residual.publish(joint_state_msg(int(S[k]), names, effort=F[k]))
        assert ros.spin_until(lambda: node.counters["states"] == k + 1, timeout=10.0)
    assert ros.spin_until(lambda: len(probe.torque) == n - 1, timeout=10.0)
    used = F.copy()
    used[skipped] = F[skipped - 1]           # the newest older within residual_staleness: the last state's
    ref = MomentumObserver(model, gains=50.0).run((S - S[0]) * 1e-9, Q, V, TAU, residuals=used)
    got = by_stamp(probe.torque, names)
    np.testing.assert_allclose(np.array([got[s] for s in S[:-1]]), ref[:-1], atol=1e-9)
    assert node.counters["residual_missing"] == 0
    k = n - 1                      # no residual for the last one, none newer: taken after 0.5 s, with
    probe.send(S[k], Q[k], V[k], TAU[k])    # the newest older within residual_staleness
    ros.spin_for(0.2)
    assert node.counters["states"] == k
    assert ros.spin_until(lambda: node.counters["states"] == k + 1, timeout=5.0)
    used[k] = F[k - 1]
    ref = MomentumObserver(model, gains=50.0).run((S - S[0]) * 1e-9, Q, V, TAU, residuals=used)
    assert ros.spin_until(lambda: len(probe.torque) == n, timeout=5.0)
    np.testing.assert_allclose(by_stamp(probe.torque, names)[S[k]], ref[k], atol=1e-9)
    assert node.counters["residual_missing"] == 0


def test_vector_buffer_nearest():
    """VectorBuffer.nearest: the exact stamp, else the nearest older or newer within the
    tolerance (the older on a tie); get stays older-only."""
    from adaptive_dynamics.ros.arrays import VectorBuffer

    b = VectorBuffer()
    for s in (10, 20, 40):
        b.add(s, np.array([float(s)]))
    assert b.nearest(20, 0)[0] == 20.0 and b.nearest(23, 5)[0] == 20.0 and b.nearest(37, 5)[0] == 40.0
    assert b.nearest(30, 10)[0] == 20.0          # a tie: the older
    assert b.nearest(30, 5) is None and b.nearest(50, 5) is None and b.nearest(5, 5)[0] == 10.0
    assert b.get(37, 5) is None and b.get(23, 5)[0] == 20.0
