"""The prediction / model-update split over DDS: model_update publishes versioned
snapshots of what it learns (the same samples as the ROS-free core), prediction
publishes the residual of the snapshot it applied, refuses bad snapshots and keeps its
model, holds its last output without a model or when a prediction fails, extrapolates
the reference, and both continue where they were after a restart."""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import UInt8MultiArray
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import Learner, OnlineResidual, make_learner
from adaptive_dynamics.learning.snapshot import MAGIC, decode_snapshot, encode_snapshot, read_header
from adaptive_dynamics.nodes.model_update import ModelUpdateNode
from adaptive_dynamics.nodes.prediction import PredictionNode
from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.params import to_parameters
from adaptive_dynamics.ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.ros.stamps import to_ns

pytestmark = pytest.mark.ros

ROBOT = "planar2"
DT = 10_000_000          # 10 ms between samples
LEAD = 0.03
CFG = {"n_basis": 48, "width": 0.4}


@pytest.fixture(scope="module")
def model():
    return RobotModel(ROBOT)


def motion(model, N):
    n = model.n
    t = np.arange(N + 20) * DT * 1e-9
    w = np.array([0.9, 1.4])[:n]
    Q = 0.7 * np.sin(np.outer(t, w))
    QD = 0.7 * w * np.cos(np.outer(t, w))
    QDD = -0.7 * w ** 2 * np.sin(np.outer(t, w))
    q = Q + 0.01 * np.cos(3 * t)[:, None]
    v = QD - 0.02 * np.sin(3 * t)[:, None]
    tau = 1.5 * v + 0.4 * np.tanh(v / 0.05) + np.sin(q)
    pt = 0.3 * np.sin(q) + 0.1
    return Q, QD, QDD, q, v, tau, pt


class Probe:
    def __init__(self, ros, names):
        self.node = ros.node("split_probe")
        self.names = list(names)
        self.state = self.node.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.ptorque = self.node.create_publisher(JointState, "adaptive/parametric_torque", PUBLISHER_STREAM_QOS)
        self.update = self.node.create_publisher(JointState, "adaptive/parameter_update", PUBLISHER_STREAM_QOS)
        self.ref = self.node.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
        self.snap = self.node.create_publisher(UInt8MultiArray, "learner/model", LATCHED_QOS)
        self.res, self.mon, self.models = [], [], []
        deep = QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(JointState, "feedforward/residual", self.res.append, deep)
        self.node.create_subscription(JointState, "learner/prediction", self.mon.append, deep)

    def listen_models(self):
        # transient local: also the newest snapshot published before this reader matched.  The
        # writer keeps only its newest (depth 1), so a reader may skip versions, never reorder them
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                         durability=LATCHED_QOS.durability)
        self.node.create_subscription(UInt8MultiArray, "learner/model", self.models.append, qos)

    def versions(self, start=0):
        return [read_header(m.data, max_bytes=None)[0]["version"] for m in self.models[start:]]

    def send(self, k, q, v, tau, pt=None):
        self.state.publish(joint_state_msg(k * DT, self.names, q, v, tau))
        if pt is not None:
            self.ptorque.publish(joint_state_msg(k * DT, self.names, effort=pt))

    def publish_snapshot(self, data: bytes, label: str = "probe"):
        from std_msgs.msg import MultiArrayDimension
        msg = UInt8MultiArray()
        msg.layout.dim = [MultiArrayDimension(label=label, size=len(data), stride=len(data))]
        msg.data = bytes(data)
        self.snap.publish(msg)


def by_stamp(msgs, names):
    out = {}
    for m in msgs:
        idx = [list(m.name).index(j) for j in names]
        out[to_ns(m.header.stamp)] = np.array(m.effort)[idx]
    return out


def remove(ros, node):
    ros.executor.remove_node(node)
    ros.nodes.remove(node)
    node.destroy_node()


