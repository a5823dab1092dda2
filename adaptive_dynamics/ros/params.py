"""Live-tunable ROS 2 parameters with descriptors and validation.

Every tunable is declared from a :class:`ParamSpec` by :func:`declare_params`,
which gives it a ``rcl_interfaces/ParameterDescriptor`` (description, a
``FloatingPointRange``/``IntegerRange`` for two-sided scalar bounds, an
``additional_constraints`` text for everything else, ``read_only``) so that
rqt_reconfigure shows sliders and ``ros2 param describe`` explains it, and
validates every change in ONE ``on_set_parameters`` callback that refuses bad
values with a reason (``SetParametersResult(successful=False, reason=...)``).

Hooks used per node (registered once, however many times ``declare_params`` is
called on the node):

* pre-set: coerces integers to floats for float parameters (``ros2 param set
  /node kp 100`` sends an INTEGER; without this rclpy refuses it as the wrong
  type);
* on-set: validation (type, NaN, range, array length, per-element range,
  choices, custom validators, cross-parameter validators); parameters not
  declared through this module are left alone;
* post-set: only after the change is committed (no other on-set callback
  refused it) the :class:`ParamStore` is updated and ``on_change`` listeners
  are called.  Listeners run in the executor thread serving the parameter
  service.

Value precedence at declaration: ``--ros-args -p``/``--params-file`` overrides
of the node > the ``overrides`` mapping given to :func:`declare_params` (e.g.
from :func:`load_param_file`) > ``ParamSpec.default``.  An invalid initial
value raises ``ValueError`` (or rclpy's ``InvalidParameterValueException``)
at startup with the reason: a bad config file fails loudly.
"""

from __future__ import annotations

import fnmatch
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.parameter import Parameter

__all__ = [
    "ParamSpec",
    "ParamStore",
    "declare_params",
    "load_param_file",
    "to_parameters",
    "PARAM_TYPES",
]

_T = Parameter.Type
PARAM_TYPES: Dict[str, Parameter.Type] = {
    "bool": _T.BOOL,
    "int": _T.INTEGER,
    "float": _T.DOUBLE,
    "str": _T.STRING,
    "bool[]": _T.BOOL_ARRAY,
    "int[]": _T.INTEGER_ARRAY,
    "float[]": _T.DOUBLE_ARRAY,
    "str[]": _T.STRING_ARRAY,
}
_SCALAR_OF = {"bool[]": "bool", "int[]": "int", "float[]": "float", "str[]": "str"}


class _Refused(ValueError):
    pass


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return _is_int(x) or isinstance(x, (float, np.floating))


def _infer_type(default) -> str:
    if isinstance(default, (bool, np.bool_)):
        return "bool"
    if _is_int(default):
        return "int"
    if isinstance(default, (float, np.floating)):
        return "float"
    if isinstance(default, str):
        return "str"
    if isinstance(default, np.ndarray):
        if default.dtype.kind == "f":
            return "float[]"
        if default.dtype.kind in "iu":
            return "int[]"
        if default.dtype.kind == "b":
            return "bool[]"
        if default.dtype.kind in "US":
            return "str[]"
    if isinstance(default, (list, tuple)):
        if len(default) == 0:
            raise TypeError("cannot infer the type of an empty default; pass type='float[]' etc.")
        for kind, test in (("bool[]", lambda v: isinstance(v, (bool, np.bool_))),
                           ("int[]", _is_int), ("str[]", lambda v: isinstance(v, str))):
            if all(test(v) for v in default):
                return kind
        if all(_is_real(v) for v in default):
            return "float[]"
    raise TypeError(f"unsupported parameter default {default!r}")


def _fmt(v) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, np.ndarray):
        return np.array2string(v, separator=", ")
    return str(v)


