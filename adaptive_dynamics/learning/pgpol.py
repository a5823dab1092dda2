"""PGPOL: parallel drifting sparse GPs with a database (Habich et al. 2019, sec. II-B and
III, Fig. 1-2, eq. 7-9); SGPOL is the same with one GP.

The data stream (x_t, y_t) feeds ``k`` sparse GPs (:class:`~.sparse_gp.SparseGP`, DTC,
eq. 4-5) that drift along it, GP i trained on the newest ``windows[i]`` samples (FIFO).

* **Database** (Fig. 1): a sample leaving the *smallest* window enters a bounded FIFO
  database (``database_size``; the oldest dropped), so the database holds every past
  sample any GP no longer has (the paper's rule: "the oldest data point of the GP model
  with the index k_min is then added to it").  A database sample still inside GP i's own
  window is never added to GP i's training set twice.
* **k nearest neighbours** (``knn``): GP i's training set is its window plus the ``knn``
  database samples nearest to the *next query* -- the input given by :meth:`hint`
  (the reference ahead; the model-update node passes it), or the newest sample when no
  hint came -- in inputs standardised by the spread of the largest window.  Brute
  force, vectorised: over a database of a few thousand samples it is ~0.1 ms, below a
  KD-tree rebuild per update.  Each GP standardises its own training set (window plus
  neighbours, ``scale_on="training"``, the default; ``"window"``: the window alone, the
  paper's) at its refit; a consistency shift keeps those scalers, so they are saved.
* **One GP refitted per update** (sec. II-C: "only one model is updated"): every
  :meth:`partial_fit` call inserts its samples and refits exactly one GP, round robin;
  the refit optimises (Z, theta, sn2) for at most ``max_iter`` iterations, warm-started.
  The paper updates per sample; a caller that falls behind the stream passes the
  samples that arrived meanwhile as one batch (none is lost, one refit).  Batches
  larger than the smallest window send samples to the database unseen by that GP:
  offline, feed blocks well below it (``replay --learner pgpol --block 10``).
* **Fusion**: the k predictions are weighted by the reciprocal of their standard
  deviation, w_i = 1 / sigma_i, mu = sum w_i mu_i / sum w_i; the fused variance is
  sum w_i var_i / sum w_i (var_i the latent variance in raw units).  ``fusion="raw"``
  (default): sigma_i per output, the GP's predictive standard deviation of y (latent
  variance + noise) in raw torque units, comparable across GPs whose scalers differ;
  ``fusion="scaled"`` (the paper's): one sigma_i per GP, in the GP's own standardised
  output units (the root of the mean over outputs of latent variance + noise).
* **Change detection** (eq. 7-9): every sample is first predicted by the current model
  (prequential); with nmse_{t,j} = mean_i (y_ij - y~_ij)^2 / var(y_j) (var over the
  samples since the last reset) and nmse-bar_t its mean over the outputs, gamma =
  nmse-bar_t - nmse-bar_{t-L} > ``change_threshold`` (eta) clears the database (the
  windows keep the newest data, so the GPs re-learn from the new dynamics only).
  Incremental, O(outputs) per sample.  Two extensions of the paper's test (its setting:
  ``change_horizon=0, change_lag=1``): the squared errors are averaged over the horizon
  N (cumulative over the first N samples, then exponentially over ~N), so the test keeps
  its sensitivity after hours of data; and gamma is the rise over L samples, not one: a
  sustained error step of e^2 / var(y) = r moves it by ~r L / N, a single outlier z by
  only z / N, so a payload is told from the spikes of a closed loop, where L = 1 fires
  on any sample much worse than average.  The statistics restart after a clear and are
  not tested during the first ``change_warmup`` samples after a (re)start: the first
  pass over a task is novelty, which raises the error as a change does (the default,
  1500 samples, is one pick-and-place cycle of ``experiment pgpol`` at 100 Hz).  A
  change the drifting windows absorb within a second stays invisible; what the test
  catches is the stale database: when the neighbours it adds from before the change
  make the error rise again.  :class:`ChangeTest` is the test on its own.
* **Consistency** with an adapting parametric model (beyond the paper): a parameter
  change dpi shifts every stored target -- windows, database and the GPs' training
  sets -- by -Y(x) dpi, and each GP re-solves its posterior weights with unchanged
  inducing inputs, hyperparameters and scalers (:meth:`SparseGP.refit_targets`), so the
  ensemble is exactly what it would be had the data been measured against the new model.

Prediction reads one immutable snapshot of the fitted GPs stacked into arrays (one
vectorised evaluation for all of them), replaced by a single assignment after a refit
or transform, so a control thread may predict while a worker learns.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from .base import Learner, register, split_state
from .consistency import ParameterChange
from .gp import LENGTH_SCALE, Standardiser
from .gp_kernel import OUTSIDE_CORRELATION, spread_support
from .sparse_gp import SparseGP

__all__ = ["PGPOL", "SGPOL"]


#: the radius [standard deviations of a GP's training inputs] of the support around them:
#: a query's support is exp(-d^2 / (2 r^2)), d its distance to the nearest training input in
#: the GP's standardised inputs (times the spread factor, :func:`.gp_kernel.spread_support`);
#: at 0.5 the torque models asked 0.1-0.3 rad off their data were 0.1 % worse than the
#: training mean (``experiment realdata``'s batch_far), at 0.25 they are not
SUPPORT_RADIUS = 0.25
#: the change test's defaults (samples at the learner's rate; see the module docstring)
CHANGE_DEFAULTS: Dict[str, Any] = {"change_threshold": 0.1, "change_horizon": 300, "change_warmup": 1500,
                                   "change_lag": 50}
#: the paper's test: eta of its order, cumulative nmse-bar, gamma over one sample
CHANGE_PAPER: Dict[str, Any] = {"change_threshold": 1e-3, "change_horizon": 0, "change_warmup": 50, "change_lag": 1}


class ChangeTest:
    """PGPOL's change test (eq. 7-9), incremental: :meth:`update` takes one sample's
    prequential squared error and target and says whether gamma exceeded eta (the
    statistics then restart).  See the module docstring for horizon and lag."""

    def __init__(self, output_dim: int, threshold: float, horizon: int = 1000, warmup: int = 50, lag: int = 1):
        self.o, self.threshold = int(output_dim), float(threshold)
        self.horizon, self.warmup, self.lag = int(horizon), int(warmup), int(lag)
        self.reset()

    def reset(self) -> None:
        o = self.o
        self.t = 0
        self.err, self.mean, self.var = np.zeros(o), np.zeros(o), np.zeros(o)
        self.nmse = float("nan")                    # nmse-bar of the newest sample
        self.hist = np.full(self.lag, np.nan)       # nmse-bar of the last `lag` samples
        self.gamma = float("nan")

    def update(self, e2: np.ndarray, y: np.ndarray) -> bool:
        self.t += 1
        t = self.t
        a = 1.0 / (t if self.horizon == 0 else min(t, self.horizon))
        self.err += a * (e2 - self.err)
        # var(y) over every sample since the (re)start, the paper's normaliser: with the
        # horizon's mean instead, a payload's torque shift raised var(y) as fast as the
        # error and the test did not see it
        delta = y - self.mean
        self.mean += delta / t
        self.var = (1.0 - 1.0 / t) * (self.var + delta * delta / t)
        if t < 2:
            return False
        var = np.maximum(self.var, 1e-12 * (1.0 + np.square(self.mean)))
        nmse = float(np.mean(self.err / var))                   # eq. 8-9
        k = t % self.lag
        self.gamma = nmse - self.hist[k]          # eq. 7 (lag 1: nmse-bar_t - nmse-bar_{t-1})
        self.hist[k] = nmse
        self.nmse = nmse
        if t > self.warmup and self.gamma > self.threshold:
            self.reset()
            return True
        return False

    def get_arrays(self) -> Dict[str, np.ndarray]:
        return {"cd": np.concatenate([[self.t, self.nmse], self.err, self.mean, self.var]), "cd_hist": self.hist}

    def set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        o = self.o
        cd = np.asarray(arrays["cd"], dtype=float)
        if cd.shape != (2 + 3 * o,):
            raise ValueError(f"saved PGPOL change statistics have shape {cd.shape}, expected {(2 + 3 * o,)}")
        self.t, self.nmse = int(cd[0]), float(cd[1])
        self.err, self.mean, self.var = (cd[2 + k * o: 2 + (k + 1) * o].copy() for k in range(3))
        hist = np.asarray(arrays.get("cd_hist", ()), dtype=float).reshape(-1)
        # saved with another lag (or before lags existed): the test restarts its history
        self.hist = hist.copy() if hist.size == self.lag else np.full(self.lag, np.nan)


@register
class PGPOL(Learner):
    """Parallel drifting sparse GPs with a database (see the module docstring).

    Parameters
    ----------
    input_dim, output_dim:
        Sizes of x and y.
    windows:
        FIFO window sizes n_1 ... n_k, one GP each (paper's best: 60 and 480).
    knn:
        Nearest database samples of the next query added to each training set (0: no
        database).
    database_size:
        Most samples the database holds (FIFO).
    n_inducing, max_iter:
        Inducing inputs m per GP and the optimiser's iteration cap per refit (paper:
        20 and 10); ``max_iter = 0`` keeps Z and the hyperparameters fixed.
    length_scale, signal_var, noise_var, ard:
        Initial hyperparameters in standardised units (length scale default
        :data:`~.gp.LENGTH_SCALE`, one standard deviation of the training inputs); one
        length scale per GP (``ard=False``, the paper's kernel) or per input.
    groups:
        ``"shared"``: one GP for all outputs with shared Z and hyperparameters (GPy's
        multi-output model, the paper's); ``"joint"``: one per output.
    change_threshold, change_horizon, change_warmup, change_lag:
        eta of eq. 7 (``None``: no change detection), the error averaging horizon N in
        samples (0: cumulative since the last reset, the paper's), the samples after a
        (re)start before the test runs, and L of gamma = nmse-bar_t - nmse-bar_{t-L}
        (1: eq. 7 as the paper).
    seed:
        Seeds the inducing inputs' first draw.
    fusion:
        ``"raw"`` (default) or ``"scaled"`` (the paper's): the standard deviation the
        fusion weights are the reciprocal of (see the module docstring).
    scale_on:
        ``"training"`` (default: window + neighbours) or ``"window"`` (the paper's): the
        samples each GP's input and output scalers are fitted on.
    """

    kind = "pgpol"
    FUSIONS = ("raw", "scaled")
    SCALE_ON = ("training", "window")
    DEFAULT_WINDOWS: Sequence[int] = (60, 480)

    def __init__(self, input_dim: int, output_dim: int, *, windows: Optional[Sequence[int]] = None,
                 knn: int = 20, database_size: int = 2000, n_inducing: int = 20, max_iter: int = 10,
                 length_scale=None, signal_var: float = 1.0, noise_var: float = 0.01, ard: bool = False,
                 groups: str = "shared", change_threshold: Optional[float] = CHANGE_DEFAULTS["change_threshold"],
                 change_horizon: int = CHANGE_DEFAULTS["change_horizon"],
                 change_warmup: int = CHANGE_DEFAULTS["change_warmup"],
                 change_lag: int = CHANGE_DEFAULTS["change_lag"], seed: int = 0, fusion: str = "raw",
                 scale_on: str = "training"):
        super().__init__(input_dim, output_dim)
        if fusion not in self.FUSIONS:
            raise ValueError(f"fusion must be one of {self.FUSIONS}, got {fusion!r}")
        if scale_on not in self.SCALE_ON:
            raise ValueError(f"scale_on must be one of {self.SCALE_ON}, got {scale_on!r}")
        self.fusion, self.scale_on = fusion, scale_on
        windows = list(self.DEFAULT_WINDOWS if windows is None else np.atleast_1d(windows).tolist())
        if not windows or any(int(w) != w or w < 2 for w in windows):
            raise ValueError(f"windows must be integers >= 2, got {windows}")
        if int(knn) < 0 or int(database_size) < 0 or int(change_horizon) < 0 or int(change_warmup) < 2 \
                or int(change_lag) < 1:
            raise ValueError("knn, database_size and change_horizon must be >= 0, change_warmup >= 2,"
                             " change_lag >= 1")
        if change_threshold is not None and not (np.isfinite(change_threshold) and change_threshold > 0):
            raise ValueError(f"change_threshold must be > 0 or None, got {change_threshold}")
        self.windows = [int(w) for w in windows]
        self.knn = int(knn)
        self.database_size = int(database_size)
        self.n_inducing, self.max_iter = int(n_inducing), int(max_iter)
        if length_scale is None:
            length_scale = LENGTH_SCALE
        self.length_scale, self.signal_var, self.noise_var = length_scale, float(signal_var), float(noise_var)
        self.ard, self.groups, self.seed = bool(ard), groups, int(seed)
        self.change_threshold = None if change_threshold is None else float(change_threshold)
        self.change_horizon, self.change_warmup = int(change_horizon), int(change_warmup)
        self.change_lag = int(change_lag)
        self.members = [self._member(i) for i in range(len(self.windows))]
        d, o = self.input_dim, self.output_dim
        self._X, self._Y, self._seq = np.zeros((0, d)), np.zeros((0, o)), np.zeros(0, np.int64)
        self._dbX, self._dbY, self._dbseq = np.zeros((0, d)), np.zeros((0, o)), np.zeros(0, np.int64)
        self._t = 0                 # samples inserted (the next sample's sequence number)
        self._rr = 0                # round-robin counter: the next GP to refit
        self._query: Optional[np.ndarray] = None
        self.n_refits = 0
        self.n_queries_outside = 0
        self.n_changes = 0          # database clears by the change detection
        self.last_change = -1       # sequence number of the sample that triggered the last one
        self._cd = ChangeTest(self.output_dim, self.change_threshold or 1.0, self.change_horizon,
                              self.change_warmup, self.change_lag)
        self._snap = None

    def _member(self, i: int) -> SparseGP:
        return SparseGP(self.input_dim, self.output_dim, n_inducing=self.n_inducing,
                        length_scale=self.length_scale, signal_var=self.signal_var, noise_var=self.noise_var,
                        ard=self.ard, groups=self.groups, optimize=self.max_iter > 0,
                        max_iter=self.max_iter, seed=self.seed + i)

    # ---------------------------------------------------------------- config
    def get_config(self) -> Dict[str, Any]:
        ls = self.length_scale
        return {"input_dim": self.input_dim, "output_dim": self.output_dim, "windows": list(self.windows),
                "knn": self.knn, "database_size": self.database_size, "n_inducing": self.n_inducing,
                "max_iter": self.max_iter, "length_scale": np.asarray(ls).tolist(),
                "signal_var": self.signal_var, "noise_var": self.noise_var, "ard": self.ard,
                "groups": self.groups, "change_threshold": self.change_threshold,
                "change_horizon": self.change_horizon, "change_warmup": self.change_warmup,
                "change_lag": self.change_lag, "seed": self.seed, "fusion": self.fusion,
                "scale_on": self.scale_on}

    def _counters(self) -> Dict[str, int]:
        c = super()._counters()
        c.update(n_refits=self.n_refits, n_changes=self.n_changes, last_change=self.last_change,
                 n_queries_outside=self.n_queries_outside)
        return c

    @property
    def n_points(self) -> int:
        """Samples in the largest window."""
        return self._X.shape[0]

    @property
    def database_points(self) -> int:
        return self._dbX.shape[0]

    @property
    def nmse(self) -> float:
        """nmse-bar (eq. 8) of the prequential predictions since the last reset (NaN
        before two samples)."""
        return self._cd.nmse

    def hint(self, x) -> None:
        x = np.asarray(x, dtype=float).reshape(-1)
        if x.shape == (self.input_dim,) and np.isfinite(x).all():
            self._query = x.copy()

    # ---------------------------------------------------------------- updates
    def _fit(self, X: np.ndarray, y: np.ndarray, R) -> None:
        if self.change_threshold is not None:
            self._detect_change(X, y)
        self._insert(X, y)
        self._refit_next()

    def _insert(self, X: np.ndarray, y: np.ndarray) -> None:
        b = X.shape[0]
        seq = self._t + np.arange(b, dtype=np.int64)
        allX, allY = np.vstack([self._X, X]), np.vstack([self._Y, y])
        allseq = np.concatenate([self._seq, seq])
        self._t += b
        if self.knn and self.database_size:
            # samples leaving the smallest window enter the database
            n_min = min(self.windows)
            leave = (allseq >= self._t - b - n_min) & (allseq < self._t - n_min)
            if leave.any():
                keep = self.database_size
                self._dbX = np.vstack([self._dbX, allX[leave]])[-keep:]
                self._dbY = np.vstack([self._dbY, allY[leave]])[-keep:]
                self._dbseq = np.concatenate([self._dbseq, allseq[leave]])[-keep:]
        W = max(self.windows)
        self._X, self._Y, self._seq = allX[-W:], allY[-W:], allseq[-W:]

    def _neighbours(self, i: int):
        """The ``knn`` database samples nearest to the next query outside GP i's window."""
        if not self.knn or not self._dbX.shape[0]:
            return None
        outside = self._dbseq < self._t - self.windows[i]
        if not outside.any():
            return None
        q = self._query if self._query is not None else self._X[-1]
        std = Standardiser.fit(self._X).std
        dbX = self._dbX[outside]
        d2 = np.square((dbX - q) / std).sum(axis=1)
        k = min(self.knn, d2.size)
        idx = np.argpartition(d2, k - 1)[:k] if k < d2.size else np.arange(d2.size)
        return dbX[idx], self._dbY[outside][idx]

    def _refit_next(self) -> None:
        """Refit exactly one GP (round robin) on its window plus its neighbours."""
        i = self._rr % len(self.members)
        self._rr += 1
        n = min(self.windows[i], self.n_points)
        if n < 2:
            return
        X, Y = self._X[-n:], self._Y[-n:]
        scalers = (Standardiser.fit(X), Standardiser.fit(Y)) if self.scale_on == "window" else (None, None)
        nb = self._neighbours(i)
        if nb is not None:
            X, Y = np.vstack([X, nb[0]]), np.vstack([Y, nb[1]])
        try:
            self.members[i].fit(X, Y, *scalers)
        except np.linalg.LinAlgError:   # a degenerate window: keep the previous fit of this GP
            return
        self.n_refits += 1
        self._publish()

    # ------------------------------------------------------- change detection
    def _detect_change(self, X: np.ndarray, Y: np.ndarray) -> None:
        P = self._predict(X, False)[0]          # prequential: the model before these samples
        for i, (e2, y) in enumerate(zip(np.square(Y - P), Y)):
            if self._cd.update(e2, y):
                self.n_changes += 1
                self.last_change = self._t + i          # this sample's sequence number
                self._clear_database()

    def _clear_database(self) -> None:
        d, o = self.input_dim, self.output_dim
        self._dbX, self._dbY, self._dbseq = np.zeros((0, d)), np.zeros((0, o)), np.zeros(0, np.int64)

    # ------------------------------------------------------------- prediction
    def _publish(self) -> None:
        """Stack the fitted GPs into one prediction snapshot (atomic replacement)."""
        fitted = [g for g in self.members if g.snap is not None]
        if not fitted:
            self._snap = None
            return
        snaps = [g.snap for g in fitted]
        Z = np.stack([s[0] for s in snaps])                       # K x G x m x d (standardised)
        ls = np.stack([s[5] for s in snaps])                      # K x G x d_ls
        xsd = np.stack([s[3].std for s in snaps])                 # K x d
        Zs = Z / ls[:, :, None, :]
        sf2 = np.stack([s[6] for s in snaps])                     # K x G
        w, R = np.stack([s[1] for s in snaps]), np.stack([s[2] for s in snaps])
        # k(x, z) = exp(log sf2 - |xs|^2 / 2 - |zs|^2 / 2 + xs.zs), xs = (x - mean) / (std ls)
        snap = dict(
            off=np.stack([s[3].mean for s in snaps])[:, None, None, :],
            scale=1.0 / (xsd[:, None, None, :] * ls[:, :, None, :]),            # K x G x 1 x d
            ZsT=np.ascontiguousarray(np.swapaxes(Zs, 2, 3)),
            c0=(np.log(sf2)[:, :, None] - 0.5 * np.einsum("kgmd,kgmd->kgm", Zs, Zs))[:, :, None, :],
            w=w, WR=np.concatenate([w, R], axis=3), c=w.shape[3], sf2=sf2,
            ym=np.stack([s[4].mean for s in snaps])[:, None, :], ysd=np.stack([s[4].std for s in snaps]),
            sn2=np.stack([g.sn2 for g in fitted]), D=self._support_inputs(fitted), xsd=xsd,
            joint=self.groups == "joint")
        snap["one"] = self._one_query_arrays(snap)
        self._snap = snap                                  # one atomic swap, complete

    @staticmethod
    def _support_inputs(fitted) -> np.ndarray:
        """Every fitted GP's standardised training inputs divided by
        :data:`SUPPORT_RADIUS`, padded to one length, with their squared norms in the last
        column (K x n_max x (d + 1); padding rows are never the nearest)."""
        D = [g.support_inputs() / SUPPORT_RADIUS for g in fitted]
        n_max = max(d.shape[0] for d in D)
        out = np.zeros((len(D), n_max, D[0].shape[1] + 1))
        for k, d in enumerate(D):
            out[k, :d.shape[0], :-1] = d
            out[k, :d.shape[0], -1] = np.einsum("nd,nd->n", d, d)
            out[k, d.shape[0]:, -1] = np.inf
        return out

    @staticmethod
    def _data_support(U: np.ndarray, D: np.ndarray) -> np.ndarray:
        """``exp(-min_n |u - u_n|^2 / 2)`` for queries ``U`` (K x N x d, standardised by each
        GP's scaler and divided by :data:`SUPPORT_RADIUS`) and ``D`` from
        :meth:`_support_inputs`: K x N."""
        d2 = np.einsum("knd,knd->kn", U, U)[..., None] + D[:, None, :, -1] - 2.0 * (U @ np.swapaxes(D[..., :-1], 1, 2))
        return np.exp(-0.5 * np.maximum(d2.min(axis=2), 0.0))

    @staticmethod
    def _one_query_arrays(s: dict) -> dict:
        """The snapshot rearranged for one query (the prediction node's case): with
        u = x - mean (K x d), the kernel exponents of every GP are one batched product
        ``[u, u*u] @ A + C`` (A = [scale * Zs ; -scale^2 / 2]), its means and quadratic
        forms one more, with the output scaling folded in -- about half the numpy calls
        of the batch path, whose numbers it gives to rounding."""
        K, G, _, d = s["scale"].shape
        m = s["ZsT"].shape[3]
        sc = s["scale"][:, :, 0, :]                                           # K x G x d
        Zs = np.swapaxes(s["ZsT"], 2, 3)                                      # K x G x m x d
        A = np.concatenate([sc[:, :, None, :] * Zs,
                            np.broadcast_to((-0.5 * sc * sc)[:, :, None, :], (K, G, m, d))], axis=3)
        ysd = s["ysd"]
        ysd2 = ysd * ysd
        joint = s["joint"]
        return dict(off=s["off"][:, 0, 0, :], A=np.ascontiguousarray(A.reshape(K, G * m, 2 * d).transpose(0, 2, 1)),
                    C=s["c0"][:, :, 0, :].reshape(K, 1, G * m).copy(), WR=s["WR"].reshape(K * G, m, -1),
                    sf2=s["sf2"].reshape(K * G), sf2_out=OUTSIDE_CORRELATION * s["sf2"].reshape(K * G),
                    ysd=ysd, ym=s["ym"][:, 0, :], ysd2=ysd2,
                    D=s["D"], xsd=s["xsd"],
                    noise=(s["sn2"] if joint else s["sn2"][:, :1]) * ysd2, K=K, G=G, m=m)

    def _predict_one(self, snap: dict, x: np.ndarray, return_var: bool):
        s = snap["one"]
        K, G, m, c = s["K"], s["G"], s["m"], snap["c"]
        u = x - s["off"]                                                     # K x d
        E = np.concatenate((u, u * u), axis=1)[:, None, :] @ s["A"]          # K x 1 x G m
        E += s["C"]
        kq = np.exp(E, out=E).reshape(K * G, 1, m)
        if (kq[:, 0].max(axis=1) < s["sf2_out"]).all():
            self.n_queries_outside += 1
        us = u / s["xsd"]                                                     # K x d, standardised
        sup = (self._data_support(us[:, None, :] / SUPPORT_RADIUS, s["D"])[:, 0] * spread_support(us))[:, None]
        P = kq @ s["WR"]                                                     # K G x 1 x (c + m)
        joint = snap["joint"]
        mean = (P[:, 0, 0].reshape(K, G) if joint else P[:, 0, :c]) * s["ysd"] + s["ym"]   # K x o
        if K == 1 and not return_var:
            return mean, None, sup[:, 0]
        e = (P[:, 0, c:] * kq[:, 0]).sum(1)                                 # explained prior variance
        v = s["sf2"] - e
        np.maximum(v, 0.0, out=v)
        var = v.reshape(K, G if joint else 1) * s["ysd2"]                     # K x o, raw latent
        if K == 1:
            return mean, var, sup[:, 0]
        if self.fusion == "scaled":   # one weight per GP, its standardised output units
            w = 1.0 / np.sqrt(np.mean(var / s["ysd2"] + s["noise"] / s["ysd2"], axis=1, keepdims=True))
        else:
            w = 1.0 / np.sqrt(var + s["noise"])
        wsum = w.sum(axis=0)
        fused = (w * mean).sum(axis=0) / wsum
        return fused[None], ((w * var).sum(axis=0) / wsum)[None] if return_var else None, sup.max(axis=0)

    def _predict(self, X: np.ndarray, return_var: bool):
        s = self._snap
        N, o = X.shape[0], self.output_dim
        if s is None:
            return np.zeros((N, o)), (np.full((N, o), np.inf) if return_var else None), np.zeros(N)
        if N == 1:
            return self._predict_one(s, X[0], return_var)
        Qs = (X - s["off"]) * s["scale"]                                     # K x G x N x d
        E = Qs @ s["ZsT"]
        E -= 0.5 * np.einsum("kgnd,kgnd->kgn", Qs, Qs)[..., None]
        E += s["c0"]
        Kq = np.exp(E, out=E)                                                # K x G x N x m
        near = (Kq.max(axis=3) >= OUTSIDE_CORRELATION * s["sf2"][:, :, None]).any(axis=(0, 1))
        if not near.all():
            self.n_queries_outside += int(N - np.count_nonzero(near))
        K, joint, c = Kq.shape[0], s["joint"], s["c"]
        U = (X - s["off"][:, 0]) / s["xsd"][:, None, :]                      # K x N x d, standardised
        sup = self._data_support(U / SUPPORT_RADIUS, s["D"]) * spread_support(U)   # K x N
        need_var = return_var or K > 1
        P = Kq @ (s["WR"] if need_var else s["w"])                          # K x G x N x (c [+ m])
        M = P[..., :c]
        ysd = s["ysd"][:, None, :]
        mean = (np.swapaxes(M[..., 0], 1, 2) if joint else M[:, 0]) * ysd + s["ym"]   # K x N x o
        if not need_var:
            return mean[0], None, sup[0]
        e = np.einsum("kgnm,kgnm->kgn", P[..., c:], Kq)                     # explained prior variance
        v = s["sf2"][:, :, None] - e
        np.maximum(v, 0.0, out=v)
        noise = s["sn2"]                                                     # K x G
        if joint:
            var_s, noise_s = np.swapaxes(v, 1, 2), noise[:, None, :]
        else:
            var_s, noise_s = v[:, 0][:, :, None], noise[:, :1, None]
        ysd2 = ysd * ysd
        var = var_s * ysd2                                                   # K x N x o, raw latent
        if K == 1:
            return mean[0], var[0] if return_var else None, sup[0]
        if self.fusion == "scaled":   # one weight per GP, its standardised output units
            w = 1.0 / np.sqrt(np.mean(var_s + noise_s, axis=2, keepdims=True))
        else:
            w = 1.0 / np.sqrt(var + noise_s * ysd2)
        wsum = w.sum(axis=0)
        fused = (w * mean).sum(axis=0) / wsum
        return fused, ((w * var).sum(axis=0) / wsum if return_var else None), sup.max(axis=0)

    # ------------------------------------------------------------ consistency
    def _transform(self, dpi: np.ndarray, model) -> None:
        parts = [self._X, self._dbX] + [g.X for g in self.members if g.X is not None]
        sizes = [p.shape[0] for p in parts]
        if not sum(sizes):
            return
        q, v, a = split_state(np.vstack(parts), model.n)
        S = np.split(ParameterChange.for_model(model).set(dpi).values(q, v, a), np.cumsum(sizes)[:-1])
        self._Y = self._Y - S[0]
        self._dbY = self._dbY - S[1]
        for g, s in zip((g for g in self.members if g.X is not None), S[2:]):
            g.refit_targets(g.Y - s)
        self._publish()

    # ------------------------------------------------------------ persistence
    def _get_arrays(self) -> Dict[str, np.ndarray]:
        a = {"X": self._X, "Y": self._Y, "seq": self._seq, "dbX": self._dbX, "dbY": self._dbY,
             "dbseq": self._dbseq,
             "state": np.array([self._t, self._rr], dtype=np.int64),
             **self._cd.get_arrays()}
        if self._query is not None:
            a["query"] = self._query
        for i, g in enumerate(self.members):
            if g.X is None:
                continue
            a.update({f"m{i}_X": g.X, f"m{i}_Y": g.Y, f"m{i}_Z": g.Z_raw, f"m{i}_ls": g.ls, f"m{i}_sf2": g.sf2,
                      f"m{i}_sn2": g.sn2, f"m{i}_scalers": g.scalers(), f"m{i}_fits": np.array(g.n_fits)})
        return a

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        d, o = self.input_dim, self.output_dim

        def rows(key, width):
            A = np.asarray(arrays[key], dtype=float)
            if A.ndim != 2 or A.shape[1] != width or not np.isfinite(A).all():
                raise ValueError(f"saved PGPOL array {key!r} has shape {A.shape} (or non-finite values);"
                                 f" expected N x {width}")
            return A

        X, Y, dbX, dbY = rows("X", d), rows("Y", o), rows("dbX", d), rows("dbY", o)
        seq, dbseq = np.asarray(arrays["seq"], np.int64), np.asarray(arrays["dbseq"], np.int64)
        if not (X.shape[0] == Y.shape[0] == seq.size <= max(self.windows)
                and dbX.shape[0] == dbY.shape[0] == dbseq.size <= self.database_size):
            raise ValueError(f"saved PGPOL stream sizes disagree: X {X.shape}, Y {Y.shape}, seq {seq.shape},"
                             f" database {dbX.shape}, {dbY.shape}, {dbseq.shape}")
        self._X, self._Y, self._seq, self._dbX, self._dbY, self._dbseq = X, Y, seq, dbX, dbY, dbseq
        self._t, self._rr = (int(v) for v in arrays["state"])
        self._cd.set_arrays(arrays)
        self._query = np.asarray(arrays["query"], dtype=float) if "query" in arrays else None
        for i, g in enumerate(self.members):
            if f"m{i}_X" not in arrays:
                continue
            try:
                g.restore(rows(f"m{i}_X", d), rows(f"m{i}_Y", o), arrays[f"m{i}_Z"], arrays[f"m{i}_ls"],
                          arrays[f"m{i}_sf2"], arrays[f"m{i}_sn2"], arrays.get(f"m{i}_scalers"))
            except np.linalg.LinAlgError as exc:
                raise ValueError(f"saved PGPOL GP {i} does not factorise: {exc}") from None
            g.n_fits = int(arrays[f"m{i}_fits"])
        self._publish()

    def memory_bytes(self) -> int:
        return int(sum(np.asarray(v).nbytes for v in self._get_arrays().values()))


@register
class SGPOL(PGPOL):
    """SGPOL: PGPOL with one GP (the paper's single drifting GP, n = 480)."""

    kind = "sgpol"
    DEFAULT_WINDOWS = (480,)
