"""Inertial parameter vectors: orders, rigid transforms, physical consistency.

The project's canonical per-link order is pinocchio's ``Inertia.toDynamicParameters``:

    [m, m*cx, m*cy, m*cz, Ixx, Ixy, Iyy, Ixz, Iyz, Izz]

with the first moment ``h = m*c`` and the rotational inertia taken about the **link
frame origin** (not the CoM), both expressed in the link frame.  A robot's vector pi
stacks one 10-block per joint-moving body, in joint order.

Other libraries use other orders (same physical quantities, same reference point):

* ``"ardl"``  (ARDL ``SpatialInertia::toVector``): [m, hx, hy, hz, Ixx, Iyy, Izz, Ixy, Ixz, Iyz]
* ``"thunder"`` (Thunder Dynamics ``*_inertial_REG.yaml``, also Khalil/Atkeson):
  [m, hx, hy, hz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz]
"""
from __future__ import annotations

import math

import numpy as np

PINOCCHIO_ORDER = ("m", "mx", "my", "mz", "Ixx", "Ixy", "Iyy", "Ixz", "Iyz", "Izz")

# index in the foreign order of each pinocchio-order element
_ORDERS = {
    "pinocchio": PINOCCHIO_ORDER,
    "ardl": ("m", "mx", "my", "mz", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz"),
    "thunder": ("m", "mx", "my", "mz", "Ixx", "Ixy", "Ixz", "Iyy", "Iyz", "Izz"),
}


class PhysicalConsistencyError(ValueError):
    """Raised when an inertial parameter block is not physically realisable."""


def _perm(order: str) -> np.ndarray:
    try:
        names = _ORDERS[order]
    except KeyError:
        raise ValueError(f"unknown parameter order {order!r}; use one of {sorted(_ORDERS)}") from None
    # perm[k] = position in pinocchio order of the k-th element of `order`
    return np.array([PINOCCHIO_ORDER.index(n) for n in names])


def convert_order(pi, src: str, dst: str) -> np.ndarray:
    """Reorder a stacked parameter vector (length multiple of 10) between conventions.

    ``convert_order(pi, "pinocchio", "ardl")`` etc.  Friction or other extra entries are
    not allowed here: pass only the 10-per-link inertial part.
    """
    pi = np.asarray(pi, dtype=float)
    if pi.ndim != 1 or pi.size % 10:
        raise ValueError(f"pi must be a flat vector with 10 entries per link, got shape {pi.shape}")
    blocks = pi.reshape(-1, 10)
    p_src, p_dst = _perm(src), _perm(dst)
    canonical = np.empty_like(blocks)
    canonical[:, p_src] = blocks
    return canonical[:, p_dst].reshape(-1).copy()


def inertia_matrix(pi10) -> np.ndarray:
    """3x3 rotational inertia about the frame origin from a pinocchio-order 10-vector."""
    _, _, _, _, xx, xy, yy, xz, yz, zz = pi10
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def from_mass_com_inertia(mass: float, com, inertia_com) -> np.ndarray:
    """10-vector (pinocchio order, inertia about the frame origin) from m, CoM and the
    3x3 inertia about the CoM (the URDF convention)."""
    c = np.asarray(com, dtype=float).reshape(3)
    Ic = np.asarray(inertia_com, dtype=float).reshape(3, 3)
    Io = Ic + mass * (c @ c * np.eye(3) - np.outer(c, c))
    h = mass * c
    return np.array([mass, *h, Io[0, 0], Io[0, 1], Io[1, 1], Io[0, 2], Io[1, 2], Io[2, 2]])


def pseudo_inertia(pi10) -> np.ndarray:
    """4x4 pseudo-inertia J = [[S, h], [h^T, m]], S = tr(I)/2 * 1 - I (Wensing et al. 2017).

    A link is physically consistent (a real mass distribution exists) iff J is positive
    definite; the limit of a degenerate body (point mass, rod) is positive semidefinite.
    """
    pi10 = np.asarray(pi10, dtype=float)
    I = inertia_matrix(pi10)
    J = np.empty((4, 4))
    J[:3, :3] = 0.5 * np.trace(I) * np.eye(3) - I
    J[:3, 3] = J[3, :3] = pi10[1:4]
    J[3, 3] = pi10[0]
    return J


def pseudo_inertias(blocks: np.ndarray) -> np.ndarray:
    """Stack of 4x4 pseudo-inertias (:func:`pseudo_inertia`) of L x 10 pinocchio-order blocks."""
    m, hx, hy, hz, xx, xy, yy, xz, yz, zz = blocks.T
    half_tr = 0.5 * (xx + yy + zz)
    J = np.empty((blocks.shape[0], 4, 4))
    J[:, 0, 0], J[:, 1, 1], J[:, 2, 2] = half_tr - xx, half_tr - yy, half_tr - zz
    J[:, 0, 1] = J[:, 1, 0] = -xy
    J[:, 0, 2] = J[:, 2, 0] = -xz
    J[:, 1, 2] = J[:, 2, 1] = -yz
    J[:, :3, 3] = J[:, 3, :3] = blocks[:, 1:4]
    J[:, 3, 3] = m
    return J


#: the unit ball block: pseudo-inertia = identity (m = 1, h = 0, I = 2 * 1 about the origin)
UNIT_BALL = np.array([1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 2.0, 0.0, 0.0, 2.0])

# ||J(pi10)||_F^2 = pi10^T _FROB pi10 for the pseudo-inertia J of a block (m^2 + 2 |h|^2 +
# |tr(I)/2 1 - I|_F^2, the last a quadratic form in (Ixx, Iyy, Izz) plus 2 (Ixy^2 + Ixz^2 + Iyz^2))
_FROB = np.diag([1.0, 2.0, 2.0, 2.0, 0.75, 2.0, 0.75, 2.0, 2.0, 0.75])
for _i, _j in ((4, 6), (4, 9), (6, 9)):
    _FROB[_i, _j] = _FROB[_j, _i] = -0.25


def ball_shift_scale(blocks) -> float:
    """Scale ``s`` that makes ``blocks / s + UNIT_BALL`` physical for any finite L x 10
    ``blocks`` (negative or zero masses included).

    ``s = 2 max_i ||J_i||_F`` (J_i the pseudo-inertia of block i; the Frobenius norm
    bounds the spectral norm), so every shifted block has pseudo-inertia eigenvalues in
    [1/2, 3/2]: physical and well conditioned.  A quantity linear in the inertial
    parameters is then ``f(blocks) = s (f(blocks / s + ball) - f(ball))`` (about one
    digit lost to the subtraction).  ``0`` for all-zero blocks.
    """
    B = np.asarray(blocks, dtype=float)
    return 2.0 * math.sqrt(max(0.0, float(((B @ _FROB) * B).sum(axis=1).max())))


def link_consistency_margin(pi10) -> float:
    """Smallest eigenvalue of the pseudo-inertia (> 0 means strictly consistent)."""
    return float(np.linalg.eigvalsh(pseudo_inertia(pi10))[0])


def check_physical_consistency(pi, link_names, *, tol: float = 0.0) -> None:
    """Raise :class:`PhysicalConsistencyError` naming the first inconsistent link.

    ``pi`` holds 10 entries per link (pinocchio order) for ``link_names``; extra trailing
    entries (friction) are ignored.  ``tol`` is the smallest accepted pseudo-inertia
    eigenvalue (0 accepts semidefinite limits such as point masses).
    """
    pi = np.asarray(pi, dtype=float)
    for i, name in enumerate(link_names):
        blk = pi[10 * i: 10 * i + 10]
        if not np.all(np.isfinite(blk)):
            raise PhysicalConsistencyError(f"link {name!r}: inertial parameters are not finite: {blk}")
        if blk[0] <= 0.0:
            raise PhysicalConsistencyError(f"link {name!r}: mass must be > 0, got {blk[0]:.6g} kg")
        lam = link_consistency_margin(blk)
        if lam < tol - 1e-12 * max(1.0, abs(blk).max()):
            raise PhysicalConsistencyError(
                f"link {name!r}: pseudo-inertia not positive definite (smallest eigenvalue {lam:.3g});"
                " the inertia violates the triangle inequality or the CoM/mass are inconsistent")


def transform_matrix(R, p) -> np.ndarray:
    """10x10 matrix L with pi_A = L @ pi_B for a rigid body whose parameters pi_B are
    expressed in frame B, where frame B sits at position ``p`` with orientation ``R``
    in frame A (``x_A = R x_B + p``).  Linear in pi, so it also maps parameter *changes*
    (and physically meaningless vectors such as a zero-mass delta).
    """
    R = np.asarray(R, dtype=float).reshape(3, 3)
    p = np.asarray(p, dtype=float).reshape(3)
    L = np.zeros((10, 10))
    basis = np.eye(10)
    for k in range(10):
        L[:, k] = _transform(basis[k], R, p)
    return L


def _transform(pi10, R, p):
    m = pi10[0]
    c = R @ pi10[1:4]  # rotated first moment
    I_B = inertia_matrix(pi10)
    # I_A about A's origin: R I_B R^T + m (p.p 1 - p p^T) + 2 (p.c) 1 - p c^T - c p^T
    I_A = R @ I_B @ R.T + m * (p @ p * np.eye(3) - np.outer(p, p)) \
        + 2.0 * (p @ c) * np.eye(3) - np.outer(p, c) - np.outer(c, p)
    h = c + m * p
    return np.array([m, *h, I_A[0, 0], I_A[0, 1], I_A[1, 1], I_A[0, 2], I_A[1, 2], I_A[2, 2]])
