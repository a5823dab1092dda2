"""One controller protocol (control/law.py): every law class of ``control`` steps through
``compute`` and persists through ``state_dict`` / ``load_state_dict`` / ``save`` /
``load_state``; a law saved to a file and loaded into a fresh one computes the same
torque as the original from then on."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from adaptive_dynamics import control
from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.control.backstepping import BacksteppingController
from adaptive_dynamics.control.baseline import ComputedTorqueController, PDController
from adaptive_dynamics.control.law import ControlLaw
from adaptive_dynamics.control.mrac import TaskSpaceMRAC
from adaptive_dynamics.control.scqp import SCQPController
from adaptive_dynamics.dynamics import RobotModel

LAWS = [PDController, ComputedTorqueController, AdaptiveController, BacksteppingController, TaskSpaceMRAC,
        SCQPController]


def test_every_law_class_of_control_is_listed_here():
    """A law added to ``control`` (a class with ``compute``) joins the protocol's check."""
    import pkgutil, importlib
    found = set()
    for info in pkgutil.iter_modules(control.__path__, "adaptive_dynamics.control."):
        mod = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and hasattr(cls, "compute") and not cls.__name__.startswith("_") \
                    and cls is not ControlLaw:
                found.add(cls)
    # TaskSpaceReference computes a reference (qd_r, qdd_r), not a torque: not a law
    found = {c for c in found if c.__name__ != "TaskSpaceReference"}
    assert found == set(LAWS)


@pytest.mark.parametrize("cls", LAWS, ids=lambda c: c.__name__)
def test_protocol_names(cls):
    for name in ("compute", "state_dict", "load_state_dict", "save", "load_state"):
        assert callable(getattr(cls, name, None)), f"{cls.__name__} lacks {name}"
    assert not hasattr(cls, "step") and not hasattr(cls, "get_state") and not hasattr(cls, "set_state")


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda")


def _joint_inputs(model, k):
    rng = np.random.default_rng(k)
    q = 0.5 * (model.lower + model.upper) + 0.2 * rng.standard_normal(model.n)
    return q, 0.1 * rng.standard_normal(model.n), q + 0.01, np.full(model.n, 0.05), np.full(model.n, 0.1)


def _roundtrip(make, step, tmp_path, n_before=30, n_after=5):
    a = make()
    for k in range(n_before):
        step(a, k)
    path = a.save(tmp_path / "state")
    b = make()
    b.load_state(path)
    for k in range(n_before, n_before + n_after):
        np.testing.assert_allclose(step(b, k), step(a, k), rtol=1e-12, atol=1e-12)
    assert isinstance(a, ControlLaw)


def test_adaptive_roundtrip(panda, tmp_path):
    """The direct law (the composite law's regressor filter restarts on a load: its state
    is of the instants before the file)."""
    def step(c, k):
        q, v, qd, vd, ad = _joint_inputs(panda, k)
        return c.compute(q, v, qd, vd, ad)
    _roundtrip(lambda: AdaptiveController(panda, "direct", pi0=0.8 * panda.parameters), step, tmp_path)


def test_baseline_roundtrip_and_refusal(panda, tmp_path):
    def step(c, k):
        return c.compute(*_joint_inputs(panda, k))
    _roundtrip(lambda: ComputedTorqueController(panda, kp=np.arange(1.0, 8.0), kd=20.0), step, tmp_path)
    pd = PDController(panda, kp=1.0, kd=1.0)
    path = ComputedTorqueController(panda, kp=5.0, kd=2.0).save(tmp_path / "ct")
    with pytest.raises(ValueError, match="'computed_torque' state, this law is 'pd'"):
        pd.load_state(path)
    assert np.all(pd.kp == 1.0)


def test_mrac_roundtrip(tmp_path):
    def step(c, k):
        rng = np.random.default_rng(k)
        return c.compute(*(0.1 * rng.standard_normal(3) for _ in range(5)), 1e-3)
    a = TaskSpaceMRAC(kp=100.0)
    for k in range(50):
        step(a, k)
    b = TaskSpaceMRAC(kp=100.0)
    b.load_state(a.save(tmp_path / "mrac"), reference=True)
    for k in range(50, 55):
        np.testing.assert_allclose(step(b, k), step(a, k), rtol=1e-12, atol=1e-12)


def test_backstepping_and_scqp_state_dicts(panda, tmp_path):
    bs = BacksteppingController(panda, "direct", pi0=panda.parameters)
    other = BacksteppingController(panda, "direct", pi0=0.5 * panda.parameters)
    other.load_state(bs.save(tmp_path / "bs"))
    np.testing.assert_array_equal(other.core.theta, bs.core.theta)
    sc = SCQPController(panda, dt=1e-3)
    q = 0.5 * (panda.lower + panda.upper)
    x0 = panda.frame_pose(q)[:3, 3]
    for _ in range(3):
        sc.compute(q, np.zeros(panda.n), x0, np.zeros(3), np.zeros(3))
    d = sc.state_dict()
    fresh = SCQPController(panda, dt=1e-3)
    fresh.load_state_dict(d)
    assert fresh.residual.pending == sc.residual.pending and np.array_equal(fresh.mrac.psi_r, sc.mrac.psi_r)
    with pytest.raises(ValueError, match="missing 'gp'"):
        fresh.load_state_dict({k: v for k, v in d.items() if k != "gp"})
