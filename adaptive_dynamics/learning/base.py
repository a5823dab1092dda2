"""Common base of the residual learners: API, input validation, counters, save/load.

API (scikit-learn habits; every learner in :mod:`adaptive_dynamics.learning` follows it)

``partial_fit(X, y, *, regressors=None, model=None) -> self``
    Learn from a batch ``X`` (N x input_dim), ``y`` (N x output_dim) -- a single sample
    may be given as 1-D vectors.  Rows with a NaN/inf anywhere (in ``X``, ``y`` or the
    optional ``regressors``) are *rejected*: counted in :attr:`n_rejected`, never seen
    by the model.  A wrong shape raises ``ValueError`` and leaves the model untouched.
    ``regressors`` (N x n x n_params) / ``model`` are only used by learners that carry a
    parameter sensitivity (the RBF network, ARDL eq. 14); others ignore them.
``predict(X, return_var=False)``
    Mean prediction (N x output_dim, or output_dim for a 1-D ``X``); with
    ``return_var=True`` also the per-output predictive variance (same shape).  A
    non-finite query raises ``ValueError`` (as scikit-learn does): never a silent NaN
    feed-forward.
``apply_parameter_update(delta_pi, model)``
    The consistency transform (consistency paper eq. 15-19, ARDL eq. 12-14): make the
    learned residual ``f = tau - Y pi_hat`` consistent with ``pi_hat + delta_pi``
    without new data.  ``model`` is the :class:`~adaptive_dynamics.dynamics.RobotModel`
    that evaluates Y and its state derivatives; inputs must then be x = (q, qd, qdd).
    The transform is linear in ``delta_pi`` and composes exactly, so a caller may sum
    many small updates and apply them at once.
``support(X)``
    The learner's own measure, in [0, 1], of how well its data covers each query (N,
    or N x output_dim): 1 where it has seen data like ``x``, falling continuously to
    0 where its data does not reach (see "Falling back to the prior" below).
``hint(x)``
    The input the next prediction will be asked for (the reference ahead).  Learners
    that select training data around the query (PGPOL's k nearest database points)
    use it at their next update; the others ignore it.
``save(path)`` / ``Learner.load(path)``
    One ``.npz`` (numeric arrays + a JSON config string; loaded with
    ``allow_pickle=False``, so a model file can never execute code).  Written to a
    temporary file, fsynced, then renamed (:func:`.files.atomic_write`): a crash
    mid-save leaves the previous file intact.
    ``to_bytes()`` / ``Learner.from_bytes(data)``: the same ``.npz`` in memory (the
    model snapshots of the prediction / model-update split).

Falling back to the prior: every learner predicts its *prior* where its data does not
reach.  With s(x) in [0, 1] the learner's support of the query (:meth:`support`: the
GP family's posterior variance relative to the prior's, the GMM's chi^2 level of the
nearest component, the RBF network's activation-weighted data density) and m(x),
v(x) its raw mean and variance, the prediction is

    mean(x) = p + s(x) (m(x) - p)
    var(x)  = s(x) min(v(x), v_p) + (1 - s(x)) v_p + s(x) (1 - s(x)) (m(x) - p)^2

-- the moments of the mixture "the learner with probability s, the prior otherwise"
(where 0 < s < 1; a learner never claims more uncertainty than the prior it falls back
to): continuous in x (no switch that makes a feed-forward jump), and the variance grows
where the mean is pulled back.  The prior is ``prior="zero"`` (a residual: zero, i.e. the
parametric model alone; v_p the targets' second moment) or ``prior="mean"`` (a learner
of the torque itself: the targets' running mean, v_p their variance), both from the
targets learnt so far, or a constant vector c (``prior=[c_1, ..., c_n]``: the part of
an identified model that the parametric model the residual is stacked on does not
carry -- ``identify``'s torque offsets; v_p the targets' second moment about c).  ``raw=True`` (:meth:`set_prediction`, ``make_learner(...,
raw=True)``) returns m, v unchanged (experiments that need the learner as it is); the
support is computed and counted either way.  The consistency transform changes neither
the inputs nor any learner's support, so it holds exactly for the learned part m.

Counters: :attr:`n_updates` (accepted samples), :attr:`n_rejected`,
:attr:`n_transforms`, :attr:`n_predictions` / :attr:`n_pulled_back` (queries whose
support was below :data:`PULLED_BACK`: the prediction is mostly the prior), and per
learner its size (``n_components`` / ``n_basis``).

Concurrency: ``predict`` reads one immutable snapshot of the prediction arrays that
the writers (``partial_fit``, ``apply_parameter_update``) replace by a single
attribute assignment, so a control thread may call ``predict`` while one worker thread
learns, without a lock (tested).  Exception: the RBF network updates its K x K matrix
P in place (a copy per sample would dominate the cost at K = 2048), so a concurrent
``predict(..., return_var=True)`` may read a P that is mid-update (its *variance* is
then slightly off; the mean never is).  Writers must be serialised by the caller.
"""
from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any, ClassVar, Dict, Optional, Tuple, Type

