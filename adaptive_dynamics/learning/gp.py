"""Exact Gaussian-process regression, one GP per output joint (PGPOL sec. II-A; SCQP
eq. 12-16 use its mean and mean gradient).

Model, per output j (inputs and outputs standardised per model, as PGPOL does with its
scalers): y_j = f_j(x) + eps, f_j ~ GP(0, k_j), k_j the squared-exponential kernel with
ARD length scales (:mod:`.gp_kernel`), eps ~ N(0, sn2_j).  With K_j = k_j(X, X) + sn2_j I
= L_j L_j^T (Cholesky; no explicit inverse anywhere on the prediction path):

    mean_j(x) = k_j(x, X) alpha_j,            alpha_j = K_j^-1 y_j  (two triangular solves)
    var_j(x)  = sf2_j - |L_j^-1 k_j(X, x)|^2  (latent f; add sn2_j for a noisy y)
    d mean_j / dx = sum_i alpha_ji k_j(x, x_i) (x_i - x) / ls_j^2     (SCQP eq. 16)

All outputs are computed together (a stack of ``output_dim`` GPs on the same inputs).
When every output has the same hyperparameters (the default: fixed, in standardised
units) the outputs share one kernel matrix: one Cholesky factor, ``alpha`` a matrix
(n x outputs), and memory and time of a single GP (SCQP's thousands of points per
joint: 7x less of both).
Hyperparameters are fixed by default (``length_scale``, ``signal_var``, ``noise_var`` in
standardised units); ``optimize=True`` fits them by type-II maximum likelihood with the
analytic gradient (L-BFGS-B, warm-started from the current values, ``max_iter``).

Streaming: ``partial_fit`` appends to a FIFO of at most ``max_points`` samples (oldest
dropped) and refits once per call when at least ``refit_every`` samples arrived since the
last fit.  The consistency transform shifts every stored target by -Y(x) dpi and
re-solves alpha with the same factorisation (K depends on the inputs only), so the GP is
exactly the posterior of the shifted data.

Persistence saves the model in use -- its data (targets shifted), scalers and
hyperparameters -- next to the window, so a reloaded GP predicts bit-identically even
after a transform or with samples not yet refitted.
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
from scipy.linalg import cho_solve, solve_triangular
from scipy.optimize import minimize

from .base import Learner, register, split_state
from .consistency import ParameterChange
from .gp_kernel import OUTSIDE_CORRELATION, se_kernel, se_kernel_grads, spread_support

__all__ = ["ExactGP", "Standardiser", "nlml_exact", "minimise_nlml", "hyper_bounds"]

LOG2PI = float(np.log(2.0 * np.pi))
#: smallest standard deviation used to standardise a coordinate (relative to the largest)
STD_FLOOR = 1e-6
#: largest length scale the hyperparameter fits may reach, in standard deviations of the
#: training inputs (see :func:`hyper_bounds`)
LS_MAX = 10.0
#: largest signal variance of the fits (standardised targets have variance 1)
SF2_MAX = 4.0
#: default length scale (standardised units, every input): one standard deviation of the
#: training inputs -- chosen on held-out motions outside the training region (docs/learners.md)
LENGTH_SCALE = 1.0


class Standardiser:
    """Per-column mean and standard deviation of a data set (PGPOL's scalers)."""

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean = np.asarray(mean, dtype=float)
        self.std = np.asarray(std, dtype=float)

    @classmethod
    def fit(cls, Z: np.ndarray, center: bool = True) -> "Standardiser":
        """The data's mean and standard deviation; ``center=False``: mean 0 and the root
        mean square (a GP whose prior mean is zero in the data's own units)."""
        if center:
            mean = Z.mean(axis=0)
            std = Z.std(axis=0) if Z.shape[0] > 1 else np.ones(Z.shape[1])
        else:
            mean = np.zeros(Z.shape[1])
            std = np.sqrt(np.mean(Z * Z, axis=0))
        floor = STD_FLOOR * max(1.0, float(std.max()) if std.size else 1.0)
        std = np.where(std > floor, std, 1.0)  # a constant column: leave it unscaled
        return cls(mean, std)

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        return (Z - self.mean) / self.std


def _as_hyper(value, G: int, d: int, what: str) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    if d == 1 and a.ndim == 1 and a.size == G:
        a = a[:, None]  # one value per output
    try:
        out = np.broadcast_to(a, (G, d)).copy()
    except ValueError:
        raise ValueError(f"{what}: cannot broadcast shape {a.shape} to {(G, d)}") from None
    if not (np.isfinite(out).all() and (out > 0).all()):
        raise ValueError(f"{what} must be finite and > 0")
    return out


def nlml_exact(Xs: np.ndarray, Ys: np.ndarray, ls: np.ndarray, sf2: np.ndarray, sn2: np.ndarray,
               grad: bool = True):
    """Negative log marginal likelihood of G independent GPs (column g of ``Ys`` with
    hyperparameters g) and its gradient with respect to (log ls, log sf2, log sn2).

    Returns ``(nlml (G,), (d_log_ls (G x d_ls), d_log_sf2 (G,), d_log_sn2 (G,)))``.
    dF/dK = 1/2 (K^-1 - alpha alpha^T) (Rasmussen & Williams eq. 5.9)."""
    n = Xs.shape[0]
    Kf = se_kernel(Xs, Xs, ls, sf2)
    K = Kf + sn2[:, None, None] * np.eye(n)[None]
    L = np.linalg.cholesky(K)
    Y = Ys.T[:, :, None]                                          # G x n x 1
    alpha = cho_solve((L, True), Y)[:, :, 0]                     # G x n
    nl = 0.5 * np.einsum("gn,gn->g", Ys.T, alpha) + np.log(np.diagonal(L, axis1=1, axis2=2)).sum(1) \
        + 0.5 * n * LOG2PI
    if not grad:
        return nl, None
    Kinv = cho_solve((L, True), np.broadcast_to(np.eye(n), K.shape).copy())
    dK = 0.5 * (Kinv - alpha[:, :, None] * alpha[:, None, :])
    d_ls, d_sf2, _ = se_kernel_grads(Xs, Xs, ls, Kf, dK)
    d_sn2 = sn2 * np.einsum("gii->g", dK)
    return nl, (d_ls, d_sf2, d_sn2)


def hyper_bounds(input_dim: int, n_ls: int, G: int) -> list:
    """L-BFGS-B bounds of (log ls, log sf2, log sn2) in standardised units: length scales
    in [e^-7, LS_MAX] (``input_dim`` is kept for the signature) -- maximum likelihood on a window of a smooth
    trajectory prefers long length scales and large signal variances (an almost linear
    model of the window, confident far beyond it: held-out motions 0.1-0.6 rad away got
    corrections 2-9x worse than none) -- signal variance in [e^-9, SF2_MAX] (the targets
    are standardised to variance 1: the prior's variance is at most the data's) and noise
    variance in [1e-6, e^5]."""
    ls_max = float(np.log(LS_MAX))
    return ([(-7.0, ls_max)] * n_ls + [(-9.0, float(np.log(SF2_MAX)))] * G + [(float(np.log(1e-6)), 5.0)] * G)


def minimise_nlml(objective, t0: np.ndarray, bounds, max_iter: int) -> np.ndarray:
    """L-BFGS-B on ``objective(t) -> (value, gradient)`` from ``t0`` for at most
    ``max_iter`` iterations; a failed factorisation counts as +inf.  Returns the result,
    or ``t0`` when it is not finite or no better than the start."""
    def f(t):
        try:
            return objective(t)
        except np.linalg.LinAlgError:
            return np.inf, np.zeros_like(t)

    f0 = f(t0)[0]
    res = minimize(f, t0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": max_iter})
    return res.x if np.isfinite(res.fun) and res.fun <= f0 else t0


@register
class ExactGP(Learner):
    """Exact GP regression per output joint (see the module docstring).

    Parameters
    ----------
    input_dim, output_dim:
        Sizes of x and y.
    length_scale, signal_var, noise_var:
        Initial (and, unless ``optimize``, fixed) hyperparameters in standardised units:
        length scale(s) (a scalar or ``input_dim`` values, per output if ``output_dim x
        input_dim``; default :data:`LENGTH_SCALE`, one standard deviation of the training
        inputs), signal variance and noise variance (scalars or per output).
    ard:
        One length scale per input (True) or one per output GP (False: PGPOL eq. 6).
    prior_mean:
        The GP's prior mean, which its raw prediction returns to away from its data:
        ``"data"`` (default) the training targets' mean, ``"zero"`` zero (targets scaled
        by their root mean square, not centred: SCQP's GP on the rigid-body prior).
    max_points:
        Training-set size cap (FIFO: the oldest samples are dropped).
    refit_every:
        Refit after this many new samples (a refit costs O(max_points^3) per output).
    optimize, max_iter:
        Type-II ML fit of the hyperparameters at every refit (L-BFGS-B, analytic
        gradient, at most ``max_iter`` iterations, warm-started).
    """

    kind = "gp"

    def __init__(self, input_dim: int, output_dim: int, *, length_scale=None, signal_var=1.0,
                 noise_var=0.01, ard: bool = True, max_points: int = 500, refit_every: int = 1,
                 optimize: bool = False, max_iter: int = 50, prior_mean: str = "data"):
        super().__init__(input_dim, output_dim)
        self.ard = bool(ard)
        if prior_mean not in ("data", "zero"):
            raise ValueError(f"prior_mean must be 'data' or 'zero', got {prior_mean!r}")
        self.prior_mean = prior_mean
        d_ls = self.input_dim if self.ard else 1
        o = self.output_dim
        if length_scale is None:  # standardised inputs: one standard deviation of the training inputs
            length_scale = LENGTH_SCALE
        self.ls = _as_hyper(length_scale, o, d_ls, "length_scale")
        self.sf2 = _as_hyper(signal_var, o, 1, "signal_var")[:, 0]
        self.sn2 = _as_hyper(noise_var, o, 1, "noise_var")[:, 0]
        if int(max_points) < 1 or int(refit_every) < 1 or int(max_iter) < 1:
            raise ValueError("max_points, refit_every and max_iter must be >= 1")
        self.max_points = int(max_points)
        self.refit_every = int(refit_every)
        self.optimize = bool(optimize)
        self.max_iter = int(max_iter)
        self.X = np.zeros((0, self.input_dim))
        self.Y = np.zeros((0, o))
        self._pending = 0
        self.n_refits = 0
        self.n_queries_outside = 0
        self._fit_data = None   # (X, Y) raw data of the factorisation in use (Y shifted by transforms)
        self._snap = None   # immutable prediction snapshot (tuple), replaced atomically

    # ---------------------------------------------------------------- config
    def get_config(self) -> Dict[str, Any]:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim,
                "length_scale": self.ls.tolist(), "signal_var": self.sf2.tolist(),
                "noise_var": self.sn2.tolist(), "ard": self.ard, "max_points": self.max_points,
                "refit_every": self.refit_every, "optimize": self.optimize, "max_iter": self.max_iter,
                "prior_mean": self.prior_mean}

    @property
    def n_points(self) -> int:
        return self.X.shape[0]

    def _counters(self) -> Dict[str, int]:
        c = super()._counters()
        c["n_refits"] = self.n_refits
        c["n_queries_outside"] = self.n_queries_outside
        return c

    # ---------------------------------------------------------------- fitting
    def _fit(self, X: np.ndarray, y: np.ndarray, R) -> None:
        self.X = np.vstack([self.X, X])[-self.max_points:]
        self.Y = np.vstack([self.Y, y])[-self.max_points:]
        self._pending += X.shape[0]
        if self._pending >= self.refit_every or self._snap is None:
            self.refit()

    def refit(self) -> None:
        """Standardise the stored data, optionally fit the hyperparameters, factorise."""
        self._pending = 0
        if self.n_points == 0:
            self._snap = self._fit_data = None
            return
        xs, ys = Standardiser.fit(self.X), Standardiser.fit(self.Y, center=self.prior_mean == "data")
        Xs, Ys = xs(self.X), ys(self.Y)
        if self.optimize and self.n_points > 1:
            self._optimize(Xs, Ys)
        self._factorise(self.X, self.Y, xs, ys)
        self.n_refits += 1

    def _factorise(self, X, Y, xs, ys) -> None:
        """Factorise raw data ``X``, ``Y`` with the scalers ``xs``, ``ys`` (the model in use)."""
        Xs, Ys = xs(X), ys(Y)
        n = Xs.shape[0]
        ls, sf2, sn2 = self.ls.copy(), self.sf2.copy(), self.sn2.copy()
        if self.shared_kernel:         # one K for every output: G = 1 in the snapshot
            ls, sf2, sn2 = ls[:1], sf2[:1], sn2[:1]
        K = se_kernel(Xs, Xs, ls, sf2) + sn2[:, None, None] * np.eye(n)[None]
        L = np.linalg.cholesky(K)
        alpha = self._solve_alpha(L, Ys)
        self._fit_data = (X, Y)
        self._snap = (Xs, L, alpha, xs, ys, ls, sf2, sn2)

    @property
    def shared_kernel(self) -> bool:
        """Every output has the same hyperparameters: one kernel matrix serves them all."""
        return bool(np.all(self.ls == self.ls[:1]) and np.all(self.sf2 == self.sf2[0])
                    and np.all(self.sn2 == self.sn2[0]))

    @staticmethod
    def _solve_alpha(L: np.ndarray, Ys: np.ndarray) -> np.ndarray:
        """alpha (outputs x n) for a factor stack L (G x n x n, G = 1 or outputs)."""
        if L.shape[0] == 1:
            return cho_solve((L[0], True), Ys).T.copy()
        return cho_solve((L, True), Ys.T[:, :, None])[:, :, 0]

    def _optimize(self, Xs: np.ndarray, Ys: np.ndarray) -> None:
        G, d_ls = self.ls.shape

        def unpack(t):
            return (np.exp(t[: G * d_ls]).reshape(G, d_ls), np.exp(t[G * d_ls: G * d_ls + G]),
                    np.exp(t[G * d_ls + G:]))

        def f(t):
            nl, (g_ls, g_sf2, g_sn2) = nlml_exact(Xs, Ys, *unpack(t))
            return float(nl.sum()), np.concatenate([g_ls.ravel(), g_sf2, g_sn2])

        t0 = np.concatenate([np.log(self.ls).ravel(), np.log(self.sf2), np.log(self.sn2)])
        bounds = hyper_bounds(self.input_dim, G * d_ls, G)
        t0 = np.clip(t0, [b[0] for b in bounds], [b[1] for b in bounds])
        self.ls, self.sf2, self.sn2 = unpack(minimise_nlml(f, t0, bounds, self.max_iter))

    # ---------------------------------------------------------------- prediction
    def _predict(self, X: np.ndarray, return_var: bool):
        snap = self._snap
        N, o = X.shape[0], self.output_dim
        if snap is None:
            return np.zeros((N, o)), (np.full((N, o), np.inf) if return_var else None), np.zeros(N)
        Xs, L, alpha, xs, ys, ls, sf2, _ = snap
        Q = xs(X)
        Ks = se_kernel(Q, Xs, ls, sf2)                              # G x N x n (G = 1 or o)
        c = Ks.max(axis=2) / sf2[:, None]                             # G x N: nearest training input
        near = (c >= OUTSIDE_CORRELATION).any(axis=0)                 # per query
        if not near.all():
            self.n_queries_outside += int(N - np.count_nonzero(near))
        if Ks.shape[0] == 1 and o > 1:
            mean = ys.mean + ys.std * (Ks[0] @ alpha.T)
        else:
            mean = ys.mean + ys.std * np.einsum("gqn,gn->qg", Ks, alpha)
        # support: the prior variance the nearest training input alone would explain at half
        # the fitted length scale -- (c at l/2)^2 = c^8 -- within the data's spread.  The
        # fitted l says how smooth the window's function is, not how far a window of the
        # recent past can be trusted: with c^2 the torque model asked 0.1-0.3 rad off its
        # data was 0.7 % worse than the training mean (realdata's batch_far), with c^4 0.08 %
        support = ((c * c) ** 4).T * spread_support(Q)[:, None]        # N x G
        if support.shape[1] == 1:
            support = support[:, 0]
        var = None
        if return_var:
            v = solve_triangular(L, np.swapaxes(Ks, 1, 2), lower=True)  # G x n x N
            var_s = np.maximum(sf2[:, None] - np.einsum("gnq,gnq->gq", v, v), 0.0)
            var = (ys.std ** 2)[None, :] * np.broadcast_to(var_s.T, (N, o))
        return mean, var, support

    def mean_gradient(self, X) -> np.ndarray:
        """d mean / dx: ``output_dim x input_dim`` for one x, ``N x output_dim x
        input_dim`` for N rows (SCQP eq. 16)."""
        X2 = np.asarray(X, dtype=float)
        single = X2.ndim == 1
        X2 = np.atleast_2d(X2)
        if X2.shape[1] != self.input_dim or not np.isfinite(X2).all():
            raise ValueError(f"X: expected finite rows of {self.input_dim} values")
        snap = self._snap
        if snap is None:
            out = np.zeros((X2.shape[0], self.output_dim, self.input_dim))
            return out[0] if single else out
        Xs, _, alpha, xs, ys, ls, sf2, _ = snap
        Q = xs(X2)
        Ks = se_kernel(Q, Xs, ls, sf2)                              # o x N x n
        W = Ks * alpha[:, None, :]                                  # o x N x n
        inv2 = 1.0 / ls ** 2                                        # o x d_ls
        # sum_i W_i (x_i - x) / l^2  (standardised), then the scalers' chain rule
        g = (W @ Xs - W.sum(axis=2)[:, :, None] * Q[None]) * inv2[:, None, :]
        out = np.transpose(g, (1, 0, 2)) * (ys.std[None, :, None] / xs.std[None, None, :])
        return out[0] if single else out

    def predict_with_gradient(self, x):
        """Mean (outputs) and its gradient (outputs x inputs) at one input ``x`` from one
        kernel evaluation (what SCQP's QP needs every cycle)."""
        x = np.asarray(x, dtype=float).reshape(1, -1)
        if x.shape[1] != self.input_dim or not np.isfinite(x).all():
            raise ValueError(f"x: expected {self.input_dim} finite values")
        snap = self._snap
        if snap is None:
            return np.zeros(self.output_dim), np.zeros((self.output_dim, self.input_dim))
        Xs, _, alpha, xs, ys, ls, sf2, _ = snap
        Q = xs(x)
        Ks = se_kernel(Q, Xs, ls, sf2)[:, 0, :]                     # G x n
        W = Ks * alpha                                              # o x n
        mean = ys.mean + ys.std * W.sum(axis=1)
        g = (W @ Xs - W.sum(axis=1)[:, None] * Q) / ls ** 2         # o x d (standardised)
        return mean, g * (ys.std[:, None] / xs.std[None, :])

    def log_marginal_likelihood(self) -> np.ndarray:
        """Per-output log marginal likelihood of the standardised training data."""
        snap = self._snap
        if snap is None:
            return np.zeros(self.output_dim)
        Xs, _, _, xs, ys, ls, sf2, sn2 = snap
        return -nlml_exact(Xs, ys(self.Y), ls, sf2, sn2, grad=False)[0]

    # ---------------------------------------------------------------- consistency
    def _transform(self, dpi: np.ndarray, model) -> None:
        if self.n_points == 0:
            return
        q, v, a = split_state(self.X, model.n)
        self.Y = self.Y - ParameterChange.for_model(model).set(dpi).values(q, v, a)
        snap = self._snap
        if snap is None:
            return
        if self._pending:   # samples arrived since the last refit: refit on the shifted window
            self.refit()
            return
        # the window is the factorised set: same inputs, same K, same scalers -> re-solve alpha
        Xs, L, _, xs, ys, ls, sf2, sn2 = snap
        alpha = self._solve_alpha(L, ys(self.Y))
        self._fit_data = (self.X, self.Y)
        self._snap = (Xs, L, alpha, xs, ys, ls, sf2, sn2)

    # ---------------------------------------------------------------- persistence
    def _get_arrays(self) -> Dict[str, np.ndarray]:
        a = {"X": self.X, "Y": self.Y, "pending": np.array(self._pending)}
        if self._snap is not None:   # the model in use: its data and scalers (a transform keeps them)
            xs, ys = self._snap[3], self._snap[4]
            a.update(fit_X=self._fit_data[0], fit_Y=self._fit_data[1], scalers=np.stack([
                np.concatenate([xs.mean, ys.mean]), np.concatenate([xs.std, ys.std])]))
        return a

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        d, o = self.input_dim, self.output_dim

        def data(kx, ky):
            X, Y = np.asarray(arrays[kx], dtype=float), np.asarray(arrays[ky], dtype=float)
            if X.ndim != 2 or X.shape[1] != d or Y.shape != (X.shape[0], o) or X.shape[0] > self.max_points \
                    or not (np.isfinite(X).all() and np.isfinite(Y).all()):
                raise ValueError(f"saved GP data has shapes {X.shape}, {Y.shape} (or non-finite values)")
            return X, Y

        self.X, self.Y = data("X", "Y")
        self._pending = int(arrays.get("pending", 0))
        if "fit_X" in arrays:
            fX, fY = data("fit_X", "fit_Y")
            S = np.asarray(arrays["scalers"], dtype=float)
            if S.shape != (2, d + o) or not np.isfinite(S).all() or (S[1] <= 0).any() or not len(fX):
                raise ValueError(f"saved GP scalers have shape {S.shape} (or bad values)")
            xs, ys = Standardiser(S[0, :d], S[1, :d]), Standardiser(S[0, d:], S[1, d:])
            try:
                self._factorise(fX, fY, xs, ys)   # the saved hyperparameters: no optimisation
            except np.linalg.LinAlgError as exc:
                raise ValueError(f"saved GP does not factorise: {exc}") from None
        elif self.n_points:
            self._pending = max(self._pending, 1)
            opt, self.optimize = self.optimize, False
            try:
                self.refit()
            finally:
                self.optimize = opt

    def memory_bytes(self) -> int:
        total = self.X.nbytes + self.Y.nbytes
        if self._snap is not None:
            total += sum(a.nbytes for a in self._snap[:3])
        return int(total)