def test_snapshots_flow_and_prediction_uses_the_applied_version(ros, model):
    N = 120
    upd = ros.add(ModelUpdateNode, robot=ROBOT, target_torque="measured", learner="rbfn", learner_config=json.dumps(CFG), warmup=30,
                  learn_decimation=1, block_size=10, publish_period=0.02, hint_lead=0.02, diagnostics_period=0.2)
    pred = ros.add(PredictionNode, robot=ROBOT, learner="rbfn", prediction_lead=LEAD, monitor_decimation=1,
                   diagnostics_period=0.2)
    probe = Probe(ros, model.joint_names)
    probe.listen_models()
    hints = []
    core_hint = upd.core.hint
    upd.core.hint = lambda x: hints.append(np.array(x)) or core_hint(x)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, N)
    X = np.hstack([Q, QD, QDD])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and len(pred.refs) == len(Q)
                          and probe.ptorque.get_subscription_count() > 0 and probe.state.get_subscription_count() > 1,
                          timeout=10.0)
    ref_core = OnlineResidual(model, "rbfn", dict(CFG), learn_every=1, warmup=30, threaded=False)
    d = 0.02 * np.abs(model.parameters) * np.cos(np.arange(model.n_params))
    for k in range(N):
        if k == 80:   # a parameter update between samples 79 and 80: the transform, in stream order
            assert ros.spin_until(lambda: upd.core.counters["samples_offered"] == 80, timeout=10.0)
            probe.update.publish(joint_state_msg(k * DT, model.parameter_names, q=d))
            assert ros.spin_until(lambda: upd.core.counters["updates_received"] == 1, timeout=10.0)
            ref_core.add_parameter_update(d)
        probe.send(k, q[k], v[k], tau[k], pt[k])
        ref_core.add_sample(np.concatenate([q[k], v[k], QDD[k]]), tau[k] - pt[k])
        assert ros.spin_until(lambda: upd.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert upd.core.flush(timeout=20.0)
    ref_core.process()
    np.testing.assert_allclose(upd.core.predict(X), ref_core.predict(X), rtol=1e-7, atol=1e-9)
    # the hint before each sample: the reference point hint_lead (2 steps) ahead of the state
    assert len(hints) == N
    for k in (0, 50, N - 1):
        np.testing.assert_array_equal(hints[k], X[k + 2])

    # snapshots: increasing versions, each "rbfn vN" with the header's version
    assert ros.spin_until(lambda: upd.core.revision == upd._snap_rev, timeout=10.0)
    assert ros.spin_until(lambda: probe.models and probe.versions()[-1] == upd.version, timeout=10.0)
    versions = probe.versions()
    assert versions == sorted(set(versions)) and len(versions) >= 3 and upd.version >= 3, versions
    assert [m.layout.dim[0].label for m in probe.models] == [f"rbfn v{v}" for v in versions]
    assert all(m.layout.dim[0].size == len(m.data) for m in probe.models)
    assert upd.counters["snapshots_published"] == upd.version

    # prediction applies the newest; its residuals are that snapshot's prediction on the reference
    assert ros.spin_until(lambda: pred.model is not None and pred.model.version == upd.version, timeout=10.0)
    published = decode_snapshot(probe.models[-1].data, max_bytes=None).learner
    # decoded snapshot: caches/factors rebuilt from the stored arrays, BLAS may sum in another order (~n eps)
    np.testing.assert_allclose(published.predict(X), upd.core.predict(X), rtol=1e-9, atol=1e-12)
    # learning off first, so the next state's sample does not make a new version meanwhile
    v_before = upd.version
    upd.set_parameters(to_parameters({"learning": False}))
    probe.send(N, q[N], v[N], tau[N], pt[N])
    k_new = N + round(LEAD * 1e9) // DT
    assert ros.spin_until(lambda: probe.res and to_ns(probe.res[-1].header.stamp) == k_new * DT, timeout=10.0)
    got = by_stamp(probe.res, names)
    # (the stamps already ahead of state N were answered, once, by the version applied then)
    # the node predicts its stamps as one batch from its own decoded copy: another BLAS summation order (~n eps)
    np.testing.assert_allclose(got[k_new * DT], published.predict(X[k_new]), rtol=1e-9, atol=1e-12)
    for k in range(N + 1, k_new):
        assert any(np.allclose(got[k * DT], decode_snapshot(m.data, max_bytes=None).learner.predict(X[k]),
                               rtol=1e-9, atol=1e-12) for m in probe.models), k     # (as above)
    # one residual per reference stamp, in order, never for the past, never NaN
    stamps = [to_ns(m.header.stamp) for m in probe.res]
    assert stamps == sorted(set(stamps)) and stamps[0] == 0
    assert all(np.isfinite(m.effort).all() for m in probe.res)
    c = pred.counters
    assert c["snapshots_applied"] >= 1 and c["snapshots_refused"] == 0
    assert ros.spin_until(lambda: pred.counters["model_version"] == upd.version and
                          upd.counters["version"] == upd.version, timeout=5.0)

    # learning off: no change, no new version
    probe.send(N + 1, q[N + 1], v[N + 1], tau[N + 1], pt[N + 1])
    ros.spin_for(0.2)
    assert upd.version == v_before and pred.model.version == v_before
    assert upd.core.counters["samples_learned"] == N


def _trained(model, kind="rbfn", seed=0, **cfg):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (200, 3 * model.n))
    Y = np.c_[np.sin(X[:, 0]), X[:, 1] * X[:, 2]]
    cfg = cfg or ({"n_basis": 16} if kind == "rbfn" else {"max_components": 4})
    return make_learner(kind, input_dim=3 * model.n, output_dim=model.n, **cfg).partial_fit(X, Y)


