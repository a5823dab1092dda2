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

The noise-whitened estimate
---------------------------
Per-joint thresholds on r must cover the sensor noise, and the velocity noise reaches r
almost white and *coupled*: ``K_O M(q)`` times it.  A push shows on several joints at
once, the noise through ``M(q)``; beside r the detector can watch ``z = L(q)^-1 r`` with
``L L^T = Sigma(q) = M(q) diag(w^2) M(q) + diag(s^2)`` (:class:`NoiseWhitening`): the
covariance of r in free motion modelled as a white part, ``w`` per joint in the
acceleration domain (``M^-1 r``: the velocity noise there is independent per joint), and
a slow part, ``s`` per joint in the torque domain (what the model does not explain).
:meth:`NoiseWhitening.from_samples` estimates both from free motion -- ``w_i^2`` half the
variance of ``M^-1 r``'s sample-to-sample difference (a slow error cancels in it),
``s_i^2`` the mean square of r averaged over ``window`` samples (white noise averages
out) -- and :func:`calibrate_whitening` calibrates per-component thresholds on ``z`` over
the same samples as r's (``"max"`` or ``"std"``, the debounce alike: zero false alarms on
the segment by construction).  There is a contact when a ``|r_i|`` or a ``|z_i|`` is above
its threshold (each with its debounce and hysteresis): with a perfect model ``z`` sees a
push through the noise several-fold sooner than r; with a model error the slow part
keeps ``z`` from amplifying it (a joint whose error dominates is weighted down).  ``z``
says *that* there is a contact, not where (``z_i`` mixes joints ``1..i`` through the
Cholesky factor, and the inverse of the inertia spreads a torque on one joint over the
others): the joints reported are r's -- those above their thresholds and, while z
flags, the joint whose ``|r_i|`` is nearest its threshold.

The change of the estimate
--------------------------
A model error is slow (what a learned model leaves: 0.5-2 Hz), a contact a step; z's
thresholds must cover the slow error too, and where the noise model conditions one joint
on the others (``z_i`` given ``r_1..r_(i-1)``) a small slow error weighs heavily.  Over a
short window of ``D`` samples (``change_window``) the slow error hardly changes while a
push's rise shows whole: the detector can also watch the change of r whitened by the
white part alone, ``d_k = L_w(q_k)^-1 (r_k - r_(k-D))``, ``L_w L_w^T = M diag(w^2) M``
(:meth:`NoiseWhitening.white_part`) -- the velocity noise's coupling through ``M(q)``
taken out as in z, without the slow part that z must carry.  A step of height ``T`` gives
``r_k - r_(k-D) = T (1 - exp(-K_O t))`` for ``t <= D dt``, then decays: ``d`` marks a
contact's onset (and its end), not its duration.  So ``d`` *starts* a contact -- a rise
of d while neither r nor z flags -- and holds it ``change_hold`` samples, by when r or z has risen
above its own thresholds; it never extends a contact (a rise while r or z flags only
records its direction), and the next rise nearly opposite to the last onset's (cosine
below -0.7: r going back) is that contact's end, not a new one.  Where the model r is computed
with changed within the window (a residual that came or went), the caller restarts d
(:meth:`ContactDetector.restart_change`: 0 until ``D`` new samples came).
:func:`calibrate_change` calibrates per-component thresholds on ``d`` over the same
free-motion samples (consecutive: ``d`` needs r ``D`` samples back), with the debounce.

Decision (per sample)
---------------------
A joint enters contact after ``min_samples`` consecutive samples above its threshold
(a debounce against single-sample spikes: each costs one sample of detection delay) and
leaves it when ``|r_i|`` falls below ``release * threshold_i`` (hysteresis, 0 < release
<= 1); with a whitening, ``|z_i|`` alike beside it (above: the joint nearest its r
threshold is reported).  The contact flag is "any joint in contact"; :attr:`ContactDetector.contacts`
counts its rising edges.  Without thresholds (:attr:`ContactDetector.configured` False)
there is never a contact.  With a change statistic, ``|d_i|`` alike (its own debounce and
hysteresis; a rise while there is no contact starts one and holds it ``change_hold``
samples; the joint nearest its r threshold is reported).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..validation import as_vector, per_joint

__all__ = ["ContactDetector", "ThresholdCalibration", "CALIBRATION_METHODS", "calibrate_residual_joints",
           "NoiseWhitening", "calibrate_whitening", "WHITENING_WINDOW", "calibrate_change", "change_samples",
           "CHANGE_WINDOW", "CHANGE_HOLD"]