@dataclass(frozen=True)
class ParamSpec:
    """Declaration of one parameter.

    ``type`` is inferred from ``default`` (bool, int, float, str, list of
    float/int/bool/str) unless given as one of ``PARAM_TYPES`` (needed for an
    empty default; a list of ints is inferred as ``int[]``: write ``[0.0, ...]``
    or pass ``type='float[]'`` for float arrays).  ``min``/``max`` are
    inclusive; for arrays they bound every element and may be scalars or
    per-element sequences.  ``length`` is the required array length.
    ``choices`` restricts the value (each element, for arrays).
    ``validator(value) -> Optional[str]`` returns a refusal reason or None; it
    receives the value as stored (numpy array for numeric arrays).
    ``constraints`` is extra human-readable text for the descriptor.
    """

    name: str
    default: Any
    description: str = ""
    min: Any = field(default=None, kw_only=True)
    max: Any = field(default=None, kw_only=True)
    step: Optional[float] = field(default=None, kw_only=True)
    read_only: bool = field(default=False, kw_only=True)
    validator: Optional[Callable[[Any], Optional[str]]] = field(default=None, kw_only=True)
    choices: Optional[Sequence[Any]] = field(default=None, kw_only=True)
    length: Optional[int] = field(default=None, kw_only=True)
    type: Optional[str] = field(default=None, kw_only=True)
    constraints: str = field(default="", kw_only=True)

    def __post_init__(self):
        t = self.type if self.type is not None else _infer_type(self.default)
        if t not in PARAM_TYPES:
            raise ValueError(f"{self.name}: unknown type {t!r}; one of {list(PARAM_TYPES)}")
        object.__setattr__(self, "type", t)
        if (self.min is not None or self.max is not None or self.step is not None) and \
                self.elem_type not in ("int", "float"):
            raise ValueError(f"{self.name}: min/max/step only apply to numeric parameters")
        if self.length is not None and not self.is_array:
            raise ValueError(f"{self.name}: length only applies to arrays")
        if self.is_array:
            for b in ("min", "max"):
                bv = getattr(self, b)
                if bv is not None and not np.isscalar(bv) and self.length is not None and \
                        len(bv) != self.length:
                    raise ValueError(f"{self.name}: per-element {b} has {len(bv)} entries, "
                                     f"length is {self.length}")

    @property
    def is_array(self) -> bool:
        return self.type.endswith("[]")

    @property
    def elem_type(self) -> str:
        return _SCALAR_OF.get(self.type, self.type)

    @property
    def ros_type(self) -> Parameter.Type:
        return PARAM_TYPES[self.type]

    # -- value handling --------------------------------------------------------

    def _coerce_elem(self, v, where: str):
        et = self.elem_type
        if et == "bool":
            if isinstance(v, (bool, np.bool_)):
                return bool(v)
        elif et == "int":
            if _is_int(v):
                return int(v)
        elif et == "float":
            if _is_real(v):
                f = float(v)
                if math.isnan(f):
                    raise _Refused(f"{where} is NaN")
                return f
        elif et == "str":
            if isinstance(v, str):
                return v
        raise _Refused(f"{where} must be {et}, got {type(v).__name__} {v!r}")

    def coerce(self, value) -> Any:
        """ROS-side value (Python scalar or list) of the spec's type, or raise
        ``ValueError`` with a reason.  Integers are accepted for floats."""
        if self.is_array:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                raise _Refused(f"parameter '{self.name}' must be a list of {self.elem_type}, "
                               f"got {type(value).__name__} {value!r}")
            return [self._coerce_elem(v, f"parameter '{self.name}'[{i}]")
                    for i, v in enumerate(value)]
        return self._coerce_elem(value, f"parameter '{self.name}'")

    def stored(self, ros_value) -> Any:
        """Value as kept in the store (arrays: read-only numpy arrays / str tuples)."""
        if not self.is_array:
            return ros_value
        if self.type == "str[]":
            return tuple(ros_value)
        dtype = {"float[]": np.float64, "int[]": np.int64, "bool[]": np.bool_}[self.type]
        a = np.array(list(ros_value), dtype=dtype)
        a.flags.writeable = False
        return a

    def check(self, ros_value) -> Optional[str]:
        """Refusal reason for a (coerced) value, or None if acceptable."""
        n = self.name
        vals = list(ros_value) if self.is_array else [ros_value]
        if self.is_array and self.length is not None and len(vals) != self.length:
            return f"parameter '{n}' must have {self.length} elements, got {len(vals)}"
        for bname, bound, bad in (("min", self.min, lambda v, b: v < b),
                                  ("max", self.max, lambda v, b: v > b)):
            if bound is None:
                continue
            per_elem = self.is_array and not np.isscalar(bound)
            if per_elem and len(bound) != len(vals):
                return (f"parameter '{n}': per-element {bname} has {len(bound)} entries "
                        f"but the value has {len(vals)}")
            for i, v in enumerate(vals):
                b = bound[i] if per_elem else bound
                if bad(v, b):
                    where = f"'{n}'[{i}]" if self.is_array else f"'{n}'"
                    return (f"parameter {where}={_fmt(v)} is out of range "
                            f"[{_fmt(self._lo(i))}, {_fmt(self._hi(i))}]")
        if self.step and not self.is_array and self.min is not None:
            k = (ros_value - self.min) / self.step
            if abs(k - round(k)) > 1e-9 * max(1.0, abs(k)):
                return f"parameter '{n}'={_fmt(ros_value)} is not min + k*step (step {self.step})"
        if self.choices is not None:
            for i, v in enumerate(vals):
                if v not in self.choices:
                    where = f"'{n}'[{i}]" if self.is_array else f"'{n}'"
                    return f"parameter {where}={v!r} is not one of {list(self.choices)}"
        if self.validator is not None:
            try:
                reason = self.validator(self.stored(ros_value))
            except Exception as exc:  # a validator that raises refuses the value
                reason = f"{type(exc).__name__}: {exc}"
            if reason:
                return f"parameter '{n}': {reason}"
        return None

    def _lo(self, i):
        if self.min is None:
            return -math.inf
        return self.min[i] if self.is_array and not np.isscalar(self.min) else self.min

    def _hi(self, i):
        if self.max is None:
            return math.inf
        return self.max[i] if self.is_array and not np.isscalar(self.max) else self.max

    def descriptor(self) -> ParameterDescriptor:
        d = ParameterDescriptor()
        d.name = self.name
        d.type = self.ros_type.value
        d.description = self.description
        d.read_only = bool(self.read_only)
        text = []
        scalar_bounds = not self.is_array and self.min is not None and self.max is not None
        if scalar_bounds and self.type == "float":
            d.floating_point_range = [FloatingPointRange(
                from_value=float(self.min), to_value=float(self.max),
                step=float(self.step or 0.0))]
        elif scalar_bounds and self.type == "int":
            d.integer_range = [IntegerRange(
                from_value=int(self.min), to_value=int(self.max), step=int(self.step or 0))]
        elif not self.is_array:
            if self.min is not None:
                text.append(f">= {_fmt(self.min)}")
            if self.max is not None:
                text.append(f"<= {_fmt(self.max)}")
        if self.is_array:
            if self.length is not None:
                text.append(f"length {self.length}")
            if self.min is not None or self.max is not None:
                lo = "-inf" if self.min is None else _fmt(self.min)
                hi = "inf" if self.max is None else _fmt(self.max)
                text.append(f"each element in [{lo}, {hi}]")
        if self.choices is not None:
            text.append(("each element " if self.is_array else "") +
                        f"one of {list(self.choices)}")
        if self.constraints:
            text.append(self.constraints)
        d.additional_constraints = "; ".join(text)
        return d