def test_bad_snapshots_are_refused_and_the_model_stays(ros, model, tmp_path):
    junk_file = tmp_path / "prediction.snap"
    junk_file.write_bytes(b"not a snapshot")
    good = _trained(model)
    v3 = encode_snapshot(good, 3)
    pred = ros.add(PredictionNode, robot=ROBOT, learner="rbfn", prediction_lead=0.0, model_file=str(junk_file),
                   max_snapshot_bytes=len(v3) + 2000)
    assert pred.model is None and pred.counters["refused_magic"] == 1   # the file was refused at start
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, _ = motion(model, 40)
    X = np.hstack([Q, QD, QDD])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(pred.refs) == len(Q) and probe.snap.get_subscription_count() > 0, timeout=10.0)

    # no model yet: it publishes at its rate all the same, zeros, counted as held
    for k in range(3):
        probe.send(k, q[k], v[k], tau[k])
    assert ros.spin_until(lambda: len(probe.res) == 3, timeout=10.0)
    assert all(np.all(np.array(m.effort) == 0.0) for m in probe.res) and pred.counters["held_outputs"] == 3

    def handled():
        return pred.counters["snapshots_applied"] + pred.counters["snapshots_refused"]

    def offer(data):
        done = handled()
        probe.publish_snapshot(data)
        assert ros.spin_until(lambda: handled() == done + 1, timeout=10.0), pred.counters.as_dict()

    offer(v3)
    assert ros.spin_until(lambda: pred.model is not None and pred.model.version == 3, timeout=10.0)

    def edited(data, edit):
        header, body = read_header(data, max_bytes=None)
        header = dict(header)
        edit(header)
        raw = json.dumps(header).encode()
        return MAGIC + struct.pack("<I", len(raw)) + raw + bytes(body)

    flipped = bytearray(encode_snapshot(good, 5))
    flipped[-40] ^= 0xFF
    other = _trained(model, "gmm")
    wide = make_learner("rbfn", input_dim=9, output_dim=2, n_basis=8)
    big = _trained(model, n_basis=64)
    bad = {
        "checksum": bytes(flipped),
        "truncated": encode_snapshot(good, 6)[:-100],
        "magic": b"PK\x03\x04" + b"\x00" * 200,
        "version": encode_snapshot(good, 2),               # older
        "kind": encode_snapshot(other, 8),                  # a gmm: this node takes rbfn
        "dims": encode_snapshot(wide, 9),                   # 9 -> 2: not (q, qd, qdd) of this robot
        "size": encode_snapshot(big, 10),                   # over max_snapshot_bytes
        "mismatch": edited(encode_snapshot(other, 11), lambda h: h.update(kind="rbfn")),   # holds a gmm
    }
    order = []
    inc = pred.counters.inc
    pred.counters.inc = lambda key, n=1: (order.append(key), inc(key, n))[1]
    import adaptive_dynamics.nodes.prediction as prediction_module
    parsed = []
    decode_bytes = prediction_module.decode_bytes
    prediction_module.decode_bytes = lambda raw: (parsed.append(len(raw)), decode_bytes(raw))[1]
    try:
        for reason, data in bad.items():
            before = pred.counters[f"refused_{reason}"]
            offer(data)
            assert pred.counters[f"refused_{reason}"] == before + 1, (reason, pred.counters.as_dict())
            assert pred.model.version == 3
            # the reason is counted before the total (a reader waiting on the total sees it)
            k = order.index("snapshots_refused")
            assert order[k - 1] == f"refused_{reason}", order
            del order[:]
        # the oversize message was refused in the callback: never queued, never parsed
        assert len(parsed) == len(bad) - 1 and max(parsed) < len(bad["size"])
        offer(v3)                                               # equal: refused as not newer
        assert pred.counters["refused_version"] == 2 and pred.model.version == 3
        # a not-newer snapshot is refused on its header: its (broken) checksum is never computed
        stale = bytearray(encode_snapshot(good, 3))
        stale[-40] ^= 0xFF
        offer(bytes(stale))
        assert pred.counters["refused_version"] == 3 and pred.counters["refused_checksum"] == 1
    finally:
        prediction_module.decode_bytes = decode_bytes
        pred.counters.inc = inc
    assert pred.counters["snapshots_refused"] == 1 + len(bad) + 2    # with the file at start

    # the model in use is still v3: the residuals are its prediction
    for k in range(3, 6):
        probe.send(k, q[k], v[k], tau[k])
    assert ros.spin_until(lambda: len(probe.res) == 6, timeout=10.0)
    got = by_stamp(probe.res, names)
    for k in range(3, 6):
        # the node's decoded copy, its stamps predicted as one batch: another BLAS summation order (~n eps)
        np.testing.assert_allclose(got[k * DT], good.predict(X[k]), rtol=1e-9, atol=1e-12)

    v12 = _trained(model, seed=1)
    offer(encode_snapshot(v12, 12))
    assert pred.model.version == 12 and pred.counters["snapshots_applied"] == 2
    probe.send(6, q[6], v[6], tau[6])
    assert ros.spin_until(lambda: len(probe.res) == 7, timeout=10.0)
    # (as above: the node's decoded copy, its stamps predicted as one batch)
    np.testing.assert_allclose(by_stamp(probe.res, names)[6 * DT], v12.predict(X[6]), rtol=1e-9, atol=1e-12)
    assert ros.spin_until(lambda: pred.counters["model_version"] == 12, timeout=5.0)

    # the valid model replaces the refused file on shutdown
    remove(ros, pred)
    assert decode_snapshot(junk_file.read_bytes(), max_bytes=None).version == 12


