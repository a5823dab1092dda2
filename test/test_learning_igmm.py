"""Incremental GMM + GMR: GMR against an independent reference formula; cross-check of
the IGMM against scikit-learn's batch EM (same component count, same GMR) on a robot
trajectory stream and on i.i.d. data; near-singular covariances prevented (the
consistency paper's failure mode); novelty creation, spurious removal, size cap."""
from __future__ import annotations

import numpy as np
from scipy.stats import multivariate_normal
from sklearn.mixture import GaussianMixture

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import IncrementalGMM

#: Stated tolerance of the cross-check: the IGMM's hold-out nMSE (per output) is within
#: this absolute distance of scikit-learn EM + the same GMR with the same number of
#: components, i.e. both explain >= 99.5 % of the output variance.
NMSE_TOL = 0.005


def _random_mixture(rng, K, D):
    A = rng.standard_normal((K, D, D)) * 0.3
    covs = A @ np.swapaxes(A, 1, 2) + 0.05 * np.eye(D)
    return rng.dirichlet(np.ones(K)), rng.standard_normal((K, D)), covs


def test_gmr_matches_reference_formula():
    """Mean (eq. 11) and variance (law of total variance) against a direct evaluation
    with scipy's multivariate normal, component by component."""
    rng = np.random.default_rng(3)
    K, i, o = 4, 3, 2
    w, mu, cov = _random_mixture(rng, K, i + o)
    L = IncrementalGMM.from_mixture(w, mu, cov, i, eig_floor=1e-12).set_prediction(raw=True)
    X = rng.standard_normal((25, i))
    m, v = L.predict(X, return_var=True)
    for x, mm, vv in zip(X, m, v):
        h = np.array([w[k] * multivariate_normal(mu[k, :i], cov[k, :i, :i]).pdf(x) for k in range(K)])
        h /= h.sum()
        ys, Ss = [], []
        for k in range(K):
            A = cov[k, i:, :i] @ np.linalg.inv(cov[k, :i, :i])
            ys.append(mu[k, i:] + A @ (x - mu[k, :i]))
            Ss.append(cov[k, i:, i:] - A @ cov[k, :i, i:])
        ys = np.array(ys)
        y = h @ ys
        var = sum(h[k] * (np.diag(Ss[k]) + ys[k] ** 2) for k in range(K)) - y ** 2
        np.testing.assert_allclose(mm, y, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(vv, var, rtol=1e-7, atol=1e-12)


def _sklearn_gmr(X, Y, K, seed=0):
    Z = np.hstack([X, Y])
    s = Z.std(axis=0)
    gm = GaussianMixture(K, covariance_type="full", reg_covar=1e-6, random_state=seed, max_iter=300).fit(Z / s)
    return IncrementalGMM.from_mixture(gm.weights_, gm.means_ * s, gm.covariances_ * np.multiply.outer(s, s),
                                       X.shape[1])


def _nmse(model, X, Y):
    return np.mean((model.predict(X) - Y) ** 2, axis=0) / np.var(Y, axis=0)


def _planar2_stream():
    rm = RobotModel("planar2")
    t = np.arange(0.0, 40.0, 0.01)
    w = np.array([[0.7, 1.9], [0.5, 2.3]])
    c = np.array([[0.8, 0.3], [0.9, 0.2]])
    ph = np.array([[0.0, 0.0], [np.pi / 2, 0.0]])
    q = np.stack([(c[j] * np.sin(np.outer(t, w[j]) + ph[j])).sum(1) for j in range(2)], 1)
    v = np.stack([(c[j] * w[j] * np.cos(np.outer(t, w[j]) + ph[j])).sum(1) for j in range(2)], 1)
    a = np.stack([-(c[j] * w[j] ** 2 * np.sin(np.outer(t, w[j]) + ph[j])).sum(1) for j in range(2)], 1)
    X = np.hstack([q, v, a])
    Y = np.array([rm.inverse_dynamics(x[:2], x[2:4], x[4:]) for x in X])
    return X, Y


def test_igmm_matches_sklearn_em_on_robot_trajectory_stream():
    X, Y = _planar2_stream()
    tr, te = slice(0, None, 2), slice(1, None, 2)     # learn every other sample, in time order
    L = IncrementalGMM(6, 2, max_components=32).set_prediction(raw=True)
    L.partial_fit(X[tr], Y[tr])
    assert L.n_components == 32 and L.n_rejected == 0
    ref = _sklearn_gmr(X[tr], Y[tr], L.n_components)
    e_igmm, e_em = _nmse(L, X[te], Y[te]), _nmse(ref, X[te], Y[te])
    assert np.all(np.abs(e_igmm - e_em) <= NMSE_TOL), (e_igmm, e_em)


def test_igmm_matches_sklearn_em_on_iid_data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1.5, 1.5, (4000, 2))
    f = lambda X: np.column_stack([np.sin(2 * X[:, 0]) * np.cos(X[:, 1]), X[:, 0] * X[:, 1]])  # noqa: E731
    Y = f(X) + 0.01 * rng.standard_normal((4000, 2))
    Xt = rng.uniform(-1.4, 1.4, (2000, 2))
    L = IncrementalGMM(2, 2, max_components=32)
    L.partial_fit(X, Y)
    ref = _sklearn_gmr(X, Y, L.n_components)
    e_igmm, e_em = _nmse(L, Xt, f(Xt)), _nmse(ref, Xt, f(Xt))
    assert np.all(np.abs(e_igmm - e_em) <= NMSE_TOL), (e_igmm, e_em)


