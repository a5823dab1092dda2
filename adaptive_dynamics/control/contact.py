"""Contact detection on the external-torque estimate of the momentum observer
(:mod:`.momentum_observer`).  No ROS import.

Per-joint thresholds
--------------------
A joint is in contact when ``|r_i|`` exceeds its threshold::

    threshold_i(t) = base_i + k_u sqrt(model_std_i^2 + std_i(t)^2)

* ``base_i`` -- set by hand, or calibrated from free motion (:class:`ThresholdCalibration`):
  ``"max"``: ``margin * max |r_i|`` over the segment (zero false alarms on it by
  construction, ``margin`` > 1 for what the segment did not visit) or ``"std"``:
  ``|mean r_i| + k std r_i`` (a Gaussian bound; an unmodelled bias enters through the mean).
  With an uncertainty term u_i(t) (below) ``"max"`` takes ``base_i = max(margin |r_i| -
  u_i)`` (at least ``floor``) instead: ``base_i + u_i`` then covers ``margin |r_i|`` over the
  segment, and the term moves the threshold to where the model is unsure -- a constant term
  changes nothing once calibrated, a varying one lowers the threshold where the model is
  sure (``"std"`` takes r alone; the term adds on top).
  With the detector's debounce (``min_samples`` = m > 1) ``"max"`` takes the largest level
  ``|r_i|`` stayed above for m consecutive samples, ``max_k min_{j<m} |r_i(k - j)|``: what
  the debounced detector would have flagged (still zero false alarms on the segment).  The
  observer passes the velocity noise to r almost white (``K_O M`` times it, sample to
  sample independent) while a model error is slow, so a few samples of debounce lower
  the threshold that noise alone needs several-fold at a delay of ``m - 1`` samples.
* the model's own uncertainty, scaled by ``k_u`` (``uncertainty_gain``): ``model_std_i``, a
  constant (e.g. the identification residual's standard deviation per joint: the torque
  the identified model does not explain), and ``std_i(t)``, a time-varying one (a residual
  learner's predictive standard deviation at the current state): where the model is
  unsure, the threshold rises above ``base``.

The residual, per joint
-----------------------
A learned residual lowers the thresholds where it describes the arm and raises them where
it does not.  :func:`calibrate_residual_joints` calibrates from the same free motion the
observer's estimate with the residual and without it (the observer keeps both:
:attr:`~.momentum_observer.MomentumObserver.r_with_residual`, ``r_without_residual``) and
keeps the residual on a joint only where its threshold is not higher (with an uncertainty
term: the threshold's mean over the segment, ``base + mean u``) -- so the learned model's
thresholds are never above the model's without it on the calibration segment (``learning
that never makes the model worse``, applied to contact detection).

Decision (per sample)
---------------------
A joint enters contact after ``min_samples`` consecutive samples above its threshold
(a debounce against single-sample spikes: each costs one sample of detection delay) and
leaves it when ``|r_i|`` falls below ``release * threshold_i`` (hysteresis, 0 < release
<= 1).  The contact flag is "any joint in contact"; :attr:`ContactDetector.contacts`
counts its rising edges.  Without thresholds (:attr:`ContactDetector.configured` False)
there is never a contact.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..validation import as_vector, per_joint

__all__ = ["ContactDetector", "ThresholdCalibration", "CALIBRATION_METHODS", "calibrate_residual_joints"]

CALIBRATION_METHODS = ("max", "std")


class ThresholdCalibration:
    """Per-joint statistics of r over a free-motion segment (running: max |r| -- over
    ``min_samples`` consecutive samples, the detector's debounce: the module docstring --,
    mean and variance by Welford's update), turned into thresholds by :meth:`thresholds`."""

    def __init__(self, n: int, min_samples: int = 1, margin: Optional[float] = None):
        self.n = int(n)
        self.min_samples = int(min_samples)
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
        #: the ``"max"`` margin, needed per sample when :meth:`add` gets an offset
        self.margin = None if margin is None else float(margin)
        if self.margin is not None and not self.margin >= 1.0:
            raise ValueError(f"margin must be >= 1, got {margin!r}")
        self._offset_sum = np.zeros(self.n)
        self.count = 0
        self.t_first = self.t_last = math.nan
        self.max_abs = np.zeros(self.n)
        self.mean = np.zeros(self.n)
        self._m2 = np.zeros(self.n)
        self._recent = np.zeros((self.min_samples, self.n))

    def add(self, t: float, r, offset=None) -> None:
        """One sample ``r``.  ``offset`` (n values, or None): the uncertainty term u the
        detector adds to the thresholds at this sample (``k_u sqrt(model_std^2 + std^2)``,
        :meth:`ContactDetector.uncertainty`; needs :attr:`margin`); the ``"max"`` statistic
        then takes ``|r| - u / margin``, so that the base ``max(margin |r| - u)`` plus u
        covers ``margin |r|`` (the mean and variance stay those of r)."""
        r = as_vector(r, self.n, "r")
        a = np.abs(r)
        if offset is not None:
            if self.margin is None:
                raise ValueError("an offset needs the margin at construction: ThresholdCalibration(..., margin=)")
            u = as_vector(offset, self.n, "offset")
            a = a - u / self.margin
            self._offset_sum += u
        if self.count == 0:
            self.t_first = float(t)
        self.t_last = float(t)
        m = self.min_samples
        if m == 1:
            np.maximum(self.max_abs, a, out=self.max_abs)
        else:
            self._recent[self.count % m] = a
            if self.count + 1 >= m:
                np.maximum(self.max_abs, self._recent.min(axis=0), out=self.max_abs)
        self.count += 1
        d = r - self.mean
        self.mean += d / self.count
        self._m2 += d * (r - self.mean)

    @property
    def duration(self) -> float:
        """Time covered [s] (0 before two samples)."""
        return 0.0 if self.count < 2 else self.t_last - self.t_first

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self._m2 / self.count) if self.count else np.zeros(self.n)

    @property
    def offset_mean(self) -> np.ndarray:
        """The mean uncertainty term over the samples (zeros without offsets)."""
        return self._offset_sum / self.count if self.count else np.zeros(self.n)

    def thresholds(self, method: str = "max", *, margin: Optional[float] = None, k: float = 5.0,
                   floor=0.0) -> np.ndarray:
        """The bases: ``"max"``: ``margin * max |r|`` (over ``min_samples`` consecutive
        samples; with offsets ``max(margin |r| - u)``; ``margin`` None: :attr:`margin`, else
        1.5); ``"std"``: ``|mean| + k std``; at least ``floor`` (scalar or per joint)."""
        if self.count == 0:
            raise ValueError("no samples to calibrate from")
        if margin is None:
            margin = self.margin if self.margin is not None else 1.5
        elif self.margin is not None and float(margin) != self.margin and np.any(self._offset_sum):
            raise ValueError(f"the offsets were taken with margin {self.margin}, not {margin}")
        if method == "max":
            thr = float(margin) * self.max_abs
        elif method == "std":
            thr = np.abs(self.mean) + float(k) * self.std
        else:
            raise ValueError(f"calibration method must be one of {list(CALIBRATION_METHODS)}, got {method!r}")
        return np.maximum(thr, per_joint(floor, self.n, "floor", one_for_all=True))