class _Picky(Learner):
    """Predicts x[0] per output with the variance x[1]^2, and refuses (ValueError) inputs
    with x[0] > 0.65."""

    kind = "_picky"

    def _predict(self, X, return_var):
        if np.any(X[:, 0] > 0.65):
            raise ValueError("outside the picky range")
        return (np.repeat(X[:, :1], self.output_dim, axis=1),
                np.repeat(X[:, 1:2] ** 2, self.output_dim, axis=1) if return_var else None)

    def _fit(self, X, y, R):
        pass

    def get_config(self):
        return {"input_dim": self.input_dim, "output_dim": self.output_dim}

    def _get_arrays(self):
        return {}

    def _set_arrays(self, arrays):
        pass


def test_lead_extrapolation_and_holding_the_last_output(ros, model, monkeypatch):
    """The reference ends at step 4; a lead of 3 steps at state 3 asks for steps 3..6:
    5 and 6 come from the reference extrapolated linearly from its last two points
    (PGPOL sec. III), at most 3.5 steps beyond it.  A learner that fails on a point: the
    last valid output is held (any kind of the registry works, here one registered by
    the test)."""
    from adaptive_dynamics.learning import base
    monkeypatch.setitem(base.LEARNERS, _Picky.kind, _Picky)
    pred = ros.add(PredictionNode, robot=ROBOT, prediction_lead=3 * DT * 1e-9, extrapolation_limit=3.5 * DT * 1e-9)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    n = model.n
    Q = np.array([[0.0, 0.1], [0.1, 0.1], [0.2, 0.1], [0.3, 0.1], [0.4, 0.1]])
    QD = np.tile([1.0, 0.0], (5, 1))
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD))
    assert ros.spin_until(lambda: len(pred.refs) == 5 and probe.snap.get_subscription_count() > 0, timeout=10.0)
    probe.publish_snapshot(encode_snapshot(_Picky(3 * n, n), 1))
    assert ros.spin_until(lambda: pred.model is not None, timeout=10.0)
    probe.send(3, Q[3], QD[3], np.zeros(n))
    assert ros.spin_until(lambda: len(probe.res) == 4, timeout=10.0)
    got = by_stamp(probe.res, names)
    assert sorted(got) == [3 * DT, 4 * DT, 5 * DT, 6 * DT]
    for k in (3, 4, 5, 6):
        np.testing.assert_allclose(got[k * DT], [0.1 * k] * n, atol=1e-12)   # x0 = 0.1 k on the line
    assert pred.counters["extrapolated"] == 2
    # the next state asks for step 7: extrapolated to q0 = 0.7 > 0.65 -> the learner fails: hold 0.6
    probe.send(4, Q[4], QD[4], np.zeros(n))
    assert ros.spin_until(lambda: len(probe.res) == 5, timeout=10.0)
    np.testing.assert_allclose(by_stamp(probe.res, names)[7 * DT], [0.6] * n, atol=1e-12)
    assert pred.counters["prediction_failed"] == 1 and pred.counters["held_outputs"] == 1
    # step 8 would be 4 steps beyond the reference: over the limit, nothing new (5 is covered)
    probe.send(5, Q[4], QD[4], np.zeros(n))
    ros.spin_for(0.2)
    assert len(probe.res) == 5 and pred.counters["extrapolated"] == 3
    # states past everything published (the reference does not reach them): the last valid
    # output (0.6, of step 6), one per state, stamped with the state's stamp, counted as held
    for k in (6, 7, 8, 9):
        probe.send(k, Q[4], QD[4], np.zeros(n))
    assert ros.spin_until(lambda: len(probe.res) == 7, timeout=10.0)
    ros.spin_for(0.1)
    got = by_stamp(probe.res, names)
    assert sorted(got)[-2:] == [8 * DT, 9 * DT] and len(probe.res) == 7
    for k in (8, 9):
        np.testing.assert_allclose(got[k * DT], [0.6] * n, atol=1e-12)
    assert pred.counters["held_outputs"] == 3 and pred.counters["residuals_published"] == 7
    # extrapolation off: nothing beyond the reference but the held output for the state itself
    pred.set_parameters(to_parameters({"extrapolate": False}))
    probe.ref.publish(reference_batch_msg(10 * DT, DT, names, Q[:3] * 0, QD[:3]))
    assert ros.spin_until(lambda: len(pred.refs) == 8, timeout=10.0)
    probe.send(10, Q[0], QD[0], np.zeros(n))
    assert ros.spin_until(lambda: len(probe.res) == 10, timeout=10.0)
    ros.spin_for(0.1)
    assert sorted(by_stamp(probe.res, names))[-3:] == [10 * DT, 11 * DT, 12 * DT] and len(probe.res) == 10
    held = pred.counters["held_outputs"]
    probe.send(13, Q[0], QD[0], np.zeros(n))               # the reference ended at 12
    assert ros.spin_until(lambda: len(probe.res) == 11, timeout=10.0)
    np.testing.assert_allclose(by_stamp(probe.res, names)[13 * DT], [0.0] * n, atol=1e-12)   # x0 of step 12
    assert pred.counters["held_outputs"] == held + 1


