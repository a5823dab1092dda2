"""The regressor node over real DDS: its stamped matrices times the true parameters give
the torques of independent references (pinocchio's RNEA, M/C from CRBA and
computeCoriolisMatrix), the filtered regressor satisfies W pi = tau_f, columns are
named on a latched topic (with the settings they are computed with), decimation and bad
input behave, a state waits for its reference."""
from __future__ import annotations

import json

import numpy as np
import pinocchio as pin
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.regressor import RegressorNode
from adaptive_dynamics.ros import joint_state_msg
from adaptive_dynamics.ros.qos import LATCHED_QOS, RELIABLE_STREAM_QOS
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.ros.arrays import matrix_from_msg, matrix_labels
from adaptive_dynamics.robots import urdf_path
from adaptive_dynamics.trajectories import ModifiedFourier
from test_node_safety import Probe

pytestmark = pytest.mark.ros
MS = 1_000_000
ROBOT = "planar2"
STEPS = 300


def test_regressor_node_against_independent_references(ros):
    node = ros.add(RegressorNode, robot=ROBOT, lam=[5.0], standard_decimation=1, slotine_li_decimation=2,
                   filtered_decimation=1, filter_lambda=30.0)
    probe = Probe(ros)
    got = {k: [] for k in ("standard", "slotine_li", "filtered")}
    for k in got:
        probe.node.create_subscription(Float64MultiArray, f"regressor/{k}", got[k].append, RELIABLE_STREAM_QOS)
    cols = []
    probe.node.create_subscription(JointState, "regressor/columns", cols.append, LATCHED_QOS)
    m = RobotModel(ROBOT)
    names = list(m.joint_names)
    traj = ModifiedFourier.random(m.n, np.random.default_rng(2), amplitude=0.5, w_f=2 * np.pi / 1.0, L=3,
                                  lower=m.lower, upper=m.upper, vel_limit=m.velocity_limit, acc_limit=None)
    t = np.arange(STEPS) * 1e-3
    Q, V, A = traj.sample_many(t)
    Qd = Q + 0.01  # the reference differs from the state (Slotine-Li sees an error)
    probe.ref.publish(reference_batch_msg(0, MS, names, Qd, V, A))
    assert ros.spin_until(lambda: len(node.refs) >= STEPS and probe.state.get_subscription_count() >= 1)
    assert ros.spin_until(lambda: len(cols) >= 1)
    assert list(cols[0].name) == list(m.parameter_names)
    np.testing.assert_allclose(cols[0].position, m.parameters)

    ref_model = pin.buildModelFromUrdf(str(urdf_path(ROBOT)))
    data = ref_model.createData()
    tau = np.array([pin.rnea(ref_model, data, Q[k], V[k], A[k]) for k in range(STEPS)])
    for k in range(STEPS):  # one at a time, as the lockstep bridge does
        probe.state.publish(joint_state_msg(k * MS, names, Q[k], V[k], tau[k]))
        assert ros.spin_until(lambda: len(got["filtered"]) > k, timeout=3.0)
    assert ros.spin_until(lambda: len(got["standard"]) >= STEPS and len(got["filtered"]) >= STEPS
                          and len(got["slotine_li"]) >= STEPS // 2, timeout=10.0)
    assert len(got["slotine_li"]) == STEPS // 2   # decimation 2
    pi = m.parameters
    # standard (measured): q_dd from the backward difference of v -> O(dt) torque error
    for msg in got["standard"][5::37]:
        stamp, Y = matrix_from_msg(msg, expected_shape=(m.n, m.n_params))
        k = stamp // MS
        assert np.allclose(Y @ pi, tau[k], atol=2e-2 * (1 + np.abs(tau).max())), k
    assert matrix_labels(got["standard"][0]) == ("joints", "pi")
    # Slotine-Li: M(q) ar + C(q, v) vr + g(q) from pinocchio's CRBA / Coriolis / gravity
    for msg in got["slotine_li"][3::17]:
        stamp, Y = matrix_from_msg(msg)
        k = stamp // MS
        vr = V[k] + 5.0 * (Qd[k] - Q[k])
        ar = A[k] + 5.0 * (V[k] - V[k])
        M = pin.crba(ref_model, data, Q[k])
        M = np.triu(M) + np.triu(M, 1).T
        C = pin.computeCoriolisMatrix(ref_model, data, Q[k], V[k])
        g = pin.computeGeneralizedGravity(ref_model, data, Q[k])
        np.testing.assert_allclose(Y @ pi, M @ ar + C @ vr + g, rtol=1e-9, atol=1e-9)
    # filtered: [W | tau_f], W pi = tau_f up to the O(h^2) discretisation
    for msg in got["filtered"][50::50]:
        _, Wt = matrix_from_msg(msg, expected_shape=(m.n, m.n_params + 1))
        W, tau_f = Wt[:, :-1], Wt[:, -1]
        assert np.allclose(W @ pi, tau_f, atol=1e-3 * (1 + np.abs(tau_f).max()))
    # bad input: NaN state and an out-of-order stamp are rejected and counted
    n_std = len(got["standard"])
    probe.state.publish(joint_state_msg(STEPS * MS, names, np.array([np.nan, 0.0]), V[0], tau[0]))
    probe.state.publish(joint_state_msg(10 * MS, names, Q[10], V[10], tau[10]))
    ros.spin_for(0.3)
    assert len(got["standard"]) == n_std
    c = node.counters.as_dict()
    assert c["state_rejected"] == 1 and c["out_of_order"] == 1


def test_regressor_node_base_columns_and_reference_input(ros):
    node = ros.add(RegressorNode, robot=ROBOT, base_parameters=True, standard_input="reference",
                   slotine_li_decimation=0, filtered_decimation=0)
    probe = Probe(ros)
    got = []
    probe.node.create_subscription(Float64MultiArray, "regressor/standard", got.append, RELIABLE_STREAM_QOS)
    m = RobotModel(ROBOT)
    base = m.base_parameters()
    names = list(m.joint_names)
    Q = np.array([[0.3, -0.2], [0.31, -0.21]])
    V = np.array([[0.5, 0.1], [0.4, 0.2]])
    A = np.array([[1.0, -2.0], [0.5, 0.3]])
    probe.ref.publish(reference_batch_msg(0, MS, names, Q, V, A))
    assert ros.spin_until(lambda: len(node.refs) >= 2 and probe.state.get_subscription_count() >= 1)
    for k in range(2):
        probe.state.publish(joint_state_msg(k * MS, names, np.zeros(2), np.zeros(2), np.zeros(2)))
    assert ros.spin_until(lambda: len(got) >= 2)
    for k, msg in enumerate(got):
        _, Yb = matrix_from_msg(msg, expected_shape=(m.n, base.n_base))
        np.testing.assert_allclose(Yb @ base.to_base(m.parameters), m.inverse_dynamics(Q[k], V[k], A[k]),
                                   rtol=1e-9, atol=1e-9)
    assert matrix_labels(got[0]) == ("joints", "base")


def test_regressor_node_settings_and_reference_wait(ros):
    """The latched columns carry the settings (republished when lam changes); a state whose
    reference has not arrived is held until it does, until a newer state, or reference_wait."""
    node = ros.add(RegressorNode, robot=ROBOT, lam=[5.0], filter_lambda=30.0, standard_decimation=0,
                   reference_wait=5.0)
    probe = Probe(ros)
    got = {k: [] for k in ("slotine_li", "filtered")}
    for k in got:
        probe.node.create_subscription(Float64MultiArray, f"regressor/{k}", got[k].append, RELIABLE_STREAM_QOS)
    cols = []
    probe.node.create_subscription(JointState, "regressor/columns", cols.append, LATCHED_QOS)
    assert ros.spin_until(lambda: len(cols) >= 1 and probe.state.get_subscription_count() >= 2)
    assert json.loads(cols[-1].header.frame_id) == {"lam": [5.0], "filter_lambda": 30.0, "rate_hz": 1000.0,
                                                     "coordinates": "pi", "friction": False,
                                                     "friction_smoothing": 0.0}
    assert node.p.set("lam", [4.0, 6.0]).successful
    assert ros.spin_until(lambda: len(cols) >= 2)
    assert json.loads(cols[-1].header.frame_id)["lam"] == [4.0, 6.0]

    m = RobotModel(ROBOT)
    names = list(m.joint_names)
    q, v, tau = np.array([0.3, -0.2]), np.array([0.5, 0.1]), np.array([1.0, 0.5])
    qd, vd, ad = np.array([0.35, -0.1]), np.array([0.4, 0.3]), np.array([1.0, -2.0])
    probe.state.publish(joint_state_msg(0, names, q, v, tau))  # before its reference: held
    ros.spin_for(0.3)
    assert got["slotine_li"] == [] and got["filtered"] == []
    probe.ref.publish(reference_batch_msg(0, MS, names, qd[None], vd[None], ad[None]))
    assert ros.spin_until(lambda: len(got["slotine_li"]) == 1 and len(got["filtered"]) == 1)
    stamp, Y = matrix_from_msg(got["slotine_li"][0], expected_shape=(m.n, m.n_params))
    lam = np.array([4.0, 6.0])
    assert stamp == 0
    np.testing.assert_allclose(Y, m.slotine_li_regressor(q, v, vd + lam * (qd - q), ad + lam * (vd - v)),
                               rtol=1e-12, atol=1e-12)
    # no reference for 1 ms: held until the newer state, which then waits until reference_wait
    probe.state.publish(joint_state_msg(MS, names, q, v, tau))
    ros.spin_for(0.2)
    assert len(got["filtered"]) == 1
    assert node.p.set("reference_wait", 0.2).successful
    probe.state.publish(joint_state_msg(2 * MS, names, q, v, tau))
    assert ros.spin_until(lambda: len(got["filtered"]) == 3, timeout=5.0)
    assert len(got["slotine_li"]) == 1 and node.counters.as_dict()["reference_missing"] == 2