class ParamStore:
    """Current values of a node's declared parameters (one store per node).

    ``store[name]`` is a plain dict lookup (arrays are read-only numpy arrays,
    string arrays tuples).  A successful set replaces the whole value dict at
    once, so :meth:`snapshot` is a consistent view across an atomic multi-
    parameter change.
    """

    def __init__(self, node):
        self._node = node
        self._specs: Dict[str, ParamSpec] = {}
        self._values: Dict[str, Any] = {}
        self._listeners: Dict[str, List[Callable[[str, Any], None]]] = {}
        self._cross: List[Callable[[Mapping[str, Any]], Optional[str]]] = []
        self._declaring = False
        self._lock = threading.Lock()
        node.add_pre_set_parameters_callback(self._pre_set)
        node.add_on_set_parameters_callback(self._on_set)
        node.add_post_set_parameters_callback(self._post_set)

    # -- mapping API -------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def names(self) -> List[str]:
        return list(self._specs)

    def spec(self, name: str) -> ParamSpec:
        return self._specs[name]

    def snapshot(self) -> Dict[str, Any]:
        """The current value dict (do not mutate; it is replaced, not updated)."""
        return self._values

    def on_change(self, name: str, fn: Callable[[str, Any], None]) -> None:
        """Call ``fn(name, new_value)`` after each accepted change of ``name``."""
        if name not in self._specs:
            raise KeyError(f"parameter '{name}' is not declared through this store")
        self._listeners.setdefault(name, []).append(fn)

    def add_validator(self, fn: Callable[[Mapping[str, Any]], Optional[str]]) -> None:
        """Cross-parameter check: ``fn(candidate_values) -> reason or None``,
        run on every change with all values as they would be after it."""
        reason = fn(self._values)
        if reason:
            raise ValueError(f"current parameter values refused: {reason}")
        self._cross.append(fn)

    def set(self, name: str, value: Any) -> SetParametersResult:
        """Set through the node (same validation as a remote set)."""
        spec = self._specs[name]
        try:
            v = spec.coerce(value)
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return self._node.set_parameters([Parameter(name, spec.ros_type, v)])[0]

    # -- callbacks ---------------------------------------------------------------

    def _pre_set(self, params: List[Parameter]) -> List[Parameter]:
        out = []
        for p in params:
            spec = self._specs.get(p.name)
            if spec is not None and spec.elem_type == "float" and p.type_ != spec.ros_type:
                if (spec.type == "float" and p.type_ == _T.INTEGER) or \
                        (spec.type == "float[]" and p.type_ == _T.INTEGER_ARRAY):
                    try:
                        p = Parameter(p.name, spec.ros_type, spec.coerce(p.value))
                    except ValueError:
                        pass  # left as is; the on-set check refuses it with a reason
            out.append(p)
        return out

    def _on_set(self, params: List[Parameter]) -> SetParametersResult:
        new = {}
        for p in params:
            spec = self._specs.get(p.name)
            if spec is None:
                continue  # not ours: leave it to whoever declared it
            if p.type_ == _T.NOT_SET:
                if self._declaring:
                    continue
                return SetParametersResult(successful=False,
                                           reason=f"parameter '{p.name}' cannot be unset")
            if p.type_ != spec.ros_type:
                return SetParametersResult(
                    successful=False,
                    reason=f"parameter '{p.name}' must be {spec.type}, got {p.type_.name}")
            try:
                v = spec.coerce(p.value)
            except ValueError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
            reason = spec.check(v)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
            new[p.name] = spec.stored(v)
        if new and self._cross and not self._declaring:
            candidate = dict(self._values)
            candidate.update(new)
            for fn in self._cross:
                try:
                    reason = fn(candidate)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                if reason:
                    return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def _post_set(self, params: List[Parameter]) -> None:
        changed = []
        with self._lock:
            values = dict(self._values)
            for p in params:
                spec = self._specs.get(p.name)
                if spec is None or p.type_ == _T.NOT_SET:
                    continue
                values[p.name] = spec.stored(spec.coerce(p.value))
                changed.append(p.name)
            if not changed:
                return
            self._values = values
        for name in changed:
            for fn in self._listeners.get(name, ()):
                try:
                    fn(name, values[name])
                except Exception as exc:  # never break the parameter service
                    self._node.get_logger().error(
                        f"parameter listener for '{name}' raised {type(exc).__name__}: {exc}")

    # -- declaration -------------------------------------------------------------

    def declare(self, specs: Sequence[ParamSpec],
                overrides: Optional[Mapping[str, Any]] = None) -> "ParamStore":
        node = self._node
        overrides = dict(overrides or {})
        # Overrides given to the node itself (--ros-args -p / --params-file).
        # rclpy keeps them in Node._parameter_overrides; we read them so that an
        # int given for a float parameter can be coerced instead of refused.
        node_overrides = getattr(node, "_parameter_overrides", {}) or {}
        for spec in specs:
            if spec.name in self._specs or node.has_parameter(spec.name):
                raise ValueError(f"parameter '{spec.name}' is already declared")
            if spec.name in node_overrides:
                raw, source = node_overrides[spec.name].value, "node parameter overrides"
            elif spec.name in overrides:
                raw, source = overrides[spec.name], "overrides"
            else:
                raw, source = spec.default, "default"
            try:
                value = spec.coerce(raw)
            except ValueError as exc:
                raise ValueError(f"{exc} (from {source})") from None
            reason = spec.check(value)
            if reason:
                raise ValueError(f"{reason} (from {source})")
            self._specs[spec.name] = spec
            desc = spec.descriptor()
            self._declaring = True
            try:
                if spec.is_array and len(value) == 0:
                    # An empty list has no inferable type in rclpy: declare the
                    # static type, then set the empty value.
                    ro = desc.read_only
                    desc.read_only = False
                    node.declare_parameter(spec.name, spec.ros_type, desc, ignore_override=True)
                    node.set_parameters([Parameter(spec.name, spec.ros_type, [])])
                    node.describe_parameter(spec.name).read_only = ro
                else:
                    node.declare_parameter(spec.name, value, desc, ignore_override=True)
            except Exception:
                del self._specs[spec.name]
                raise
            finally:
                self._declaring = False
        return self