def _std_prediction(ros, model, monkeypatch, learner_cls):
    """A prediction node with publish_std, ``learner_cls`` registered as a learner kind,
    a probe and the list its feedforward/residual_std messages go to."""
    from adaptive_dynamics.learning import base
    monkeypatch.setitem(base.LEARNERS, learner_cls.kind, learner_cls)
    pred = ros.add(PredictionNode, robot=ROBOT, prediction_lead=2 * DT * 1e-9, extrapolate=False,
                   publish_std=True)
    probe = Probe(ros, model.joint_names)
    std = []
    deep = QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE)
    probe.node.create_subscription(JointState, "feedforward/residual_std", std.append, deep)
    return pred, probe, std


def test_publish_std_follows_the_residual_and_is_held_with_it(ros, model, monkeypatch):
    """publish_std: feedforward/residual_std with the residual's stamps, sqrt of the
    learner's variance; zeros without a model; the last valid one held with the last
    valid residual when a prediction fails or the reference ended."""
    pred, probe, std = _std_prediction(ros, model, monkeypatch, _Picky)
    names = model.joint_names
    n = model.n
    Q = np.array([[0.0, 0.1], [0.1, 0.2], [0.2, 0.3], [0.3, 0.4]])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, np.zeros_like(Q)))
    assert ros.spin_until(lambda: len(pred.refs) == 4 and probe.snap.get_subscription_count() > 0
                          and pred.output.pub_std.get_subscription_count() > 0, timeout=10.0)
    probe.send(0, Q[0], Q[0], np.zeros(n))                     # no model: zeros, held, for 0..2
    assert ros.spin_until(lambda: len(std) == 3, timeout=10.0)
    probe.publish_snapshot(encode_snapshot(_Picky(3 * n, n), 1))
    assert ros.spin_until(lambda: pred.model is not None, timeout=10.0)
    probe.send(1, Q[1], Q[1], np.zeros(n))                     # step 3: x0 = 0.3, std |x1| = 0.4
    assert ros.spin_until(lambda: len(std) == 4, timeout=10.0)
    probe.ref.publish(reference_batch_msg(4 * DT, DT, names, np.array([[0.7, 0.5]]), np.zeros((1, 2))))
    assert ros.spin_until(lambda: len(pred.refs) == 5, timeout=10.0)
    probe.send(2, Q[2], Q[2], np.zeros(n))                     # step 4: x0 = 0.7 fails: hold
    probe.send(5, Q[3], Q[3], np.zeros(n))                     # past the reference: hold, stamped 5
    assert ros.spin_until(lambda: len(std) == 6 and len(probe.res) == 6, timeout=10.0)
    ros.spin_for(0.1)
    assert [to_ns(m.header.stamp) for m in std] == [to_ns(m.header.stamp) for m in probe.res] \
        == [k * DT for k in range(6)]
    got, res = by_stamp(std, names), by_stamp(probe.res, names)
    for k in range(3):
        assert np.all(got[k * DT] == 0.0) and np.all(res[k * DT] == 0.0)
    for k in (3, 4, 5):
        np.testing.assert_allclose(res[k * DT], [0.3] * n, atol=1e-12)
        np.testing.assert_allclose(got[k * DT], [0.4] * n, atol=1e-12)
    assert pred.counters["prediction_failed"] == 1 and pred.counters["held_outputs"] == 5


class _NanVar(_Picky):
    """_Picky with a non-finite variance where x[1] > 0.45."""

    kind = "_nanvar"

    def _predict(self, X, return_var):
        F, V = super()._predict(X, return_var)
        if V is not None:
            V = np.where(X[:, 1:2] > 0.45, np.nan, V)
        return F, V


def test_a_nonfinite_std_leaves_the_residual_as_it_is(ros, model, monkeypatch):
    """publish_std with a learner whose variance is NaN at a state: the residual there is
    the one published without publish_std (the feed-forward does not change with the
    monitor), its std message left out and counted in std_failed."""
    pred, probe, std = _std_prediction(ros, model, monkeypatch, _NanVar)
    names, n = model.joint_names, model.n
    Q = np.array([[0.1, 0.2], [0.2, 0.5], [0.3, 0.4]])           # the second: NaN variance
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, np.zeros_like(Q)))
    assert ros.spin_until(lambda: len(pred.refs) == 3 and probe.snap.get_subscription_count() > 0
                          and pred.output.pub_std.get_subscription_count() > 0, timeout=10.0)
    probe.publish_snapshot(encode_snapshot(_NanVar(3 * n, n), 1))
    assert ros.spin_until(lambda: pred.model is not None, timeout=10.0)
    for k in range(3):
        probe.send(k, Q[k], Q[k], np.zeros(n))
    assert ros.spin_until(lambda: len(probe.res) == 3, timeout=10.0)
    ros.spin_for(0.1)
    res = by_stamp(probe.res, names)
    for k in range(3):
        np.testing.assert_allclose(res[k * DT], [Q[k, 0]] * n, atol=1e-12)    # the mean, every one
    assert sorted(to_ns(m.header.stamp) for m in std) == [0, 2 * DT]
    assert pred.counters["std_failed"] >= 1 and pred.counters["prediction_failed"] == 0
    assert pred.counters["held_outputs"] == 0


