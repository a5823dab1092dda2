"""Experiments and graphs on an arm the package does not ship (UR5, xArm 7 from
example-robot-data): a resolved URDF resolves to itself and carries its generated
parameter file (end-effector frame, model-derived gains, the URDF's friction or a
fraction of the effort limits); the task pose is the most manipulable feasible one;
``experiment ardl / scqp / consistency / realdata`` run on the URDF with those settings
and meet their targets; an ``adaptive_controller`` whose URDF comes from
``robot_description`` (no parameter file of the robot) derives K_D from the model."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from adaptive_dynamics.control.gains import default_gains
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.experiments.robot_choice import task_configuration
from adaptive_dynamics.trajectories import ACCELERATION_LIMIT
from adaptive_dynamics.robots import DEFAULT_FRICTION_PER_EFFORT, friction, robot_config, robot_label
from adaptive_dynamics.robot_setup import controller_gains, resolve_robot
from test_any_robot import UR5, XARM7

pytestmark = pytest.mark.skipif(not os.path.isfile(UR5), reason="example-robot-data URDFs not found")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_resolved_urdf_names_its_parameter_file_and_friction():
    spec = resolve_robot(XARM7, ee_frame="link7")
    again = resolve_robot(spec.urdf)                         # the experiments pass the resolved file on
    assert (again.urdf, again.config, again.ee_frame, again.label) == (spec.urdf, spec.config, "link7", "xarm7")
    assert robot_label(spec.urdf) == "xarm7" and robot_config(spec.urdf)["joint_names"] == spec.joint_names
    assert RobotModel(spec.urdf).ee_frame == "link7"         # not the URDF's last frame (link_eef)
    assert RobotModel(XARM7).ee_frame == "link_eef"
    # xArm 7 declares <dynamics damping friction>: the simulator takes them as they are
    joints = {j.get("name"): j.find("dynamics") for j in ET.parse(XARM7).getroot().findall("joint")}
    fv, fc = friction(spec.urdf)
    np.testing.assert_allclose(fv, [float(joints[n].get("damping")) for n in spec.joint_names])
    np.testing.assert_allclose(fc, [float(joints[n].get("friction")) for n in spec.joint_names])
    # UR5 declares zeros: a fraction of each joint's effort limit
    ur5 = resolve_robot(UR5).urdf
    lim = RobotModel(ur5).effort_limit
    fv, fc = friction(ur5)
    np.testing.assert_allclose(fv, DEFAULT_FRICTION_PER_EFFORT[0] * lim, atol=1e-4)
    np.testing.assert_allclose(fc, DEFAULT_FRICTION_PER_EFFORT[1] * lim, atol=1e-4)
    assert controller_gains(ur5)["kd"] == default_gains(RobotModel(ur5))["kd"]


def test_a_parameter_file_of_an_older_version_is_resolved_again(tmp_path):
    """A locked URDF whose generated parameter file lacks a section this version writes
    (the simulator's friction) is not taken as it is: it resolves again, to a complete file."""
    import shutil

    import yaml
    spec = resolve_robot(UR5)
    old_urdf = tmp_path / "ur5.urdf"
    shutil.copy(spec.urdf, old_urdf)
    doc = yaml.safe_load(open(spec.config))
    doc["/**"]["ros__parameters"]["urdf"] = str(old_urdf)
    del doc["/**/mujoco_bridge"]
    (tmp_path / "ur5.yaml").write_text(yaml.safe_dump(doc))
    again = resolve_robot(str(old_urdf))
    assert again.config != str(tmp_path / "ur5.yaml") and again.joint_names == spec.joint_names
    np.testing.assert_allclose(friction(again.urdf)[0], friction(spec.urdf)[0])
    assert robot_config(again.urdf)["joint_names"] == spec.joint_names


def test_task_configuration_is_the_most_manipulable_feasible_pose():
    m = RobotModel(resolve_robot(UR5).urdf)
    lo, hi = m.lower, m.upper
    mid, half = 0.5 * (lo + hi), np.minimum(0.5 * (hi - lo), np.pi)

    def manip(q):
        return float(np.prod(np.linalg.svd(m.jacobian(q), compute_uv=False)))

    q = task_configuration(m)
    assert np.all(np.abs(q - mid) <= 0.5 * half + 1e-12) and m.frame_pose(q)[2, 3] > 0
    # the middle of the UR5's ranges is the stretched arm: singular
    assert manip(mid) < 1e-6 < manip(q)
    rng = np.random.default_rng(5)
    others = mid + rng.uniform(-0.5, 0.5, (200, m.n)) * half
    above = [manip(x) for x in others if m.frame_pose(x)[2, 3] > 0]     # an independent draw
    assert manip(q) >= 0.8 * max(above) and manip(q) >= np.percentile(above, 95)
    seen = []
    q2 = task_configuration(m, feasible=lambda x: seen.append(x) or len(seen) == 3)
    assert len(seen) == 3 and np.array_equal(q2, seen[-1]) and manip(q2) <= manip(q)
    with pytest.raises(ValueError, match="within the joint"):
        task_configuration(m, feasible=lambda x: False, tries=4)


def test_ardl_on_a_urdf_robot(tmp_path, capsys):
    from adaptive_dynamics.experiments.ardl import main
    assert main(["--out", str(tmp_path), "--quick", "--robots", UR5, "--jobs", "1"]) == 0
    res = _last_json(capsys)
    r = res["robots"]["ur5_robot"]
    urdf = resolve_robot(UR5).urdf
    assert r["urdf"] == urdf and r["gains"]["kd"] == default_gains(RobotModel(urdf))["kd"]
    assert not r["diverged"] and r["meets_targets"], (r["composite_vs_pd_rmse_ratio"], r["base_param_rel_error"])
    assert (tmp_path / "ur5_robot_tracking_error.png").stat().st_size > 10_000


def test_scqp_and_consistency_on_urdf_robots(tmp_path, capsys):
    from adaptive_dynamics.experiments import consistency, scqp
    assert scqp.main(["--out", str(tmp_path / "s"), "--quick", "--robots", UR5, "--jobs", "1", "--mode", "project"]) == 0
    res = _last_json(capsys)
    row = res["table"]["ur5_robot/z"]
    urdf = resolve_robot(UR5).urdf
    np.testing.assert_allclose(row["start_pose"], task_configuration(RobotModel(urdf)), atol=1e-4)
    assert res["qp_failures"] == 0 and row["ends_lowest"] and row["episodes_to_baseline"] is not None
    assert consistency.main(["--out", str(tmp_path / "c"), "--quick", "--part", "virtual", "--robots", XARM7,
                             "--jobs", "1"]) == 0
    res = _last_json(capsys)
    assert res["reference_robot"] == "xarm7" and res["virtual_meets_target"]
    assert (tmp_path / "c" / "consistency_virtual_xarm7.png").is_file()


def test_realdata_on_a_urdf_robot(tmp_path, capsys):
    """The realistic recording of another arm: the Panda's sensor bias as fractions of its
    effort limits; the GMM and the RBFN improve on the identification on every joint (as
    the Panda's --quick test asserts)."""
    from adaptive_dynamics.experiments import realdata
    assert realdata.main(["--out", str(tmp_path), "--quick", "--part", "offline", "--robots", UR5,
                          "--learners", "gmm,rbfn"]) == 0
    res = _last_json(capsys)
    lim = RobotModel(UR5).effort_limit
    panda = RobotModel("panda").effort_limit
    np.testing.assert_allclose(np.asarray(res["reality"]["tau_bias"]) / lim,
                               (np.asarray(realdata.REALITY["tau_bias"]) / panda)[:6], atol=1e-4)
    idn = np.asarray(res["id_nmse"])
    for kind in ("gmm", "rbfn"):
        assert np.all(np.asarray(res["semiparam_nmse"][kind]) < 0.9 * idn), (kind, res["semiparam_nmse"][kind], idn)
    assert res["out_of_region_vs_id_max"] <= res["targets"]["out_of_region_vs_id_max"]


def test_pgpol_settings_of_a_urdf_robot_pass_the_trajectory_checks():
    """The generated task pose keeps Experiment I's path and both pick-and-place sets within
    the limits the trajectory node enforces (checked again here, on the node's grid)."""
    from adaptive_dynamics.experiments import pgpol
    urdf = resolve_robot(UR5).urdf
    m = RobotModel(urdf)
    acc = np.full(m.n, ACCELERATION_LIMIT)
    pgpol.task_trajectory(urdf).check_limits(m.lower, m.upper, m.velocity_limit, acc)
    for which in ("test", "train"):
        p = pgpol.pick_place_params(urdf, which)
        W = pgpol.pick_place_waypoints(urdf, which)
        assert np.all(W >= m.lower) and np.all(W <= m.upper)
        T = np.array([m.frame_pose(q)[:3, 3] for q in W[::2]])                # the pick/place points
        assert np.ptp(T[:, 2]) < 0.04, T                                      # at one height (+ train lift)
        assert p["move_time"] > 0


def test_experiments_refuse_what_they_cannot_run(tmp_path):
    from adaptive_dynamics.experiments import ardl, pgpol
    with pytest.raises(SystemExit, match="settings for"):
        pgpol.main(["--out", str(tmp_path), "--robot", "planar2"])
    with pytest.raises(SystemExit, match="neither a shipped robot"):
        ardl.main(["--out", str(tmp_path), "--robots", "ur5"])
    with pytest.raises(SystemExit, match="not moving joints"):
        ardl.main(["--out", str(tmp_path), "--robots", UR5, "--joints", "nope"])


@pytest.mark.ros
def test_adaptive_controller_from_robot_description_derives_kd(ros, tmp_path):
    """No parameter file of the robot (its URDF from the latched robot_description topic):
    K_D is the model-derived one, reported in the diagnostics; a K_D set live replaces it
    and [0] brings it back."""
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from adaptive_dynamics.nodes.adaptive_controller import AdaptiveControllerNode

    pub_node = ros.node("robot_state_publisher")
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    pub = pub_node.create_publisher(String, "robot_description", qos)
    pub.publish(String(data=open(UR5).read()))
    node = ros.add(AdaptiveControllerNode, robot="robot_description", use_sim_time=False, autosave_period=0.0)
    # no parameter file states a drive inertia here: the derivation assumes none (armature [0.0], the
    # smaller, conservative K_D where the discrete-time margin binds)
    want = np.asarray(default_gains(RobotModel(UR5), armature=np.zeros(6))["kd"])
    np.testing.assert_allclose(np.diag(node.core.kd), want)
    np.testing.assert_allclose(np.diag(node.laws.fixed["sliding_pd"].kd), want)
    assert node.counters["kd_source"] == "model-derived"
    tuner = ros.node("rqt_like")
    cli = tuner.create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")

    def set_params(*params):
        return ros.call(cli, SetParameters.Request(parameters=[p.to_parameter_msg() for p in params])).results

    (res,) = set_params(Parameter("kd", value=[7.0] * 6))
    assert res.successful, res.reason
    np.testing.assert_allclose(np.diag(node.core.kd), 7.0)
    assert node.counters["kd_source"] == "parameter"
    (res,) = set_params(Parameter("kd", value=[0.0]))
    assert res.successful, res.reason
    np.testing.assert_allclose(np.diag(node.core.kd), want)
    assert node.counters["kd_source"] == "model-derived"
    pub_node.destroy_publisher(pub)