import numpy as np

from ..files import atomic_write

__all__ = ["Learner", "LEARNERS", "register", "make_learner", "load_learner", "split_state", "PRIORS",
           "PULLED_BACK"]

FORMAT_VERSION = 1
#: what a learner falls back to where its data does not reach (see the module docstring)
PRIORS = ("zero", "mean")
#: a query whose support is below this is counted as pulled back (mostly the prior)
PULLED_BACK = 0.5

#: kind -> Learner subclass (filled by :func:`register`)
LEARNERS: Dict[str, Type["Learner"]] = {}


def register(cls):
    """Class decorator: make ``cls`` loadable by its ``kind``."""
    LEARNERS[cls.kind] = cls
    return cls


def make_learner(kind: str, *, prior: str = "zero", raw: bool = False, **config) -> "Learner":
    """Build a learner by name (:data:`LEARNERS`) from keyword configuration; ``prior`` and
    ``raw`` set what it falls back to (:meth:`Learner.set_prediction`)."""
    try:
        cls = LEARNERS[kind]
    except KeyError:
        raise ValueError(f"unknown learner {kind!r}; available: {sorted(LEARNERS)}") from None
    return cls(**config).set_prediction(prior=prior, raw=raw)


def load_learner(path) -> "Learner":
    return Learner.load(path)


