"""Self-collision distances of an arm along a trajectory, with pinocchio's collision module
(coal / hpp-fcl) (no ROS import).

:func:`self_collision_model` builds a :class:`SelfCollision` for a
:class:`~adaptive_dynamics.dynamics.RobotModel` from collision geometry:

* the model's own URDF when it has ``<collision>`` elements (meshes found through
  ``package://`` with the URDF's folders, example-robot-data's share folder and
  ``ROS_PACKAGE_PATH``);
* for a shipped robot whose URDF carries none (``urdf/panda.urdf`` is for dynamics only),
  example-robot-data's URDF of the same arm (:data:`GEOMETRY_SOURCES`), used only when its
  joints' placements agree with the model's (checked at random configurations).

Joints of the geometry's URDF that the model does not have (a gripper's fingers) are
locked at 0 (or the nearest limit).  Every mesh is replaced by its convex hull (GJK
distances in tens of microseconds, and the hull contains the mesh, so a hull distance
never overstates the real one).  Pairs: every pair of geometries
(``GeometryModel.addAllCollisionPairs``) less the SRDF's ``disable_collisions`` (the
robot's SRDF beside its description, when there is one: example-robot-data ships
``panda.srdf``) and less **adjacent links**: geometries on the same joint, or on a joint
and its parent joint -- and pairs already touching at the neutral pose (MoveIt's "default"
rule, for a URDF without an SRDF whose convex hulls overlap there).  The pairs are grouped by the two joints (bodies) they connect;
:meth:`SelfCollision.distances` gives, per sample, the smallest signed distance of each
group [m] (negative: penetration), and :meth:`SelfCollision.distances_and_gradients` its
gradient with respect to q from the witness points, ``dd/dq = n^T (J_p2 - J_p1)``
(``n`` the unit normal from body 1 to body 2, ``J_p`` the translational Jacobian of the
witness point fixed to its body).
"""
from __future__ import annotations

import glob
import os
import re
import sys
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["SelfCollision", "self_collision_model", "GEOMETRY_SOURCES"]

#: shipped robots whose URDF has no collision geometry: example-robot-data's URDF of the
#: same arm (relative to its ``robots/`` folder) and SRDF
GEOMETRY_SOURCES = {
    "panda": ("panda_description/urdf/panda.urdf", "panda_description/srdf/panda.srdf"),
}


def _erd_share() -> Optional[str]:
    """example-robot-data's share folder (the one holding ``example-robot-data/robots``)."""
    cands = []
    for base in sys.path + [sys.prefix]:
        cands.append(os.path.join(base, "cmeel.prefix", "share"))
    cands += glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "cmeel.prefix", "share"))
    for c in cands:
        if os.path.isdir(os.path.join(c, "example-robot-data", "robots")):
            return c
    return None


def _package_dirs(urdf: str) -> List[str]:
    d = os.path.dirname(os.path.abspath(urdf))
    dirs = [d]
    for _ in range(4):
        d = os.path.dirname(d)
        dirs.append(d)
    share = _erd_share()
    if share:
        dirs.append(share)
    dirs += [p for p in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep) if p]
    return [p for p in dict.fromkeys(dirs) if os.path.isdir(p)]


def _has_collision(urdf: str) -> bool:
    try:
        with open(urdf, encoding="utf-8") as fh:
            return "<collision" in fh.read()
    except OSError:
        return False


def _srdf_for(urdf: str, package_dirs: Sequence[str]) -> Optional[str]:
    """The robot's SRDF: ``<name>.srdf`` in a ``srdf/`` folder of the description the URDF's
    meshes (``package://<pkg>/<...>_description/...``) or the URDF itself live in."""
    with open(urdf, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r'<robot[^>]*name="([^"]+)"', text)
    name = m.group(1) if m else os.path.splitext(os.path.basename(urdf))[0]
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(urdf)))]
    for uri in set(re.findall(r'filename="package://([^"]+)"', text)):
        parts = uri.split("/")
        for k in range(len(parts) - 1, 0, -1):
            if parts[k - 1].endswith("_description") or parts[k] in ("meshes", "urdf"):
                for pd in package_dirs:
                    roots.append(os.path.join(pd, *parts[:k]))
                break
    for r in dict.fromkeys(roots):
        for cand in (os.path.join(r, "srdf", f"{name}.srdf"), os.path.join(r, f"{name}.srdf")):
            if os.path.isfile(cand):
                return cand
    return None


