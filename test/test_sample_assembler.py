"""The learner nodes' sample assembly (nodes.learner_streams.SampleAssembler), without DDS:
which torque the target takes, parts matched by stamp whatever their order of arrival,
and the bounded buffers."""
from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.nodes.learner_streams import SampleAssembler
from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.node_base import Counters
from adaptive_dynamics.ros.references import ReferenceBuffer, reference_batch_msg

NAMES = ["j1", "j2"]
DT = 1_000_000


class Core:
    """What the assembler needs of OnlineResidual: the samples it was offered."""
    learning = True

    def __init__(self):
        self.samples = []

    def add_sample(self, x, y, stamp=None):   # (the stamp: a lockstep core orders by it)
        self.samples.append((np.array(x), np.array(y)))

    def hint(self, x):
        pass


def assembler(**kw):
    refs = ReferenceBuffer(NAMES, capacity=64, where="reference")
    t = np.arange(20)[:, None] * 1e-3
    refs.add_any(reference_batch_msg(0, DT, NAMES, np.hstack([t, -t]), np.ones((20, 2)), np.hstack([t, 2 * t])))
    rejected = []
    a = SampleAssembler(Core(), NAMES, refs, Counters("t"), lambda what, exc: rejected.append((what, str(exc))),
                        param_names=[], **kw)
    return a, rejected


def state(k, bias=0.0, effort=True):
    q, v = np.array([0.1 * k, -0.2]), np.array([0.5, 0.01 * k])
    tau = np.array([1.0 + k, 2.0 - k]) + bias
    return joint_state_msg(k * DT, NAMES, q, v, tau if effort else None), q, v, tau - bias


def test_commanded_target_is_the_command_whatever_the_order_and_the_sensor_bias():
    a, rejected = assembler(torque="commanded")
    expected = {}
    for k, order in enumerate(["s,p,c", "c,s,p", "p,c,s", "c,p,s", "s,c,p"]):
        msg, q, v, tau = state(k, bias=0.7)        # the sensor reads 0.7 N m too much
        cmd = tau                                   # ... the command is what the joint got
        pt = np.array([0.25 * k, -0.5])
        for part in order.split(","):
            {"s": lambda: a.on_state(msg),
             "p": lambda: a.on_parametric_torque(joint_state_msg(k * DT, NAMES[::-1], effort=pt[::-1])),
             "c": lambda: a.on_command(joint_state_msg(k * DT, NAMES, effort=cmd))}[part]()
        expected[k] = (np.concatenate([q, v, [1e-3 * k, 2e-3 * k]]), cmd - pt)
    assert not rejected and len(a.core.samples) == 5 and not a._parts
    for (x, y), (x_ref, y_ref) in zip(a.core.samples, expected.values()):
        np.testing.assert_allclose(x, x_ref, atol=1e-12)
        np.testing.assert_allclose(y, y_ref, atol=1e-12)


def test_commanded_needs_no_measured_torque_and_measured_does():
    a, rejected = assembler(torque="commanded", target="torque")
    msg, q, v, tau = state(3, effort=False)
    a.on_state(msg)
    assert not a.core.samples                     # waits for its command
    a.on_command(joint_state_msg(3 * DT, NAMES, effort=tau))
    assert len(a.core.samples) == 1 and not rejected
    np.testing.assert_allclose(a.core.samples[0][1], tau)
    b, rejected = assembler(torque="measured")
    b.on_state(msg)
    assert rejected and rejected[0][0] == "joint_states" and "target_torque commanded" in rejected[0][1]


def test_measured_target_and_bad_commands():
    a, rejected = assembler(torque="measured")
    msg, q, v, tau = state(2, bias=0.7)
    a.on_parametric_torque(joint_state_msg(2 * DT, NAMES, effort=[0.5, 0.5]))
    a.on_state(msg)
    np.testing.assert_allclose(a.core.samples[0][1], tau + 0.7 - 0.5)
    c, rejected = assembler(torque="commanded")
    c.on_command(joint_state_msg(2 * DT, NAMES, effort=[np.nan, 0.0]))
    c.on_command(joint_state_msg(2 * DT, ["x", "y"], effort=[0.0, 0.0]))
    assert [w for w, _ in rejected] == ["command", "command"] and not c._parts
    with pytest.raises(ValueError, match="measured.*commanded"):
        assembler(torque="estimated")


def test_parts_that_never_complete_are_bounded():
    a, _ = assembler(torque="commanded", buffer=8)
    for k in range(20):           # commands whose states never come, states without parametric torque
        a.on_command(joint_state_msg(k * DT, NAMES, effort=[0.0, 0.0]))
        a.on_state(state(k)[0])
    assert not a.core.samples and len(a._parts) <= 8 and len(a._states) <= 8
