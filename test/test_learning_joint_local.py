"""The joint-local residual learner (learning/joint_local.py): n one-output RBF networks on
each joint's own state -- the same as those networks trained apart (the RBF network is
tested against batch least squares in test_learning_rbfn.py), unmoved by the other
joints' states (where a full-state learner extrapolates or falls back), the consistency
transform against a learner trained on the transformed targets (regressors from
pinocchio), save / load, the OnlineResidual core, the configuration's errors."""
import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import JointLocal, OnlineResidual, RBFNetwork, load_learner, make_learner


def _states(n, N, centre, rng, amp=0.5):
    q = centre + rng.uniform(-amp, amp, (N, n))
    v = rng.uniform(-1.0, 1.0, (N, n))
    a = rng.uniform(-2.0, 2.0, (N, n))
    return np.hstack([q, v, a])


def _joint_local_target(X, n):
    """Friction with a Stribeck bump, a position ripple and an offset per joint: a function
    of each joint's own (q_i, qd_i)."""
    q, v = X[:, :n], X[:, n:2 * n]
    off = np.linspace(-0.3, 0.3, n)
    return 0.4 * v + (0.3 + 0.2 * np.exp(-(v / 0.05) ** 2)) * np.tanh(v / 0.02) + 0.2 * np.sin(6.0 * q) + off


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda", friction=True)


def test_each_output_is_its_joints_network(panda):
    n = panda.n
    rng = np.random.default_rng(0)
    X = _states(n, 800, np.zeros(n), rng)
    y = _joint_local_target(X, n)
    cfg = dict(n_basis=64, width=0.2, warmup=100)
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, **cfg)
    for s in range(0, len(X), 100):
        L.partial_fit(X[s:s + 100], y[s:s + 100])
    Xq = _states(n, 50, np.zeros(n), rng, amp=0.4)
    L.set_prediction(raw=True)      # the networks as they are (the fall-back: the next tests)
    m, v = L.predict(Xq, return_var=True)
    for i in (0, 3, 6):
        Z = X[:, [i, n + i, 2 * n + i]]
        np.testing.assert_array_equal(L.joint_inputs(X, i), Z)
        net = RBFNetwork(3, 1, **cfg).set_prediction(raw=True)
        for s in range(0, len(X), 100):
            net.partial_fit(Z[s:s + 100], y[s:s + 100, i:i + 1])
        Zq = Xq[:, [i, n + i, 2 * n + i]]
        mi, vi = net.predict(Zq, return_var=True)
        np.testing.assert_allclose(m[:, i], mi[:, 0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(v[:, i], vi[:, 0], rtol=1e-9, atol=1e-12)
    # and it learns the joint-local target
    nmse = np.mean((m - _joint_local_target(Xq, n)) ** 2, axis=0) / np.var(y, axis=0)
    assert np.all(nmse < 0.1), nmse


def test_other_joints_elsewhere_change_nothing_raw_and_fall_back_far(panda):
    """Trained with the other joints around one pose, asked with them around another: the
    raw joint-local networks predict the same (no slopes in the other joints' directions);
    with the fall-back the support falls with the configuration's distance to those learnt
    (``reach``) -- along one motion a coupled effect can look joint-local -- so 1.5 rad away
    it is the prior; on the learnt configurations it is the networks'."""
    n = panda.n
    rng = np.random.default_rng(1)
    t = np.arange(1500) * 0.01
    q = 0.4 * np.sin(np.outer(t, np.linspace(0.5, 1.1, n)))
    v = 0.4 * np.linspace(0.5, 1.1, n) * np.cos(np.outer(t, np.linspace(0.5, 1.1, n)))
    X = np.hstack([q, v, rng.uniform(-2.0, 2.0, (t.size, n))])
    y = _joint_local_target(X, n)
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", warmup=200, reach=0.05,
                     velocity_scale=0.0)      # the configuration's distance alone (the state's: below)
    for s in range(0, len(X), 150):
        L.partial_fit(X[s:s + 150], y[s:s + 150])
    Xq = X[::7]
    moved = Xq.copy()
    moved[:, 1:n] += 1.5                       # every joint but the first 1.5 rad away
    L.set_prediction(raw=True)
    np.testing.assert_allclose(L.predict(moved)[:, 0], L.predict(Xq)[:, 0], rtol=0, atol=1e-12)
    truth = _joint_local_target(Xq, n)
    assert np.sqrt(np.mean((L.predict(Xq) - truth) ** 2)) < 0.25 * np.std(truth)
    L.set_prediction(raw=False)
    assert np.all(L.support(Xq) > 0.99)
    assert np.sqrt(np.mean((L.predict(Xq) - truth) ** 2)) < 0.25 * np.std(truth)
    assert np.all(L.support(moved) < 1e-12) and np.abs(L.predict(moved)).max() < 1e-9
    # between: full support within `reach` of a configuration learnt, a Gaussian of width reach / 2 beyond
    off = Xq[:5].copy()
    off[:, 0] += 0.07                          # 0.07 rad off a learnt configuration
    d = np.array([np.min(np.linalg.norm(o[:n] - X[:, :n], axis=1)) for o in off])
    L2 = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", warmup=200, reach=1e6,
                      velocity_scale=0.0)
    for s in range(0, len(X), 150):
        L2.partial_fit(X[s:s + 150], y[s:s + 150])
    nearest_cover = np.array([np.min(np.linalg.norm(o[:n] - L.cover, axis=1)) for o in off])
    assert np.all(nearest_cover >= d - 1e-12) and np.all(nearest_cover <= d + 0.5 * 0.05)
    D = np.maximum(nearest_cover - 0.05, 0.0)   # beyond reach of the kept configurations
    np.testing.assert_allclose(L.support(off), L2.support(off) * np.exp(-2.0 * (D / 0.05) ** 2)[:, None],
                               rtol=1e-6, atol=1e-300)