def test_torque_target_learns_the_measured_torque(ros, model):
    N = 60
    upd = ros.add(ModelUpdateNode, robot=ROBOT, target_torque="measured", learner="gmm", target="torque", warmup=20, learn_decimation=1,
                  block_size=10, publish_period=0.02, learner_config='{"max_components": 8}')
    probe = Probe(ros, model.joint_names)
    probe.listen_models()
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, N)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and probe.state.get_subscription_count() > 0, timeout=10.0)
    assert probe.ptorque.get_subscription_count() == 0 and probe.update.get_subscription_count() == 0
    ref_core = OnlineResidual(model, "gmm", {"max_components": 8}, learn_every=1, warmup=20, threaded=False)
    for k in range(N):
        probe.send(k, q[k], v[k], tau[k])   # no parametric torque: the state makes the sample
        ref_core.add_sample(np.concatenate([q[k], v[k], QDD[k]]), tau[k])
        assert ros.spin_until(lambda: upd.core.counters["samples_offered"] == k + 1, timeout=10.0)
    assert upd.core.flush(timeout=10.0)
    ref_core.process()
    X = np.hstack([q[:N], v[:N], QDD[:N]])
    np.testing.assert_allclose(upd.core.predict(X), ref_core.predict(X), rtol=1e-9, atol=1e-12)
    assert upd.core.counters["samples_learned"] == N and not upd.core.transform
    assert ros.spin_until(lambda: upd.core.revision == upd._snap_rev and probe.models
                          and probe.versions()[-1] == upd.version, timeout=10.0)
    snap = decode_snapshot(probe.models[-1].data, max_bytes=None)
    np.testing.assert_allclose(snap.learner.predict(X), ref_core.predict(X), rtol=1e-9, atol=1e-12)


def test_restart_continues_versions_and_reloads_the_model(ros, model, tmp_path):
    upd_file, pred_file = tmp_path / "model.snap", tmp_path / "prediction.snap"
    N = 50
    kw = dict(robot=ROBOT, target_torque="measured", learner="gmm", warmup=20, learn_decimation=1, block_size=10, publish_period=0.02,
              learner_config='{"max_components": 8}', model_file=str(upd_file))
    upd = ros.add(ModelUpdateNode, **kw)
    pred = ros.add(PredictionNode, robot=ROBOT, learner="gmm", model_file=str(pred_file))
    probe = Probe(ros, model.joint_names)
    probe.listen_models()
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, 2 * N)
    X = np.hstack([Q, QD, QDD])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0,
                          timeout=10.0)

    def feed(lo, hi, node):
        for k in range(lo, hi):
            probe.send(k, q[k], v[k], tau[k], pt[k])
            assert ros.spin_until(lambda: node.core.counters["samples_offered"] == k + 1 - lo, timeout=10.0)
        assert node.core.flush(timeout=10.0)
    feed(0, N, upd)
    assert ros.spin_until(lambda: upd.version >= 1 and upd.core.revision == upd._snap_rev and pred.model is not None
                          and pred.model.version == upd.version, timeout=10.0)
    v_pub = upd.version
    remove(ros, upd)    # saves: nothing changed since v_pub, so the file holds v_pub
    remove(ros, pred)   # saves its current model
    assert decode_snapshot(upd_file.read_bytes(), max_bytes=None).version == v_pub
    assert decode_snapshot(pred_file.read_bytes(), max_bytes=None).version == v_pub
    expected = decode_snapshot(pred_file.read_bytes(), max_bytes=None).learner.predict(X)

    # prediction restarts with its model (no model_update running yet)
    pred2 = ros.add(PredictionNode, robot=ROBOT, learner="gmm", model_file=str(pred_file))
    assert pred2.model is not None and pred2.model.version == v_pub
    np.testing.assert_allclose(pred2.model.learner.predict(X), expected, rtol=1e-9)
    # model_update restarts from its file: republishes v_pub, then numbers on from there
    n0 = len(probe.models)
    upd2 = ros.add(ModelUpdateNode, **kw)
    assert upd2.version == v_pub and upd2.core.ready
    np.testing.assert_allclose(upd2.core.predict(X), expected, rtol=1e-9)
    assert ros.spin_until(lambda: probe.ptorque.get_subscription_count() > 0 and len(upd2.refs) == len(Q)
                          and probe.state.get_subscription_count() >= 2, timeout=10.0)
    assert ros.spin_until(lambda: pred2.counters["refused_version"] == 1, timeout=5.0)   # v_pub again: not newer
    feed(N, 2 * N, upd2)
    assert ros.spin_until(lambda: upd2.core.revision == upd2._snap_rev and pred2.model.version == upd2.version
                          and probe.versions()[-1] == upd2.version, timeout=10.0)
    after = probe.versions(n0)
    assert after[0] == v_pub and after == sorted(set(after)) and upd2.version > v_pub, after
    assert probe.models[-1].layout.dim[0].label == f"gmm v{upd2.version}"
    np.testing.assert_allclose(pred2.model.learner.predict(X), upd2.core.predict(X), rtol=1e-9, atol=1e-12)
    assert hashlib.sha256(pred2.model.data).digest() == hashlib.sha256(bytes(probe.models[-1].data)).digest()