def declare_params(node, specs: Sequence[ParamSpec],
                   overrides: Optional[Mapping[str, Any]] = None) -> ParamStore:
    """Declare ``specs`` on ``node`` and return the node's :class:`ParamStore`.

    Calling it again on the same node adds to the same store.
    """
    store = getattr(node, "_adaptive_dynamics_param_store", None)
    if store is None:
        store = ParamStore(node)
        setattr(node, "_adaptive_dynamics_param_store", store)
    return store.declare(specs, overrides)


def to_parameters(values: Mapping[str, Any]) -> List[Parameter]:
    """``rclpy.parameter.Parameter`` list (e.g. ``Node(parameter_overrides=...)``)."""
    out = []
    for k, v in values.items():
        if isinstance(v, tuple):
            v = list(v)
        out.append(Parameter(k, value=v))
    return out


# ------------------------------------------------------------------ YAML files


def _flatten(d: Mapping, prefix: str, out: Dict[str, Any]) -> None:
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            _flatten(v, name, out)
        else:
            out[name] = v


def _sections(doc: Mapping, path: List[str], out: List):
    for k, v in doc.items():
        if not isinstance(v, Mapping):
            continue
        keys = path + [t for t in str(k).split("/") if t]
        if "ros__parameters" in v:
            params = v["ros__parameters"] or {}
            if not isinstance(params, Mapping):
                raise ValueError(f"'ros__parameters' of '{k}' is not a mapping")
            out.append((keys, params))
        else:
            _sections(v, keys, out)