def test_consistency_transform_against_the_transformed_targets(panda):
    """Samples arriving over a widening range (the networks' boxes grow and refit), the
    estimate changing between batches: the learner equals one trained on the targets
    ``y - Y(x) (pi_final - pi_k)`` (Y from pinocchio's regressor)."""
    m = panda
    n = m.n
    rng = np.random.default_rng(2)
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=m.n_params, warmup=200)
    pi = np.zeros(m.n_params)
    Xs, ys, Rs, pis = [], [], [], []
    for k in range(8):
        X = _states(n, 100, np.zeros(n), rng, amp=0.2 + 0.1 * k)
        R = np.array([m.regressor(x[:n], x[n:2 * n], x[2 * n:]) for x in X])
        y = _joint_local_target(X, n) - R @ pi
        L.partial_fit(X, y, regressors=R)
        Xs.append(X), ys.append(y), Rs.append(R), pis.append(pi.copy())
        d = 0.02 * rng.standard_normal(m.n_params)
        L.apply_parameter_update(d, m)
        pi = pi + d
    assert L._counters()["n_box_growths"] > 0 and L.n_transforms == 8
    X, R = np.vstack(Xs), np.vstack(Rs)
    Y = np.vstack([y - R_ @ (pi - p) for y, R_, p in zip(ys, Rs, pis)])
    ref = make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=m.n_params, warmup=200)
    for s in range(0, len(X), 100):
        ref.partial_fit(X[s:s + 100], Y[s:s + 100], regressors=R[s:s + 100])
    scale = np.abs(Y).max()
    np.testing.assert_allclose(L.predict(X), ref.predict(X), rtol=0, atol=2e-3 * scale)
    # with the model instead of the regressors: the same learner
    M = make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=m.n_params, warmup=200)
    M.partial_fit(Xs[0], ys[0], model=m)
    L0 = make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=m.n_params, warmup=200)
    L0.partial_fit(Xs[0], ys[0], regressors=Rs[0])
    np.testing.assert_allclose(M.predict(X), L0.predict(X), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="regressors"):
        M.partial_fit(Xs[1], ys[1])
    plain = make_learner("joint_local", input_dim=3 * n, output_dim=n, warmup=10)
    plain.partial_fit(Xs[0], ys[0])
    with pytest.raises(ValueError, match="dW/dpi"):
        plain.apply_parameter_update(np.ones(m.n_params), m)