def calibrate_residual_joints(with_residual: ThresholdCalibration, without_residual: ThresholdCalibration,
                              method: str = "max", **kw) -> tuple:
    """``(bases, mask)`` from two calibrations over the same samples: r with the residual
    and r without it (module docstring).  ``mask[i]``: joint i keeps the residual (its
    threshold with it -- base plus the mean uncertainty term -- at most the one without);
    ``bases[i]`` that joint's.
    ``kw``: :meth:`ThresholdCalibration.thresholds`'s."""
    if with_residual.n != without_residual.n or with_residual.count != without_residual.count:
        raise ValueError("the two calibrations must cover the same samples "
                         f"({with_residual.count} and {without_residual.count} samples)")
    thr_w = with_residual.thresholds(method, **kw)
    thr_wo = without_residual.thresholds(method, **kw)
    mask = thr_w + with_residual.offset_mean <= thr_wo + without_residual.offset_mean
    return np.where(mask, thr_w, thr_wo), mask


class ContactDetector:
    """Contact flag and the joints involved (module docstring).

    ``thresholds``: base thresholds [N m] (scalar or per joint, > 0), or None (set later
    with :meth:`set_thresholds`; ``n`` then gives the number of joints).
    """

    def __init__(self, thresholds=None, *, n: Optional[int] = None, joint_names: Optional[Sequence[str]] = None,
                 uncertainty_gain: float = 0.0, model_std=0.0, release: float = 0.8, min_samples: int = 1):
        if n is None:
            if thresholds is None:
                n = len(joint_names) if joint_names is not None else None
            else:
                n = np.size(thresholds)
        if not n:
            raise ValueError("give the thresholds, n or the joint names")
        self.n = int(n)
        self.joint_names = list(joint_names) if joint_names is not None else [f"joint{i + 1}" for i in range(self.n)]
        if len(self.joint_names) != self.n:
            raise ValueError(f"{len(self.joint_names)} joint names for {self.n} joints")
        self.thresholds = None
        if thresholds is not None:
            self.set_thresholds(thresholds)
        self.uncertainty_gain = float(uncertainty_gain)
        if not (self.uncertainty_gain >= 0 and math.isfinite(self.uncertainty_gain)):
            raise ValueError(f"uncertainty_gain must be >= 0, got {uncertainty_gain!r}")
        self.model_std = per_joint(model_std, self.n, "model_std", one_for_all=True)
        self.release = float(release)
        if not 0 < self.release <= 1:
            raise ValueError(f"release must be in (0, 1], got {release!r}")
        self.min_samples = int(min_samples)
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
        self.active = np.zeros(self.n, dtype=bool)
        self._above = np.zeros(self.n, dtype=int)
        self.contact = False
        self.contacts = 0

    @property
    def configured(self) -> bool:
        return self.thresholds is not None

    def set_thresholds(self, thresholds) -> None:
        thr = per_joint(thresholds, self.n, "thresholds", one_for_all=True)
        if not np.all(thr > 0):
            raise ValueError(f"thresholds must be > 0 [N m], got {thr.tolist()}")
        self.thresholds = thr

    def clear_thresholds(self) -> None:
        self.thresholds = None
        self.reset()

    def reset(self) -> None:
        self.active[:] = False
        self._above[:] = 0
        self.contact = False

    def uncertainty(self, std=None) -> np.ndarray:
        """The uncertainty term ``k_u sqrt(model_std^2 + std^2)`` (``std``: the
        time-varying part, or None)."""
        var = self.model_std ** 2
        if std is not None:
            var = var + as_vector(std, self.n, "std") ** 2
        return self.uncertainty_gain * np.sqrt(var)

    def effective_thresholds(self, std=None) -> np.ndarray:
        """The thresholds with the uncertainty term (``std``: the time-varying part, or None)."""
        if self.thresholds is None:
            return np.full(self.n, np.inf)
        return self.thresholds + self.uncertainty(std)

    def update(self, r, std=None):
        """``(contact, joints)`` after the sample ``r`` (``joints``: a bool per joint, a copy)."""
        r = np.abs(as_vector(r, self.n, "r"))
        thr = self.effective_thresholds(std)
        above = r > thr
        self._above = np.where(above, self._above + 1, 0)
        self.active = (self._above >= self.min_samples) | (self.active & (r > self.release * thr))
        was = self.contact
        self.contact = bool(self.active.any())
        if self.contact and not was:
            self.contacts += 1
        return self.contact, self.active.copy()

    def joints_in_contact(self) -> list:
        return [j for j, a in zip(self.joint_names, self.active) if a]
