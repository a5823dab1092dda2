"""Joint-space reference trajectories (no ROS import).

* :class:`Trajectory` -- common interface: ``sample(t) -> (q, qd, qdd)``,
  ``sample_many(ts)``, ``n``, ``period``, ``duration``, ``check_limits(...)``.
* :class:`ScaledTrajectory` -- live speed scaling with a continuous phase.
* :class:`ModifiedFourier` -- Park 2006 excitation (cyclic, start state guaranteed).
* :class:`MultiSine` -- sum of sines per joint.
* :class:`PickAndPlace` -- minimum-jerk point-to-point cycle with dwell times
  (:func:`pgpol_speed_schedule`: 33 / 66 / 100 % speed, PGPOL section IV-B).
* :class:`SplineTrajectory`, :func:`load_trajectory_file` -- a trajectory file (what
  ``adaptive-dynamics excite`` writes: its exact Fourier series; or a CSV, interpolated).
* :class:`CartesianTrajectory` -- Lissajous / figure-8 / square + circle / z-sine end-effector paths via
  differential IK; :class:`CartesianPath` -- the same path as a task-space reference.
"""
from .base import ACCELERATION_LIMIT, ScaledTrajectory, Trajectory, check_limit_arrays
from .cartesian import (CartesianPath, CartesianTrajectory, LissajousPath, SquareCirclePath, figure_eight, lissajous,
                        lissajous3d, square_circle, z_sine)
from .fourier import ModifiedFourier
from .from_file import Approach, SplineTrajectory, load_trajectory_file
from .pick_place import PGPOL_SPEEDS, PickAndPlace, minimum_jerk, pgpol_speed_schedule
from .sines import MultiSine

__all__ = [
    "ACCELERATION_LIMIT",
    "Trajectory",
    "ScaledTrajectory",
    "check_limit_arrays",
    "ModifiedFourier",
    "MultiSine",
    "SplineTrajectory",
    "load_trajectory_file", "Approach",
    "PickAndPlace",
    "minimum_jerk",
    "PGPOL_SPEEDS",
    "pgpol_speed_schedule",
    "CartesianTrajectory",
    "CartesianPath",
    "z_sine",
    "LissajousPath",
    "lissajous",
    "lissajous3d",
    "figure_eight",
    "SquareCirclePath",
    "square_circle",
]