def test_velocity_scale_measures_the_support_from_the_state(panda, tmp_path):
    """velocity_scale tau (default 0.2 s): the support's distance is the state's, (q, tau qd) -- the same
    configurations at another velocity fall back (the learnt ones do not), exactly as the
    configuration-only learner's support at the point (q, tau qd) in 2n dimensions would;
    0 keeps the configuration's alone; the cover and tau saved and loaded."""
    n = panda.n
    t = np.arange(1500) * 0.01
    w = np.linspace(0.5, 1.1, n)
    q, v = 0.4 * np.sin(np.outer(t, w)), 0.4 * w * np.cos(np.outer(t, w))
    X = np.hstack([q, v, np.zeros((t.size, n))])
    y = _joint_local_target(X, n)
    tau = 0.2
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", warmup=200, reach=0.05,
                     velocity_scale=tau)
    L0 = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", warmup=200, reach=0.05,
                      velocity_scale=0.0)
    for s in range(0, len(X), 150):
        L.partial_fit(X[s:s + 150], y[s:s + 150])
        L0.partial_fit(X[s:s + 150], y[s:s + 150])
    assert L.cover.shape[1] == 2 * n and L0.cover.shape[1] == n
    Xq = X[::7]
    back = Xq.copy()
    back[:, n:2 * n] *= -1.0                   # the same configurations, run backwards
    assert np.all(L.support(Xq) > 0.99) and np.all(L0.support(Xq) > 0.99)
    assert np.all(L0.support(back) > 0.99)     # the configuration alone: still "learnt"
    s_back = L.support(back)
    # as the distance of (q, tau qd) to the kept states (a Gaussian of width reach / 2 beyond reach)
    Z = np.hstack([back[:, :n], tau * back[:, n:2 * n]])
    d = np.array([np.min(np.linalg.norm(z - L.cover, axis=1)) for z in Z])
    raw = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", warmup=200, reach=1e6)
    for s in range(0, len(X), 150):
        raw.partial_fit(X[s:s + 150], y[s:s + 150])
    np.testing.assert_allclose(s_back, raw.support(back) * np.exp(-2.0 * (np.maximum(d - 0.05, 0) / 0.05) ** 2)[:, None],
                               rtol=1e-6, atol=1e-300)
    assert np.mean(s_back[:, 0] < 0.5) > 0.5    # most of the reversed states fall back
    loaded = load_learner(L.save(tmp_path / "jlv"))
    assert loaded.get_config()["velocity_scale"] == tau
    np.testing.assert_allclose(loaded.support(back), s_back, rtol=1e-9, atol=1e-300)   # (its tree built at once)
    with pytest.raises(ValueError, match="velocity_scale"):
        JointLocal(3 * n, n, velocity_scale=-1.0)


