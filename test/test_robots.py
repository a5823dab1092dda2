"""Robot descriptions, their parameter files, and the URDF -> MuJoCo loader.

The key cross-check: MuJoCo's inverse dynamics on the model built by
``load_mujoco_model`` equals pinocchio's RNEA on the same URDF, so any mismatch the
controllers see in simulation is injected on purpose, never an import artefact.
"""
from __future__ import annotations

import os
import pathlib
import re
import sys

import mujoco
import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics import robots
from adaptive_dynamics.sim.mujoco_model import joint_indices, load_mujoco_model, urdf_to_mujoco_xml

EXPECTED = {
    "panda": ([f"panda_joint{i}" for i in range(1, 8)], "panda_hand_tcp"),
    "iiwa14": ([f"iiwa_joint_{i}" for i in range(1, 8)], "iiwa_link_ee"),
    "planar2": (["joint1", "joint2"], "ee"),
}
FINGERS = ("panda_finger_joint1", "panda_finger_joint2")


def _pin_model(name):
    return pin.buildModelFromUrdf(robots.urdf_path(name))


def _pin_idx(model, joint_names):
    return np.array([model.joints[model.getJointId(j)].idx_q for j in joint_names])


def _erd_panda_path() -> str:
    rel = pathlib.Path("cmeel.prefix/share/example-robot-data/robots/panda_description/urdf/panda.urdf")
    for entry in sys.path:
        cand = pathlib.Path(entry or ".") / rel
        if cand.is_file():
            return str(cand)
    raise AssertionError(f"example-robot-data's Panda URDF ({rel}) not found on sys.path")


def _erd_panda_locked():
    """example-robot-data's Panda with both finger joints locked at 0 (closed)."""
    full = pin.buildModelFromUrdf(_erd_panda_path())
    lock = [full.getJointId(j) for j in FINGERS]
    assert all(0 < j < full.njoints for j in lock)
    return pin.buildReducedModel(full, lock, pin.neutral(full))


# ---------------------------------------------------------------- descriptions


@pytest.mark.parametrize("name", robots.ROBOT_NAMES)
def test_urdf_loads_in_pinocchio(name):
    joints, ee = EXPECTED[name]
    model = _pin_model(name)
    assert list(model.names)[1:] == joints
    assert model.nq == model.nv == len(joints)
    assert model.existFrame(ee)
    assert np.all(np.isfinite(model.effortLimit)) and np.all(model.effortLimit > 0)
    assert np.all(np.isfinite(model.velocityLimit)) and np.all(model.velocityLimit > 0)
    assert np.all(model.lowerPositionLimit < model.upperPositionLimit)
    # every moving link has a strictly positive-definite, physically consistent inertia
    for inertia in list(model.inertias)[1:]:
        assert inertia.mass > 0
        eig = np.linalg.eigvalsh(inertia.inertia)
        assert eig.min() > 0
        assert eig[0] + eig[1] >= eig[2] * (1 - 1e-12)


def test_urdfs_reference_no_meshes():
    for name in robots.ROBOT_NAMES:
        text = pathlib.Path(robots.urdf_path(name)).read_text()
        assert "<mesh" not in text and ".dae" not in text and ".stl" not in text.lower()


def test_limits_match_the_cited_sources():
    panda = _pin_model("panda")
    np.testing.assert_array_equal(panda.effortLimit, [87, 87, 87, 87, 12, 12, 12])
    np.testing.assert_array_equal(panda.velocityLimit, [2.175] * 4 + [2.61] * 3)
    iiwa = _pin_model("iiwa14")
    np.testing.assert_array_equal(iiwa.effortLimit, [320, 320, 176, 176, 110, 40, 40])
    np.testing.assert_allclose(iiwa.velocityLimit, np.deg2rad([85, 85, 100, 75, 130, 135, 135]), rtol=1e-15)
    planar = _pin_model("planar2")
    np.testing.assert_array_equal(planar.effortLimit, [50, 50])
    np.testing.assert_array_equal(planar.velocityLimit, [3, 3])


