"""Radial basis function network with recursive least squares (ARDL eq. 4-9) and the
semi-parametric consistency transform by parameter sensitivity (ARDL eq. 13-14).

Model: ``f(x) = W^T theta(x)``, ``theta_k(x) = exp(-beta |x~ - c_k|^2)`` with the input
mapped to the unit box, ``x~ = (x - low) / (high - low)``, ``beta = 1 / (2 width^2)``,
and the K centres ``c_k`` the first K points of a scrambled Sobol sequence
(``scipy.stats.qmc.Sobol``) -- ARDL spreads its 2048 centres the same way.

Learning: recursive least squares with covariance P (eq. 8-9), optionally with a
forgetting factor ``lam``.  A batch of m samples is absorbed in one *block* update
(Woodbury), algebraically identical to m sequential updates:

    S = lam^m L^-1 + Theta P Theta^T      (L = diag(lam^(m-1-r)), m x m)
    G = P Theta^T S^-1                    (K x m)
    W <- W + G (Y - Theta W),   P <- lam^-m (P - G Theta P)

so with ``lam = 1`` the weights equal the regularised batch least-squares solution
``(Theta^T Theta + reg I)^-1 Theta^T Y`` (``P0 = I / reg``, ``W0 = 0``) on all data seen,
whatever the batching (tested).  P (and dW/dpi) are updated in place with BLAS rank-1
(``dger``) / rank-m (``dgemm``) updates.  Cost (Panda: 21 inputs, 7 outputs, dW/dpi for
70 parameters; measured by ``bench/learners.py`` on the 2-core VM): K = 512: ~0.3 ms per
single-sample update (0.1 ms per sample in blocks), P 2 MB; K = 2048: ~4 ms per single
sample (~1 ms per sample in blocks of 256), P 32 MB, dW/dpi 8 MB -- so at 2048 basis
functions learn at a decimated rate (<= ~200 Hz, or buffer samples and learn in blocks
on the worker thread).  Prediction is ~K i flops: 15-25 us per query at either size.

Consistency (ARDL eq. 13-14): the target is ``y = tau - Y pi_hat``, and RLS is linear
in its targets, so ``D = dW/dpi_hat`` (K x n_out x n_params) obeys the same recursion
with targets ``-Y`` (eq. 14) -- it is learnt as extra output columns of the same RLS.
A parameter change then moves the weights exactly as if every past sample had been
learnt with the new target: ``W <- W + D dpi`` (the network equals one trained on
``y - Y dpi``; tested).  Enable with ``n_params > 0``; ``partial_fit`` then needs
the regressors of the samples (``regressors=`` or ``model=`` to evaluate them from
x = (q, qd, qdd)).

Out of the box on real data (``low``/``high`` not given, ``bias``, ``standardize``): the
first ``warmup`` samples are buffered (however they arrive: the same samples give the
same network whatever the batch sizes), then the input box is their range widened by
``box_margin`` of the span on each side (at least 0.1 wide per input), the targets are
standardised with their mean and standard deviation (the network learns ``(y - mean) /
std``: a joint with a large mean torque costs the ridge nothing), and a constant basis
function (``bias``) takes the offset that is left; then the buffer is learnt.  Until
then :meth:`predict` gives 0 with infinite variance.  A warm-up rarely spans the whole
workspace, so a box from the data **grows** (``grow``): a learnt sample beyond it (by
more than half a basis width, which the Gaussians still cover) widens the box to the
samples' range plus half of it on every side (``GROW_MARGIN``),
the centres are spread over the new box and the network is refitted from a uniform
reservoir of the samples learnt so far (``memory`` samples, Vitter's algorithm R with
draws that depend on the sample's position only, so batching does not matter; with the
consistency transform their regressors too, so the refit stays consistent) -- growths
become rare once the workspace is covered (``n_box_growths``).  After a growth
the weights are the regularised least squares on the reservoir rather than on every
sample.  Queries outside the box are counted (``n_queries_outside``): the Gaussians
decay there and the network predicts the mean.  A given box does not grow; samples
learnt outside it are counted (``n_outside_box``, with a warning the first time).
``bias=False, standardize=False`` with an explicit box is ARDL's plain network.

Predictive variance: Bayesian linear regression reading of RLS (prior W ~ N(0,
sigma^2 / reg), noise sigma^2): ``var = sigma_o^2 (1 + theta^T P theta)`` with sigma_o^2
the running mean of the squared a-priori residuals divided by (1 + theta^T P theta)
(K^2 flops per query).

Support (:meth:`~.base.Learner.support`): ``q(x) = theta^T P theta`` is the posterior
variance of f(x) in units of the noise variance -- about K_eff / N where the data are
dense, growing without bound off them, where the fitted weights are unconstrained
combinations that the learnt samples never tested -- and ``s(x) = exp(-q^2 / 2)``: 1
while the network knows f(x) better than one measurement does (q << 1), 0.61 at q = 1,
below 0.011 beyond q = 3.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.linalg.blas import dgemm as _dgemm
from scipy.linalg.blas import dger as _dger
from scipy.stats import qmc

from .base import Learner, register, split_state

__all__ = ["RBFNetwork", "regressors_for"]

#: symmetrise P after this many rank updates (rounding drift of the in-place updates)
_SYMMETRISE_EVERY = 256
#: a growing box widens by at least this fraction of the samples' range on every side, so
#: that a motion widening gradually costs a few refits rather than one per new extreme
GROW_MARGIN = 0.5


def _uniform(i: np.ndarray, seed: int) -> np.ndarray:
    """A uniform [0, 1) number per sample index (splitmix64 of index and seed): the
    reservoir's draws depend on the sample's position in the stream only."""
    with np.errstate(over="ignore"):
        z = (i.astype(np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % 2 ** 64)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(float) / float(2 ** 53)


def regressors_for(X: np.ndarray, regressors, model, n: int, n_params: int, who: str) -> np.ndarray:
    """The regressors of the rows of X (N x n x n_params): ``regressors`` checked, or
    evaluated by ``model`` at x = (q, qd, qdd) (a row with a NaN/inf gets NaN)."""
    N, o, p = X.shape[0], n, n_params
    if regressors is not None:
        R = np.asarray(regressors, dtype=float)
        if R.ndim == 2:
            R = R[None]
        if R.shape != (N, o, p):
            raise ValueError(f"regressors: expected shape ({N}, {o}, {p}), got {R.shape}")
        return R
    if model is None:
        raise ValueError(f"{who} carries dW/dpi (n_params > 0): pass regressors= (N x n x n_params)"
                         " or model= (to evaluate Y at x = (q, qd, qdd))")
    if model.n_params != p or model.n != o:
        raise ValueError(f"model has n={model.n}, n_params={model.n_params}; {who} expects {o}, {p}")
    q, v, a = split_state(X, model.n)
    R = np.full((N, o, p), np.nan)
    ok = np.isfinite(X).all(axis=1)
    for r in np.flatnonzero(ok):
        R[r] = model.regressor(q[r], v[r], a[r])
    return R


@register
class RBFNetwork(Learner):
    """Gaussian RBF network, (block) RLS, optional parameter sensitivity.

    Parameters
    ----------
    input_dim, output_dim:
        Sizes of x and y.
    n_basis:
        Number of Gaussian basis functions K (a power of two keeps the Sobol points
        balanced).
    low, high:
        The input box (input_dim values each) the centres are spread over; inputs are
        scaled by it.  Inputs outside the box are allowed (the basis functions decay),
        and counted.  Not given: the range of the first ``warmup`` samples, widened by
        ``box_margin`` of the span on each side.
    width:
        Basis width in unit-box coordinates (``beta = 1 / (2 width^2)``).
    reg:
        Ridge regulariser: ``P0 = I / reg``.
    forgetting:
        RLS forgetting factor lam in (0, 1] (1 = none).  With lam < 1 and poorly exciting
        data P grows (wind-up); keep it close to 1.
    n_params:
        Length of pi to carry the sensitivity dW/dpi for (0 = no consistency transform).
    normalize:
        Normalised RBF (theta / sum theta) instead of ARDL's plain Gaussians.
    seed:
        Seed of the Sobol scrambling.
    block_size:
        Largest block absorbed in one RLS update (memory ~ block_size x K).
    bias:
        Add a constant basis function (K + 1 features).
    standardize:
        Learn the targets standardised by the mean and standard deviation of the first
        ``warmup`` samples.
    warmup:
        Samples buffered before the first update when the box or the target scaling
        come from the data.
    box_margin:
        Widening of the warm-up range on each side, as a fraction of its span.
    grow:
        A box from the data grows to take samples outside it (refit from the reservoir).
    memory:
        Reservoir size for the refits of a growing box.
    """

    kind = "rbfn"
    #: constructor arguments of files written before they existed (the plain network)
    LEGACY_CONFIG = {"bias": False, "standardize": False}

    def __init__(self, input_dim: int, output_dim: int, *, n_basis: int = 512, low=None, high=None,
                 width: float = 0.5, reg: float = 1e-3, forgetting: float = 1.0, n_params: int = 0,
                 normalize: bool = False, seed: int = 0, block_size: int = 256, bias: bool = True,
                 standardize: bool = True, warmup: int = 200, box_margin: float = 0.2, grow: bool = True,
                 memory: int = 4096):
        super().__init__(input_dim, output_dim)
        i = self.input_dim
        self.n_basis = int(n_basis)
        if self.n_basis < 1:
            raise ValueError(f"n_basis must be >= 1, got {n_basis}")
        if (low is None) != (high is None):
            raise ValueError("give both low and high (the input box) or neither (the box from the warm-up data)")
        self.box_from_data = low is None
        if self.box_from_data:
            low, high = -np.ones(i), np.ones(i)        # placeholders until the warm-up data arrive
        low = np.broadcast_to(np.asarray(low, dtype=float), (i,)).copy()
        high = np.broadcast_to(np.asarray(high, dtype=float), (i,)).copy()
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
            raise ValueError("the input box needs finite low < high in every coordinate")
        self.low, self.high = low, high
        self.bias = bool(bias)
        self.standardize = bool(standardize)
        self.warmup = max(1, int(warmup))
        self.box_margin = float(box_margin)
        if not self.box_margin >= 0:
            raise ValueError(f"box_margin must be >= 0, got {box_margin}")
        self.n_features = self.n_basis + int(self.bias)
        self.ready = not (self.box_from_data or self.standardize)
        self.y_mean, self.y_scale = np.zeros(self.output_dim), np.ones(self.output_dim)
        self._buf: list = []                           # warm-up: (X, y, R) blocks
        self.n_outside_box = 0
        self.n_queries_outside = 0
        self._warned_outside = False
        self.grow = bool(grow) and self.box_from_data
        self.memory = max(1, int(memory))
        self.n_box_growths = 0
        self._refitting = False
        self._pred = None
        self._seen = 0                                 # samples offered to the reservoir
        self._res_X = self._res_y = self._res_R = None  # reservoir (raw targets)
        self.width = float(width)
        self.reg = float(reg)
        self.forgetting = float(forgetting)
        if not self.width > 0 or not self.reg > 0:
            raise ValueError(f"width and reg must be > 0, got {width}, {reg}")
        if not 0.0 < self.forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        self.n_params = int(n_params)
        self.normalize = bool(normalize)
        self.seed = int(seed)
        self.block_size = max(1, int(block_size))
        self.beta = 1.0 / (2.0 * self.width ** 2)

        sob = qmc.Sobol(d=i, scramble=True, seed=self.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # balance warning for K not a power of 2
            self.centres = sob.random(self.n_basis)                     # unit-box coordinates, K x i
        self._init_state()

    def _init_state(self) -> None:
        K, o = self.n_features, self.output_dim
        self.W = np.zeros((K, o))
        self.P = np.eye(K) / self.reg
        self.D = np.zeros((K, o * self.n_params)) if self.n_params else None
        self.noise_var = np.zeros(o)
        self._nv_count = 0.0
        self._n_rank_updates = 0
        self._refresh_geometry()
        self._snapshot(self.W)

    def _snapshot(self, W: np.ndarray) -> None:
        """The prediction snapshot (swapped atomically; a predicting thread never sees a
        half-changed network): W, P, the noise variance, the mean's weights in the
        target's units -- the Gaussians' ``W[:K] * std`` and the constant
        ``W[K] * std + mean`` (bias and standardisation folded in) -- and the geometry
        (box, centres) they belong to.  None until the warm-up has been learnt; not
        refreshed while a growing box refits (the previous network answers meanwhile)."""
        if not self.ready or self._refitting:
            return
        K = self.n_basis
        Wg = W[:K] * self.y_scale
        const = self.y_mean + (W[K] * self.y_scale if self.bias else 0.0)
        geo = (self.low.copy(), self._inv_span.copy(), self._Ct2, self._cnorm)
        self._pred = (W, self.P, self.noise_var * self.y_scale ** 2, Wg, const, geo)

    def _counters(self) -> Dict[str, int]:
        return {**super()._counters(), "n_outside_box": self.n_outside_box,
                "n_queries_outside": self.n_queries_outside, "n_box_growths": self.n_box_growths}

    def _refresh_geometry(self) -> None:
        i = self.input_dim
        self._inv_span = 1.0 / (self.high - self.low)
        # theta = exp(-beta |x~ - c|^2) = exp(2 beta c.x~ - beta |x~|^2 - beta |c|^2):
        # one GEMV with Ct2 = 2 beta c^T applied to x~
        self._Ct2 = np.ascontiguousarray(2.0 * self.beta * self.centres.T)   # i x K
        self._cnorm = self.beta * np.einsum("ki,ki->k", self.centres, self.centres)
        assert self._Ct2.shape == (i, self.n_basis)

    @property
    def uses_regressors(self) -> bool:  # type: ignore[override]
        return self.n_params > 0

    def get_config(self) -> Dict[str, Any]:
        box = {} if self.box_from_data else {"low": self.low.tolist(), "high": self.high.tolist()}
        return {"input_dim": self.input_dim, "output_dim": self.output_dim, "n_basis": self.n_basis,
                **box, "width": self.width, "reg": self.reg,
                "forgetting": self.forgetting, "n_params": self.n_params, "normalize": self.normalize,
                "seed": self.seed, "block_size": self.block_size, "bias": self.bias,
                "standardize": self.standardize, "warmup": self.warmup, "box_margin": self.box_margin,
                "grow": self.grow, "memory": self.memory}

    # ------------------------------------------------------------------ features
    def _gaussians(self, X: np.ndarray, geo=None) -> tuple:
        """``(theta, x~)``: the K Gaussians at the rows of X and the unit-box coordinates
        (``geo``: a snapshot's box and centres, default the current ones)."""
        low, inv_span, Ct2, cnorm = geo or (self.low, self._inv_span, self._Ct2, self._cnorm)
        Xs = (np.atleast_2d(X) - low) * inv_span
        E = Xs @ Ct2
        E -= cnorm
        E -= self.beta * np.einsum("ni,ni->n", Xs, Xs)[:, None]
        np.exp(E, out=E)
        if self.normalize:
            E /= np.maximum(E.sum(axis=1, keepdims=True), 1e-300)
        return E, Xs

    def features(self, X: np.ndarray) -> np.ndarray:
        """theta(x) for the rows of X (N x K, then the constant 1 with ``bias``)."""
        E = self._gaussians(X)[0]
        if self.bias:
            E = np.concatenate([E, np.ones((E.shape[0], 1))], axis=1)
        return E

    def _outside(self, X: np.ndarray) -> int:
        """Rows beyond the box by more than :meth:`_grow_tolerance` (what the Gaussians cover)."""
        tol = self._grow_tolerance()
        return int(np.count_nonzero(((X < self.low - tol) | (X > self.high + tol)).any(axis=1)))

    # ------------------------------------------------------------------ learning
    def _regressors(self, X, regressors, model) -> Optional[np.ndarray]:
        return regressors_for(X, regressors, model, self.output_dim, self.n_params, "this RBFNetwork")

    def _fit(self, X: np.ndarray, y: np.ndarray, R: Optional[np.ndarray]) -> None:
        if not self.ready:
            self._buf.append((X.copy(), y.copy(), None if R is None else R.copy()))
            if sum(b[0].shape[0] for b in self._buf) < self.warmup:
                return
            X = np.concatenate([b[0] for b in self._buf])
            y = np.concatenate([b[1] for b in self._buf])
            R = None if R is None else np.concatenate([b[2] for b in self._buf])
            self._buf = []
            self._finish_warmup(X[: self.warmup], y[: self.warmup])   # the first `warmup`: batch sizes do not matter
        while self.grow and X.shape[0]:              # in sample order: the result does not depend on batching
            tol = self._grow_tolerance()
            outside = ((X < self.low - tol) | (X > self.high + tol)).any(axis=1)
            k = int(np.argmax(outside)) if outside.any() else X.shape[0]
            if k:
                self._remember(X[:k], y[:k], None if R is None else R[:k])
                self._learn(X[:k], y[:k], None if R is None else R[:k])
            if k == X.shape[0]:
                return
            kept = self._remember(X[k:k + 1], y[k:k + 1], None if R is None else R[k:k + 1])
            self._grow(X[k])                           # refit from the reservoir
            if not kept:                               # (a full reservoir may not keep it: learn it on top)
                self._learn(X[k:k + 1], y[k:k + 1], None if R is None else R[k:k + 1])
            X, y, R = X[k + 1:], y[k + 1:], None if R is None else R[k + 1:]
        if not X.shape[0]:
            return
        out = self._outside(X)
        if out:
            self.n_outside_box += out
            if not self._warned_outside:
                self._warned_outside = True
                warnings.warn(f"RBFNetwork: {out} of {X.shape[0]} learnt samples lie outside the input box (the"
                              " basis functions decay there: widen low/high or the warm-up); counted in"
                              " n_outside_box", RuntimeWarning, stacklevel=3)
        self._learn(X, y, R)

    def _learn(self, X: np.ndarray, y: np.ndarray, R: Optional[np.ndarray]) -> None:
        """RLS on raw targets (standardised here), in blocks."""
        y = (y - self.y_mean) / self.y_scale
        if R is not None:
            R = R / self.y_scale[None, :, None]
        for s0 in range(0, X.shape[0], self.block_size):
            sl = slice(s0, s0 + self.block_size)
            self._block(X[sl], y[sl], None if R is None else R[sl])

    def _remember(self, X: np.ndarray, y: np.ndarray, R: Optional[np.ndarray]) -> bool:
        """Vitter's algorithm R: a uniform sample of every learnt sample, ``memory`` at
        most.  Returns whether the last of these samples is in the reservoir."""
        if self._res_X is None:
            self._res_X = np.empty((0, self.input_dim))
            self._res_y = np.empty((0, self.output_dim))
            self._res_R = None if R is None else np.empty((0,) + R.shape[1:])
        free = self.memory - self._res_X.shape[0]
        if free > 0:
            k = min(free, X.shape[0])
            self._res_X = np.concatenate([self._res_X, X[:k]])
            self._res_y = np.concatenate([self._res_y, y[:k]])
            if self._res_R is not None:
                self._res_R = np.concatenate([self._res_R, R[:k]])
            self._seen += k
            X, y, R = X[k:], y[k:], None if R is None else R[k:]
        last_kept = True
        if X.shape[0]:                                 # slot of sample i: floor(u_i (i + 1)), u_i a hash of i
            i = self._seen + np.arange(X.shape[0], dtype=np.uint64)
            j = np.floor(_uniform(i, self.seed) * (i + 1).astype(float)).astype(np.int64)
            keep = j < self.memory
            self._res_X[j[keep]] = X[keep]
            self._res_y[j[keep]] = y[keep]
            if self._res_R is not None:
                self._res_R[j[keep]] = R[keep]
            self._seen += X.shape[0]
            last_kept = bool(keep[-1])
        return last_kept

    @property
    def _unit_tolerance(self) -> float:
        """How far beyond the box (in box units) a sample may lie before the box grows:
        half a basis width, at most a quarter of the box -- the Gaussians still cover it."""
        return min(0.5 * self.width, 0.25)

    def _grow_tolerance(self) -> np.ndarray:
        return self._unit_tolerance * (self.high - self.low)

    def _grow(self, x: np.ndarray) -> None:
        """Widen the box to the reservoir's range and ``x`` (the sample beyond it) plus
        ``GROW_MARGIN`` of that range on every side, spread the centres over it and refit
        from the reservoir; the prediction snapshot is swapped once, at the end."""
        lo = np.minimum(self._res_X.min(axis=0), x)
        hi = np.maximum(self._res_X.max(axis=0), x)
        span = np.maximum(hi - lo, 0.1)
        m = max(self.box_margin, GROW_MARGIN)      # every side at once: one growth, not one per input and side
        self.low = np.minimum(self.low, lo - m * span)
        self.high = np.maximum(self.high, hi + m * span)
        self._refitting = True
        try:
            self._init_state()                     # new geometry, empty RLS (no snapshot while refitting)
            self._learn(self._res_X, self._res_y, self._res_R)
        finally:
            self._refitting = False
        self._snapshot(self.W)
        self.n_box_growths += 1

    def _finish_warmup(self, X: np.ndarray, y: np.ndarray) -> None:
        """Box and target scaling from the warm-up samples (see the module docstring)."""
        if self.box_from_data:
            lo, hi = X.min(axis=0), X.max(axis=0)
            span = np.maximum(hi - lo, 0.1)
            mid = 0.5 * (lo + hi)
            lo, hi = np.minimum(lo, mid - 0.05), np.maximum(hi, mid + 0.05)
            self.low, self.high = lo - self.box_margin * span, hi + self.box_margin * span
            self._refresh_geometry()
        if self.standardize:
            self.y_mean = y.mean(axis=0)
            sd = y.std(axis=0)
            self.y_scale = np.where(sd > 1e-9 * (1.0 + np.abs(self.y_mean)), sd, 1.0)
        self.ready = True

    def _block(self, X, y, R) -> None:
        m, o = X.shape[0], self.output_dim
        Th = self.features(X)                                  # m x K
        P, W, lam = self.P, self.W, self.forgetting
        PT = P @ Th.T                                          # K x m  (= (Theta P)^T, P symmetric)
        S = Th @ PT                                            # m x m
        if lam < 1.0:
            S[np.diag_indices(m)] += lam ** m / lam ** np.arange(m - 1, -1, -1)
        else:
            S[np.diag_indices(m)] += 1.0
        if m == 1:
            G = PT / S[0, 0]                                   # K x 1  (P theta / (lam + theta^T P theta))
        else:
            cf = cho_factor(S, lower=True, check_finite=False)
            G = cho_solve(cf, np.ascontiguousarray(PT.T), check_finite=False).T   # K x m (P Theta^T S^-1)
        err = y - Th @ W                                       # a-priori residuals
        inflation = 1.0 + np.einsum("mk,km->m", Th, PT)
        self._update_noise(err, inflation)
        W_new = W + G @ err                                    # a new array: predict's snapshot swaps
        # P <- (P - G PT^T) / lam^m in place (BLAS, no K x K temporary); P is symmetric,
        # so its C-ordered buffer is also P in Fortran order
        Pf = P.T
        if m == 1:
            out = _dger(-1.0, G[:, 0], PT[:, 0], a=Pf, overwrite_a=True)
        else:
            out = _dgemm(-1.0, G, PT.T, beta=1.0, c=Pf, overwrite_c=True)
        if not np.shares_memory(out, P):                       # pragma: no cover - BLAS made a copy
            P[...] = out.T
        if lam < 1.0:
            P *= lam ** -m
        self._n_rank_updates += m
        if self._n_rank_updates >= _SYMMETRISE_EVERY:          # rounding drift: symmetrise now and then
            P += P.T
            P *= 0.5
            self._n_rank_updates = 0
        if self.D is not None:                                 # dW/dpi: same RLS, targets -Y (ARDL eq. 14)
            E = -R.reshape(m, o * self.n_params)
            E -= Th @ self.D
            Df = self.D.T                                      # D += G E in place, Fortran view
            if m == 1:
                out = _dger(1.0, E[0], G[:, 0], a=Df, overwrite_a=True)
            else:
                out = _dgemm(1.0, E.T, G.T, beta=1.0, c=Df, overwrite_c=True)
            if not np.shares_memory(out, self.D):              # pragma: no cover - BLAS made a copy
                self.D[...] = out.T
        self.W = W_new
        self._snapshot(W_new)

    def _update_noise(self, err, inflation) -> None:
        e2 = (err * err) / inflation[:, None]
        n_old = self._nv_count
        n_new = n_old + e2.shape[0]
        self.noise_var = (self.noise_var * n_old + e2.sum(axis=0)) / n_new
        self._nv_count = min(n_new, 1e4)  # effective memory: the last ~10^4 samples

    # ------------------------------------------------------------------ prediction
    def _predict(self, X: np.ndarray, return_var: bool):
        N = X.shape[0]
        snap = self._pred
        if snap is None:
            return (np.zeros((N, self.output_dim)), (np.full((N, self.output_dim), np.inf) if return_var else None),
                    np.zeros(N))
        W, P, nv, Wg, const, geo = snap
        tol = self._unit_tolerance
        mean = np.empty((N, self.output_dim))
        var = np.empty((N, self.output_dim)) if return_var else None
        support = np.empty(N)
        K = self.n_basis
        chunk = max(1, 262144 // self.n_basis)
        for s0 in range(0, N, chunk):
            E, Xs = self._gaussians(X[s0: s0 + chunk], geo)
            if Xs.min() < -tol or Xs.max() > 1.0 + tol:          # queries beyond the data's region
                self.n_queries_outside += int(np.count_nonzero(((Xs < -tol) | (Xs > 1.0 + tol)).any(axis=1)))
            m = mean[s0: s0 + E.shape[0]]
            np.matmul(E, Wg, out=m)
            m += const
            Th = np.empty((E.shape[0], P.shape[0]))
            Th[:, :K] = E
            if self.bias:
                Th[:, K] = 1.0
            q = ((Th @ P) * Th).sum(axis=1)             # posterior variance of f(x) / noise variance (K^2)
            if return_var:
                var[s0: s0 + E.shape[0]] = np.outer(1.0 + q, nv)
            support[s0: s0 + E.shape[0]] = np.exp(-0.5 * q * q)
        return mean, var, support

    # ------------------------------------------------------------------ consistency
    def _transform(self, dpi: np.ndarray, model) -> None:
        if self.D is None:
            raise ValueError("this RBFNetwork does not carry dW/dpi: build it with n_params = model.n_params")
        if dpi.shape != (self.n_params,):
            raise ValueError(f"delta_pi has {dpi.size} entries, the network carries {self.n_params}")
        if not self.ready:                            # warm-up buffer: move its targets exactly
            self._buf = [(X, y - np.einsum("nop,p->no", R, dpi), R) for X, y, R in self._buf]
            return
        if self._res_R is not None:                   # the reservoir a growth refits from, likewise
            self._res_y = self._res_y - np.einsum("nop,p->no", self._res_R, dpi)
        K, o = self.n_features, self.output_dim
        dW = (self.D.reshape(K * o, self.n_params) @ dpi).reshape(K, o)
        self.W = self.W + dW
        self._snapshot(self.W)

    # ------------------------------------------------------------------ persistence
    def _get_arrays(self) -> Dict[str, np.ndarray]:
        out = {"W": self.W, "P": self.P, "noise_var": self.noise_var, "centres": self.centres,
               "nv_count": np.array(self._nv_count), "box": np.vstack([self.low, self.high]),
               "y_scaling": np.vstack([self.y_mean, self.y_scale]), "ready": np.array(self.ready)}
        if self.D is not None:
            out["D"] = self.D
        if self._res_X is not None:
            out["res_X"], out["res_y"], out["res_seen"] = self._res_X, self._res_y, np.array(self._seen)
            if self._res_R is not None:
                out["res_R"] = self._res_R
        if self._buf:
            out["buf_X"] = np.concatenate([b[0] for b in self._buf])
            out["buf_y"] = np.concatenate([b[1] for b in self._buf])
            if self._buf[0][2] is not None:
                out["buf_R"] = np.concatenate([b[2] for b in self._buf])
        return out

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        K, o = self.n_features, self.output_dim
        if "box" in arrays:
            box = np.asarray(arrays["box"], dtype=float)
            ys = np.asarray(arrays["y_scaling"], dtype=float)
            if box.shape != (2, self.input_dim) or ys.shape != (2, o) or not (box[1] > box[0]).all():
                raise ValueError(f"saved network has an input box {box.shape} / target scaling {ys.shape}")
            self.low, self.high = box[0].copy(), box[1].copy()
            self.y_mean, self.y_scale = ys[0].copy(), ys[1].copy()
            self.ready = bool(arrays["ready"])
        self._res_X = self._res_y = self._res_R = None
        if "res_X" in arrays:
            self._res_X = np.asarray(arrays["res_X"], dtype=float).copy()
            self._res_y = np.asarray(arrays["res_y"], dtype=float).copy()
            self._seen = int(arrays["res_seen"])
            if "res_R" in arrays:
                self._res_R = np.asarray(arrays["res_R"], dtype=float).copy()
        self._buf = []
        if "buf_X" in arrays:
            self._buf = [(np.asarray(arrays["buf_X"], dtype=float), np.asarray(arrays["buf_y"], dtype=float),
                          np.asarray(arrays["buf_R"], dtype=float) if "buf_R" in arrays else None)]
        W = np.asarray(arrays["W"], dtype=float)
        P = np.asarray(arrays["P"], dtype=float)
        if W.shape != (K, o) or P.shape != (K, K):
            raise ValueError(f"saved network has W {W.shape}, P {P.shape}; expected ({K}, {o}), ({K}, {K})")
        self.centres = np.asarray(arrays["centres"], dtype=float)
        self._refresh_geometry()
        self.W, self.P = W.copy(), P.copy()
        self.noise_var = np.asarray(arrays["noise_var"], dtype=float).copy()
        self._nv_count = float(arrays["nv_count"])
        if self.n_params:
            self.D = np.asarray(arrays["D"], dtype=float).copy()
        self._snapshot(self.W)

    def memory_bytes(self) -> int:
        arrays = [self.W, self.P, self.centres, self._Ct2, self._cnorm, self.noise_var, self.low, self.high]
        if self.D is not None:
            arrays.append(self.D)
        arrays += [a for a in (self._res_X, self._res_y, self._res_R) if a is not None]
        arrays += [a for b in self._buf for a in b if a is not None]
        return int(sum(a.nbytes for a in arrays))