def _match(pat: List[str], name: List[str]) -> bool:
    if not pat:
        return not name
    if pat[0] == "**":
        return any(_match(pat[1:], name[i:]) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], pat[0]) and _match(pat[1:], name[1:])


def load_param_file(path, node_name: str, namespace: Optional[str] = None) -> Dict[str, Any]:
    """Parameters for one node from a ROS 2 parameter YAML file.

    Sections are ``<key>: {ros__parameters: {...}}`` where key is ``/**``, a
    node name, ``/ns/node_name`` (or nested ``ns: {node_name: ...}``), with the
    ROS wildcards ``*`` (within a name token) and ``**`` (any number of
    tokens).  ``node_name`` may be fully qualified (``/ns/node``); with a bare
    name and ``namespace=None`` the namespace part of keys is not checked.
    Matching sections are merged, wildcard sections first and exact ones last
    (the node's own section wins); nested mappings become dotted names.
    """
    import yaml

    with open(path, "r", encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: top level is not a mapping")
    sections: List = []
    _sections(doc, [], sections)

    if node_name.startswith("/"):
        target = [t for t in node_name.split("/") if t]
        ns_known = True
    else:
        ns_tokens = [t for t in (namespace or "").split("/") if t]
        target = ns_tokens + [node_name]
        ns_known = namespace is not None
    base = target[-1]

    wild, exact = [], []
    for keys, params in sections:
        if not keys:
            continue
        if ns_known:
            ok = _match(keys, target)
        else:
            ok = keys[-1] == "**" or fnmatch.fnmatchcase(base, keys[-1])
        if ok:
            (wild if any("*" in k for k in keys) else exact).append(params)
    merged: Dict[str, Any] = {}
    for params in wild + exact:
        _flatten(params, "", merged)
    return merged