def _source(model) -> Tuple[Optional[str], Optional[str], str]:
    """(geometry URDF, SRDF or None, note) or (None, None, why not)."""
    urdf = getattr(model, "urdf_path", None)
    if urdf and _has_collision(urdf):
        return urdf, _srdf_for(urdf, _package_dirs(urdf)), "the model's URDF"
    try:
        from ..robots import share_dir  # lazy
        shipped = {os.path.realpath(p): os.path.splitext(os.path.basename(p))[0]
                   for p in glob.glob(str(share_dir() / "urdf" / "*.urdf"))}
    except FileNotFoundError:
        shipped = {}
    name = shipped.get(os.path.realpath(urdf)) if urdf else None
    if name in GEOMETRY_SOURCES:
        share = _erd_share()
        if share is None:
            return None, None, f"{name}: its URDF has no collision geometry and example-robot-data is not installed"
        rel_urdf, rel_srdf = GEOMETRY_SOURCES[name]
        base = os.path.join(share, "example-robot-data", "robots")
        src, srdf = os.path.join(base, rel_urdf), os.path.join(base, rel_srdf)
        if os.path.isfile(src):
            return src, srdf if os.path.isfile(srdf) else None, f"example-robot-data's {rel_urdf}"
    return None, None, "the URDF has no collision geometry" + ("" if urdf else " (no URDF file)")