def test_every_number_in_the_urdfs_has_a_comment():
    # Cheap guard for the "cite your sources" rule: each file opens with a sources
    # comment and every <inertial> is preceded by a comment naming where it comes from.
    for name in robots.ROBOT_NAMES:
        text = pathlib.Path(robots.urdf_path(name)).read_text()
        head = text[: text.index("<robot")]
        assert "<!--" in head and ("SOURCE" in head.upper() or "SYNTHETIC" in head.upper())
        for m in re.finditer(r"<link name=\"[^\"]+\">\s*<inertial>", text):
            before = text[: m.start()].rstrip()
            assert before.endswith("-->"), f"{name}: inertial without a source comment at {m.start()}"


# ---------------------------------------------------------------- MuJoCo loader


@pytest.mark.parametrize("name", robots.ROBOT_NAMES)
def test_loads_in_mujoco(name):
    joints, ee = EXPECTED[name]
    model = load_mujoco_model(robots.urdf_path(name))
    assert model.nq == model.nv == len(joints)
    assert model.opt.timestep == 1e-3
    np.testing.assert_array_equal(model.opt.gravity, [0, 0, -9.81])
    assert model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    assert model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
    assert not model.dof_armature.any() and not model.dof_damping.any() and not model.dof_frictionloss.any()
    # fixed base: no free joint; fusestatic off: the ee frame is still a body
    assert all(int(t) != int(mujoco.mjtJoint.mjJNT_FREE) for t in model.jnt_type)
    assert mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, ee) >= 0
    # the moving mass equals the URDF's; what is welded to the base (pinocchio: inertias[0],
    # the universe) is left out of MuJoCo's model -- it does not enter the dynamics
    pm = _pin_model(name)
    assert model.body_mass.sum() == pytest.approx(sum(i.mass for i in pm.inertias[1:]), rel=1e-12)
    assert pm.inertias[0].mass > 0 or name == "planar2"


@pytest.mark.parametrize("name", robots.ROBOT_NAMES)
def test_mujoco_inverse_dynamics_equals_pinocchio_rnea(name):
    joints, _ = EXPECTED[name]
    pm = _pin_model(name)
    pd = pm.createData()
    mm = load_mujoco_model(robots.urdf_path(name))
    md = mujoco.MjData(mm)
    qi, di = joint_indices(mm, joints)
    pi_ = _pin_idx(pm, joints)
    rng = np.random.default_rng(12345)
    for _ in range(20):
        q = rng.uniform(pm.lowerPositionLimit, pm.upperPositionLimit)
        v = rng.uniform(-1, 1, pm.nv) * pm.velocityLimit
        a = rng.normal(0.0, 5.0, pm.nv)
        tau = pin.rnea(pm, pd, q, v, a)[pi_]
        md.qpos[qi] = q[pi_]
        md.qvel[di] = v[pi_]
        md.qacc[di] = a[pi_]
        mujoco.mj_inverse(mm, md)
        scale = max(1.0, float(np.max(np.abs(tau))))
        np.testing.assert_allclose(md.qfrc_inverse[di], tau, rtol=1e-6, atol=1e-9 * scale)


