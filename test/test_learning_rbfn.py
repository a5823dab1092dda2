"""RBF network: the (block) RLS equals the batch regularised least-squares solution,
whatever the block size (and the weighted one with forgetting); Sobol centres in the
box; features; 2048 basis functions with the parameter sensitivity run; variance."""
from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.learning import RBFNetwork


def _data(N=700, i=4, o=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (N, i))
    Y = np.column_stack([np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2], np.cos(X.sum(1)), X[:, 3] ** 2][:o])
    return X, Y + 0.01 * rng.standard_normal(Y.shape)


@pytest.mark.parametrize("block", [1, 7, 256])
def test_rls_equals_batch_ridge(block):
    X, Y = _data()
    reg = 1e-2
    net = RBFNetwork(4, 3, n_basis=48, low=-1, high=1, width=0.6, reg=reg, block_size=block, bias=False,
                     standardize=False)
    net.partial_fit(X[:300], Y[:300])
    net.partial_fit(X[300], Y[300])          # one sample on its own
    net.partial_fit(X[301:], Y[301:])
    Th = net.features(X)
    W = np.linalg.solve(Th.T @ Th + reg * np.eye(48), Th.T @ Y)
    np.testing.assert_allclose(net.W, W, rtol=1e-7, atol=1e-9 * np.abs(W).max())
    P = np.linalg.inv(Th.T @ Th + reg * np.eye(48))
    np.testing.assert_allclose(net.P, P, rtol=1e-6, atol=1e-9 * np.abs(P).max())


def test_rls_with_forgetting_equals_weighted_ridge():
    X, Y = _data(400)
    reg, lam = 1e-2, 0.99
    net = RBFNetwork(4, 3, n_basis=32, low=-1, high=1, width=0.6, reg=reg, forgetting=lam, block_size=64,
                     bias=False, standardize=False)
    net.partial_fit(X, Y)
    N = len(X)
    w = lam ** np.arange(N - 1, -1, -1)                    # sample i weighs lam^(N-1-i)
    Th = net.features(X)
    A = (Th * w[:, None]).T @ Th + lam ** N * reg * np.eye(32)
    W = np.linalg.solve(A, (Th * w[:, None]).T @ Y)
    np.testing.assert_allclose(net.W, W, rtol=1e-6, atol=1e-8 * np.abs(W).max())


def test_sobol_centres_features_and_determinism():
    lo, hi = np.array([-2.0, 0.0, 1.0]), np.array([2.0, 1.0, 3.0])
    a = RBFNetwork(3, 1, n_basis=256, low=lo, high=hi, seed=4)
    b = RBFNetwork(3, 1, n_basis=256, low=lo, high=hi, seed=4)
    c = RBFNetwork(3, 1, n_basis=256, low=lo, high=hi, seed=5)
    np.testing.assert_array_equal(a.centres, b.centres)
    assert not np.allclose(a.centres, c.centres)
    assert a.centres.min() >= 0 and a.centres.max() <= 1         # unit-box coordinates
    # space-filling: every octant of the box holds 256 / 8 centres (Sobol balance)
    octant = (a.centres > 0.5) @ np.array([1, 2, 4])
    assert np.all(np.bincount(octant, minlength=8) == 32)
    x = lo + a.centres[10] * (hi - lo)                            # a centre in input units
    th = a.features(x[None])[0]
    assert th[10] == pytest.approx(1.0) and np.all(th <= 1.0) and np.all(th > 0)
    nn = RBFNetwork(3, 1, n_basis=64, low=lo, high=hi, normalize=True, bias=False)
    np.testing.assert_allclose(nn.features(np.array([[0.0, 0.5, 2.0], [5.0, 5.0, 5.0]])).sum(1), 1.0)
    nb = RBFNetwork(3, 1, n_basis=64, low=lo, high=hi, normalize=True)         # + the constant feature
    np.testing.assert_array_equal(nb.features(x[None])[0, -1], 1.0)


def test_2048_basis_functions_with_sensitivity_run():
    rng = np.random.default_rng(0)
    n, p = 7, 70
    X = rng.uniform(-1, 1, (300, 3 * n))
    Y = np.sin(X[:, :n]) + 0.1 * X[:, n:2 * n]
    R = 0.01 * rng.standard_normal((300, n, p))
    net = RBFNetwork(3 * n, n, n_basis=2048, low=-1, high=1, width=0.8, n_params=p, block_size=128)
    net.partial_fit(X, Y, regressors=R)
    assert net.W.shape == (2049, n) and net.D.shape == (2049, n * p)      # 2048 Gaussians + the bias
    m, v = net.predict(X[:5], return_var=True)
    assert m.shape == v.shape == (5, n) and np.all(np.isfinite(m)) and np.all(v > 0)
    assert net.memory_bytes() > 8 * 2048 * 2048