class SelfCollision:
    """Self-collision distances of a model's arm (see the module docstring); build it with
    :func:`self_collision_model`."""

    def __init__(self, pin_model, geom_model, q_index: np.ndarray, v_index: np.ndarray, source: str,
                 srdf: Optional[str], note: str):
        import pinocchio as pin

        self.pin = pin
        self.model, self.geom = pin_model, geom_model
        self.data = pin_model.createData()
        self.gdata = pin.GeometryData(geom_model)
        self.q_index, self.v_index = q_index, v_index      # model joint j -> index in the geometry model's q, v
        self.q_ref = pin.neutral(pin_model)
        self.source, self.srdf, self.note = source, srdf, note
        pairs = [(cp.first, cp.second) for cp in geom_model.collisionPairs]
        keys = {}
        for k, (a, b) in enumerate(pairs):
            ja, jb = geom_model.geometryObjects[a].parentJoint, geom_model.geometryObjects[b].parentJoint
            keys.setdefault((min(ja, jb), max(ja, jb)), []).append(k)
        self.groups = sorted(keys)                         # (joint a, joint b) of the geometry model
        self._members = [np.array(keys[g]) for g in self.groups]
        self.n_pairs = len(pairs)

    # ------------------------------------------------------------------ description
    def group_names(self) -> List[str]:
        """``"<body a> / <body b>"`` per group (the geometry objects' link names)."""
        out = []
        for g, mem in zip(self.groups, self._members):
            a, b = self.geom.collisionPairs[int(mem[0])].first, self.geom.collisionPairs[int(mem[0])].second
            na, nb = (self._link(self.geom.geometryObjects[i].name) for i in (a, b))
            if self.geom.geometryObjects[a].parentJoint != g[0]:
                na, nb = nb, na
            out.append(f"{na} / {nb}")
        return out

    @staticmethod
    def _link(geom_name: str) -> str:
        return re.sub(r"_\d+$", "", geom_name)

    def describe(self) -> dict:
        return {"geometry": self.source, "srdf": self.srdf, "source": self.note, "pairs": self.n_pairs,
                "body_pairs": len(self.groups)}

    # ------------------------------------------------------------------ distances
    def _q(self, q) -> np.ndarray:
        x = self.q_ref.copy()
        x[self.q_index] = q
        return x

    def _pair_distances(self, qk) -> np.ndarray:
        pin = self.pin
        pin.computeDistances(self.model, self.data, self.geom, self.gdata, self._q(qk))
        return np.array([r.min_distance for r in self.gdata.distanceResults])

    def distances(self, Q) -> np.ndarray:
        """(K, groups): the smallest signed distance [m] of each body pair at each sample."""
        Q = np.atleast_2d(np.asarray(Q, dtype=float))
        out = np.empty((len(Q), len(self.groups)))
        for k, qk in enumerate(Q):
            d = self._pair_distances(qk)
            out[k] = [d[m].min() for m in self._members]
        return out

    def min_distance(self, Q) -> Tuple[float, int, str]:
        """(smallest distance [m] over the samples and pairs, its sample, its body pair)."""
        Q = np.atleast_2d(np.asarray(Q, dtype=float))
        D = self.distances(Q)
        k, g = np.unravel_index(int(np.argmin(D)), D.shape)
        d = self._pair_distances(Q[k])
        cp = self.geom.collisionPairs[int(self._members[g][np.argmin(d[self._members[g]])])]
        names = (self._link(self.geom.geometryObjects[i].name) for i in (cp.first, cp.second))
        return float(D[k, g]), int(k), " / ".join(names)

    def distances_and_gradients(self, Q, active: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(K, G) distances and (K, G, n) their gradients with respect to the model's q;
        with ``active`` [m], gradients only where the distance is below it (0 elsewhere)."""
        pin = self.pin
        Q = np.atleast_2d(np.asarray(Q, dtype=float))
        G, n = len(self.groups), len(self.q_index)
        D, dD = np.empty((len(Q), G)), np.zeros((len(Q), G, n))
        lwa = pin.ReferenceFrame.LOCAL_WORLD_ALIGNED
        for k, qk in enumerate(Q):
            d = self._pair_distances(qk)                 # also the placements (forward kinematics)
            jac, kinematics = {}, False
            for g, mem in enumerate(self._members):
                i = int(mem[np.argmin(d[mem])])
                D[k, g] = d[i]
                if active is not None and d[i] >= active:
                    continue
                if not kinematics:
                    pin.computeJointJacobians(self.model, self.data, self._q(qk))
                    kinematics = True
                cp = self.geom.collisionPairs[i]
                res = self.gdata.distanceResults[i]
                nrm = np.asarray(res.normal, dtype=float)          # from object 1 to object 2
                grad = np.zeros(self.model.nv)
                for obj, p, sign in ((cp.first, res.getNearestPoint1(), -1.0),
                                     (cp.second, res.getNearestPoint2(), 1.0)):
                    jid = self.geom.geometryObjects[obj].parentJoint
                    if jid == 0:
                        continue
                    if jid not in jac:
                        jac[jid] = pin.getJointJacobian(self.model, self.data, jid, lwa)
                    J = jac[jid]
                    r = np.asarray(p, dtype=float) - self.data.oMi[jid].translation
                    Jp = J[:3] - np.cross(r[:, None], J[3:], axis=0)      # v_p = v_o + w x r
                    grad += sign * (nrm @ Jp)
                dD[k, g] = grad[self.v_index]
        return D, dD


def _neutral_locked(model, jid: int) -> float:
    i = model.joints[jid].idx_q
    lo, hi = float(model.lowerPositionLimit[i]), float(model.upperPositionLimit[i])
    return min(max(0.0, lo), hi) if hi >= lo else 0.0


def self_collision_model(model, *, rng_seed: int = 0) -> Tuple[Optional[SelfCollision], str]:
    """``(SelfCollision, note)`` for ``model`` (a :class:`~adaptive_dynamics.dynamics.RobotModel`),
    or ``(None, why not)`` when there is no usable collision geometry."""
    src, srdf, note = _source(model)
    if src is None:
        return None, note
    import pinocchio as pin

    from ..dynamics.continuous import unbind_continuous  # lazy

    dirs = _package_dirs(src)
    try:
        with open(src, encoding="utf-8") as fh:
            text, continuous = unbind_continuous(fh.read())     # as RobotModel reads it: one angle each
        if continuous:
            full = pin.buildModelFromXML(text)
            geom = pin.buildGeomFromUrdfString(full, text, pin.GeometryType.COLLISION, package_dirs=dirs)
        else:
            full = pin.buildModelFromUrdf(src)
            geom = pin.buildGeomFromUrdf(full, src, pin.GeometryType.COLLISION, package_dirs=dirs)
    except (RuntimeError, ValueError, OSError) as exc:
        return None, f"cannot read the collision geometry of {src}: {exc}"
    if geom.ngeoms == 0:
        return None, f"{src} has no collision geometry"
    names = list(model.joint_names)
    lock = [j for j in range(1, full.njoints) if full.names[j] not in names]
    missing = [nm for nm in names if nm not in list(full.names)]
    if missing:
        return None, f"{src} lacks the model's joints {missing}"
    q_ref = pin.neutral(full)
    for j in lock:
        if full.joints[j].nq == 1:
            q_ref[full.joints[j].idx_q] = _neutral_locked(full, j)
    if lock:
        red, geom = pin.buildReducedModel(full, geom, lock, q_ref)
    else:
        red = full
    jids = [red.getJointId(nm) for nm in names]
    if any(red.joints[j].nq != 1 or red.joints[j].nv != 1 for j in jids):
        return None, f"{src}: a joint of the model is not 1-DoF in the geometry's model"
    q_index = np.array([red.joints[j].idx_q for j in jids])
    v_index = np.array([red.joints[j].idx_v for j in jids])
    # the geometry's kinematics must be the model's: joint placements at random configurations
    rng = np.random.default_rng(rng_seed)
    dm, dr = model.model.createData(), red.createData()
    lo, up = np.asarray(model.lower, float), np.asarray(model.upper, float)
    ok = np.isfinite(lo) & np.isfinite(up) & (up - lo < 1e6)
    for _ in range(5):
        q = np.where(ok, rng.uniform(np.where(ok, lo, -1), np.where(ok, up, 1)), rng.uniform(-np.pi, np.pi, model.n))
        x = pin.neutral(red)
        x[q_index] = q
        pin.forwardKinematics(model.model, dm, q)
        pin.forwardKinematics(red, dr, x)
        for j, jr in zip(range(1, model.model.njoints), jids):
            a, b = dm.oMi[j], dr.oMi[jr]
            if np.abs(a.translation - b.translation).max() > 1e-6 or np.abs(a.rotation - b.rotation).max() > 1e-6:
                return None, f"the kinematics of {src} differ from the model's (joint {names[j - 1]})"
    for go in geom.geometryObjects:              # convex hulls: fast GJK, never an overstated distance
        g = go.geometry
        if hasattr(g, "buildConvexRepresentation"):
            g.buildConvexRepresentation(False)
            go.geometry = g.convex
    geom.addAllCollisionPairs()
    if srdf is not None:
        pin.removeCollisionPairs(red, geom, srdf, False)
    parents = list(red.parents)
    drop = []
    for cp in geom.collisionPairs:
        ja, jb = geom.geometryObjects[cp.first].parentJoint, geom.geometryObjects[cp.second].parentJoint
        if ja == jb or parents[ja] == jb or parents[jb] == ja:
            drop.append((cp.first, cp.second))
    # by index: the pairs the vector hands out are references that an erase shifts
    for a, b in drop:
        geom.removeCollisionPair(pin.CollisionPair(a, b))
    # MoveIt's "default" rule: a pair touching at the neutral pose (hulls that overlap there,
    # a URDF without an SRDF) is no constraint a motion could meet
    gd = pin.GeometryData(geom)
    x = pin.neutral(red)
    x[q_index] = np.clip(0.0, lo, up)
    pin.computeDistances(red, red.createData(), geom, gd, x)
    touching = [(cp.first, cp.second) for cp, r in zip(geom.collisionPairs, gd.distanceResults)
                if r.min_distance <= 0.0]
    for a, b in touching:
        geom.removeCollisionPair(pin.CollisionPair(a, b))
    if len(geom.collisionPairs) == 0:
        return None, f"{src}: no pair of non-adjacent bodies left to check"
    sc = SelfCollision(red, geom, q_index, v_index, src, srdf, note)
    return sc, note
