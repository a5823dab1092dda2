"""``controller`` node: the baseline joint-space laws, PD and computed torque
(:mod:`adaptive_dynamics.control.baseline`) -> ``effort_controller/commands``, on the
shell every joint-space controller shares (:mod:`.controller_shell`).

Event driven: every
``joint_states`` message (matched by joint name) is answered by exactly one command,
computed for the reference stamped with the state's time (references arrive ahead of
time; the node never uses "the latest").  In lockstep the command carries the state
stamp (see :func:`adaptive_dynamics.ros.commands.stamped_command_msg`).

Safety: NaN/inf or mismatched joint states are rejected (logged, counted) and
answered with the safe command; a state not newer than the last one is ignored
(counted); no state for ``state_timeout`` s (wall clock) after
the first one -> the safe command is published by the watchdog; the safe command is
also sent on shutdown (ros2_control's effort controller holds the last command
forever); torques are clipped to the URDF effort limits (counted); a non-finite
torque is never published.

Parameters (live-tunable unless read-only): see ``specs()`` below or
``ros2 param describe /controller <name>``.
"""
from __future__ import annotations

import numpy as np

from ..control.baseline import LAWS, make_controller
from ..ros.node_base import run_node
from ..ros.params import ParamSpec
from .controller_shell import JointControllerShell, shell_specs


def specs() -> list[ParamSpec]:
    return shell_specs() + [
        ParamSpec("law", "computed_torque", "control law", choices=sorted(LAWS)),
        ParamSpec("kp", [100.0], "position gains [1/s^2 for computed_torque, Nm/rad for pd];"
                  " one value for all joints or one per joint", min=0.0, max=1e5, type="float[]"),
        ParamSpec("kd", [20.0], "velocity gains [1/s or Nm s/rad], > 0", min=1e-6, max=1e4, type="float[]"),
        ParamSpec("gravity_compensation", False, "pd: add the nominal model's g(q)"),
        ParamSpec("robot_compensates_gravity", False, "the robot adds g(q) itself (franka_ros2):"
                  " the model's gravity is removed from the command"),
    ]


class ControllerNode(JointControllerShell):
    """The baseline: PD or computed torque with the nominal model."""

    def __init__(self, **kwargs):
        super().__init__("controller", specs(), **kwargs)

    def _setup_law(self) -> None:
        self.ctl = None
        self._build_controller()
        for name in ("law", "kp", "kd", "gravity_compensation"):
            self.p.on_change(name, lambda *_: self._build_controller())
        self.p.add_validator(self._validate_gains)

    def _describe(self) -> str:
        return f"law={self.p['law']} kp={self.ctl.kp} kd={self.ctl.kd}"

    def _gain(self, name, values):
        arr = np.asarray(values, dtype=float)
        if arr.size == 1:
            return np.full(self.n, float(arr[0]))
        if arr.size != self.n:
            raise ValueError(f"{name} needs 1 or {self.n} values, got {arr.size}")
        return arr

    def _validate_gains(self, cand) -> str | None:
        try:
            self._gain("kp", cand["kp"])
            self._gain("kd", cand["kd"])
        except ValueError as exc:
            return str(exc)
        return None

    def _build_controller(self) -> None:
        kw = dict(kp=self._gain("kp", self.p["kp"]), kd=self._gain("kd", self.p["kd"]))
        if self.p["law"] == "pd":
            kw["gravity_compensation"] = self.p["gravity_compensation"]
        ctl = make_controller(self.p["law"], self.model, **kw)
        with self._lock:
            self.ctl = ctl

    def _control(self, stamp, q, v, effort, ref, qd, qdd):
        with self._lock:
            tau = self.ctl.compute(q, v, ref.q, qd, qdd)
        if self.p["robot_compensates_gravity"]:
            tau = tau - self.model.gravity(q)
        return tau


def main(args=None) -> int:
    return run_node(ControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