CALIBRATION_METHODS = ("max", "std")
#: samples r is averaged over for the slow part of the noise model (:meth:`NoiseWhitening.from_samples`)
WHITENING_WINDOW = 20
#: samples back the change statistic d compares r with (module docstring; at 1 kHz: 10 ms)
CHANGE_WINDOW = 10
#: samples a contact the change statistic flags stays flagged (at 1 kHz: 50 ms, by when r or z has risen)
CHANGE_HOLD = 50
#: a rise of d this close to the opposite of the one that started a contact (cosine) is that contact's end
END_COSINE = 0.7


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

    @classmethod
    def from_samples(cls, T, R, min_samples: int = 1, margin: Optional[float] = None) -> "ThresholdCalibration":
        """The statistics of K samples at once (``T``: K times, ``R``: K x n), those
        :meth:`add` gathers one by one (without offsets), vectorised."""
        R = np.asarray(R, dtype=float)
        if R.ndim != 2 or len(R) == 0:
            raise ValueError(f"R must be K x n with K >= 1, got shape {R.shape}")
        cal = cls(R.shape[1], min_samples=min_samples, margin=margin)
        m = cal.min_samples
        if len(R) >= m:   # the largest level |r| stayed above for m consecutive samples
            cal.max_abs = np.lib.stride_tricks.sliding_window_view(np.abs(R), m, axis=0).min(axis=-1).max(axis=0)
        cal.count, cal.t_first, cal.t_last = len(R), float(T[0]), float(T[-1])
        cal.mean = R.mean(axis=0)
        cal._m2 = ((R - cal.mean) ** 2).sum(axis=0)
        return cal

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


class NoiseWhitening:
    """The free-motion covariance of r, ``Sigma(q) = M(q) diag(white^2) M(q) + diag(slow^2)``,
    and the whitened estimate ``z = L^-1 r`` (``L L^T = Sigma``, Cholesky; module
    docstring).  ``white``: per joint, >= 0, not all 0 [N m / (kg m^2) = rad/s^2 scale of
    ``M^-1 r``]; ``slow``: per joint, >= 0 [N m]."""

    def __init__(self, white, slow):
        w = np.asarray(white, dtype=float).reshape(-1)
        self.n = w.size
        self.white = per_joint(w, self.n, "white")
        self.slow = per_joint(slow, self.n, "slow")
        if not np.all((self.white > 0) | (self.slow > 0)):
            raise ValueError("the noise model needs a white part or a slow part on every joint"
                             f" (white {self.white.tolist()}, slow {self.slow.tolist()})")

    def covariance(self, M) -> np.ndarray:
        M = np.asarray(M, dtype=float)
        return (M * self.white ** 2) @ M.T + np.diag(self.slow ** 2)

    def _factor(self, M) -> np.ndarray:
        M = np.asarray(M, dtype=float)
        if M.shape[-2:] != (self.n, self.n) or not np.all(np.isfinite(M)):
            raise ValueError(f"the inertia must be finite {self.n} x {self.n}, got shape {M.shape}")
        S = np.einsum("...ij,j,...kj->...ik", M, self.white ** 2, M) + np.diag(self.slow ** 2)
        jitter = 1e-12 * np.trace(S, axis1=-2, axis2=-1)[..., None, None] + 1e-300
        try:
            return np.linalg.cholesky(S + jitter * np.eye(self.n))
        except np.linalg.LinAlgError:
            raise ValueError("the noise covariance is not positive definite at this inertia") from None

    def transform(self, r, M) -> np.ndarray:
        """``z`` of one sample (``M``: the inertia there, n x n; a physical one, the URDF's
        plus the drives')."""
        r = as_vector(r, self.n, "r")
        return np.linalg.solve(self._factor(M), r)

    def transform_many(self, R, Ms) -> np.ndarray:
        """``z`` of K samples (``R``: K x n, ``Ms``: K x n x n)."""
        R = np.asarray(R, dtype=float)
        return np.linalg.solve(self._factor(Ms), R[..., None])[..., 0]

    def white_part(self) -> "NoiseWhitening":
        """The noise model of r's change over a few samples: the white part alone (the slow
        part hardly changes over them).  A joint without a white part gets 1e-6 of the
        largest (the factor stays regular)."""
        top = float(np.max(self.white))
        if not top > 0:
            raise ValueError("the noise model has no white part: no change statistic")
        return NoiseWhitening(np.maximum(self.white, 1e-6 * top), np.zeros(self.n))

    @classmethod
    def from_samples(cls, R, Ms, window: int = WHITENING_WINDOW) -> "NoiseWhitening":
        """The noise model of free-motion samples (module docstring): ``R`` K x n, ``Ms``
        K x n x n (K > ``window``, evenly spaced)."""
        R, Ms = np.asarray(R, dtype=float), np.asarray(Ms, dtype=float)
        window = int(window)
        if window < 1:
            raise ValueError(f"window must be >= 1 samples, got {window!r}")
        if R.ndim != 2 or Ms.shape != (*R.shape, R.shape[1]):
            raise ValueError(f"R must be K x n and Ms K x n x n, got {R.shape} and {Ms.shape}")
        if len(R) <= max(window, 2):
            raise ValueError(f"{len(R)} samples: the noise model needs more than {max(window, 2)}")
        if not (np.all(np.isfinite(R)) and np.all(np.isfinite(Ms))):
            raise ValueError("non-finite samples")
        a = np.linalg.solve(Ms, R[..., None])[..., 0]          # M^-1 r
        white = np.sqrt(0.5 * np.var(np.diff(a, axis=0), axis=0))
        c = np.vstack([np.zeros(R.shape[1]), np.cumsum(R, axis=0)])
        slow = np.sqrt(np.mean(((c[window:] - c[:-window]) / window) ** 2, axis=0))
        return cls(white, slow)


