"""Residual learners, common API (every registered learner but the exact GP, tested in test_learning_gp.py): shapes, one-sample and batch
partial_fit, rejection of non-finite rows (counted, model untouched), shape errors,
save/load round trip (no pickle), the registry, concurrent predict during learning."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from adaptive_dynamics.learning import (LEARNERS, IncrementalGMM, Learner, RBFNetwork, load_learner,
                                        make_learner)


def _data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 12, n)
    X = np.column_stack([np.sin(0.9 * t), np.cos(0.5 * t), np.sin(1.3 * t + 1)])
    y = np.column_stack([np.sin(X[:, 0] + X[:, 1]), X[:, 2] * X[:, 0]]) + 0.01 * rng.standard_normal((n, 2))
    return X, y


def _make(kind):
    if kind == "sgpol":
        return make_learner("sgpol", input_dim=3, output_dim=2, windows=[400], knn=0)
    if kind == "pgpol":
        return make_learner("pgpol", input_dim=3, output_dim=2, windows=[100, 400], knn=10)
    if kind == "gmm":
        return IncrementalGMM(3, 2, max_components=16, scale=[0.7, 0.7, 0.7, 0.6, 0.6])
    return RBFNetwork(3, 2, n_basis=64, low=-1.2, high=1.2, width=0.4)


KINDS = ["gmm", "rbfn", "sgpol", "pgpol"]


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_single_and_batch(kind):
    X, y = _data()
    L = _make(kind)
    # before any data: zero prediction, finite shapes
    assert L.predict(X[0]).shape == (2,)
    L.partial_fit(X[0], y[0])                # one sample as 1-D vectors
    L.partial_fit(X[2::2], y[2::2])          # a batch (every other sample)
    assert L.n_updates == 300 and L.n_rejected == 0
    m, v = L.predict(X[401:421], return_var=True)
    assert m.shape == v.shape == (20, 2)
    assert np.all(v >= 0) and np.all(np.isfinite(m))
    m1, v1 = L.predict(X[401], return_var=True)
    assert m1.shape == v1.shape == (2,)
    np.testing.assert_allclose(m1, m[0], rtol=1e-10, atol=1e-10)
    # interpolation between the training samples
    nmse = np.mean((L.predict(X[1::2]) - y[1::2]) ** 2, axis=0) / np.var(y, axis=0)
    assert np.all(nmse < 0.05), nmse


@pytest.mark.parametrize("kind", KINDS)
def test_nonfinite_rows_rejected_and_counted(kind):
    X, y = _data()
    A, B = _make(kind), _make(kind)
    A.partial_fit(X[:300], y[:300])
    B.partial_fit(X[:300], y[:300])
    before = A.predict(X[300:320])
    Xb = X[300:306].copy()
    yb = y[300:306].copy()
    Xb[0, 1] = np.nan
    yb[2, 0] = np.inf
    Xb[4, 2] = -np.inf
    # a batch of only bad rows leaves the model untouched
    A.partial_fit(Xb[[0, 2, 4]], yb[[0, 2, 4]])
    assert A.n_rejected == 3 and A.n_updates == 300
    np.testing.assert_array_equal(A.predict(X[300:320]), before)
    # a mixed batch is the same as its finite rows alone
    A.partial_fit(Xb, yb)
    B.partial_fit(Xb[[1, 3, 5]], yb[[1, 3, 5]])
    assert A.n_rejected == 6 and A.n_updates == 303
    np.testing.assert_allclose(A.predict(X[300:320]), B.predict(X[300:320]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_shapes_raise_and_leave_model(kind):
    X, y = _data()
    L = _make(kind)
    L.partial_fit(X[:100], y[:100])
    before = L.predict(X[:5])
    with pytest.raises(ValueError, match="X"):
        L.partial_fit(X[:5, :2], y[:5])
    with pytest.raises(ValueError, match="rows"):
        L.partial_fit(X[:5], y[:4])
    with pytest.raises(ValueError, match="y"):
        L.partial_fit(X[:5], y[:5, :1])
    with pytest.raises(ValueError, match="NaN"):
        L.predict(np.array([0.1, np.nan, 0.0]))
    with pytest.raises(ValueError):
        L.predict(X[:3, :2])
    assert L.n_updates == 100
    np.testing.assert_array_equal(L.predict(X[:5]), before)


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_roundtrip(kind, tmp_path):
    X, y = _data()
    L = _make(kind)
    L.partial_fit(X[:500], y[:500])
    L.partial_fit(np.full((2, 3), np.nan), y[:2])
    path = L.save(tmp_path / "model")
    assert path.endswith(".npz")
    # plain arrays only: loads with allow_pickle=False
    with np.load(path, allow_pickle=False) as z:
        assert "__meta__" in z.files
    R = Learner.load(path)
    assert type(R) is type(L)
    assert (R.n_updates, R.n_rejected) == (500, 2)
    m0, v0 = L.predict(X[500:], return_var=True)
    m1, v1 = R.predict(X[500:], return_var=True)
    np.testing.assert_allclose(m1, m0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(v1, v0, rtol=1e-8, atol=1e-12)
    # learning continues identically after loading
    L.partial_fit(X[500:550], y[500:550])
    R.partial_fit(X[500:550], y[500:550])
    np.testing.assert_allclose(R.predict(X[550:]), L.predict(X[550:]), rtol=1e-9, atol=1e-10)
    # the subclass loader checks the kind; the module helper dispatches
    other = RBFNetwork if kind != "rbfn" else IncrementalGMM
    with pytest.raises(ValueError, match="holds"):
        other.load(path)
    assert type(load_learner(path)) is type(L)
    # a crash-safe write: no temporary files left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]


@pytest.mark.parametrize("kind", KINDS)
def test_bytes_roundtrip_and_malformed_buffers(kind):
    """to_bytes/from_bytes (the split's model snapshots) carry the same model as a file;
    a truncated or foreign buffer is a ValueError, never a half-loaded learner."""
    X, y = _data()
    L = _make(kind)
    L.partial_fit(X[:300], y[:300])
    data = L.to_bytes()
    R = Learner.from_bytes(data)
    np.testing.assert_allclose(R.predict(X[300:]), L.predict(X[300:]), rtol=1e-10, atol=1e-12)
    assert R.n_updates == L.n_updates
    for bad in (data[: len(data) // 2], b"", b"\x80\x04 pickle", data[:-20]):
        with pytest.raises(ValueError, match="not a learner file"):
            Learner.from_bytes(bad)


def test_registry_and_config_validation():
    from adaptive_dynamics.scenarios import LEARNERS as LAUNCH_LEARNERS

    assert set(LEARNERS) == {"gmm", "rbfn", "gp", "pgpol", "sgpol", "joint_local"}
    assert set(LAUNCH_LEARNERS) == {"none"} | set(LEARNERS)  # launch choices follow the registry
    assert isinstance(make_learner("gmm", input_dim=3, output_dim=1), IncrementalGMM)
    assert isinstance(make_learner("rbfn", input_dim=3, output_dim=1, n_basis=8), RBFNetwork)
    with pytest.raises(ValueError, match="unknown learner"):
        make_learner("svm", input_dim=3, output_dim=1)
    with pytest.raises(ValueError):
        IncrementalGMM(3, 1, beta=1.5)
    with pytest.raises(ValueError):
        IncrementalGMM(3, 1, delta=0.02, reg=0.01, eig_floor=1.0)
    with pytest.raises(ValueError):
        RBFNetwork(3, 1, low=[0, 0, 0], high=[1, 0, 1])
    with pytest.raises(ValueError):
        RBFNetwork(3, 1, forgetting=0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_predict_while_learning_in_another_thread(kind):
    """predict reads an immutable snapshot: a control thread may predict while a worker
    learns; every prediction is finite and has the right shape.  The control thread
    predicts as a control loop does -- every 0.2 ms, not in a busy loop that would starve
    the learner of the GIL -- and does so many times while the learner learns."""
    X, y = _data(1200)
    L = _make(kind)
    L.partial_fit(X[:50], y[:50])
    stop = threading.Event()
    bad = []
    count = [0]

    def control():
        while not stop.is_set():
            out = L.predict(X[7])
            count[0] += 1
            if out.shape != (2,) or not np.all(np.isfinite(out)):
                bad.append(out)
            stop.wait(2e-4)

    th = threading.Thread(target=control)
    th.start()
    try:
        for s in range(50, 1200, 10):
            L.partial_fit(X[s:s + 10], y[s:s + 10])
    finally:
        stop.set()
        th.join()
    assert not bad
    assert count[0] >= 20, count[0]        # the predictions did interleave with the learning