def test_versions_applied_in_diagnostics(ros, model):
    """``versions_applied``: the last APPLIED_KEPT applied versions, oldest first, in the
    same /diagnostics message as the ``snapshots_applied`` count they end at (a monitor
    sampling often enough sees every version applied, in order); a refused one is not
    listed."""
    from diagnostic_msgs.msg import DiagnosticArray

    from adaptive_dynamics.nodes.prediction import APPLIED_KEPT
    pred = ros.add(PredictionNode, robot=ROBOT, learner="rbfn", diagnostics_period=0.05)
    probe = Probe(ros, model.joint_names)
    seen = []
    probe.node.create_subscription(DiagnosticArray, "/diagnostics",
                                   lambda m: seen.extend(s for s in m.status if s.name == "prediction"), 100)
    assert ros.spin_until(lambda: probe.snap.get_subscription_count() > 0, timeout=10.0)
    good = _trained(model)
    versions = list(range(2, 2 * APPLIED_KEPT + 6, 2))

    def handled():
        return pred.counters["snapshots_applied"] + pred.counters["snapshots_refused"]

    for v in versions + [3]:             # 3: older than the model in use, refused
        done = handled()
        probe.publish_snapshot(encode_snapshot(good, v))
        assert ros.spin_until(lambda: handled() == done + 1, timeout=10.0), pred.counters.as_dict()
    assert pred.counters["refused_version"] == 1 and pred.counters["snapshots_applied"] == len(versions)
    assert pred.counters["versions_applied"] == " ".join(map(str, versions[-APPLIED_KEPT:]))
    n = len(seen)
    assert ros.spin_until(lambda: len(seen) > n, timeout=5.0)
    for st in seen:
        values = {kv.key: kv.value for kv in st.values}
        count = int(values["snapshots_applied"])
        listed = [int(x) for x in values.get("versions_applied", "").split()]
        assert listed == versions[:count][-APPLIED_KEPT:], (count, listed)
    assert int({kv.key: kv.value for kv in seen[-1].values}["snapshots_applied"]) == len(versions)


def _feed(ros, probe, node, q, v, tau, pt, lo, hi):
    base = node.core.counters["samples_offered"]
    for k in range(lo, hi):
        probe.send(k, q[k], v[k], tau[k], pt[k])
        assert ros.spin_until(lambda: node.core.counters["samples_offered"] == base + k + 1 - lo, timeout=10.0)
    assert node.core.flush(timeout=10.0)


def test_a_restart_without_a_file_is_a_new_epoch(ros, model):
    """model_update restarted without model_file numbers from 1 again, in a new epoch: the
    prediction node holding a higher version of the old epoch takes the new run's
    snapshots (created later) at once; so it does after a publisher's huge version."""
    N = 50
    kw = dict(robot=ROBOT, target_torque="measured", learner="gmm", warmup=20, learn_decimation=1, block_size=10, publish_period=0.02,
              learner_config='{"max_components": 8}')
    upd = ros.add(ModelUpdateNode, **kw)
    pred = ros.add(PredictionNode, robot=ROBOT, learner="gmm")
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, 3 * N)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0,
                          timeout=10.0)
    _feed(ros, probe, upd, q, v, tau, pt, 0, N)
    assert ros.spin_until(lambda: upd.version >= 2 and upd.core.revision == upd._snap_rev
                          and pred.model is not None and pred.model.version == upd.version, timeout=10.0)
    first_epoch, v_old = upd.epoch, upd.version
    assert pred.model.epoch == first_epoch and len(first_epoch) == 16
    remove(ros, upd)

    upd2 = ros.add(ModelUpdateNode, **kw)                   # no file: versions from 1, a new epoch
    assert upd2.epoch != first_epoch and upd2.version == 0
    assert ros.spin_until(lambda: probe.ptorque.get_subscription_count() > 0 and len(upd2.refs) == len(Q),
                          timeout=10.0)
    _feed(ros, probe, upd2, q, v, tau, pt, N, 2 * N)
    assert ros.spin_until(lambda: upd2.core.revision == upd2._snap_rev and pred.model.epoch == upd2.epoch
                          and pred.model.version == upd2.version, timeout=10.0), pred.counters.as_dict()
    assert upd2.version <= v_old or pred.counters["snapshots_applied"] >= 2
    assert pred.counters["snapshots_refused"] == 0
    assert ros.spin_until(lambda: pred.counters["model_epoch"] == upd2.epoch, timeout=5.0)

    # a publisher's huge version (another epoch) is applied, then model_update's next one all the same
    huge = encode_snapshot(_trained(model, "gmm"), 10 ** 12, epoch="rogue")
    probe.publish_snapshot(huge)
    assert ros.spin_until(lambda: pred.model.version == 10 ** 12, timeout=10.0)
    _feed(ros, probe, upd2, q, v, tau, pt, 2 * N, 2 * N + 10)
    assert ros.spin_until(lambda: upd2.core.revision == upd2._snap_rev and pred.model.epoch == upd2.epoch
                          and pred.model.version == upd2.version, timeout=10.0), pred.counters.as_dict()
    assert pred.counters["snapshots_refused"] == 0
    # and a snapshot of the held epoch keeps the version order: the republished huge one is not newer
    probe.publish_snapshot(encode_snapshot(_trained(model, "gmm"), upd2.version, epoch=upd2.epoch))
    assert ros.spin_until(lambda: pred.counters["refused_version"] == 1, timeout=10.0)
    remove(ros, pred)
    assert not pred._worker.is_alive()                      # joined before the final save