def test_near_singular_covariances_are_prevented():
    """Degenerate data -- inputs on a line, the output an exact linear function, and
    long runs of the very same sample -- would drive the plain incremental covariance
    to rank 1 or 0 (the failure mode of the consistency paper, sec. VII).  The
    regularised update keeps every eigenvalue (scaled coordinates) above the floor,
    the factorisations succeed and predictions stay finite."""
    t = np.linspace(0, 1, 600)
    d = np.array([1.0, -2.0, 0.5])
    X = np.outer(t, d)
    Y = (X @ np.array([[1.0], [0.3], [-2.0]]))
    X = np.vstack([X, np.repeat(X[300:301], 300, axis=0)])       # 300 identical samples
    Y = np.vstack([Y, np.repeat(Y[300:301], 300, axis=0)])
    L = IncrementalGMM(3, 1, max_components=8, scale=[1.0, 2.0, 0.5, 1.0], delta=0.05)
    L.partial_fit(X, Y)
    lam = L.min_eigenvalues()
    assert np.all(lam >= L.eig_floor * (1 - 1e-9)), (lam, L.eig_floor)
    # the floor is what holds them: without it the smallest eigenvalue would be ~0
    assert lam.min() < 4 * L.reg ** 2
    assert np.all(np.isfinite(L.logdet[: L.K]))
    xq = np.vstack([X[:600:37], X[:600:37] + [0.1, 0.1, -0.1]])  # on and off the line
    m, v = L.predict(xq, return_var=True)
    assert np.all(np.isfinite(m)) and np.all(np.isfinite(v)) and np.all(v >= 0)
    np.testing.assert_allclose(L.predict(X[:600:37]), Y[:600:37], atol=0.05)

    # an exactly singular covariance from outside (from_mixture / load) is floored
    cov = np.zeros((1, 4, 4))
    cov[0, :3, :3] = np.outer(d, d)
    R = IncrementalGMM.from_mixture([1.0], [[0, 0, 0, 0.0]], cov, 3, scale=[1, 1, 1, 1.0], delta=0.1)
    assert R.n_floored == 1
    assert R.min_eigenvalues()[0] >= R.eig_floor * (1 - 1e-9)
    assert np.all(np.isfinite(R.predict(np.array([[0.3, -0.2, 0.1]]))))


def test_novelty_creates_and_spurious_components_are_removed():
    t = np.linspace(0, 20, 2000)
    X = np.column_stack([np.sin(t), np.cos(0.7 * t)])
    Y = X[:, :1] * X[:, 1:]
    outlier = np.array([[8.0, -8.0, 30.0]])
    L = IncrementalGMM(2, 1, max_components=32, scale=[0.7, 0.7, 0.4])
    L.partial_fit(X[:1000], Y[:1000])
    created = L.n_created
    L.partial_fit(outlier[:, :2], outlier[:, 2:])          # novel -> a new component
    assert L.n_created == created + 1
    assert np.min(np.abs(L.means - outlier).sum(axis=1)) < 1e-12
    L.partial_fit(X[1000:], Y[1000:])                     # it never gets support -> removed
    assert L.n_removed >= 1
    assert np.min(np.abs(L.means - outlier).sum(axis=1)) > 1.0
    assert _nmse(L, X[1::7], Y[1::7])[0] < 0.01


def test_size_cap_merges():
    X, Y = _planar2_stream()
    # cap 1: the running moments of all data (a linear-Gaussian model) = EM with K = 1
    L1 = IncrementalGMM(6, 2, max_components=1)
    L1.partial_fit(X[::2], Y[::2])
    e1 = _nmse(L1, X[1::2], Y[1::2])
    np.testing.assert_allclose(e1, _nmse(_sklearn_gmr(X[::2], Y[::2], 1), X[1::2], Y[1::2]), rtol=1e-3)
    # cap 6: components are merged (moment matching, Runnalls' cost) to stay at the cap
    L = IncrementalGMM(6, 2, max_components=6)
    L.partial_fit(X[::2], Y[::2])
    assert L.n_components <= 6 and L.n_merged > 0
    assert np.all(L.weights > 0) and abs(L.weights.sum() - 1) < 1e-12
    e6 = _nmse(L, X[1::2], Y[1::2])
    assert np.all(e6 < 0.5) and np.all(e6 < 0.5 * e1), (e6, e1)