def test_predictive_variance_grows_away_from_data():
    X, Y = _data(600)
    net = RBFNetwork(4, 3, n_basis=128, low=-2, high=2, width=0.4, reg=1e-3)
    net.partial_fit(X, Y)
    _, v_in = net.predict(X[:50], return_var=True)
    _, v_out = net.predict(np.full((1, 4), 1.8), return_var=True)
    assert np.all(v_out[0] > 2 * v_in.mean(axis=0))
    # the noise level is estimated from the residuals (0.01 noise + approximation error)
    assert np.all(net.noise_var > 0) and np.all(np.sqrt(net.noise_var) < 0.2)


def _far_data(N=3000, seed=0):
    """Joint-like data far from [-1, 1] with targets of large mean (a gravity-loaded
    joint); the motion widens over the first half, so the warm-up sees a fifth of it."""
    rng = np.random.default_rng(seed)
    reach = np.minimum(0.2 + np.arange(N) / (0.5 * N), 1.0)[:, None]
    X = np.array([2.5, -1.8, 0.0]) + np.array([0.5, 0.4, 3.0]) * reach * rng.uniform(-1, 1, (N, 3))
    Y = np.column_stack([40.0 + 6.0 * np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.3 * X[:, 2],
                         -12.0 + 2.0 * np.cos(X[:, 0] + X[:, 1])])
    return X, Y + 0.05 * rng.standard_normal(Y.shape)


def test_default_network_works_on_data_far_from_the_unit_box():
    """No box given: the warm-up range (+ margin) is the box and grows with the data (the
    warm-up saw a fraction of the workspace), the targets are standardised and a bias
    feature takes the offset -- the network fits joint-like data with large mean torques
    far better than linear regression, where ARDL's plain network on the default [-1, 1]
    box does not; a given box does not grow, samples and queries outside are counted."""
    from sklearn.linear_model import LinearRegression

    X, Y = _far_data()
    tr, te = slice(0, 2000), slice(2000, 3000)
    net = RBFNetwork(3, 2, n_basis=256, width=0.3).set_prediction(raw=True)
    for k in range(0, 2000, 50):
        net.partial_fit(X[k:k + 50], Y[k:k + 50])
    assert net.ready and net.box_from_data and 1 <= net.n_box_growths <= 12
    assert np.all(net.low <= X[tr].min(0)) and np.all(net.high >= X[tr].max(0))
    assert net.n_outside_box == 0

    def nmse(P):
        return np.mean((P - Y[te]) ** 2, axis=0) / Y[te].var(axis=0)

    lin = nmse(LinearRegression().fit(X[tr], Y[tr]).predict(X[te]))
    ours = nmse(net.predict(X[te]))
    plain = RBFNetwork(3, 2, n_basis=256, width=0.3, low=-1, high=1, bias=False, standardize=False).set_prediction(raw=True)
    plain.partial_fit(X[tr], Y[tr])
    assert np.all(ours < 0.5 * lin), (ours, lin)
    assert np.all(nmse(plain.predict(X[te])) > 0.5), nmse(plain.predict(X[te]))
    q0 = net.n_queries_outside
    net.predict(np.array([[10.0, 0.0, 0.0], [2.5, -1.8, 0.0]]))
    assert net.n_queries_outside == q0 + 1
    fixed = RBFNetwork(3, 2, n_basis=64, low=X[:200].min(0), high=X[:200].max(0))
    with pytest.warns(RuntimeWarning, match="outside the input box"):
        fixed.partial_fit(X[tr], Y[tr])
    assert fixed.n_outside_box > 0 and fixed.n_box_growths == 0


def test_warm_up_and_saved_network_round_trip(tmp_path):
    """Before the warm-up completes: the prior (zero, with the targets' second moment as
    its variance; infinite before any target), and a saved network
    keeps its buffer; after: the loaded network predicts the same, box and scaling
    included; batch sizes do not change the result."""
    from adaptive_dynamics.learning import Learner

    X, Y = _far_data(600)
    a = RBFNetwork(3, 2, n_basis=64, warmup=200)
    assert np.all(np.isinf(a.predict(X[:3], return_var=True)[1]))
    a.partial_fit(X[:150], Y[:150])
    m, v = a.predict(X[:3], return_var=True)
    assert not a.ready and np.all(m == 0)
    np.testing.assert_allclose(v, np.broadcast_to(np.mean(Y[:150] ** 2, axis=0), v.shape), rtol=1e-12)
    mid = Learner.load(a.save(tmp_path / "mid"))
    for net in (a, mid):
        net.partial_fit(X[150:], Y[150:])
    b = RBFNetwork(3, 2, n_basis=64, warmup=200)
    for k in range(0, 600, 37):
        b.partial_fit(X[k:k + 37], Y[k:k + 37])
    for other in (mid, b, Learner.load(a.save(tmp_path / "done"))):
        np.testing.assert_allclose(other.predict(X), a.predict(X), rtol=1e-7, atol=1e-9 * np.abs(Y).max())
        np.testing.assert_array_equal(other.low, a.low)