def test_mujoco_mass_matrix_and_gravity_equal_pinocchio():
    name = "panda"
    joints, _ = EXPECTED[name]
    pm = _pin_model(name)
    pd = pm.createData()
    mm = load_mujoco_model(robots.urdf_path(name))
    md = mujoco.MjData(mm)
    qi, di = joint_indices(mm, joints)
    rng = np.random.default_rng(7)
    for _ in range(5):
        q = rng.uniform(pm.lowerPositionLimit, pm.upperPositionLimit)
        md.qpos[qi] = q
        md.qvel[:] = 0
        mujoco.mj_forward(mm, md)
        M = np.zeros((mm.nv, mm.nv))
        mujoco.mj_fullM(mm, md, M)
        np.testing.assert_allclose(M[np.ix_(di, di)], pin.crba(pm, pd, q), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(md.qfrc_bias[di], pin.computeGeneralizedGravity(pm, pd, q), rtol=1e-9, atol=1e-9)


def test_loader_options():
    model = load_mujoco_model("planar2", timestep=2e-3, armature=[0.1, 0.2], damping=0.5, gravity=(0, 0, -1.62),
                              joint_limits=True, contacts=True)
    assert model.opt.timestep == 2e-3
    np.testing.assert_array_equal(model.dof_armature, [0.1, 0.2])
    np.testing.assert_array_equal(model.dof_damping, [0.5, 0.5])
    np.testing.assert_array_equal(model.opt.gravity, [0, 0, -1.62])
    assert not model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
    assert not model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    with pytest.raises(ValueError, match="one per DoF"):
        load_mujoco_model("planar2", armature=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="timestep"):
        load_mujoco_model("planar2", timestep=0.0)


def test_loader_strips_meshes_and_forces_compiler_flags():
    # example-robot-data's Panda references .dae meshes MuJoCo cannot read and
    # carries Gazebo <dynamics>; the loader must still build it, with zero damping.
    xml = urdf_to_mujoco_xml(_erd_panda_path())
    assert "<mesh" not in xml
    for flag in ('discardvisual="true"', 'balanceinertia="false"', 'fusestatic="false"', 'inertiafromgeom="false"'):
        assert flag in xml
    model = load_mujoco_model(_erd_panda_path())
    assert model.nv == 9
    assert not model.dof_damping.any() and not model.dof_frictionloss.any()


def test_joint_indices_by_name_not_order():
    model = load_mujoco_model("panda")
    names = EXPECTED["panda"][0]
    qi, di = joint_indices(model, names[::-1])
    np.testing.assert_array_equal(qi, np.arange(7)[::-1])
    np.testing.assert_array_equal(di, np.arange(7)[::-1])
    with pytest.raises(ValueError, match=r"nope.*panda_joint1"):
        joint_indices(model, ["panda_joint1", "nope"])


# ---------------------------------------------------------------- Panda vs example-robot-data


def test_panda_matches_example_robot_data_with_fingers_locked():
    ours = _pin_model("panda")
    ref = _erd_panda_locked()
    joints = EXPECTED["panda"][0]
    assert list(ref.names)[1:] == joints
    d_ours, d_ref = ours.createData(), ref.createData()
    np.testing.assert_array_equal(ours.lowerPositionLimit, ref.lowerPositionLimit)
    np.testing.assert_array_equal(ours.upperPositionLimit, ref.upperPositionLimit)
    np.testing.assert_array_equal(ours.velocityLimit, ref.velocityLimit)
    np.testing.assert_array_equal(ours.effortLimit, ref.effortLimit)
    rng = np.random.default_rng(3)
    for _ in range(20):
        q = rng.uniform(ours.lowerPositionLimit, ours.upperPositionLimit)
        np.testing.assert_allclose(pin.crba(ours, d_ours, q), pin.crba(ref, d_ref, q), rtol=0, atol=1e-9)
        np.testing.assert_allclose(pin.computeGeneralizedGravity(ours, d_ours, q),
                                   pin.computeGeneralizedGravity(ref, d_ref, q), rtol=0, atol=1e-9)
        # same TCP pose
        pin.framesForwardKinematics(ours, d_ours, q)
        pin.framesForwardKinematics(ref, d_ref, q)
        T1 = d_ours.oMf[ours.getFrameId("panda_hand_tcp")]
        T2 = d_ref.oMf[ref.getFrameId("panda_hand_tcp")]
        assert T1.isApprox(T2, 1e-12)


def test_panda_link_inertials_are_gaz_2019():
    # Gaz et al. 2019 (RA-L) identified masses, links 1..7.
    model = _pin_model("panda")
    gaz = [4.970684, 0.646926, 3.228604, 3.587895, 1.225946, 1.666555, 0.735522]
    masses = [model.inertias[i].mass for i in range(1, 8)]
    # joint 7's body also carries the lumped hand + fingers (0.73 + 2 * 0.015 kg)
    np.testing.assert_allclose(masses[:6], gaz[:6], rtol=0, atol=1e-12)
    np.testing.assert_allclose(masses[6], gaz[6] + 0.73 + 2 * 0.015, rtol=0, atol=1e-12)


def test_panda_hand_payload_is_included():
    text = pathlib.Path(robots.urdf_path("panda")).read_text()
    # the model without the hand's inertial
    start = text.index('<link name="panda_hand">')
    end = text.index("</link>", start) + len("</link>")
    no_hand = text[:start] + '<link name="panda_hand"/>' + text[end:]
    ours = pin.buildModelFromXML(text)
    bare = pin.buildModelFromXML(no_hand)
    d1, d2 = ours.createData(), bare.createData()
    rng = np.random.default_rng(11)
    worst = 0.0
    for _ in range(20):
        q = rng.uniform(ours.lowerPositionLimit, ours.upperPositionLimit)
        diff = pin.computeGeneralizedGravity(ours, d1, q) - pin.computeGeneralizedGravity(bare, d2, q)
        worst = max(worst, float(np.max(np.abs(diff))))
    assert worst > 1.0, worst
    # and the fingers specifically: the hand alone (without the two 15 g fingers)
    # differs measurably from our lumped inertial, which equals hand + fingers
    assert ours.inertias[7].mass == pytest.approx(_erd_panda_locked().inertias[7].mass, abs=1e-12)
    fingerless_text = text.replace('<mass value="0.76"/>', '<mass value="0.73"/>')
    fingerless = pin.buildModelFromXML(fingerless_text)
    q = np.array([0.0, 0.5, 0.0, -1.0, 0.0, 1.5, 0.0])
    dg = pin.computeGeneralizedGravity(ours, ours.createData(), q) - pin.computeGeneralizedGravity(
        fingerless, fingerless.createData(), q)
    assert np.max(np.abs(dg)) > 0.1


# ---------------------------------------------------------------- robots.py


def test_share_dir_has_urdf_and_config():
    root = robots.share_dir()
    assert (root / "urdf").is_dir() and (root / "config").is_dir()


def test_share_dir_error_lists_what_was_tried(monkeypatch, tmp_path):
    monkeypatch.setattr(robots, "_candidates", lambda: [("source tree", tmp_path), ("sys.prefix", tmp_path / "x")])
    with pytest.raises(FileNotFoundError) as exc:
        robots.share_dir()
    assert "source tree" in str(exc.value) and "sys.prefix" in str(exc.value) and str(tmp_path) in str(exc.value)


@pytest.mark.parametrize("name", robots.ROBOT_NAMES)
def test_robot_config(name):
    joints, ee = EXPECTED[name]
    cfg = robots.robot_config(name)
    assert cfg["robot"] == name
    assert cfg["joint_names"] == joints
    assert cfg["ee_frame"] == ee
    assert cfg["urdf"] == f"{name}.urdf"
    assert len(cfg["friction_viscous"]) == len(cfg["friction_coulomb"]) == len(joints)
    # the joint names of the parameter file are the URDF's
    assert list(_pin_model(name).names)[1:] == joints


def test_friction_smoothing_of_the_parameter_files():
    """friction_smoothing in /** (every node's Coulomb column): the shipped arms' files
    state FRICTION_SMOOTHING, their paper set-ups sgn (0); the bridge's own
    coulomb_smoothing (the simulated plant's) is another parameter."""
    for name in ("panda", "iiwa14"):
        assert robots.friction_smoothing(name) == robots.FRICTION_SMOOTHING == 0.03
        assert robots.friction_smoothing(name, paper=True) == 0.0
        # the simulated plant from the same file: the models' key is not the plant's coulomb_smoothing
        from adaptive_dynamics.sim.plant import RealityConfig
        assert RealityConfig.for_robot(name).coulomb_smoothing == RealityConfig().coulomb_smoothing
    assert robots.friction_smoothing("planar2") == 0.0


def test_config_files_are_ros2_parameter_files():
    import yaml

    for name in robots.ROBOT_NAMES:
        path = robots.share_dir() / "config" / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        assert set(doc) == {"/**", "/**/mujoco_bridge", "/**/adaptive_controller"}
        for node in doc.values():
            assert set(node) == {"ros__parameters"}


def test_urdf_path():
    for name in robots.ROBOT_NAMES:
        p = robots.urdf_path(name)
        assert os.path.isabs(p) and os.path.isfile(p) and p.endswith(f"{name}.urdf")
    explicit = robots.urdf_path(robots.urdf_path("planar2"))
    assert explicit == robots.urdf_path("planar2")
    assert robots.urdf_path(pathlib.Path(explicit)) == explicit
    with pytest.raises(ValueError, match="panda, iiwa14, planar2"):
        robots.urdf_path("ur5")
    with pytest.raises(ValueError, match="valid robot names"):
        robots.urdf_path("/no/such/file.urdf")


def test_unknown_robot_errors():
    with pytest.raises(ValueError, match="valid robot names: panda, iiwa14, planar2"):
        robots.robot_config("ur5")
    with pytest.raises(ValueError, match="valid robot names"):
        robots.friction("ur5")


@pytest.mark.parametrize("name", robots.ROBOT_NAMES)
def test_friction(name):
    viscous, coulomb = robots.friction(name)
    n = len(EXPECTED[name][0])
    assert viscous.shape == coulomb.shape == (n,)
    assert viscous.dtype == coulomb.dtype == np.float64
    assert np.all(viscous >= 0) and np.all(coulomb >= 0) and np.any(coulomb > 0)


def test_panda_friction_approximates_gaz_sigmoid():
    # The config's viscous + Coulomb values are a least-squares fit of the Gaz et al.
    # 2019 sigmoid friction over each joint's velocity range; re-fit and compare.
    phi1 = np.array([0.54615, 0.87224, 0.64068, 1.2794, 0.83904, 0.30301, 0.56489])
    phi2 = np.array([5.1181, 9.0657, 10.136, 5.5903, 8.3469, 17.133, 10.336])
    phi3 = np.array([0.039533, 0.025882, -0.04607, 0.036194, 0.026226, -0.021047, 0.0035526])
    vmax = _pin_model("panda").velocityLimit
    viscous, coulomb = robots.friction("panda")
    for i in range(7):
        v = np.linspace(-vmax[i], vmax[i], 20001)
        v = v[v != 0]
        tau = phi1[i] / (1 + np.exp(-phi2[i] * (v + phi3[i]))) - phi1[i] / (1 + np.exp(-phi2[i] * phi3[i]))
        (fv, fc), *_ = np.linalg.lstsq(np.c_[v, np.sign(v)], tau, rcond=None)
        assert viscous[i] == pytest.approx(fv, abs=6e-5)
        assert coulomb[i] == pytest.approx(fc, abs=6e-5)


def test_friction_validation(monkeypatch):
    cfg = robots.robot_config("planar2")
    monkeypatch.setattr(robots, "robot_config", lambda name: {**cfg, "friction_viscous": [0.1]})
    with pytest.raises(ValueError, match="friction_viscous has 1 values for 2 joints"):
        robots.friction("planar2")
    monkeypatch.setattr(robots, "robot_config", lambda name: {**cfg, "friction_coulomb": [0.1, -1.0]})
    with pytest.raises(ValueError, match=">= 0"):
        robots.friction("planar2")