def calibrate_whitening(R, Ms, method: str = "max", *, min_samples: int = 1, margin: float = 1.5, k: float = 5.0,
                        floor=1e-9, window: int = WHITENING_WINDOW) -> tuple:
    """``(whitening, thresholds)``: the noise model of the free-motion samples ``R`` (K x n,
    the inertia ``Ms`` at each: a positive definite one) and per-component thresholds on ``z`` over the
    same samples (:meth:`ThresholdCalibration.thresholds`'s ``method``, ``margin``, ``k``,
    ``floor``; ``min_samples`` the detector's debounce)."""
    w = NoiseWhitening.from_samples(R, Ms, window)
    Z = w.transform_many(R, Ms)
    cal = ThresholdCalibration.from_samples(np.arange(len(Z), dtype=float), Z, min_samples=min_samples)
    return w, cal.thresholds(method, margin=margin, k=k, floor=floor)


def change_samples(R, Ms, whitening: NoiseWhitening, window: int = CHANGE_WINDOW) -> np.ndarray:
    """The change statistic of K consecutive samples (module docstring): ``d_k = L_w(q_k)^-1
    (r_k - r_(k-D))``, ``L_w`` the white part of ``whitening``; rows before ``window`` are
    0 (no r that far back).  ``R`` K x n, ``Ms`` K x n x n (the inertia at each sample)."""
    R, Ms = np.asarray(R, dtype=float), np.asarray(Ms, dtype=float)
    window = int(window)
    if window < 1:
        raise ValueError(f"the change window must be >= 1 samples, got {window!r}")
    out = np.zeros_like(R)
    if len(R) > window:
        out[window:] = whitening.white_part().transform_many(R[window:] - R[:-window], Ms[window:])
    return out


