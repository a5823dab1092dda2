"""The machine unit: every bench's timings as a same-run ratio.

An absolute time says as much about the machine as about the code (the same code
measured 1.7x slower per call on one 2-vCPU VM than on another).  So every bench
measures, in the same run, the **machine unit**: the median per-call time of
pinocchio's ``computeJointTorqueRegressor`` (a well-kept C++ routine doing work
comparable to ours) on the Panda at random states, and reports each timing figure
``<figure>_us`` also as ``<figure>_units`` = time / unit.  Targets are stated in units.

How it is measured: 256 random in-limit states of the shipped Panda model; one *pass*
calls the regressor once at every state (timed as a whole, so the clock's own cost is
spread over 256 calls); a pass's per-call time is one sample.  The unit is the median
over all samples, which a bench takes at its start, between its parts and at its end
(``MachineUnit.sample``), so a machine that changes speed during a run (CPU frequency,
a neighbour) moves the unit with the figures.

Usage (bench scripts run from ``bench/``, which is on ``sys.path``)::

    unit = MachineUnit()          # takes a first set of samples
    ...                           # measure things
    unit.sample()                 # again, between parts
    res.update(unit.report())     # machine_unit_us, its spread, the machine
    res["core_p99_units"] = unit.units(res["core_p99_us"])
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np

STATES = 256


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - not Linux
        pass
    return platform.processor() or platform.machine()


class MachineUnit:
    """Median per-call time [us] of ``pinocchio.computeJointTorqueRegressor`` on the
    Panda at random states, sampled repeatedly through a bench run."""

    def __init__(self, passes: int = 40, seed: int = 0):
        import pinocchio as pin

        from adaptive_dynamics.robots import urdf_path

        self._reg = pin.computeJointTorqueRegressor
        self._model = pin.buildModelFromUrdf(urdf_path("panda"))
        self._data = self._model.createData()
        rng = np.random.default_rng(seed)
        lo, hi = self._model.lowerPositionLimit, self._model.upperPositionLimit
        n = self._model.nv
        self._states = [(rng.uniform(lo, hi), rng.standard_normal(n), rng.standard_normal(n))
                        for _ in range(STATES)]
        self.samples: list[float] = []
        self.sample(passes)

    def sample(self, passes: int = 40) -> float:
        """Take ``passes`` more samples; returns the unit so far [us]."""
        reg, model, data, states = self._reg, self._model, self._data, self._states
        clock = time.perf_counter_ns
        for q, v, a in states[:16]:  # warm caches and the branch predictor
            reg(model, data, q, v, a)
        for _ in range(passes):
            t0 = clock()
            for q, v, a in states:
                reg(model, data, q, v, a)
            self.samples.append((clock() - t0) / 1e3 / len(states))
        return self.us

    @property
    def us(self) -> float:
        return float(np.median(self.samples))

    def units(self, us: float | None, digits: int = 2) -> float | None:
        """``us`` in machine units (None stays None)."""
        return None if us is None else round(float(us) / self.us, digits)

    def add_units(self, res: dict, keys=None, digits: int = 2) -> dict:
        """For every ``<name>_us`` key of ``res`` (or those in ``keys``), add
        ``<name>_units``; ``<name>_ms`` keys are converted too.  Returns ``res``."""
        for k in list(keys if keys is not None else res):
            v = res.get(k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or k == "machine_unit_us":
                continue
            if k.endswith("_us"):
                res[k[:-3] + "_units"] = self.units(v, digits)
            elif k.endswith("_ms"):
                res[k[:-3] + "_units"] = self.units(1e3 * v, digits)
        return res

    def report(self) -> dict:
        """The unit with its spread over the run's samples and the machine it ran on."""
        s = np.asarray(self.samples)
        return {"machine_unit_us": round(self.us, 4),
                "machine_unit_spread_us": [round(float(np.percentile(s, 5)), 4),
                                           round(float(np.percentile(s, 95)), 4)],
                "machine_unit_samples": int(s.size),
                "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                            "python": platform.python_version()}}