def test_gmr_variance_on_linear_gaussian_data():
    """A linear-Gaussian relation learnt by one component: the GMR mean is the
    regression line and the predictive variance the noise variance plus the
    regulariser's share (reg * scale_y)^2."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((5000, 2))
    sigma = 0.1
    Y = X @ np.array([[0.5], [-1.0]]) + 0.3 + sigma * rng.standard_normal((5000, 1))
    L = IncrementalGMM(2, 1, max_components=1, scale=[1.0, 1.0, 1.2], delta=0.05)
    L.partial_fit(X, Y)
    Xq = rng.uniform(-1, 1, (50, 2))
    m, v = L.predict(Xq, return_var=True)
    np.testing.assert_allclose(m[:, 0], Xq @ [0.5, -1.0] + 0.3, atol=0.02)
    expected = np.sqrt(sigma ** 2 + (L.reg * 1.2) ** 2)
    np.testing.assert_allclose(np.sqrt(v), expected, rtol=0.05)


def test_queries_outside_the_data_are_counted():
    """A query farther than the 99.9 % chi^2 quantile from every component's input
    marginal is counted in n_queries_outside (and saved with the model)."""
    from adaptive_dynamics.learning import Learner
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 2))
    Y = np.sin(X[:, :1]) + 0.01 * rng.normal(size=(600, 1))
    g = IncrementalGMM(2, 1, max_components=8)
    g.partial_fit(X, Y)
    g.predict(X[:50])
    inside = g.n_queries_outside
    assert inside <= 1
    g.predict(np.array([[40.0, 0.0], [0.0, -40.0], [0.1, 0.2]]))
    assert g.n_queries_outside == inside + 2
    assert Learner.from_bytes(g.to_bytes()).n_queries_outside == inside + 2


def _noisy_planar2_stream():
    """The planar arm's stream as a real robot gives it: velocity and (unfiltered)
    acceleration noise, torque-sensor noise."""
    X, Y = _planar2_stream()
    rng = np.random.default_rng(1)
    Xn = X + rng.normal(size=X.shape) * np.r_[1e-4, 1e-4, 0.01, 0.01, 0.2, 0.2]
    Yn = Y + rng.normal(size=Y.shape) * 0.05 * Y.std(axis=0)
    return X, Y, Xn, Yn


def _stream_fit(L, X, Y, batch):
    for i in range(0, len(X), batch):
        L.partial_fit(X[i:i + batch], Y[i:i + batch])
    return L


def test_novelty_does_not_degenerate_on_noisy_data_and_decimation_does_not_matter():
    """On a noisy stream the novelty test of the first batch's geometry made a component
    of nearly every sample (each then merged away at the size cap); with the warm-up
    geometry and the stricter novelty level at the cap it creates few, and the fit stays
    as good as scikit-learn's batch EM at every decimation 1-10."""
    X, Y, Xn, Yn = _noisy_planar2_stream()
    tr = np.arange(0, len(X) - 1, 2)
    te = tr + 1
    legacy = _stream_fit(IncrementalGMM(6, 2, max_components=32, **IncrementalGMM.LEGACY_CONFIG).set_prediction(raw=True),
                         Xn[tr], Yn[tr], 50)
    assert legacy.n_created > 0.9 * tr.size          # the degenerate case this guards against
    for dec in (1, 2, 3, 5, 10):
        idx = tr[::dec]
        L = _stream_fit(IncrementalGMM(6, 2, max_components=32).set_prediction(raw=True), Xn[idx], Yn[idx], 50)
        if dec <= 3:
            assert L.n_created < (0.25 if dec == 1 else 0.4) * idx.size, (dec, L.n_created, idx.size)
        e, e_em = _nmse(L, X[te], Y[te]), _nmse(_sklearn_gmr(Xn[idx], Yn[idx], 32), X[te], Y[te])
        assert np.all(e < 0.02) and np.all(e <= e_em + 0.01), (dec, e, e_em)


def test_first_batch_size_does_not_matter():
    """The geometry (scale, delta) comes from the first ``warmup`` samples however they
    arrive: the same stream in batches of 1, 13, 50, 200 or 1000 gives the same model."""
    _, _, Xn, Yn = _noisy_planar2_stream()
    Xs, Ys = Xn[:1200:2], Yn[:1200:2]
    Xq = Xn[1:1200:2]
    ref = None
    for batch in (1, 13, 50, 200, 1000):
        L = _stream_fit(IncrementalGMM(6, 2, max_components=16), Xs, Ys, batch)
        if batch < L.warmup:
            assert L.n_components > 0
        P = L.predict(Xq)
        if ref is None:
            ref = (P, L.scale.copy(), L.delta, L.n_created)
        else:
            np.testing.assert_allclose(P, ref[0], rtol=1e-9, atol=1e-12)
            assert np.array_equal(L.scale, ref[1]) and L.delta == ref[2] and L.n_created == ref[3]
    # before the warm-up is complete the mixture is empty: the prior (zero) is predicted,
    # and a save / load keeps the buffered rows
    L = IncrementalGMM(6, 2, max_components=16)
    L.partial_fit(Xs[:150], Ys[:150])
    assert L.n_components == 0 and np.all(L.predict(Xq[:3]) == 0.0)
    L2 = IncrementalGMM.from_bytes(L.to_bytes())
    for M in (L, L2):
        M.partial_fit(Xs[150:], Ys[150:])
    np.testing.assert_allclose(L2.predict(Xq), L.predict(Xq), rtol=1e-12)
