"""Baseline joint-space controllers (no ROS): PD and computed torque.

Both are the references the adaptive and learning controllers must beat.

* PD:               tau = Kp (q_d - q) + Kd (qd_d - qd)   (+ g(q) if ``gravity_compensation``)
* computed torque:  tau = M(q) (qdd_d + Kd e_dot + Kp e) + C(q, qd) qd + g(q)
                    with the *nominal* model (the URDF's parameters): one RNEA call.

Gains are per-joint vectors (a scalar is broadcast); ``set_gains`` validates them
(finite, >= 0 for Kp, > 0 for Kd) and leaves the old gains in place on refusal.
"""
from __future__ import annotations

import numpy as np

from ..validation import as_vector
from .law import NpzState


def _gain(value, n: int, name: str, *, strictly_positive: bool) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value, dtype=float), (n,)).copy() if np.ndim(value) == 0 \
        else as_vector(value, n, name)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: gains must be finite, got {arr}")
    if strictly_positive and np.any(arr <= 0):
        raise ValueError(f"{name}: gains must be > 0 (a positive-definite diagonal), got {arr}")
    if np.any(arr < 0):
        raise ValueError(f"{name}: gains must be >= 0, got {arr}")
    return arr


class PDController(NpzState):
    """Joint PD with optional gravity compensation from the nominal model."""

    law = "pd"
    STATE_WHAT = "a baseline controller state file"

    def __init__(self, model, kp, kd, *, gravity_compensation: bool = False):
        self.model = model
        self.n = model.n
        self.kp = self.kd = None
        self.set_gains(kp=kp, kd=kd)
        self.gravity_compensation = bool(gravity_compensation)

    def set_gains(self, *, kp=None, kd=None) -> None:
        kp_new = self.kp if kp is None else _gain(kp, self.n, "kp", strictly_positive=False)
        kd_new = self.kd if kd is None else _gain(kd, self.n, "kd", strictly_positive=True)
        self.kp, self.kd = kp_new, kd_new

    def state_dict(self) -> dict:
        """The law and its gains (a baseline learns nothing)."""
        return {"law": np.array(self.law), "kp": self.kp.copy(), "kd": self.kd.copy(),
                "gravity_compensation": np.array(self.gravity_compensation)}

    def load_state_dict(self, state: dict, *, where: str = "state") -> None:
        if str(state.get("law", "")) != self.law:
            raise ValueError(f"{where}: a {str(state.get('law', 'missing'))!r} state, this law is {self.law!r}")
        try:
            self.set_gains(kp=state["kp"], kd=state["kd"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        self.gravity_compensation = bool(state.get("gravity_compensation", self.gravity_compensation))

    def compute(self, q, v, q_d, qd_d, qdd_d) -> np.ndarray:
        tau = self.kp * (q_d - q) + self.kd * (qd_d - v)
        if self.gravity_compensation:
            tau += self.model.gravity(q)
        return tau


class ComputedTorqueController(PDController):
    """Computed torque (inverse dynamics + PD) with the nominal model."""

    law = "computed_torque"

    def compute(self, q, v, q_d, qd_d, qdd_d) -> np.ndarray:
        a = qdd_d + self.kd * (qd_d - v) + self.kp * (q_d - q)
        return self.model.inverse_dynamics(q, v, a)


def saturate(tau: np.ndarray, limit: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Clip ``tau`` to +-``limit`` in place; increment ``counts`` where clipped."""
    over = np.abs(tau) > limit
    if over.any():   # the usual case: nothing to clip
        if counts is not None:
            counts += over
        np.clip(tau, -limit, limit, out=tau)
    return tau


LAWS = {"pd": PDController, "computed_torque": ComputedTorqueController}


def make_controller(law: str, model, **gains):
    try:
        cls = LAWS[law]
    except KeyError:
        raise ValueError(f"unknown control law {law!r}; available: {sorted(LAWS)}") from None
    return cls(model, **gains)
