"""Every registered learner falls back to its prior where its data does not reach
(learning/base.py: mean = p + s (m - p), the mixture's variance), continuously, with an
honest variance, counted, kept through save/load, and unchanged by the consistency
transform (which moves only the learned part)."""
import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import LEARNERS, Learner, make_learner

KINDS = sorted(LEARNERS)


def _stream(rm, centre, seconds=15.0, rate=100.0, seed=0):
    """A planar-arm state stream around ``centre`` (sums of sines) and a smooth residual
    target: viscous + smooth Coulomb friction and a position-dependent torque."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 1.0 / rate)
    n = rm.n
    a = rng.uniform(0.2, 0.4, (n, 2))
    w = rng.uniform(0.5, 1.5, (n, 2))
    q = centre[:, None] + (a[:, :1] * np.sin(w[:, :1] * t) + a[:, 1:] * np.sin(w[:, 1:] * t + 1.0))
    qd = a[:, :1] * w[:, :1] * np.cos(w[:, :1] * t) + a[:, 1:] * w[:, 1:] * np.cos(w[:, 1:] * t + 1.0)
    qdd = -a[:, :1] * w[:, :1] ** 2 * np.sin(w[:, :1] * t) - a[:, 1:] * w[:, 1:] ** 2 * np.sin(w[:, 1:] * t + 1.0)
    X = np.vstack([q, qd, qdd]).T
    Y = (0.5 * qd + 0.8 * np.tanh(qd / 0.05) + 0.6 * np.sin(2.0 * q)).T
    return X, Y + 0.01 * rng.standard_normal(Y.shape)


@pytest.fixture(scope="module")
def planar():
    rm = RobotModel("planar2")
    X, Y = _stream(rm, np.array([0.3, -0.4]))
    Xf, Yf = _stream(rm, np.array([2.6, 1.9]), seconds=5.0, seed=1)   # far from every training state
    return rm, X, Y, Xf, Yf


def _fit(kind, X, Y, **kw):
    L = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1], **kw)
    for i in range(0, len(X), 50):          # a stream, in time order, no hints
        L.partial_fit(X[i:i + 50], Y[i:i + 50])
    return L


@pytest.mark.parametrize("kind", KINDS)
def test_far_queries_get_the_prior_near_ones_the_learner(kind, planar):
    _, X, Y, Xf, Yf = planar
    L = _fit(kind, X, Y)
    scale = float(np.abs(Y).max())
    # far from the data: the prior (zero residual), its variance the targets' second moment
    m, v = L.predict(Xf, return_var=True)
    assert np.abs(m).max() <= 1e-3 * scale, np.abs(m).max()
    np.testing.assert_allclose(v, np.broadcast_to(np.mean(Y ** 2, axis=0), v.shape), rtol=0.02)
    assert np.all(L.support(Xf) <= 1e-3)
    # never worse than the prior there, per output (the batch_far_vs_prior check)
    assert np.all(np.mean((Yf - m) ** 2, axis=0) <= np.mean(Yf ** 2, axis=0) * (1 + 1e-6))
    # near the newest data (every learner, windowed ones included, has it): the learner,
    # as good as without the fall-back
    near = slice(len(X) - 100, len(X), 2)
    s = L.support(X[near])
    assert np.median(s if s.ndim == 1 else s.min(axis=1)) > 0.9
    raw = L.set_prediction(raw=True).predict(X[near])
    L.set_prediction(raw=False)
    err = np.mean((L.predict(X[near]) - Y[near]) ** 2, axis=0)
    err_raw = np.mean((raw - Y[near]) ** 2, axis=0)
    assert np.all(err <= 1.05 * err_raw + 1e-9 * np.mean(Y[near] ** 2, axis=0)), (err, err_raw)
    # where the support is full the fall-back changes nothing
    full = (s if s.ndim == 1 else s.min(axis=1)) > 1 - 1e-9
    if full.any():
        np.testing.assert_allclose(L.predict(X[near])[full], raw[full], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_the_fall_back_is_continuous_and_its_variance_grows(kind, planar):
    _, X, Y, Xf, _ = planar
    L = _fit(kind, X, Y)
    s_near = L.support(X[-100:])
    a, b = X[-100 + int(np.argmax(s_near if s_near.ndim == 1 else s_near.min(axis=1)))], Xf[len(Xf) // 2]
    path = a + np.linspace(0.0, 1.0, 801)[:, None] * (b - a)
    m, v = L.predict(path, return_var=True)
    s = L.support(path)
    s = s if s.ndim == 1 else s.min(axis=1)
    assert s[0] > 0.3 and s[-1] <= 1e-3
    # no switch: the largest step of the feed-forward along the path shrinks when that
    # stretch is sampled 1000 times finer (a jump would stay)
    steps = np.abs(np.diff(m, axis=0)).max(axis=1)
    k = int(np.argmax(steps))
    fine = path[k] + np.linspace(0.0, 1.0, 1001)[:, None] * (path[k + 1] - path[k])
    fine_steps = np.abs(np.diff(L.predict(fine), axis=0)).max()
    assert fine_steps <= 0.05 * steps[k] + 1e-12, (fine_steps, steps[k])
    # honest variance: never below the learner's own (at most the prior's) where the mean is
    # pulled back, the prior's where the support is gone
    pv = np.mean(Y ** 2, axis=0)
    np.testing.assert_allclose(v[-1], pv, rtol=0.02)
    raw_v = L.set_prediction(raw=True).predict(path, return_var=True)[1]
    L.set_prediction(raw=False)
    assert np.all(v >= np.minimum(raw_v, pv[None]) * (1 - 1e-9))


@pytest.mark.parametrize("kind", KINDS)
def test_prior_mean_raw_switch_counters_and_save_load(kind, planar, tmp_path):
    _, X, Y, Xf, _ = planar
    off = np.array([5.0, -3.0])
    L = _fit(kind, X, Y + off, prior="mean")
    pm = (Y + off).mean(axis=0)
    np.testing.assert_allclose(L.predict(Xf), np.broadcast_to(pm, (len(Xf), 2)), atol=1e-3 * np.abs(off).max())
    c = np.array([0.25, -0.5])                              # a constant prior (identify's offsets)
    L.set_prediction(prior=c)
    np.testing.assert_allclose(L.predict(Xf[:5]), np.broadcast_to(c, (5, 2)), atol=1e-3 * np.abs(off).max())
    n0, p0 = L.n_predictions, L.n_pulled_back
    L.predict(Xf[:40])
    assert L.n_predictions == n0 + 40 and L.n_pulled_back == p0 + 40
    s_near = L.support(X[-100:])
    s_near = s_near if s_near.ndim == 1 else s_near.min(axis=1)
    L.predict(X[-100:])
    assert L.n_predictions == n0 + 140 and L.n_pulled_back == p0 + 40 + np.count_nonzero(s_near < 0.5)
    assert 0.0 < L.pulled_back_fraction <= 1.0
    # the raw switch: the learner's own mean everywhere, the support still counted
    raw = make_learner(kind, input_dim=6, output_dim=2, raw=True)
    for i in range(0, len(X), 50):
        raw.partial_fit(X[i:i + 50], Y[i:i + 50])
    np.testing.assert_allclose(raw.predict(Xf), _raw_mean(raw, Xf), rtol=0, atol=0)
    raw.predict(Xf[:10])
    assert raw.n_pulled_back >= 10
    # the prior, the switch and the target statistics are saved with the learner
    for a in (L, raw):
        b = Learner.load(a.save(tmp_path / f"{kind}_{a.raw}"))
        assert b.raw == a.raw and np.array_equal(np.asarray(b.prior), np.asarray(a.prior))
        # reloaded: factors rebuilt from the stored arrays, BLAS may sum in another order (~n eps; atol: var cancels)
        np.testing.assert_allclose(b.predict(Xf[:20]), a.predict(Xf[:20]), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b.predict(X[-20:], return_var=True)[1], a.predict(X[-20:], return_var=True)[1],
                                   rtol=1e-9, atol=1e-12)
        c2 = Learner.from_bytes(a.to_bytes())
        np.testing.assert_allclose(c2.predict(Xf[:20]), a.predict(Xf[:20]), rtol=1e-9, atol=1e-12)  # (as above)
    with pytest.raises(ValueError, match="prior"):
        L.set_prediction(prior="median")
    with pytest.raises(ValueError, match="constant prior"):
        L.set_prediction(prior=[1.0, np.nan])


def _raw_mean(L, X):
    out = L._predict(np.asarray(X, dtype=float), False)
    return out[0]


@pytest.mark.parametrize("kind", KINDS)
def test_transform_moves_the_learned_part_and_leaves_the_support(kind, planar):
    rm, X, Y, Xf, _ = planar
    kw = {"n_params": rm.n_params} if kind in ("rbfn", "joint_local") else {}
    L = make_learner(kind, input_dim=6, output_dim=2, **kw)
    for i in range(0, len(X), 50):
        L.partial_fit(X[i:i + 50], Y[i:i + 50], model=rm)
    Q = np.vstack([X[-60::3], Xf[:20], X[-1] + 0.5 * (Xf[0] - X[-1])])
    s0 = L.support(Q)
    dpi = 0.05 * np.random.default_rng(3).standard_normal(rm.n_params)
    L.apply_parameter_update(dpi, rm)
    np.testing.assert_allclose(L.support(Q), s0, rtol=1e-9, atol=1e-12)
    s = s0 if s0.ndim == 2 else s0[:, None]
    np.testing.assert_allclose(L.predict(Q), s * _raw_mean(L, Q), rtol=1e-9, atol=1e-12)