def test_an_oversize_learner_state_is_encoded_once(ros, model):
    upd = ros.add(ModelUpdateNode, robot=ROBOT, target_torque="measured", learner="rbfn", learner_config=json.dumps(CFG), warmup=20,
                  learn_decimation=1, block_size=40, publish_period=0.01, max_snapshot_bytes=1024)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, 40)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0,
                          timeout=10.0)
    encodes = []
    core_snapshot = upd.core.snapshot
    upd.core.snapshot = lambda *a, **k: (encodes.append(upd.core.revision), core_snapshot(*a, **k))[1]
    upd.set_parameters(to_parameters({"learning": True}))
    _feed(ros, probe, upd, q, v, tau, pt, 0, 20)            # the warm-up: one learner update
    assert ros.spin_until(lambda: upd.counters["snapshots_oversize"] == 1, timeout=10.0)
    ros.spin_for(0.2)                                        # ~20 publish ticks, the learner unchanged
    assert len(encodes) == 1 and upd.counters["snapshots_oversize"] == 1 and upd.version == 0
    assert upd.counters["snapshots_published"] == 0
    _feed(ros, probe, upd, q, v, tau, pt, 20, 21)           # a change: encoded (and refused) once more
    assert ros.spin_until(lambda: len(encodes) == 2, timeout=10.0)
    ros.spin_for(0.1)
    assert len(encodes) == 2 and upd.counters["snapshots_oversize"] == 2 and upd.version == 0


def test_autosave_saves_what_is_learnt_without_waiting(ros, model, tmp_path):
    path = tmp_path / "model.snap"
    upd = ros.add(ModelUpdateNode, robot=ROBOT, target_torque="measured", learner="gmm", warmup=20, learn_decimation=1, block_size=10,
                  publish_period=0.02, learner_config='{"max_components": 8}', model_file=str(path),
                  autosave_period=0.05, diagnostics_period=0.05)
    probe = Probe(ros, model.joint_names)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, 30)
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(upd.refs) == len(Q) and probe.ptorque.get_subscription_count() > 0,
                          timeout=10.0)
    flushes = []
    core_flush = upd.core.flush
    upd.core.flush = lambda timeout=10.0: (flushes.append(timeout), core_flush(timeout))[1]
    _feed(ros, probe, upd, q, v, tau, pt, 0, 30)
    flushes.clear()                                          # _feed's own
    assert ros.spin_until(lambda: path.exists() and upd._saved_rev == upd.core.revision, timeout=10.0)
    assert flushes == []                                     # the autosave never waited for the worker
    assert decode_snapshot(path.read_bytes(), max_bytes=None).epoch == upd.epoch
    upd.save_model()                                         # ~/save_model and shutdown do
    assert flushes == [5.0]


def test_residual_learner_hints_the_reference_at_the_prediction_lead(ros, model):
    from adaptive_dynamics.nodes.residual_learner import ResidualLearnerNode
    node = ros.add(ResidualLearnerNode, robot=ROBOT, target_torque="measured", learner="rbfn", learner_config=json.dumps(CFG),
                   prediction_lead=LEAD, warmup=20)
    probe = Probe(ros, model.joint_names)
    hints = []
    core_hint = node.core.hint
    node.core.hint = lambda x: hints.append(np.array(x)) or core_hint(x)
    names = model.joint_names
    Q, QD, QDD, q, v, tau, pt = motion(model, 10)
    X = np.hstack([Q, QD, QDD])
    probe.ref.publish(reference_batch_msg(0, DT, names, Q, QD, QDD))
    assert ros.spin_until(lambda: len(node.refs) == len(Q) and probe.state.get_subscription_count() > 0,
                          timeout=10.0)
    for k in range(3):
        probe.send(k, q[k], v[k], tau[k], pt[k])
    assert ros.spin_until(lambda: len(hints) == 3, timeout=10.0)
    ahead = round(LEAD * 1e9) // DT                          # the point the next prediction is asked for
    for k in range(3):
        np.testing.assert_array_equal(hints[k], X[k + ahead])


def test_byte_array_wire_decoding_matches_rclpy():
    from rclpy.serialization import serialize_message
    from std_msgs.msg import MultiArrayDimension

    from adaptive_dynamics.wire import WireError, decode_bytes
    for label, data in (("gmm v3", bytes(range(256)) * 3), ("", b""), ("x" * 5, b"\x01")):
        msg = UInt8MultiArray()
        if label:
            msg.layout.dim = [MultiArrayDimension(label=label, size=len(data), stride=len(data))]
        msg.data = data
        raw = serialize_message(msg)
        got_label, view = decode_bytes(raw)
        assert got_label == (label or None) and bytes(view) == data and view.readonly
        assert view.obj is raw or bytes(view.obj) == raw    # a view into the message, not a copy
        with pytest.raises(WireError):
            decode_bytes(raw[:-1] if data else raw[:6])