def test_save_load_bytes_and_errors(panda, tmp_path):
    n = panda.n
    rng = np.random.default_rng(3)
    X = _states(n, 500, np.zeros(n), rng)
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, inputs="qv", n_params=panda.n_params,
                     warmup=100)
    L.partial_fit(X, _joint_local_target(X, n), model=panda)
    # on the learnt configurations (the networks and the cover answer) and far from them (the prior)
    Xq = np.vstack([X[::25] + 0.01, _states(n, 20, np.zeros(n), rng, amp=1.5)])
    assert np.all(L.support(Xq[:20]) > 0.5) and np.all(L.support(Xq[20:]) < 1e-6)
    L.predict(Xq)                              # counters moved before the save
    backs = (load_learner(L.save(tmp_path / "jl")), JointLocal.from_bytes(L.to_bytes()))
    for back in backs:
        assert back.get_config() == L.get_config() and back._counters() == L._counters()
    for back in backs:   # reloaded: geometry and cover tree rebuilt, BLAS may sum in another order (~n eps)
        for a, b in zip(back.predict(Xq, return_var=True), L.predict(Xq, return_var=True)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(back.support(Xq), L.support(Xq), rtol=1e-9, atol=1e-12)
    assert L.support(Xq).shape == (40, n)
    np.testing.assert_array_equal(backs[0].cover, L.cover)
    with pytest.raises(ValueError, match="3 x output_dim"):
        JointLocal(14, 7)
    with pytest.raises(ValueError, match="inputs"):
        JointLocal(21, 7, inputs="q")
    arrays = L._get_arrays()
    broken = JointLocal(**L.get_config())
    with pytest.raises(ValueError, match="joint 7"):
        broken._set_arrays({k: v for k, v in arrays.items() if not k.startswith("j6_")})


def test_online_core_builds_and_transforms_it(panda):
    m = panda
    n = m.n
    rng = np.random.default_rng(4)
    core = OnlineResidual(m, "joint_local", threaded=False, learn_every=1, warmup=100)
    X = _states(n, 300, np.zeros(n), rng)
    y = _joint_local_target(X, n)
    for x, t in zip(X, y):
        core.add_sample(x, t)
    core.process()
    assert core.learner.n_params == m.n_params and core.size() == n * 64
    d = 0.01 * rng.standard_normal(m.n_params)
    core.add_parameter_update(d)
    core.process()
    # as if every sample had been learnt against the changed estimate (the networks can
    # only hold the joint-local part of Y d: that is what such a learner would hold too)
    R = np.array([m.regressor(x[:n], x[n:2 * n], x[2 * n:]) for x in X])
    ref = make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=m.n_params, warmup=100)
    ref.partial_fit(X, y - R @ d, regressors=R)
    np.testing.assert_allclose(core.predict(X), ref.predict(X), rtol=0, atol=2e-3 * np.abs(y).max())
    with pytest.raises(ValueError, match="joint_local"):
        core.set_learner(make_learner("joint_local", input_dim=3 * n, output_dim=n, n_params=5))


def test_stacked_prediction_is_each_networks_and_predict_runs_while_learning(panda):
    """One stacked evaluation for every joint equals the networks asked one by one (mean,
    variance, support; inside, beyond the boxes, and while a network still warms up); a
    thread predicting while another learns (box growths, the cover's tree rebuilt) gets
    finite answers of the right shape and ``support`` moves no counter."""
    import threading

    n = panda.n
    rng = np.random.default_rng(5)
    L = make_learner("joint_local", input_dim=3 * n, output_dim=n, warmup=100)
    X0 = _states(n, 60, np.zeros(n), rng)
    L.partial_fit(X0, _joint_local_target(X0, n))       # still warming up: the per-network path
    assert L._stacked() is None and L.predict(X0[:3]).shape == (3, n)
    X = _states(n, 600, np.zeros(n), rng, amp=0.3)
    L.partial_fit(X, _joint_local_target(X, n))
    Q = np.vstack([X[::20], _states(n, 30, np.zeros(n), rng, amp=1.0)])
    for a, b in zip(L._predict(Q, True), L._predict_each(Q, True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    before = L._counters()["n_queries_outside"]
    L.support(Q)
    assert L._counters()["n_queries_outside"] == before
    errors, done = [], threading.Event()

    def ask():
        while not done.is_set():
            try:
                m, v = L.predict(Q, return_var=True)
                assert m.shape == v.shape == (len(Q), n) and np.isfinite(m).all() and np.isfinite(v).all()
            except Exception as exc:   # pragma: no cover - reported below
                errors.append(exc)
                return

    th = threading.Thread(target=ask)
    th.start()
    try:
        for k in range(6):                                # the motion widens: boxes grow, the cover too
            Xk = _states(n, 200, 0.2 * k * np.ones(n), rng, amp=0.3 + 0.1 * k)
            L.partial_fit(Xk, _joint_local_target(Xk, n))
    finally:
        done.set()
        th.join(10.0)
    assert not errors, errors[:1]
    assert L._counters()["n_box_growths"] > 0
