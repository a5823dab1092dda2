"""Incremental Gaussian mixture model (IGMM) with Gaussian mixture regression (GMR).

Learning follows Pinto & Engel's incremental GMM (R. Pinto, P. Engel, "A fast
incremental Gaussian mixture model", PLoS ONE 2015; "Scalable and incremental learning
of Gaussian mixture models", arXiv:1701.03940 -- ref. [12] of the consistency paper),
on the *joint* vector z = (x, y), D = input_dim + output_dim, in coordinates scaled by
``scale`` (per-coordinate typical magnitudes):

* **novelty**: a sample whose squared Mahalanobis distance to every component is at
  least ``chi2.ppf(1 - beta, D)`` -- and that lies farther than ``delta *
  sqrt(threshold)`` (scaled Euclidean) from every component mean, so a young,
  point-like component always captures its neighbours -- creates a component at z
  with covariance ``diag((delta * scale)^2)`` (support sp = 1, age v = 1);
* otherwise every component j is updated with its posterior p(j|z):
  ``sp_j += p``, ``w = p / sp_j``, ``e = z - mu_j``, ``mu_j += w e`` and
  ``Sigma_j <- (1 - w) (Sigma_j + w e e^T) + w R`` -- the exact running weighted
  covariance plus a regulariser ``R = diag((reg * scale)^2)`` (below);
* **removal** of spurious components: age ``v_j > v_min`` with support
  ``sp_j < sp_min``;
* **size cap** ``max_components``: when a new component is needed at the cap, the two
  components whose moment-matched merge loses the least (Runnalls' KL upper bound) are
  merged first (pair costs cached, recomputed only for components that changed).  At the
  cap a sample is novel only if it is also an outlier (squared Mahalanobis distance to
  every component at least ``chi2.ppf(full_novelty, D)``, default 0.99) or farther than
  ``sqrt(FULL_FAR)`` outlier radii from every mean (no component chases a sweep into new
  territory).  The novelty level of ``beta`` (the 10 % quantile by default: a fresh,
  point-like component must capture its neighbours) flags most samples of a *noisy*
  stream -- a component per sample, each merged away again, for up to 98 % of the
  samples on torque data with sensor noise -- while a mixture that already covers the
  data needs a new component only for what it cannot explain.

Choosing delta (and reg) -- what we learnt: for a *stream* (robot data in time order)
the outcome hinges on the ratio of ``delta`` to the scaled distance between consecutive
samples and on ``delta / reg``.  Too small a delta and every sample is novel; too large
and new components lose the posterior competition to the older, already elongated ones
and die as "spurious" while the old ones chase the trajectory (few, long components).
The default ``delta=None`` therefore sets ``delta = 3 * median step / sqrt(threshold)``
from the first ``warmup`` samples (the novelty radius is three steps; clipped to [1e-3, 0.1]) and
``reg = 0.6 delta``: on the Panda/iiwa virtual-model data this gives one clean
segmentation (~70 components created for 64 kept, none removed) whatever the sampling
rate (1 kHz / 3, / 6, / 9 tested), and on i.i.d. data (large steps -> delta = 0.1) it
stays within 0.005 nMSE of batch EM (``test_learning_igmm.py``).  The geometry
(``scale``, ``delta``) comes from the first ``warmup`` samples (default 200) however they
arrive -- they are buffered and learnt in order once it is set -- so the batch sizes of
``partial_fit`` do not change the model (tested: batches of 1 to 1000 give the same
mixture); until then the mixture is empty and predicts the prior (zero).  (A scale from
a first batch of 50 samples -- a quarter second of a 200 Hz stream -- makes nearly
every later sample novel.)  Files saved before ``warmup`` / ``full_novelty`` existed load with
:data:`IncrementalGMM.LEGACY_CONFIG` (the first batch's geometry, the ``beta`` level at
the cap).

Near-singular covariances (the failure mode the consistency paper reports, sec. VII:
data on a trajectory is locally a curve, so a component's covariance collapses onto
it) are prevented twice: (1) the regulariser R makes every update a convex
combination with a full-rank term, so in the scaled coordinates ``z / scale`` every
eigenvalue tends to at least ``reg^2`` instead of 0 and never drops below
``eig_floor <= min(reg, delta)^2``; (2) that floor is enforced explicitly (an
eigen-decomposition) for covariances that come from outside (``from_mixture``,
``load``) or when rounding breaks a Cholesky factorisation.  Both are tested (``test_learning_igmm.py``).

GMR (consistency paper eq. 11): with the input marginal N(x; mu_i, Sigma_ii),
``y(x) = sum_j h_j(x) (mu_o + Sigma_oi Sigma_ii^-1 (x - mu_i))`` and the predictive
variance by the law of total variance.  The prediction cache stacks every component's
whitening and regression matrices into one matrix, so one query costs one
matrix-vector product (K (input_dim + output_dim) x input_dim) plus a softmax.

Consistency transform (eq. 16-19): see :mod:`.consistency`.  T = [[I, 0], [-J, I]] has
unit determinant and leaves Sigma_ii and the conditional covariance unchanged, so the
responsibilities h_j(x) are untouched and the regression matrices shift exactly by -J:
the transform updates the whitening by ``W T^-1`` (no new decomposition).
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import numpy as np
from scipy.special import gammaincc
from scipy.stats import chi2

from .base import Learner, register
from .consistency import ParameterChange, transform_gaussians

__all__ = ["IncrementalGMM"]

#: chi^2 tail probability (input marginal) beyond which a query is outside every component;
#: the support falls from 1 there (see ``_predict``)
OUTSIDE_LEVEL = 1e-3
#: default regulariser as a fraction of delta (see the class docstring)
REG_PER_DELTA = 0.6
#: largest automatic delta
DELTA_MAX = 0.1
#: at the size cap a sample inside the novelty level is still novel when it is farther than
#: sqrt(FULL_FAR) times the outlier radius from every mean (no component chases a sweep)
FULL_FAR = 16.0


@register
class IncrementalGMM(Learner):
    """Incremental GMM on (x, y) with GMR prediction.

    Parameters
    ----------
    input_dim, output_dim:
        Sizes of x (e.g. 3n for (q, qd, qdd)) and y (n residual torques).
    max_components:
        Size cap K_max (memory and prediction cost are preallocated for it).
    beta:
        Novelty level: a sample is novel when its squared Mahalanobis distance to every
        component exceeds the (1 - beta) quantile of chi^2 with D degrees of freedom.
    delta:
        Initial standard deviation of a new component, as a fraction of ``scale``
        (``None``: from the first batch's step size, see the module docstring).
    reg:
        Regulariser: every update adds ``w (reg * scale)^2`` to the diagonal (see the
        module docstring); also the smallest standard deviation a component tends to.
        Default ``0.6 delta``.
    eig_floor:
        Hard floor on the eigenvalues of a component's covariance in the scaled
        coordinates ``z / scale`` (default ``(reg / 2)^2``).
    v_min, sp_min:
        Spurious-component removal: age (samples seen since creation) above ``v_min``
        with accumulated posterior support below ``sp_min``.  Default
        ``max(2 D, 4 max_components)``: with K components a genuine one collects about
        1/K of the support of a well-spread stream, so it needs ~3 K samples to reach
        ``sp_min = 3`` (a shorter age removes real components on i.i.d. data).
    scale:
        Typical magnitude of each of the D coordinates (x then y), e.g. their standard
        deviations; ``None`` = estimated from the first ``partial_fit`` batch with at
        least 2 rows (the per-column standard deviation), falling back to 1 (with a
        warning) for a one-row first batch.
    post_tol:
        Components whose posterior for a sample is below this are not updated (their
        change would be below rounding anyway); keeps the update cost at the few
        responsible components.
    warmup:
        Samples buffered before ``scale`` / ``delta`` (those not given) are estimated
        from them; 0 = from the first ``partial_fit`` batch.
    full_novelty:
        At ``max_components``: the chi^2 level (of D degrees of freedom) a sample's
        squared Mahalanobis distance to every component must reach to be novel (module
        docstring); ``None`` = the ``beta`` level, as below the cap.
    """

    kind = "gmm"
    #: what a file saved before ``warmup`` / ``full_novelty`` existed was learnt with
    LEGACY_CONFIG = {"warmup": 0, "full_novelty": None}

    def __init__(self, input_dim: int, output_dim: int, *, max_components: int = 64, beta: float = 0.9,
                 delta: Optional[float] = None, reg: Optional[float] = None, eig_floor: Optional[float] = None,
                 v_min: Optional[int] = None, sp_min: float = 3.0, scale=None, post_tol: float = 1e-6,
                 warmup: int = 200, full_novelty: Optional[float] = 0.99):
        super().__init__(input_dim, output_dim)
        D = self.input_dim + self.output_dim
        self.D = D
        if int(max_components) < 1:
            raise ValueError(f"max_components must be >= 1, got {max_components}")
        if not 0.0 < float(beta) < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        for name, val in (("delta", delta), ("reg", reg)):
            if val is not None and (not float(val) > 0 or not np.isfinite(float(val))):
                raise ValueError(f"{name} must be > 0, got {val}")
        self.max_components = int(max_components)
        self.beta = float(beta)
        self.delta = None if delta is None else float(delta)
        self.reg = None if reg is None else float(reg)
        self.eig_floor = None if eig_floor is None else float(eig_floor)
        if self.delta is not None:
            self._resolve_geometry()
        self.v_min = int(v_min) if v_min is not None else max(2 * D, 4 * self.max_components)
        self.sp_min = float(sp_min)
        self.post_tol = float(post_tol)
        self.threshold = float(chi2.ppf(1.0 - self.beta, D))
        if int(warmup) < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.warmup = int(warmup)
        if full_novelty is not None and not 0.0 < float(full_novelty) < 1.0:
            raise ValueError(f"full_novelty must be in (0, 1) or None, got {full_novelty}")
        self.full_novelty = None if full_novelty is None else float(full_novelty)
        self.full_threshold = self.threshold if full_novelty is None else max(
            self.threshold, float(chi2.ppf(self.full_novelty, D)))
        self._buf: list = []                  # warm-up rows (scale / delta not known yet)
        self.scale = None if scale is None else self._check_scale(scale)

        Kmax = self.max_components
        self.K = 0
        self.mu = np.zeros((Kmax, D))
        self.cov = np.zeros((Kmax, D, D))
        self.sp = np.zeros(Kmax)
        self.age = np.zeros(Kmax)
        self.white = np.zeros((Kmax, D, D))   # Lambda^-1/2 U^T S^-1: |white (z - mu)|^2 = Mahalanobis^2
        self.wmu = np.zeros((Kmax, D))        # white @ mu
        self.logdet = np.zeros(Kmax)
        self._dirty = np.ones(Kmax, dtype=bool)  # merge costs to recompute
        self._changed: set = set()               # components changed since the prediction snapshot
        self._structural = False                 # components created/removed since the snapshot
        self._mcost = np.full((Kmax, Kmax), np.inf)
        self.n_created = 0
        self.n_removed = 0
        self.n_merged = 0
        self.n_floored = 0
        #: queries farther than the 99.9 % chi^2 quantile (input marginal) from every
        #: component: outside the region the mixture has data for
        self.n_queries_outside = 0
        self._outside_d2 = float(chi2.isf(OUTSIDE_LEVEL, self.input_dim))
        self._pred = None                     # immutable prediction snapshot (tuple)

    # ---------------------------------------------------------------- config
    def _check_scale(self, scale) -> np.ndarray:
        s = np.broadcast_to(np.asarray(scale, dtype=float), (self.D,)).copy()
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise ValueError(f"scale must be {self.D} finite values > 0")
        return s

    def get_config(self) -> Dict[str, Any]:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim,
                "max_components": self.max_components, "beta": self.beta, "delta": self.delta,
                "reg": self.reg, "eig_floor": self.eig_floor, "v_min": self.v_min, "sp_min": self.sp_min,
                "scale": None if self.scale is None else self.scale.tolist(), "post_tol": self.post_tol,
                "warmup": self.warmup, "full_novelty": self.full_novelty}

    @property
    def n_components(self) -> int:
        return self.K

    @property
    def weights(self) -> np.ndarray:
        sp = self.sp[: self.K]
        return sp / sp.sum() if self.K else sp.copy()

    @property
    def means(self) -> np.ndarray:
        return self.mu[: self.K].copy()

    @property
    def covariances(self) -> np.ndarray:
        return self.cov[: self.K].copy()

    def _counters(self) -> Dict[str, int]:
        c = super()._counters()
        c.update(n_created=self.n_created, n_removed=self.n_removed, n_merged=self.n_merged,
                 n_floored=self.n_floored, n_queries_outside=self.n_queries_outside)
        return c

    @classmethod
    def from_mixture(cls, weights, means, covariances, input_dim: int, **config) -> "IncrementalGMM":
        """A GMR model from given mixture parameters (e.g. a scikit-learn
        ``GaussianMixture`` fitted on the joint data, ``covariance_type="full"``).
        ``weights`` become the supports; the eigenvalue floor still applies."""
        means = np.atleast_2d(np.asarray(means, dtype=float))
        covs = np.asarray(covariances, dtype=float)
        w = np.asarray(weights, dtype=float).reshape(-1)
        K, D = means.shape
        config.setdefault("max_components", max(K, 1))
        config.setdefault("scale", np.sqrt(np.einsum("kii->i", covs) / K).tolist())
        config.setdefault("delta", 0.02)
        obj = cls(input_dim, D - int(input_dim), **config)
        if K > obj.max_components:
            raise ValueError(f"{K} components exceed max_components={obj.max_components}")
        obj.K = K
        obj.mu[:K] = means
        obj.cov[:K] = covs
        obj.sp[:K] = w / w.sum() * max(K, 1) * 10.0
        obj.age[:K] = obj.v_min + 1
        obj._enforce_floor(np.arange(K))
        obj._refresh(np.arange(K))
        obj._rebuild_predict()
        return obj

    # ---------------------------------------------------------------- learning
    def _fit(self, X: np.ndarray, y: np.ndarray, R) -> None:
        Z = np.hstack([X, y])
        if (self.scale is None or self.delta is None) and self.warmup > 0:
            # the geometry comes from the first `warmup` rows however they arrive
            self._buf.append(Z)
            if sum(b.shape[0] for b in self._buf) < self.warmup:
                return
            Z = np.concatenate(self._buf)
            self._buf = []
            self._set_geometry(Z[: self.warmup])
        else:
            self._set_geometry(Z)
        for z in Z:
            self._learn_one(z)
        self._rebuild_predict()

    def _set_geometry(self, Z: np.ndarray) -> None:
        """scale and delta (those not given) from these rows."""
        if self.scale is None:
            if Z.shape[0] >= 2:
                s = Z.std(axis=0)
                s = np.where(s > 1e-9 * max(1.0, float(s.max())), s, max(1.0, float(s.max())) * 1e-3)
                self.scale = self._check_scale(s)
            else:
                warnings.warn("IncrementalGMM: scale=None and the first batch has one row; using scale = 1 for"
                              " every coordinate (pass scale= or a first batch of >= 2 rows)", stacklevel=3)
                self.scale = np.ones(self.D)
        if self.delta is None:
            self.delta = self._auto_delta(Z)
            self._resolve_geometry()

    def _resolve_geometry(self) -> None:
        """Fill the defaults that depend on delta and validate the three."""
        if self.reg is None:
            self.reg = REG_PER_DELTA * self.delta
        if self.eig_floor is None:
            self.eig_floor = (0.5 * self.reg) ** 2
        if not 0 < self.eig_floor <= min(self.reg, self.delta) ** 2:
            raise ValueError(f"eig_floor must be in (0, min(reg, delta)^2] = (0, {min(self.reg, self.delta) ** 2:.3g}],"
                             f" got {self.eig_floor}")

    def _auto_delta(self, Z: np.ndarray) -> float:
        """delta = the median scaled distance between consecutive samples of the first
        batch, clipped to [max(reg / 2, sqrt(eig_floor)), 0.3] (0.02 with fewer than 10 rows): a new component
        starts as wide as the stream's step, so it captures its successors; on shuffled
        (i.i.d.) data the step is large and the clip gives broad initial components."""
        if Z.shape[0] < 10:
            d = 0.02
        else:
            step = float(np.median(np.linalg.norm(np.diff(Z, axis=0) / self.scale, axis=1)))
            d = 3.0 * step / np.sqrt(self.threshold)
        lo = 1e-3 if self.eig_floor is None else max(1e-3, float(np.sqrt(self.eig_floor)))
        return float(np.clip(d, lo, DELTA_MAX))

    def _learn_one(self, z: np.ndarray) -> None:
        K = self.K
        if K == 0:
            self._create(z)
            return
        r = np.einsum("kij,j->ki", self.white[:K], z) - self.wmu[:K]
        d2 = np.einsum("ki,ki->k", r, r)
        self.age[:K] += 1.0
        d2min = d2.min()
        novel = d2min >= self.threshold
        if novel:
            e2 = self._nearest2(z, K)
            if K >= self.max_components:   # a new component costs a merge: only an outlier, or
                novel = K >= 2 and (        # a sample far from every mean
                    (d2min >= self.full_threshold and e2 >= self.threshold)
                    or e2 >= FULL_FAR * self.full_threshold)
            else:
                novel = e2 >= self.threshold
        if novel:
            self._create(z)
        else:
            logp = np.log(self.sp[:K]) - 0.5 * self.logdet[:K] - 0.5 * d2
            logp -= logp.max()
            p = np.exp(logp)
            p /= p.sum()
            idx = np.flatnonzero(p > self.post_tol)
            pj = p[idx]
            self.sp[idx] += pj
            w = pj / self.sp[idx]
            e = z - self.mu[idx]                                    # k x D
            self.mu[idx] += w[:, None] * e
            C = self.cov[idx]
            C += w[:, None, None] * np.einsum("ki,kj->kij", e, e)
            C *= (1.0 - w)[:, None, None]
            diagR = (self.reg * self.scale) ** 2
            C[:, np.arange(self.D), np.arange(self.D)] += w[:, None] * diagR
            self.cov[idx] = C
            self._refresh(idx)
        self._prune()

    def _nearest2(self, z: np.ndarray, K: int) -> float:
        """Squared scaled Euclidean distance from z to the nearest component mean, in
        units of delta^2: z is "far" beyond ``threshold`` (the radius of a fresh
        component's novelty ellipsoid: a young, still point-like component always absorbs
        the samples within it)."""
        dz = (z - self.mu[:K]) / self.scale
        return float(np.einsum("ki,ki->k", dz, dz).min()) / self.delta ** 2

    def _create(self, z: np.ndarray) -> None:
        if self.K >= self.max_components:
            self._merge_closest()
        k = self.K
        self.mu[k] = z
        self.cov[k] = np.diag((self.delta * self.scale) ** 2)
        self.sp[k] = 1.0
        self.age[k] = 1.0
        self.K += 1
        self._structural = True
        self.n_created += 1
        self._refresh(np.array([k]))

    def _prune(self) -> None:
        K = self.K
        bad = (self.age[:K] > self.v_min) & (self.sp[:K] < self.sp_min)
        if bad.any() and K - np.count_nonzero(bad) >= 1:
            self._remove(np.flatnonzero(bad))

    def _remove(self, idx) -> None:
        K = self.K
        keep = np.setdiff1d(np.arange(K), idx)
        m = keep.size
        for arr in (self.mu, self.cov, self.sp, self.age, self.white, self.wmu, self.logdet, self._dirty):
            arr[:m] = arr[keep]
        self._mcost[:m, :m] = self._mcost[np.ix_(keep, keep)]
        self.K = m
        self._structural = True
        self.n_removed += K - m

    def _merge_closest(self) -> None:
        """Merge the pair with the smallest Runnalls cost
        B = 0.5 [(wi + wj) logdet S_ij - wi logdet S_i - wj logdet S_j]
        (an upper bound of the KL divergence the merge causes).  Pair costs are cached
        and only recomputed for components that changed since the last merge."""
        K = self.K
        dirty = np.flatnonzero(self._dirty[:K])
        if dirty.size:
            ii = np.repeat(dirty, K)
            jj = np.tile(np.arange(K), dirty.size)
            sel = ii != jj
            ii, jj = ii[sel], jj[sel]
            _, ld, _ = self._merged(ii, jj)
            w = self.sp
            cost = 0.5 * ((w[ii] + w[jj]) * ld - w[ii] * self.logdet[ii] - w[jj] * self.logdet[jj])
            self._mcost[ii, jj] = cost
            self._mcost[jj, ii] = cost
            self._mcost[np.arange(K), np.arange(K)] = np.inf
            self._dirty[:K] = False
        C = self._mcost[:K, :K]
        p = int(np.argmin(C))
        i, j = divmod(p, K)
        i, j = min(i, j), max(i, j)
        mu, _, S = self._merged(np.array([i]), np.array([j]))
        self.mu[i] = mu[0]
        self.cov[i] = S[0]
        self.sp[i] = self.sp[i] + self.sp[j]
        self.age[i] = max(self.age[i], self.age[j])
        self._refresh(np.array([i]))
        self._remove(np.array([j]))
        self.n_removed -= 1          # a merge is not a removal
        self.n_merged += 1

    def _merged(self, ii: np.ndarray, jj: np.ndarray):
        """Moment-matched merges of the pairs (ii, jj): means, log-determinants, covariances."""
        wi, wj = self.sp[ii], self.sp[jj]
        ws = wi + wj
        a, b = wi / ws, wj / ws
        dm = self.mu[ii] - self.mu[jj]
        S = a[:, None, None] * self.cov[ii] + b[:, None, None] * self.cov[jj] \
            + (a * b)[:, None, None] * np.einsum("pi,pj->pij", dm, dm)
        inv_s = 1.0 / self.scale
        _, ld = np.linalg.slogdet(S * np.multiply.outer(inv_s, inv_s))
        ld = ld + 2.0 * np.log(self.scale).sum()
        mu = a[:, None] * self.mu[ii] + b[:, None] * self.mu[jj]
        return mu, ld, S

    def _refresh(self, idx: np.ndarray) -> None:
        """Recompute whitening (inverse Cholesky factor, scaled coordinates) and
        log-determinant of components ``idx``.

        The updates keep every eigenvalue (scaled coordinates) >= ``eig_floor`` by
        construction -- a convex combination of matrices that satisfy it, since
        ``reg^2 >= eig_floor`` and ``delta^2 >= eig_floor`` -- so the floor is only
        enforced explicitly (:meth:`_enforce_floor`) for covariances from outside
        (``from_mixture``, ``load``) or when rounding breaks the Cholesky factorisation."""
        if len(idx) == 0:
            return
        s = self.scale
        inv_s = 1.0 / s
        C = self.cov[idx] * np.multiply.outer(inv_s, inv_s)
        try:
            L = np.linalg.cholesky(C)
        except np.linalg.LinAlgError:
            self._enforce_floor(idx)
            C = self.cov[idx] * np.multiply.outer(inv_s, inv_s)
            L = np.linalg.cholesky(C)
        Linv = np.tril(np.linalg.inv(L))  # (exactly triangular: the transform relies on it)
        W = Linv * inv_s[None, None, :]
        self._dirty[idx] = True
        self._changed.update(int(k) for k in idx)
        self.white[idx] = W
        self.wmu[idx] = np.einsum("kij,kj->ki", W, self.mu[idx])
        self.logdet[idx] = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1) + 2.0 * np.log(s).sum()

    def _enforce_floor(self, idx: np.ndarray) -> None:
        """Clip the eigenvalues of components ``idx`` (scaled coordinates) at ``eig_floor``."""
        if len(idx) == 0:
            return
        s = self.scale
        inv_s = 1.0 / s
        C = self.cov[idx] * np.multiply.outer(inv_s, inv_s)
        C = 0.5 * (C + np.swapaxes(C, 1, 2))
        lam, U = np.linalg.eigh(C)
        rows = np.flatnonzero((lam < self.eig_floor).any(axis=1))
        if rows.size:
            self.n_floored += int(rows.size)
            lam = np.maximum(lam[rows], self.eig_floor)
            C[rows] = np.einsum("kij,kj,klj->kil", U[rows], lam, U[rows])
        self.cov[idx] = C * np.multiply.outer(s, s)

    def min_eigenvalues(self) -> np.ndarray:
        """Smallest eigenvalue of each component's covariance in the scaled coordinates
        ``z / scale`` (>= ``eig_floor`` up to rounding; a diagnostic)."""
        if self.K == 0:
            return np.zeros(0)
        inv_s = 1.0 / self.scale
        C = self.cov[: self.K] * np.multiply.outer(inv_s, inv_s)
        return np.linalg.eigvalsh(0.5 * (C + np.swapaxes(C, 1, 2)))[:, 0]

    # ---------------------------------------------------------------- prediction
    def _predict_parts(self, idx: np.ndarray):
        """Conditioning terms of components ``idx``: inverse Cholesky factor of
        Sigma_ii, regression matrix Sigma_oi Sigma_ii^-1, log prefactor (unnormalised
        weight: the softmax normalises), conditional variances."""
        i = self.input_dim
        C = self.cov[idx]
        Sii, Soi, Soo = C[:, :i, :i], C[:, i:, :i], C[:, i:, i:]
        L = np.linalg.cholesky(Sii)
        Linv = np.linalg.inv(L)                                     # k x i x i
        A = (Soi @ np.swapaxes(Linv, 1, 2)) @ Linv                  # Sigma_oi Sigma_ii^-1
        logdet_ii = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        logc = np.log(self.sp[idx]) - 0.5 * logdet_ii
        cond = np.diagonal(Soo - A @ np.swapaxes(Soi, 1, 2), axis1=1, axis2=2)
        return Linv, A, logc, np.maximum(cond, 0.0)

    def _rebuild_predict(self) -> None:
        """Build the immutable prediction snapshot from the current components (only the
        components changed since the last snapshot are recomputed when the set of
        components is the same)."""
        K, i = self.K, self.input_dim
        changed = self._changed
        self._changed = set()
        if K == 0:
            self._pred = None
            self._structural = False
            return
        snap = self._pred
        if self._structural or snap is None or snap[0] != K or len(changed) > K // 2:
            Linv, A, logc, cond = self._predict_parts(np.arange(K))
        else:
            if not changed:
                return
            idx = np.fromiter(changed, dtype=int)
            _, _, _, logc, cond, Linv, A, _, _ = snap
            Linv, A, logc, cond = Linv.copy(), A.copy(), logc.copy(), cond.copy()
            Linv[idx], A[idx], logc[idx], cond[idx] = self._predict_parts(idx)
        self._structural = False
        self._pred = self._pack(Linv, A, self.mu[:K, :i].copy(), self.mu[:K, i:].copy(), logc, cond)

    def _pack(self, Linv, A, mu_i, mu_o, logc, cond):
        K, i, o = Linv.shape[0], self.input_dim, self.output_dim
        G = np.vstack([Linv.reshape(K * i, i), A.reshape(K * o, i)])
        off = np.concatenate([np.einsum("kij,kj->ki", Linv, mu_i).ravel(),
                              (np.einsum("koi,ki->ko", A, mu_i) - mu_o).ravel()])
        GT = np.ascontiguousarray(G.T)
        # keep the parts for the transform (A, mu_i, mu_o, Linv) alongside the stacked form
        return (K, GT, off, logc, cond, Linv, A, mu_i, mu_o)

    def _predict(self, X: np.ndarray, return_var: bool):
        N, o = X.shape[0], self.output_dim
        snap = self._pred
        if snap is None:
            mean = np.zeros((N, o))
            return mean, (np.full((N, o), np.inf) if return_var else None), np.zeros(N)
        K, GT, off, logc, cond = snap[:5]
        i = self.input_dim
        mean = np.empty((N, o))
        var = np.empty((N, o)) if return_var else None
        support = np.empty(N)
        chunk = max(1, 65536 // (K * (i + o)))
        for s0 in range(0, N, chunk):
            Xc = X[s0: s0 + chunk]
            n = Xc.shape[0]
            Rr = Xc @ GT
            Rr -= off
            Zi = Rr[:, : K * i].reshape(n, K, i)
            d2 = np.einsum("nki,nki->nk", Zi, Zi)        # squared Mahalanobis distance to each component
            d2min = d2.min(axis=1)
            outside = np.count_nonzero(d2min > self._outside_d2)
            if outside:
                self.n_queries_outside += int(outside)
            # support: the chi^2 tail probability of the nearest component, relative to the
            # outside level (1 inside it, falling continuously to 0 beyond)
            support[s0: s0 + n] = np.minimum(1.0, gammaincc(0.5 * i, 0.5 * d2min) / OUTSIDE_LEVEL)
            m = logc - 0.5 * d2
            m -= m.max(axis=1, keepdims=True)
            h = np.exp(m)
            h /= h.sum(axis=1, keepdims=True)
            Yk = Rr[:, K * i:].reshape(n, K, o)
            yc = np.einsum("nk,nko->no", h, Yk)
            mean[s0: s0 + n] = yc
            if return_var:
                var[s0: s0 + n] = h @ cond + np.einsum("nk,nko->no", h, Yk * Yk) - yc * yc
        if return_var:
            np.maximum(var, 0.0, out=var)
        return mean, var, support

    # ---------------------------------------------------------------- consistency
    def _transform(self, dpi: np.ndarray, model) -> None:
        K, i = self.K, self.input_dim
        ev = ParameterChange.for_model(model).set(dpi)
        if self._buf:                                  # warm-up rows: move their targets exactly
            Z = np.concatenate(self._buf)
            Z[:, i:] -= ev.jacobians(Z[:, :i])[0]
            self._buf = [Z]
        if K == 0:
            return
        g, J = ev.jacobians(self.mu[:K, :i])
        self.apply_output_shift(g, J)

    def apply_output_shift(self, g: np.ndarray, J: np.ndarray) -> None:
        """Shift the learned function by ``-g`` with ``g`` (K x out) and ``J = dg/dx``
        (K x out x in) evaluated at the component input means ``means[:, :input_dim]``
        (eq. 16-19).  :meth:`apply_parameter_update` calls this with g = Y(mu_i) dpi."""
        K, i = self.K, self.input_dim
        g = np.asarray(g, dtype=float).reshape(K, self.output_dim)
        J = np.asarray(J, dtype=float).reshape(K, self.output_dim, i)
        mu, _ = transform_gaussians(self.mu[:K], self.cov[:K], i, g, J, inplace=True)
        # whitening: Sigma' = T Sigma T^T  ->  white' = white T^-1, T^-1 = [[I, 0], [J, I]];
        # white is lower triangular, so only its output rows change (white_oi += white_oo J),
        # and of white @ mu only the output rows
        Wo = self.white[:K, i:]
        Wo[:, :, :i] += Wo[:, :, i:] @ J
        # (the cached merge costs are left as they are: a heuristic ranking, refreshed
        # when a component is next updated; recomputing all K^2 pairs here would cost
        # tens of ms per transform)
        self.wmu[:K, i:] = (Wo @ mu[:, :, None])[:, :, 0]
        # prediction: Sigma_ii and the conditional covariance are unchanged, A <- A - J
        snap = self._pred
        if snap is not None and snap[0] == K:
            # the new snapshot's A rows of GT and offsets follow from A' = A - J,
            # mu_o' = mu_o - g: GT_A -= J^T, off_A' = A' mu_i - mu_o' = off_A - J mu_i + g
            # (a new snapshot: readers may still hold the old one)
            _, GT, off, logc, cond, Linv, A, mu_i, mu_o = snap
            o = self.output_dim
            GT = GT.copy()
            GT[:, K * i:] -= J.reshape(K * o, i).T
            off = off.copy()
            off[K * i:] += (g - np.einsum("koi,ki->ko", J, mu_i)).ravel()
            self._pred = (K, GT, off, logc, cond, Linv, A - J, mu_i, mu[:, i:].copy())
        else:  # pragma: no cover - the snapshot always matches after _fit
            self._rebuild_predict()

    # ---------------------------------------------------------------- persistence
    def _get_arrays(self) -> Dict[str, np.ndarray]:
        K = self.K
        out = {"mu": self.mu[:K], "cov": self.cov[:K], "sp": self.sp[:K], "age": self.age[:K],
               "scale": self.scale if self.scale is not None else np.zeros(0)}
        if self._buf:
            out["buf_Z"] = np.concatenate(self._buf)
        return out

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        mu = np.asarray(arrays["mu"], dtype=float)
        K = mu.shape[0]
        if K > self.max_components or mu.shape[1:] != (self.D,):
            raise ValueError(f"saved mixture has shape {mu.shape}, expected (<= {self.max_components}, {self.D})")
        scale = np.asarray(arrays["scale"], dtype=float)
        self.scale = self._check_scale(scale) if scale.size else None
        self.K = K
        self.mu[:K] = mu
        self.cov[:K] = arrays["cov"]
        self.sp[:K] = arrays["sp"]
        self.age[:K] = arrays["age"]
        buf = np.asarray(arrays.get("buf_Z", np.zeros((0, self.D))), dtype=float)
        if buf.ndim != 2 or buf.shape[1] != self.D or not np.isfinite(buf).all():
            raise ValueError(f"saved warm-up rows have shape {buf.shape}, expected (N, {self.D}) finite")
        self._buf = [buf] if buf.shape[0] else []
        if K:
            self._enforce_floor(np.arange(K))
            self._refresh(np.arange(K))
        self._rebuild_predict()

    def memory_bytes(self) -> int:
        arrays = [self.mu, self.cov, self.sp, self.age, self.white, self.wmu, self.logdet]
        total = sum(a.nbytes for a in arrays)
        if self._pred is not None:
            total += sum(a.nbytes for a in self._pred[1:] if isinstance(a, np.ndarray))
        return int(total)

    def input_means(self) -> np.ndarray:
        return self.mu[: self.K, : self.input_dim].copy()