def split_state(X: np.ndarray, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split inputs x = (q, qd, qdd) (N x 3n or 3n) into three views."""
    X = np.asarray(X, dtype=float)
    if X.shape[-1] != 3 * n:
        raise ValueError(f"the consistency transform needs inputs x = (q, qd, qdd) of length 3n = {3 * n},"
                         f" got {X.shape[-1]}")
    return X[..., :n], X[..., n:2 * n], X[..., 2 * n:]


def _as_2d(a, width: int, what: str) -> Tuple[np.ndarray, bool]:
    try:
        arr = np.asarray(a, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not numeric ({exc})") from None
    single = arr.ndim == 1
    if single:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"{what}: expected shape (N, {width}) or ({width},), got {np.shape(a)}")
    return arr, single


def _check_npz(buf, limit: int) -> None:
    """Refuse an archive that could expand beyond ``limit`` bytes (see
    :meth:`Learner.from_bytes`): every member stored (np.savez writes them so), their
    total size at most ``limit``, and every ``.npy`` header's shape x item size within
    its member."""
    fmt = np.lib.format
    with zipfile.ZipFile(buf) as zf:
        infos = zf.infolist()
        total = 0
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"member {info.filename!r} is compressed (a learner file stores its members)")
            total += info.file_size
        if total > limit:
            raise ValueError(f"members of {total} bytes in an archive of {limit}")
        for info in infos:
            if not info.filename.endswith(".npy"):
                continue
            with zf.open(info) as fh:
                version = fmt.read_magic(fh)
                read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape, _, dtype = read(fh)
                if dtype.hasobject:
                    raise ValueError(f"member {info.filename!r} holds Python objects")
                need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if need > info.file_size:
                    raise ValueError(f"member {info.filename!r} claims {need} bytes of array data in"
                                     f" {info.file_size}")


class Learner:
    """Base class; subclasses implement ``_fit``, ``_predict``, ``_transform`` and the
    (de)serialisation hooks ``_get_arrays`` / ``_set_arrays``."""

    kind: ClassVar[str] = "base"
    #: whether partial_fit consumes regressors (parameter-sensitivity tracking)
    uses_regressors: ClassVar[bool] = False

    def __init__(self, input_dim: int, output_dim: int):
        input_dim, output_dim = int(input_dim), int(output_dim)
        if input_dim < 1 or output_dim < 1:
            raise ValueError(f"input_dim and output_dim must be >= 1, got {input_dim}, {output_dim}")
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.n_updates = 0
        self.n_rejected = 0
        self.n_transforms = 0
        self.n_predictions = 0
        self.n_pulled_back = 0
        self.prior = "zero"
        self.raw = False
        # running statistics of the learnt targets: [count, mean..., M2...] (Welford)
        self._ystats = np.zeros(1 + 2 * self.output_dim)
        self._prior_cache = None     # (mean, variance) of the prior, rebuilt when stale

    def set_prediction(self, *, prior: Optional[str] = None, raw: Optional[bool] = None) -> "Learner":
        """What the prediction falls back to where the data does not reach: ``prior``
        ``"zero"`` (a residual), ``"mean"`` (the targets' mean: a learner of the torque
        itself) or ``output_dim`` constants (see the module docstring); ``raw=True`` turns the fall-back off (the learner's own mean and
        variance everywhere).  Returns self."""
        if prior is not None:
            if isinstance(prior, str):
                if prior not in PRIORS:
                    raise ValueError(f"prior must be one of {PRIORS} or {self.output_dim} values, got {prior!r}")
            else:
                c = np.asarray(prior, dtype=float).reshape(-1)
                if c.shape != (self.output_dim,) or not np.isfinite(c).all():
                    raise ValueError(f"a constant prior needs {self.output_dim} finite values, got shape"
                                     f" {np.shape(prior)}")
                prior = c.copy()
            self.prior = prior
        if raw is not None:
            self.raw = bool(raw)
        self._prior_cache = None
        return self

    def prior_moments(self):
        """The prior's mean and variance per output (variance inf before any target)."""
        pr = self._prior_cache
        if pr is None:
            self._prior_cache = pr = self._prior_moments()
        return pr[0].copy(), pr[1].copy()

    def _prior_moments(self):
        o = self.output_dim
        st = self._ystats
        cnt, mean, m2 = st[0], st[1:1 + o], st[1 + o:]
        if cnt < 1:
            return np.zeros(o), np.full(o, np.inf)
        var = m2 / cnt
        if isinstance(self.prior, str) and self.prior == "mean":
            return mean.copy(), var
        c = np.zeros(o) if isinstance(self.prior, str) else self.prior
        return c.copy(), var + np.square(mean - c)

    def _track_targets(self, y: np.ndarray) -> None:
        o = self.output_dim
        st = self._ystats
        n_a, mean_a, m2_a = st[0], st[1:1 + o], st[1 + o:]
        n_b = y.shape[0]
        mean_b = y.mean(axis=0)
        m2_b = np.square(y - mean_b).sum(axis=0)
        n = n_a + n_b
        delta = mean_b - mean_a
        self._ystats = np.concatenate([[n], mean_a + delta * (n_b / n),
                                       m2_a + m2_b + delta * delta * (n_a * n_b / n)])
        self._prior_cache = None
    # ----------------------------------------------------------------- public API
    def partial_fit(self, X, y, *, regressors=None, model=None) -> "Learner":
        X2, _ = _as_2d(X, self.input_dim, "X")
        y2, _ = _as_2d(y, self.output_dim, "y")
        if X2.shape[0] != y2.shape[0]:
            raise ValueError(f"X has {X2.shape[0]} rows but y has {y2.shape[0]}")
        ok = np.isfinite(X2).all(axis=1) & np.isfinite(y2).all(axis=1)
        R = None
        if self.uses_regressors:
            R = self._regressors(X2, regressors, model)
            if R is not None:
                ok &= np.isfinite(R.reshape(R.shape[0], -1)).all(axis=1)
        n_bad = int(X2.shape[0] - np.count_nonzero(ok))
        if n_bad:
            X2, y2 = X2[ok], y2[ok]
            if R is not None:
                R = R[ok]
        self.n_rejected += n_bad
        if X2.shape[0]:
            self._fit(X2, y2, R)
            self._track_targets(y2)
            self.n_updates += X2.shape[0]
        return self

    def predict(self, X, return_var: bool = False):
        X2, single = _as_2d(X, self.input_dim, "X")
        if not np.isfinite(X2).all():
            bad = np.flatnonzero(~np.isfinite(X2).all(axis=1))
            raise ValueError(f"X contains NaN/inf (rows {bad[:10].tolist()})")
        out = self._predict(X2, return_var)
        mean, var = out[0], out[1]
        s = out[2] if len(out) > 2 else None
        if s is not None:
            mean, var = self._fall_back(mean, var, s, return_var)
        if single:
            mean = mean[0]
            var = None if var is None else var[0]
        return (mean, var) if return_var else mean

    def support(self, X) -> np.ndarray:
        """The learner's support of each query in [0, 1] (N, or N x output_dim; see the
        module docstring); 0 before it has learnt anything.  Counts nothing."""
        X2, single = _as_2d(X, self.input_dim, "X")
        if not np.isfinite(X2).all():
            raise ValueError("X contains NaN/inf")
        outside = getattr(self, "n_queries_outside", None)
        out = self._predict(X2, False)
        if outside is not None:          # an inspection, not a prediction: no counter moves
            self.n_queries_outside = outside
        s = out[2] if len(out) > 2 and out[2] is not None else np.ones(X2.shape[0])
        s = np.clip(s, 0.0, 1.0)
        return s[0] if single else s

    def _fall_back(self, mean, var, s, return_var):
        N = s.shape[0]
        self.n_predictions += N
        if s.size == 1:                              # the control-rate case: Python floats
            lo = hi = float(s.reshape(-1)[0])
            if lo < PULLED_BACK:
                self.n_pulled_back += 1
        else:
            lo, hi = s.min(), s.max()
            self.n_pulled_back += int(np.count_nonzero((s if s.ndim == 1 else s.min(axis=1)) < PULLED_BACK))
        if self.raw or lo >= 1.0:                    # full support: the learner as it is
            return mean, var
        pr = self._prior_cache
        if pr is None:
            self._prior_cache = pr = self._prior_moments()
        pm, pv = pr
        if hi <= 0.0:                                # no support: the prior
            return (np.broadcast_to(pm, mean.shape).copy(),
                    np.broadcast_to(pv, mean.shape).copy() if return_var and var is not None else var)
        s = np.clip(s, 0.0, 1.0)
        w = s[:, None] if s.ndim == 1 else s
        d = mean - pm
        new = pm + w * d
        if return_var and var is not None:
            with np.errstate(invalid="ignore"):
                v = w * np.minimum(var, pv) + (1.0 - w) * pv + w * (1.0 - w) * d * d
            var = np.where(w >= 1.0, var, np.where(w <= 0.0, pv, v))
        return new, var

    @property
    def pulled_back_fraction(self) -> float:
        """Fraction of the predictions so far that were pulled back to the prior."""
        return self.n_pulled_back / self.n_predictions if self.n_predictions else 0.0

    def apply_parameter_update(self, delta_pi, model) -> None:
        dpi = np.asarray(delta_pi, dtype=float).reshape(-1)
        if dpi.shape != (model.n_params,) or not np.isfinite(dpi).all():
            raise ValueError(f"delta_pi must be {model.n_params} finite values, got shape {np.shape(delta_pi)}")
        if model.n != self.output_dim:
            raise ValueError(f"the model has {model.n} joints but the learner predicts {self.output_dim} outputs")
        split_state(np.zeros(self.input_dim), model.n)  # validates the input layout
        if not np.any(dpi):
            return
        self._transform(dpi, model)
        self.n_transforms += 1

    def hint(self, x) -> None:
        """The input of the next query (see the module docstring); ignored by default."""

    # ------------------------------------------------------------- persistence
    def get_config(self) -> Dict[str, Any]:
        """JSON-able constructor arguments."""
        raise NotImplementedError

    def _write_npz(self, fh) -> None:
        arrays = {f"a_{k}": np.asarray(v) for k, v in self._get_arrays().items()}
        meta = {"kind": self.kind, "version": FORMAT_VERSION, "config": self.get_config(),
                "counters": self._counters(), "prediction": {"prior": self.prior if isinstance(self.prior, str) else self.prior.tolist(),
                               "raw": self.raw}}
        np.savez(fh, __meta__=np.array(json.dumps(meta)), __ystats__=self._ystats, **arrays)

    def to_bytes(self) -> bytes:
        """The learner as the bytes of its ``.npz`` file (see :meth:`save`)."""
        buf = io.BytesIO()
        self._write_npz(buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data) -> "Learner":
        """Inverse of :meth:`to_bytes` (no pickle).  ``data``: any bytes-like object (a
        ``bytes`` object is read in place, not copied).  Anything but a plain ``.npz`` of
        stored members whose sizes fit in ``data`` -- compressed members, a total
        uncompressed size over ``len(data)``, an array header claiming more bytes than
        its member holds (zip or array bombs), a malformed archive or learner -- raises
        ``ValueError("not a learner file: ...")`` before anything large is allocated."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if not data.startswith(b"PK"):
            raise ValueError("not a learner file (no .npz archive)")
        buf = io.BytesIO(data)   # shares the bytes object's buffer (no copy)
        try:
            _check_npz(buf, len(data))
            buf.seek(0)
            return cls.load(buf)
        except Exception as exc:   # a malformed payload never surfaces as another error type
            msg = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(msg if msg.startswith("not a learner file") else f"not a learner file: {msg}") from None

    def save(self, path) -> str:
        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        return atomic_write(path, self._write_npz, suffix=".npz")

    @classmethod
    def load(cls, path) -> "Learner":
        """Load any learner saved by :meth:`save` (the class is taken from the file;
        called on a subclass, the file must hold that kind)."""
        where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "<bytes>"
        with np.load(path if where == "<bytes>" else where, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            arrays = {k[2:]: z[k] for k in z.files if k.startswith("a_")}
            ystats = np.asarray(z["__ystats__"], dtype=float) if "__ystats__" in z.files else None
        kind = meta.get("kind")
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{where}: unsupported learner file version {meta.get('version')!r}")
        if kind not in LEARNERS:
            raise ValueError(f"{where}: unknown learner kind {kind!r}")
        klass = LEARNERS[kind]
        if cls is not Learner and not issubclass(klass, cls):
            raise ValueError(f"{where} holds a {kind!r} learner, not a {cls.kind!r}")
        obj = klass(**{**getattr(klass, "LEGACY_CONFIG", {}), **meta["config"]})
        obj._set_arrays(arrays)
        for k, v in meta.get("counters", {}).items():
            setattr(obj, k, int(v))
        pred = meta.get("prediction", {})
        obj.set_prediction(prior=pred.get("prior", "zero"), raw=pred.get("raw", False))
        if ystats is not None:
            if ystats.shape != obj._ystats.shape or not np.isfinite(ystats).all() or ystats[0] < 0:
                raise ValueError(f"{where}: target statistics of shape {ystats.shape} (or bad values)")
            obj._ystats = ystats
            obj._prior_cache = None
        return obj

    def _counters(self) -> Dict[str, int]:
        return {"n_updates": self.n_updates, "n_rejected": self.n_rejected, "n_transforms": self.n_transforms,
                "n_predictions": self.n_predictions, "n_pulled_back": self.n_pulled_back}

    def memory_bytes(self) -> int:
        """Bytes held by the model's numeric arrays (state + prediction caches)."""
        return int(sum(np.asarray(v).nbytes for v in self._get_arrays().values()))

    # ------------------------------------------------------------------ hooks
    def _regressors(self, X, regressors, model) -> Optional[np.ndarray]:
        return None

    def _fit(self, X: np.ndarray, y: np.ndarray, R: Optional[np.ndarray]) -> None:
        raise NotImplementedError

    def _predict(self, X: np.ndarray, return_var: bool):
        """``(mean, var)`` or ``(mean, var, support)``: the raw prediction and, where the
        learner has one, its support of each query (N or N x output_dim, in [0, 1]);
        the base class applies the fall-back to the prior."""
        raise NotImplementedError

    def _transform(self, dpi: np.ndarray, model) -> None:
        raise NotImplementedError

    def _get_arrays(self) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        cfg = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if not isinstance(v, list))
        return f"{type(self).__name__}({cfg})"