def calibrate_change(R, Ms, whitening: NoiseWhitening, window: int = CHANGE_WINDOW, method: str = "max", *,
                     min_samples: int = 1, margin: float = 1.5, k: float = 5.0, floor=1e-9, valid=None) -> np.ndarray:
    """Per-component thresholds on the change statistic ``d`` over K consecutive free-motion
    samples (``R``, ``Ms`` as :func:`calibrate_whitening`'s; the first ``window`` have no d),
    :meth:`ThresholdCalibration.thresholds`'s ``method``, ``margin``, ``k``, ``floor``.
    ``valid`` (K bools, or None: all): the samples where the detector watches d (not where
    the model switched within its window): ``"max"`` takes d as 0 elsewhere (the debounce's
    runs stay consecutive), ``"std"`` the valid samples alone."""
    window = int(window)
    D = change_samples(R, Ms, whitening, window)
    ok = np.ones(len(D), dtype=bool) if valid is None else np.array(valid, dtype=bool).reshape(-1)   # (a copy)
    if ok.size != len(D):
        raise ValueError(f"valid must have one flag per sample ({len(D)}), got {ok.size}")
    ok[:window] = False
    if ok.sum() < max(int(min_samples), 2):
        raise ValueError(f"{len(R)} samples ({int(ok.sum())} with d): the change statistic needs more than"
                         f" {window + 1}")
    D = np.where(ok[:, None], D, 0.0)[window:] if method == "max" else D[ok]
    cal = ThresholdCalibration.from_samples(np.arange(len(D), dtype=float), D, min_samples=min_samples)
    return cal.thresholds(method, margin=margin, k=k, floor=floor)


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
        self._r_active = np.zeros(self.n, dtype=bool)
        self._above = np.zeros(self.n, dtype=int)
        self.contact = False
        self.contacts = 0
        #: the noise model (:class:`NoiseWhitening`) and its thresholds on z, or None
        self.whitening = None
        self.whitened_thresholds = None
        #: the last sample's whitened estimate (zeros without a whitening or an inertia)
        self.z = np.zeros(self.n)
        self._z_active = np.zeros(self.n, dtype=bool)
        self._z_above = np.zeros(self.n, dtype=int)
        #: the change statistic's thresholds, window and hold (samples), or None (:meth:`set_change`)
        self.change_thresholds = None
        self.change_window = CHANGE_WINDOW
        self.change_hold = CHANGE_HOLD
        self._white = None
        #: the last sample's change statistic (zeros when not watched)
        self.d = np.zeros(self.n)
        self._d_active = np.zeros(self.n, dtype=bool)
        self._d_above = np.zeros(self.n, dtype=int)
        self._d_hold = 0
        self._d_onset = None               # d at the onset of the contact it started (its end goes back)
        self._ring = np.zeros((CHANGE_WINDOW, self.n))     # the last change_window r's, a ring
        self._count = 0

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

    def set_whitening(self, whitening: Optional[NoiseWhitening], thresholds=None) -> None:
        """Watch ``z`` beside r (module docstring): the noise model and its thresholds on z
        (> 0), or None for r alone."""
        if whitening is None:
            self.whitening = self.whitened_thresholds = None
            self._z_active[:] = False
            self._z_above[:] = 0
            self.z = np.zeros(self.n)
            self.set_change(None)           # d takes the whitening's white part
            return
        if whitening.n != self.n:
            raise ValueError(f"the whitening has {whitening.n} joints, the detector {self.n}")
        thr = per_joint(thresholds, self.n, "whitened thresholds", one_for_all=True)
        if not np.all(thr > 0):
            raise ValueError(f"whitened thresholds must be > 0, got {thr.tolist()}")
        self.whitening, self.whitened_thresholds = whitening, thr
        self._z_active[:] = False        # the debounce and hysteresis start over under the new model
        self._z_above[:] = 0
        if self.change_thresholds is not None:   # d under the new model's white part (or off without one)
            try:
                self.set_change(self.change_thresholds, self.change_window, self.change_hold)
            except ValueError:
                self.set_change(None)

    def set_change(self, thresholds=None, window: int = CHANGE_WINDOW, hold: int = CHANGE_HOLD) -> None:
        """Watch the change statistic ``d`` (module docstring) beside r and z: its thresholds
        (> 0, per joint), the window D and the hold [samples]; None: not watched.  Uses the
        whitening's white part (:meth:`set_whitening` first; ValueError without a whitening
        or its white part)."""
        if thresholds is None:
            self.change_thresholds = self._white = None
            self._reset_change()
            return
        if self.whitening is None:
            raise ValueError("the change statistic needs the whitening (set_whitening first)")
        thr = per_joint(thresholds, self.n, "change thresholds", one_for_all=True)
        if not np.all(thr > 0):
            raise ValueError(f"change thresholds must be > 0, got {thr.tolist()}")
        window, hold = int(window), int(hold)
        if window < 1 or hold < 0:
            raise ValueError(f"the change window must be >= 1 and the hold >= 0 samples, got {window}, {hold}")
        self._white = self.whitening.white_part()
        self.change_thresholds, self.change_window, self.change_hold = thr, window, hold
        self._reset_change()

    def restart_change(self) -> None:
        """Forget the r's kept for d (d is 0 until ``change_window`` new ones came): the model
        r is computed with changed within the window (a residual that came or went), so r's
        change there is the model's, not the arm's.  A contact d flagged keeps its hold."""
        self._count = 0
        self.d = np.zeros(self.n)

    def _reset_change(self) -> None:
        self._d_active[:] = False
        self._d_above[:] = 0
        self._d_hold = 0
        self._d_onset = None
        self._ring = np.zeros((self.change_window, self.n))
        self._count = 0
        self.d = np.zeros(self.n)

    def reset(self) -> None:
        self.active[:] = False
        self._r_active[:] = False
        self._above[:] = 0
        self._z_active[:] = False
        self._z_above[:] = 0
        self._reset_change()
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

    def update(self, r, std=None, inertia=None, z=None, d=None):
        """``(contact, joints)`` after the sample ``r`` (``joints``: a bool per joint, a copy).
        ``d``: the change statistic already computed (:func:`change_samples`), with
        :meth:`set_change`; else the detector computes it from the r's it kept and ``inertia``.
        ``inertia``: ``M(q)`` at the sample (n x n, positive definite: the URDF's plus the
        drives') -- with a whitening (:meth:`set_whitening`), ``z`` is watched beside r; without it, r alone (``z``: the
        whitened estimate already computed, :meth:`NoiseWhitening.transform_many`, instead
        of the inertia).  The uncertainty term (``std``) is r's: z's noise model has its own."""
        r = as_vector(r, self.n, "r")
        a = np.abs(r)
        thr = self.effective_thresholds(std)
        self._above, self._r_active = self._debounce(a, thr, self._above, self._r_active)
        self.active = self._r_active.copy()
        if self.whitening is not None and (inertia is not None or z is not None) and self.thresholds is not None:
            self.z = self.whitening.transform(r, inertia) if z is None else as_vector(z, self.n, "z")
            self._z_above, self._z_active = self._debounce(np.abs(self.z), self.whitened_thresholds,
                                                           self._z_above, self._z_active)
            if self._z_active.any():    # z says there is a contact, r where: the joint nearest its threshold
                self.active[int(np.argmax(a / thr))] = True
        else:                           # z not watched this sample
            self._z_active[:] = False
            self._z_above[:] = 0
            self.z = np.zeros(self.n)
        if self._change_on(d, inertia):
            self._update_change(r, a, thr, inertia, d)
        elif self.change_thresholds is not None:
            self._reset_change()
        was = self.contact
        self.contact = bool(self.active.any())
        if self.contact and not was:
            self.contacts += 1
        return self.contact, self.active.copy()

    def _debounce(self, level, thresholds, above, active) -> tuple:
        """One sample of a statistic's decision (module docstring): ``(above, active)`` --
        the run of samples above the thresholds, and active after ``min_samples`` of them
        until the level falls below ``release`` x the thresholds."""
        above = np.where(level > thresholds, above + 1, 0)
        return above, (above >= self.min_samples) | (active & (level > self.release * thresholds))

    def _change_on(self, d, inertia) -> bool:
        return (self.change_thresholds is not None and self.whitening is not None and self.thresholds is not None
                and (d is not None or inertia is not None))

    def _update_change(self, r, a, thr, inertia, d) -> None:
        """One sample of the change statistic: d (given, or from the r ``change_window``
        samples back), its debounce, hysteresis and hold; the joint nearest its r threshold
        reported while it flags."""
        if d is None:
            i = self._count % self.change_window       # the slot of the r change_window samples back
            if self._count >= self.change_window:
                self.d = self._white.transform(r - self._ring[i], inertia)
            else:
                self.d = np.zeros(self.n)
            self._ring[i] = r
            self._count += 1
        else:
            self.d = as_vector(d, self.n, "d")
        was = self._d_active.any()
        self._d_above, self._d_active = self._debounce(np.abs(self.d), self.change_thresholds,
                                                       self._d_above, self._d_active)
        if self._d_hold > 0:
            self._d_hold -= 1
        # d starts a contact -- its onset --, it does not extend one nor flag one's end: a rise
        # nearly opposite to the last onset's is that contact's end; a rise while r or z flags
        # (or d holds) only records its direction
        if self._d_active.any() and not was:
            onset = self._d_onset
            if onset is not None and float(np.dot(self.d, onset)) < -END_COSINE * float(
                    np.linalg.norm(self.d) * np.linalg.norm(onset)):
                self._d_onset = None
            else:
                if not self.contact and not self.active.any():
                    self._d_hold = self.change_hold
                self._d_onset = self.d.copy()
        if self._d_hold > 0:
            self.active[int(np.argmax(a / thr))] = True

    @property
    def change_contact(self) -> bool:
        """The change statistic holds a contact it started (module docstring)."""
        return self._d_hold > 0

    @property
    def z_contact(self) -> bool:
        """z flags a contact (a component above its threshold, debounced, with hysteresis)."""
        return bool(self._z_active.any())

    def joints_in_contact(self) -> list:
        return [j for j, a in zip(self.joint_names, self.active) if a]
