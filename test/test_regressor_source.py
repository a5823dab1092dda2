"""``adaptive_controller`` with ``regressor_source: topics`` over real DDS.

* A ``regressor`` node and a topics-fed controller, driven lockstep-style by a probe
  (MuJoCo plant on the test side, one state at a time), answer every state with
  exactly the command of an in-process controller fed the same states (composite
  law, to 1e-9; in fact bit for bit); the estimates agree.  Retuning the regressor
  node's Lambda live makes the controller refuse (safe command, counted, reason in
  the diagnostics).
* With the probe playing the regressor node: a Lambda mismatch -> the safe command
  at once; malformed regressors (wrong shape, NaN) -> the safe command for that
  stamp, counted; a missing regressor -> the safe command after ``reference_wait`` or
  when a newer state supersedes it; a late one -> counted as stale; the accepted
  cycles equal the core fed the same Y, W, tau_f.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode
from adaptive_dynamics.nodes.regressor import RegressorNode
from adaptive_dynamics.ros import joint_state_msg
from adaptive_dynamics.ros.commands import command_stamp
from adaptive_dynamics.ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, RELIABLE_STREAM_QOS
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.ros.arrays import stamped_matrix_msg
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig
from adaptive_dynamics.trajectories import ModifiedFourier
from test_node_safety import Probe

pytestmark = pytest.mark.ros
MS = 1_000_000
ROBOT = "planar2"
GAINS = dict(law="composite", lam=[10.0], kd=[10.0, 5.0], p0=[1.0], r=[1.0], filter_lambda=20.0, lambda0=0.2,
             k0=200.0, k1=100.0)
NODE = dict(robot=ROBOT, state_timeout=30.0, reference_wait=20.0, update_decimation=10, parameters_decimation=50,
            autosave_period=0.0, diagnostics_period=0.2, **GAINS)


def _diag_text(probe, fqn, key):
    for arr in reversed(probe.diag):
        for st in arr.status:
            if st.hardware_id == fqn:
                for kv in st.values:
                    if kv.key == key:
                        return kv.value
    return None


def _add(ros, ctx, cls, namespace="", **params):
    """ros.add with a namespace (the fixture's factory has none)."""
    node = cls(context=ctx, namespace=namespace, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    ros.nodes.append(node)
    ros.executor.add_node(node)
    return node


def _reference(m, seconds, seed=1, q0=None):
    traj = ModifiedFourier.random(m.n, np.random.default_rng(seed), q_center=q0, amplitude=0.5, w_f=2 * np.pi / 2.0,
                                  L=3, lower=m.lower, upper=m.upper, vel_limit=m.velocity_limit, acc_limit=None)
    return traj.sample_many(np.arange(int(seconds * 1000) + 1) * 1e-3)


def _topics_and_inprocess(ros, ctx, node: dict, seconds: float):
    """A regressor node, an adaptive controller on its topics and one computing in
    process (namespace inproc), a reference for ``seconds``, every link matched; returns
    (regressor, topics controller, in-process controller, probe, plant, step) where
    ``step(timeout)`` sends the plant's state to both and returns (stamp, v, command of
    the topics controller, command of the in-process one)."""
    reg = ros.add(RegressorNode, robot=ROBOT, lam=[10.0], filter_lambda=20.0, standard_decimation=0,
                  slotine_li_decimation=1, filtered_decimation=1)
    topics = ros.add(AdaptiveControllerNode, regressor_source="topics", **node)
    inproc = _add(ros, ctx, AdaptiveControllerNode, namespace="inproc", **node)
    probe = Probe(ros)
    state_i = probe.node.create_publisher(JointState, "inproc/joint_states", PUBLISHER_STREAM_QOS)
    ref_i = probe.node.create_publisher(JointTrajectory, "inproc/reference", REFERENCE_QOS)
    cmd_i = []
    probe.node.create_subscription(Float64MultiArray, "inproc/effort_controller/commands", cmd_i.append,
                                   RELIABLE_STREAM_QOS)
    m = RobotModel(ROBOT)
    names = list(m.joint_names)
    plant = MujocoPlant(ROBOT, reality=RealityConfig(), timestep=1e-3)
    _, q0, _, _ = plant.state()
    Q, QD, QDD = _reference(m, seconds, q0=q0)
    batch = reference_batch_msg(0, MS, names, Q, QD, QDD)
    probe.ref.publish(batch)
    ref_i.publish(batch)
    assert ros.spin_until(lambda: min(len(reg.refs), len(topics.refs), len(inproc.refs)) >= len(Q), timeout=20.0)
    assert ros.spin_until(lambda: probe.state.get_subscription_count() >= 3 and state_i.get_subscription_count() >= 1
                          and topics.pub_cmd.get_subscription_count() >= 1
                          and inproc.pub_cmd.get_subscription_count() >= 1
                          and reg.pub["slotine_li"].get_subscription_count() >= 1
                          and reg.pub["filtered"].get_subscription_count() >= 1
                          and topics.regressors.regs.meta is not None, timeout=20.0)

    def step(timeout=10.0):
        t, q, v, tau = plant.state()
        stamp = int(round(t * 1e9))
        nt, ni = len(probe.commands), len(cmd_i)
        msg = joint_state_msg(stamp, names, q, v, tau)
        probe.state.publish(msg)
        state_i.publish(msg)
        assert ros.spin_until(lambda: len(probe.commands) > nt and len(cmd_i) > ni, timeout=timeout), stamp
        ct, ci = probe.commands[-1], cmd_i[-1]
        assert command_stamp(ct) == stamp and command_stamp(ci) == stamp
        return stamp, v, np.asarray(ct.data), np.asarray(ci.data)

    return reg, topics, inproc, probe, plant, step


def test_topics_source_equals_inprocess_and_refuses_a_lambda_mismatch(ros, ctx):
    steps = 500
    reg, topics, inproc, probe, plant, step = _topics_and_inprocess(ros, ctx, NODE, steps * 1e-3 + 0.1)
    assert topics.regressors.regs.check(topics.core) == {"Y": None, "W": None}
    theta0 = topics.core.theta.copy()

    worst = 0.0
    for k in range(steps):
        _, _, ut, ui = step(timeout=30.0 if k == 0 else 10.0)  # the first cycles JIT-compile
        assert np.all(np.isfinite(ut))
        worst = max(worst, float(np.abs(ut - ui).max() / (1.0 + np.abs(ui).max())))
        plant.step(ut)
    assert worst <= 1e-9, worst
    print(f"max relative command difference topics vs in-process: {worst:.3g}")
    np.testing.assert_allclose(topics.core.theta, inproc.core.theta, rtol=0, atol=1e-9)
    assert np.abs(topics.core.theta - theta0).max() > 1e-3  # it did learn
    assert topics.core.updates == inproc.core.updates == steps
    assert topics.core.filter.samples == 0 and inproc.core.filter.samples == steps  # W came from the topic
    c = topics.counters.as_dict()
    assert c["regressor_source"] == "topics" and inproc.counters.as_dict()["regressor_source"] == "inprocess"
    for key in ("regressor_missing", "regressor_rejected", "regressor_mismatch", "regressor_stale"):
        assert c.get(key, 0) == 0, (key, c)
    assert ros.spin_until(lambda: _diag_text(probe, "/adaptive_controller", "regressor_config") == "ok", timeout=5.0)
    assert _diag_text(probe, "/adaptive_controller", "regressor_source") == "topics"

    # the regressor node's Lambda retuned live: refused at once, safe command, reason reported
    assert reg.p.set("lam", [5.0]).successful
    assert ros.spin_until(lambda: topics.regressors.regs.meta["settings"]["lam"] == [5.0], timeout=5.0)
    theta = topics.core.theta.copy()
    _, v, ut, ui = step()
    np.testing.assert_allclose(ut, -topics._safe_kd * v, rtol=1e-12)  # safe_mode damping, derived per joint
    assert not np.allclose(ui, ut)
    np.testing.assert_array_equal(topics.core.theta, theta)
    assert topics.counters.as_dict()["regressor_mismatch"] == 1
    assert ros.spin_until(lambda: "Lambda" in (_diag_text(probe, "/adaptive_controller", "regressor_config") or ""),
                          timeout=5.0)


def test_mismatch_malformed_missing_and_stale_regressors(ros):
    ctl = ros.add(AdaptiveControllerNode, regressor_source="topics", **{**NODE, "reference_wait": 0.3})
    probe = Probe(ros)
    cols = probe.node.create_publisher(JointState, "regressor/columns", LATCHED_QOS)
    pub_y = probe.node.create_publisher(Float64MultiArray, "regressor/slotine_li", PUBLISHER_STREAM_QOS)
    pub_w = probe.node.create_publisher(Float64MultiArray, "regressor/filtered", PUBLISHER_STREAM_QOS)
    m = RobotModel(ROBOT)
    names = list(m.joint_names)
    Q, QD, QDD = _reference(m, 0.02, seed=3)
    rng = np.random.default_rng(4)
    X = Q + 0.02 * rng.standard_normal(Q.shape)  # the measured states
    XD = QD + 0.1 * rng.standard_normal(Q.shape)
    probe.ref.publish(reference_batch_msg(0, MS, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(ctl.refs) >= len(Q) and probe.state.get_subscription_count() >= 2
                          and pub_y.get_subscription_count() >= 1 and pub_w.get_subscription_count() >= 1
                          and cols.get_subscription_count() >= 1, timeout=20.0)
    filt = m.filtered_regressor(20.0, 1e-3)  # the test plays the regressor node
    core = AdaptiveController(m, "composite", dt=1e-3, forget_to="prior",   # (the node's default)
                              **{k: v for k, v in GAINS.items() if k != "law"})

    def columns(lam):
        settings = {"lam": lam, "filter_lambda": 20.0, "rate_hz": 1000.0, "coordinates": "pi", "friction": False}
        cols.publish(joint_state_msg(0, m.parameter_names, q=m.parameters, frame_id=json.dumps(settings)))
        assert ros.spin_until(lambda: ctl.regressors.regs.meta is not None and ctl.regressors.regs.meta["settings"]["lam"] == lam)

    def regressors(k):
        q, v = X[k], XD[k]
        tau = m.inverse_dynamics(q, v, QDD[k])
        Y = m.slotine_li_regressor(q, v, QD[k] + 10.0 * (Q[k] - q), QDD[k] + 10.0 * (QD[k] - v))
        W, tau_f = filt.update(q, v, tau)
        return tau, Y, W.copy(), tau_f.copy()

    def state(k, tau, timeout=5.0, wait=True):
        before = len(probe.commands)
        probe.state.publish(joint_state_msg(k * MS, names, X[k], XD[k], tau))
        if wait:
            assert ros.spin_until(lambda: len(probe.commands) > before, timeout=timeout), k
            assert command_stamp(probe.commands[-1]) == k * MS
            return np.asarray(probe.commands[-1].data)

    def publish(k, Y, W, tau_f):
        if Y is not None:
            pub_y.publish(stamped_matrix_msg(k * MS, Y, "joints", "pi"))
        if W is not None:
            pub_w.publish(stamped_matrix_msg(k * MS, np.column_stack([W, tau_f]), "joints", "pi+tau_f"))

    def counter(key):
        return ctl.counters.as_dict().get(key, 0)

    # Lambda mismatch: refused at once (no waiting for regressors), safe command
    columns([5.0])
    assert "Lambda" in ctl.regressors.regs.check(ctl.core)["Y"] and "lam" in ctl.regressors.regs.check(ctl.core)["Y"]
    tau, Y, W, tau_f = regressors(0)
    np.testing.assert_allclose(state(0, tau), -ctl._safe_kd * XD[0], rtol=1e-12)
    assert counter("regressor_mismatch") == 1
    np.testing.assert_array_equal(ctl.core.theta, core.theta)

    columns([10.0])
    assert ctl.regressors.regs.check(ctl.core) == {"Y": None, "W": None}
    # k=1: state first, regressors after (the state waits for them); equals the core fed the same
    tau, Y, W, tau_f = regressors(1)
    state(1, tau, wait=False)
    assert ros.spin_until(lambda: ctl._pending is not None)  # waiting for its regressors
    ros.spin_for(0.1)
    assert ctl._pending is not None and len(probe.commands) == 1
    before = len(probe.commands)
    publish(1, Y, W, tau_f)
    assert ros.spin_until(lambda: len(probe.commands) > before)
    expected = core.compute(X[1], XD[1], Q[1], QD[1], QDD[1], Y=Y, W=W, tau_f=tau_f)
    np.testing.assert_allclose(probe.commands[-1].data, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ctl.core.theta, core.theta, rtol=0, atol=1e-12)

    # k=2: Y of the wrong shape; k=3: NaN in W -> rejected, safe command for that stamp
    tau, Y, W, tau_f = regressors(2)
    publish(2, Y[:, :-1], W, tau_f)
    np.testing.assert_allclose(state(2, tau), -ctl._safe_kd * XD[2], rtol=1e-12)
    tau, Y, W, tau_f = regressors(3)
    W[1, 3] = np.nan
    publish(3, Y, W, tau_f)
    np.testing.assert_allclose(state(3, tau), -ctl._safe_kd * XD[3], rtol=1e-12)
    assert counter("regressor_rejected") == 2
    np.testing.assert_allclose(ctl.core.theta, core.theta, rtol=0, atol=1e-12)  # untouched

    # k=4 accepted again -- and what is used is what arrived (here deliberately not the model's)
    tau, Y, W, tau_f = regressors(4)
    Y, W, tau_f = 1.5 * Y, W + 0.1, tau_f - 0.2
    publish(4, Y, W, tau_f)
    expected = core.compute(X[4], XD[4], Q[4], QD[4], QDD[4], Y=Y, W=W, tau_f=tau_f)
    np.testing.assert_allclose(state(4, tau), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ctl.core.theta, core.theta, rtol=0, atol=1e-12)

    # k=5: none arrives -> the safe command after reference_wait (0.3 s); never NaN
    tau, *_ = regressors(5)
    np.testing.assert_allclose(state(5, tau, timeout=5.0), -ctl._safe_kd * XD[5], rtol=1e-12)
    assert counter("regressor_missing") == 1

    # k=6 waits, k=7 (with its regressors) supersedes it: 6 -> safe, 7 -> computed
    tau6, *_ = regressors(6)
    state(6, tau6, wait=False)
    tau, Y, W, tau_f = regressors(7)
    publish(7, Y, W, tau_f)
    ros.spin_for(0.1)
    state(7, tau, wait=False)
    assert ros.spin_until(lambda: command_stamp(probe.commands[-1]) == 7 * MS)
    got = {command_stamp(c): np.asarray(c.data) for c in probe.commands[-2:]}
    np.testing.assert_allclose(got[6 * MS], -ctl._safe_kd * XD[6], rtol=1e-12)
    expected = core.compute(X[7], XD[7], Q[7], QD[7], QDD[7], Y=Y, W=W, tau_f=tau_f)
    np.testing.assert_allclose(got[7 * MS], expected, rtol=1e-12, atol=1e-12)
    assert counter("regressor_missing") == 2

    # a late regressor (its state was answered) is counted as stale and ignored
    publish(4, Y, W, tau_f)
    assert ros.spin_until(lambda: counter("regressor_stale") == 2)
    assert all(np.all(np.isfinite(c.data)) for c in probe.commands)
    assert ros.spin_until(lambda: _diag_text(probe, "/adaptive_controller", "regressor_rejected") == "2", timeout=5.0)
    assert _diag_text(probe, "/adaptive_controller", "regressor_source") == "topics"


def test_the_scenario_starts_a_matching_regressor_node():
    from adaptive_dynamics.scenarios import build_graph

    def by_name(**kw):
        return {s.name: s for s in build_graph(**kw)}

    plain = by_name(scenario="sim", robot="panda", controller="composite")
    assert "regressor" not in plain
    nodes = by_name(scenario="sim", robot="panda", controller="composite", record=True,
                    overrides={"adaptive_controller": {"regressor_source": "topics", "lam": [7.0]},
                               "regressor": {"diagnostics_period": 2.0}})
    reg = nodes["regressor"].params
    assert reg["lam"] == [7.0] and reg["filter_lambda"] == 20.0  # the override / config/panda.yaml's value
    assert reg["base_parameters"] is False and reg["standard_decimation"] == 0
    assert reg["slotine_li_decimation"] == reg["filtered_decimation"] == 1
    assert reg["reliable_streams"] is True and reg["reference_wait"] == 20.0 and reg["use_sim_time"] is True
    assert reg["diagnostics_period"] == 2.0
    assert nodes["regressor"].param_files == nodes["adaptive_controller"].param_files
    bridge, bridge0 = nodes["mujoco_bridge"].params, by_name(scenario="sim", robot="panda", controller="composite",
                                                               record=True)["mujoco_bridge"].params
    assert bridge["wait_for_nodes"] == bridge0["wait_for_nodes"] + 1
    assert bridge["wait_for_state_subscribers"] == bridge0["wait_for_state_subscribers"] + 1
    real = by_name(scenario="real", robot="iiwa14", controller="direct", preset="lbr",
                   overrides={"adaptive_controller": {"regressor_source": "topics"}})
    assert real["regressor"].namespace == "lbr" and real["regressor"].params["reliable_streams"] is False
    # the baseline controller has no regressor_source; pd never starts a regressor node
    assert "regressor" not in by_name(scenario="sim", robot="panda", controller="pd",
                                      overrides={"adaptive_controller": {"regressor_source": "topics"}})


def test_topics_source_in_real_time_waits_for_the_regressors_not_the_reference(ros, ctx):
    """reference_wait 0 (real time): a state whose reference is in still waits for its
    regressors (they come after it, computed from the same state) and is answered with
    the law -- the same commands as the in-process regressors -- not the safe command."""
    _, topics, inproc, _, plant, step = _topics_and_inprocess(ros, ctx, {**NODE, "reference_wait": 0.0}, 0.2)
    for k in range(60):
        _, _, ut, ui = step(timeout=30.0 if k == 0 else 10.0)
        np.testing.assert_allclose(ut, ui, rtol=1e-9, atol=1e-9, err_msg=f"step {k}: {topics.counters.as_dict()}")
        plant.step(ut)
    c = topics.counters.as_dict()
    assert c.get("reference_missed", 0) == 0 and c.get("regressor_missing", 0) == 0, c
    assert topics.core.updates == inproc.core.updates == 60


def test_the_regressor_nodes_coulomb_shape_is_checked():
    """regressor_source topics: a regressor node whose friction_smoothing differs from the
    controller's model (the Coulomb columns' shape) is refused, for Y and W; the same shape passes."""
    from adaptive_dynamics.ros.regressor_topics import RegressorTopics

    for mine, theirs, refused in ((0.03, 0.0, True), (0.03, 0.03, False), (0.0, 0.0, False)):
        m = RobotModel("planar2", friction=True, coulomb_smoothing=mine)
        core = AdaptiveController(m, "composite", dt=1e-3, lam=10.0, kd=5.0)
        regs = RegressorTopics(m.n, 1000.0)
        settings = {"lam": [10.0], "filter_lambda": core.filter_lambda, "rate_hz": 1000.0, "coordinates": "pi",
                    "friction": True, "friction_smoothing": theirs}
        regs.on_columns(joint_state_msg(0, core.full_parameter_names, q=m.parameters, frame_id=json.dumps(settings)))
        chk = regs.check(core)
        if refused:
            assert "friction_smoothing" in chk["Y"] and chk["W"] == chk["Y"], chk
        else:
            assert chk == {"Y": None, "W": None}, chk
