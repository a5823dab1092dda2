"""Single-pass Slotine-Li regressor compiled with numba.

Computes, in one forward and one backward pass over the kinematic tree,

    Y(q, v, vr, ar) pi = M(q) ar + C(q, v) vr + g(q)  (+ friction columns at v)

with C the Christoffel-consistent Coriolis matrix (pinocchio's
``computeCoriolisMatrix``, the C of :meth:`RobotModel.coriolis_matrix`).

Why this C.  The Newton-Euler regressor Y(q, w, a) is affine in a and *quadratic* in
w: its velocity part is B(w, w) for a unique symmetric bilinear form B, and
B(w, w) = C(q, w) w.  For the Christoffel C, C(q, v) vr = C(q, vr) v, so
C(q, v) vr = B_sym(v, vr) = (B(v, vr) + B(vr, v)) / 2 -- the symmetrised form (which is
what the two-call polarisation ``Y_g(q, (v+vr)/2, ar) - Y_0(q, (v-vr)/2, 0)`` computes).
Here every quadratic velocity product of the recursion is replaced by its symmetric
bilinear version in the two velocity fields V (from v) and Vr (from vr):

* forward pass (link frames, pinocchio's conventions, gravity as base acceleration):
  ``V_i = X_i V_p + S_i v_i``, ``Vr_i = X_i Vr_p + S_i vr_i``,
  ``A_i = X_i A_p + S_i ar_i + (V_i x S_i vr_i + Vr_i x S_i v_i) / 2``;
* link force regressor (6 x 10, linear in the inertial parameters):
  ``F_i pi_i = I_i A_i + (V_i x* I_i Vr_i + Vr_i x* I_i V_i) / 2``;
* backward pass: ``Y[j, block i] = (S_j expressed in frame i)^T F_i`` for every
  ancestor-or-self j of i (the axis of j is carried down the chain in the forward pass,
  so the 6 x 10 blocks are never transformed).

With vr = v the kernel is the standard regressor; ``filtered_step`` (compiled with it)
uses it so for one whole sample of the filtered regressor W (midpoint state, regressor,
the W and filtered-torque recursions) in one call: see
:class:`~adaptive_dynamics.dynamics.filtered.FilteredRegressor`.

The same module compiles ``rnea_derivatives``: the RNEA torque and its derivatives
with respect to (q, v, a) for *arbitrary* inertial parameters (a parameter change dpi:
Y(q, v, a) dpi and its Jacobians, consistency paper eq. 18) at K points in one call --
pinocchio's computeRNEADerivatives algorithm with each inertia kept as its 10 linear
parameters (see :class:`~adaptive_dynamics.dynamics.parameter_change.ShiftedParameterChange`).

This is *not* the Niemeyer-Slotine split ``V x* I Vr`` (another skew-admissible C);
with V = Vr it reduces to pinocchio's standard regressor.

Compilation: the kernel has an explicit signature (C-contiguous float64 vectors, output
preallocated by the caller), is compiled by the first :func:`load_kernel` call (i.e. the
first ``RobotModel`` construction of a process) and cached on disk (``cache=True``, in
``__pycache__`` next to this file or numba's user cache dir): the very first compilation
takes ~3-4.5 s on the dev VM, later processes import numba and load the cache in
~0.7 s.  Arguments of another type or layout raise ``TypeError`` instead of triggering a
new compilation; the caller then validates and converts them.  If numba is missing or
compilation fails, :func:`load_kernel` returns ``None`` after one ``RuntimeWarning`` per
process and the caller keeps the two-call implementation;
``ADAPTIVE_DYNAMICS_NO_NUMBA=1`` selects that implementation silently.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np

# joint kinds (geometry table column 1)
_RX, _RY, _RZ, _RU, _PRISMATIC = 0, 1, 2, 3, 4
_SUPPORTED = {
    "JointModelRX": (_RX, (1.0, 0.0, 0.0)),
    "JointModelRY": (_RY, (0.0, 1.0, 0.0)),
    "JointModelRZ": (_RZ, (0.0, 0.0, 1.0)),
    "JointModelRevoluteUnaligned": (_RU, None),
    "JointModelPX": (_PRISMATIC, (1.0, 0.0, 0.0)),
    "JointModelPY": (_PRISMATIC, (0.0, 1.0, 0.0)),
    "JointModelPZ": (_PRISMATIC, (0.0, 0.0, 1.0)),
    "JointModelPrismaticUnaligned": (_PRISMATIC, None),
}
# geometry table: row 0 = header, row j = joint j (pinocchio joint index)
_HDR_N, _HDR_NCOLS, _HDR_FRIC, _HDR_EPS, _HDR_G = 0, 1, 2, 3, 4   # g: 6 entries (linear, angular)
_COL_PARENT, _COL_KIND, _COL_IDXV, _COL_R, _COL_P, _COL_AXIS, _COL_SUBEND = 0, 1, 2, 3, 12, 15, 18
_GEO_WIDTH = 19

ENV_DISABLE = "ADAPTIVE_DYNAMICS_NO_NUMBA"

_kernel = None
# numba functions, defined by _build_kernel
act_inv = inertia_col = joint_placement = slotine_li_kernel = filtered_step_kernel = regressor_batch_kernel = None
mat3mul = mcross = fcross_add = inertia_act = dot6 = subtree_block = dy_act = rnea_derivatives_kernel = None
_load_error: str | None = None
_warned: set = set()


def _build_kernel(cache: bool = True):
    # The helpers become module globals (a closure cell holding a dispatcher would be
    # part of numba's cache key and defeat the on-disk cache).
    global act_inv, inertia_col, joint_placement, slotine_li_kernel, filtered_step_kernel, regressor_batch_kernel
    global mat3mul, mcross, fcross_add, inertia_act, dot6, subtree_block, dy_act, rnea_derivatives_kernel
    import numba as nb

    @nb.njit(inline="always")
    def act_inv(r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, m):
        """liMi.actInv(m) for a motion m = [linear; angular]: (R^T (m_l - p x m_w), R^T m_w)."""
        m0, m1, m2, m3, m4, m5 = m[0], m[1], m[2], m[3], m[4], m[5]
        lx = m0 - (py * m5 - pz * m4)
        ly = m1 - (pz * m3 - px * m5)
        lz = m2 - (px * m4 - py * m3)
        return (r00 * lx + r10 * ly + r20 * lz, r01 * lx + r11 * ly + r21 * lz,
                r02 * lx + r12 * ly + r22 * lz, r00 * m3 + r10 * m4 + r20 * m5,
                r01 * m3 + r11 * m4 + r21 * m5, r02 * m3 + r12 * m4 + r22 * m5)

    @nb.njit(inline="always")
    def inertia_col(w0, w1, w2, u0, u1, u2, ju0, ju1, ju2, jw0, jw1, jw2, ja0, ja1, ja2):
        """Angular part of a rotational-inertia column: J aw + (w x J u + u x J w) / 2."""
        return (ja0 + 0.5 * ((w1 * ju2 - w2 * ju1) + (u1 * jw2 - u2 * jw1)),
                ja1 + 0.5 * ((w2 * ju0 - w0 * ju2) + (u2 * jw0 - u0 * jw2)),
                ja2 + 0.5 * ((w0 * ju1 - w1 * ju0) + (u0 * jw1 - u1 * jw0)))

    @nb.njit(inline="always")
    def mat3mul(a00, a01, a02, a10, a11, a12, a20, a21, a22, b00, b01, b02, b10, b11, b12, b20, b21, b22):
        """The 3 x 3 product a b, row-major scalars in and out."""
        return (a00 * b00 + a01 * b10 + a02 * b20, a00 * b01 + a01 * b11 + a02 * b21,
                a00 * b02 + a01 * b12 + a02 * b22, a10 * b00 + a11 * b10 + a12 * b20,
                a10 * b01 + a11 * b11 + a12 * b21, a10 * b02 + a11 * b12 + a12 * b22,
                a20 * b00 + a21 * b10 + a22 * b20, a20 * b01 + a21 * b11 + a22 * b21,
                a20 * b02 + a21 * b12 + a22 * b22)

    @nb.njit(inline="always")
    def joint_placement(g, qi):
        """liMi = jointPlacement * joint transform of one geometry row at position qi:
        (rotation row-major, translation, motion subspace S = [linear; angular])."""
        kind = int(g[_COL_KIND])
        ax, ay, az = g[_COL_AXIS], g[_COL_AXIS + 1], g[_COL_AXIS + 2]
        P00, P01, P02 = g[_COL_R], g[_COL_R + 1], g[_COL_R + 2]
        P10, P11, P12 = g[_COL_R + 3], g[_COL_R + 4], g[_COL_R + 5]
        P20, P21, P22 = g[_COL_R + 6], g[_COL_R + 7], g[_COL_R + 8]
        px, py, pz = g[_COL_P], g[_COL_P + 1], g[_COL_P + 2]
        if kind == _PRISMATIC:
            r00, r01, r02, r10, r11, r12, r20, r21, r22 = P00, P01, P02, P10, P11, P12, P20, P21, P22
            px += qi * (P00 * ax + P01 * ay + P02 * az)
            py += qi * (P10 * ax + P11 * ay + P12 * az)
            pz += qi * (P20 * ax + P21 * ay + P22 * az)
            S0, S1, S2, S3, S4, S5 = ax, ay, az, 0.0, 0.0, 0.0
        else:
            c, s = math.cos(qi), math.sin(qi)
            if kind == _RX:
                J00, J01, J02, J10, J11, J12, J20, J21, J22 = 1.0, 0.0, 0.0, 0.0, c, -s, 0.0, s, c
            elif kind == _RY:
                J00, J01, J02, J10, J11, J12, J20, J21, J22 = c, 0.0, s, 0.0, 1.0, 0.0, -s, 0.0, c
            elif kind == _RZ:
                J00, J01, J02, J10, J11, J12, J20, J21, J22 = c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0
            else:  # Rodrigues about a unit axis (Eigen's AngleAxis)
                t = 1.0 - c
                J00, J01, J02 = c + t * ax * ax, t * ax * ay - s * az, t * ax * az + s * ay
                J10, J11, J12 = t * ax * ay + s * az, c + t * ay * ay, t * ay * az - s * ax
                J20, J21, J22 = t * ax * az - s * ay, t * ay * az + s * ax, c + t * az * az
            r00, r01, r02, r10, r11, r12, r20, r21, r22 = mat3mul(
                P00, P01, P02, P10, P11, P12, P20, P21, P22, J00, J01, J02, J10, J11, J12, J20, J21, J22)
            S0, S1, S2, S3, S4, S5 = 0.0, 0.0, 0.0, ax, ay, az
        return (r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, S0, S1, S2, S3, S4, S5)

    vec, mat = nb.float64[::1], nb.float64[:, ::1]
    sig = nb.void(vec, vec, vec, vec, mat, vec, mat)

    # the GIL is kept (no nogil): the workspace is per model, as pinocchio's Data is
    @nb.njit(sig, cache=cache, error_model="numpy")
    def kernel(q, v, vr, ar, geo, work, Y):  # pragma: no cover - compiled (tested through the API)
        n = int(geo[0, _HDR_N])
        ncols = int(geo[0, _HDR_NCOLS])
        fric = int(geo[0, _HDR_FRIC])
        if (q.shape[0] != n or v.shape[0] != n or vr.shape[0] != n or ar.shape[0] != n
                or Y.shape[0] != n or Y.shape[1] != ncols):
            raise ValueError("slotine_li_regressor: wrong input length")
        nj = n + 1
        if geo.shape[0] != nj or geo.shape[1] < _GEO_WIDTH or work.shape[0] < 18 * nj + 6 * nj * nj:
            raise ValueError("slotine_li_regressor: geometry/workspace do not match")  # (no bounds checks below)
        s_in = 0.0
        for k in range(n):
            s_in += (q[k] + v[k]) + (vr[k] + ar[k])
        if not math.isfinite(s_in):
            raise ValueError("slotine_li_regressor: non-finite input")
        # workspace: V, Vr, A per joint (row 0 = base); W[i, j] = axis of joint j in frame i
        V = work[0: 6 * nj].reshape((nj, 6))
        Vr = work[6 * nj: 12 * nj].reshape((nj, 6))
        A = work[12 * nj: 18 * nj].reshape((nj, 6))
        W = work[18 * nj: 18 * nj + 6 * nj * nj].reshape((nj, nj, 6))
        for k in range(6):
            V[0, k] = 0.0
            Vr[0, k] = 0.0
            A[0, k] = -geo[0, _HDR_G + k]
        for r in range(n):
            for c in range(ncols):
                Y[r, c] = 0.0

        s_out = 0.0
        for i in range(1, nj):
            g = geo[i]
            p = int(g[_COL_PARENT])
            iv = int(g[_COL_IDXV])
            (r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz,
             S0, S1, S2, S3, S4, S5) = joint_placement(g, q[iv])

            # ---- forward pass (motion subspace S = [linear; angular])
            k = p
            while k > 0:
                o = W[i, k]
                o[0], o[1], o[2], o[3], o[4], o[5] = act_inv(
                    r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, W[p, k])
                k = int(geo[k, _COL_PARENT])
            o = W[i, i]
            o[0], o[1], o[2], o[3], o[4], o[5] = S0, S1, S2, S3, S4, S5

            vi, vri, ai = v[iv], vr[iv], ar[iv]
            l0, l1, l2, w0, w1, w2 = act_inv(r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, V[p])
            l0 += S0 * vi
            l1 += S1 * vi
            l2 += S2 * vi
            w0 += S3 * vi
            w1 += S4 * vi
            w2 += S5 * vi
            u0l, u1l, u2l, u0, u1, u2 = act_inv(r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, Vr[p])
            u0l += S0 * vri
            u1l += S1 * vri
            u2l += S2 * vri
            u0 += S3 * vri
            u1 += S4 * vri
            u2 += S5 * vri
            al0, al1, al2, aw0, aw1, aw2 = act_inv(r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz, A[p])
            # A_i += S ar_i + (V_i x S vr_i + Vr_i x S v_i) / 2 with the motion cross
            # (l, w) x (ml, mw) = (w x ml + l x mw, w x mw); S vr_i, S v_i are parallel
            # to S, so the velocity product is b x S with b = (V_i vr_i + Vr_i v_i) / 2.
            bl0 = 0.5 * (l0 * vri + u0l * vi)
            bl1 = 0.5 * (l1 * vri + u1l * vi)
            bl2 = 0.5 * (l2 * vri + u2l * vi)
            bw0 = 0.5 * (w0 * vri + u0 * vi)
            bw1 = 0.5 * (w1 * vri + u1 * vi)
            bw2 = 0.5 * (w2 * vri + u2 * vi)
            al0 += S0 * ai + ((bw1 * S2 - bw2 * S1) + (bl1 * S5 - bl2 * S4))
            al1 += S1 * ai + ((bw2 * S0 - bw0 * S2) + (bl2 * S3 - bl0 * S5))
            al2 += S2 * ai + ((bw0 * S1 - bw1 * S0) + (bl0 * S4 - bl1 * S3))
            aw0 += S3 * ai + (bw1 * S5 - bw2 * S4)
            aw1 += S4 * ai + (bw2 * S3 - bw0 * S5)
            aw2 += S5 * ai + (bw0 * S4 - bw1 * S3)
            o = V[i]
            o[0], o[1], o[2], o[3], o[4], o[5] = l0, l1, l2, w0, w1, w2
            o = Vr[i]
            o[0], o[1], o[2], o[3], o[4], o[5] = u0l, u1l, u2l, u0, u1, u2
            o = A[i]
            o[0], o[1], o[2], o[3], o[4], o[5] = al0, al1, al2, aw0, aw1, aw2

            # ---- link force regressor F (6 x 10, kept in scalars), pinocchio parameter
            # order [m, hx, hy, hz, Ixx, Ixy, Iyy, Ixz, Iyz, Izz] about the link origin;
            # V = (l, w), Vr = (ul, u), A = (al, aw).
            # mass column: (al + (w x ul + u x l) / 2, 0)
            m0 = al0 + 0.5 * ((w1 * u2l - w2 * u1l) + (u1 * l2 - u2 * l1))
            m1 = al1 + 0.5 * ((w2 * u0l - w0 * u2l) + (u2 * l0 - u0 * l2))
            m2 = al2 + 0.5 * ((w0 * u1l - w1 * u0l) + (u0 * l1 - u1 * l0))
            # first-moment columns h_k: linear aw x e_k + (u w_k + w u_k) / 2 - e_k (w . u),
            # angular e_k x al + (u l_k + w ul_k - ul w_k - l u_k) / 2 (k-th entry: 0)
            wu = w0 * u0 + w1 * u1 + w2 * u2
            x0 = w0 * u0 - wu
            x1 = aw2 + 0.5 * (u1 * w0 + w1 * u0)
            x2 = -aw1 + 0.5 * (u2 * w0 + w2 * u0)
            x4 = -al2 + 0.5 * (u1 * l0 + w1 * u0l - u1l * w0 - l1 * u0)
            x5 = al1 + 0.5 * (u2 * l0 + w2 * u0l - u2l * w0 - l2 * u0)
            y0 = -aw2 + 0.5 * (u0 * w1 + w0 * u1)
            y1 = w1 * u1 - wu
            y2 = aw0 + 0.5 * (u2 * w1 + w2 * u1)
            y3 = al2 + 0.5 * (u0 * l1 + w0 * u1l - u0l * w1 - l0 * u1)
            y5 = -al0 + 0.5 * (u2 * l1 + w2 * u1l - u2l * w1 - l2 * u1)
            z0 = aw1 + 0.5 * (u0 * w2 + w0 * u2)
            z1 = -aw0 + 0.5 * (u1 * w2 + w1 * u2)
            z2 = w2 * u2 - wu
            z3 = -al1 + 0.5 * (u0 * l2 + w0 * u2l - u0l * w2 - l0 * u2)
            z4 = al0 + 0.5 * (u1 * l2 + w1 * u2l - u1l * w2 - l1 * u2)
            # rotational-inertia columns (angular only), basis J_k x:
            # Ixx (x0,0,0), Ixy (x1,x0,0), Iyy (0,x1,0), Ixz (x2,0,x0), Iyz (0,x2,x1), Izz (0,0,x2)
            ixx0, ixx1, ixx2 = inertia_col(w0, w1, w2, u0, u1, u2, u0, 0.0, 0.0, w0, 0.0, 0.0, aw0, 0.0, 0.0)
            ixy0, ixy1, ixy2 = inertia_col(w0, w1, w2, u0, u1, u2, u1, u0, 0.0, w1, w0, 0.0, aw1, aw0, 0.0)
            iyy0, iyy1, iyy2 = inertia_col(w0, w1, w2, u0, u1, u2, 0.0, u1, 0.0, 0.0, w1, 0.0, 0.0, aw1, 0.0)
            ixz0, ixz1, ixz2 = inertia_col(w0, w1, w2, u0, u1, u2, u2, 0.0, u0, w2, 0.0, w0, aw2, 0.0, aw0)
            iyz0, iyz1, iyz2 = inertia_col(w0, w1, w2, u0, u1, u2, 0.0, u2, u1, 0.0, w2, w1, 0.0, aw2, aw1)
            izz0, izz1, izz2 = inertia_col(w0, w1, w2, u0, u1, u2, 0.0, 0.0, u2, 0.0, 0.0, w2, 0.0, 0.0, aw2)

            # ---- backward accumulation: Y[j, block i] = (S_j in frame i) . F[:, c] for
            # j = i and its ancestors
            base = 10 * (i - 1)
            j = i
            while j > 0:
                t = W[i, j]
                t0, t1, t2, t3, t4, t5 = t[0], t[1], t[2], t[3], t[4], t[5]
                c0 = t0 * m0 + t1 * m1 + t2 * m2
                c1 = (t0 * x0 + t1 * x1 + t2 * x2) + (t4 * x4 + t5 * x5)
                c2 = (t0 * y0 + t1 * y1 + t2 * y2) + (t3 * y3 + t5 * y5)
                c3 = (t0 * z0 + t1 * z1 + t2 * z2) + (t3 * z3 + t4 * z4)
                c4 = t3 * ixx0 + t4 * ixx1 + t5 * ixx2
                c5 = t3 * ixy0 + t4 * ixy1 + t5 * ixy2
                c6 = t3 * iyy0 + t4 * iyy1 + t5 * iyy2
                c7 = t3 * ixz0 + t4 * ixz1 + t5 * ixz2
                c8 = t3 * iyz0 + t4 * iyz1 + t5 * iyz2
                c9 = t3 * izz0 + t4 * izz1 + t5 * izz2
                row = Y[int(geo[j, _COL_IDXV])]
                row[base] = c0
                row[base + 1] = c1
                row[base + 2] = c2
                row[base + 3] = c3
                row[base + 4] = c4
                row[base + 5] = c5
                row[base + 6] = c6
                row[base + 7] = c7
                row[base + 8] = c8
                row[base + 9] = c9
                # finiteness probe (balanced: a serial sum would be a long latency chain)
                s_out += ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) + (c8 + c9)
                j = int(geo[j, _COL_PARENT])

        # ---- friction columns (viscous v, Coulomb sign(v) or tanh(v / eps))
        if fric > 0:
            P0 = 10 * n
            eps = geo[0, _HDR_EPS]
            for k in range(n):
                vk = v[k]
                Y[k, P0 + k] = vk
                if fric == 2:
                    Y[k, P0 + n + k] = math.tanh(vk / eps)
                else:
                    Y[k, P0 + n + k] = 1.0 if vk > 0.0 else (-1.0 if vk < 0.0 else 0.0)
        if not math.isfinite(s_out):
            raise ValueError("slotine_li_regressor: non-finite result")

    slotine_li_kernel = kernel

    fsig = nb.void(vec, vec, vec, nb.boolean, mat, mat, vec, mat, vec, mat, mat, vec)

    @nb.njit(fsig, cache=cache, error_model="numpy")
    def filtered_step(q, v, tau, has_tau, prev, mid, coef, geo, work, Y, W, tau_f):  # pragma: no cover - compiled
        """One sample of :class:`~adaptive_dynamics.dynamics.filtered.FilteredRegressor`:
        midpoint state, Y(q_m, v_m, a_m) by ``slotine_li_kernel`` with vr = v (the standard
        regressor), W <- alpha W + beta Y, tau_f <- alpha tau_f + beta (tau + tau_prev)/2,
        then the new sample becomes the previous one.  ``prev`` rows: q, v, tau of the
        previous sample; ``mid``: scratch rows q_m, v_m, a_m; ``coef``: alpha, beta, 1/h.
        Every check runs before W, tau_f or ``prev`` change (a rejected sample leaves the
        filter as it was)."""
        n = q.shape[0]
        if (v.shape[0] != n or (has_tau and tau.shape[0] != n) or prev.shape[0] < 3
                or prev.shape[1] != n or mid.shape[0] < 3 or mid.shape[1] != n
                or W.shape[0] != Y.shape[0] or W.shape[1] != Y.shape[1] or tau_f.shape[0] != n):
            raise ValueError("filtered regressor: wrong input length")
        alpha, beta, inv_dt = coef[0], coef[1], coef[2]
        qm, vm, am = mid[0], mid[1], mid[2]
        for k in range(n):
            qm[k] = 0.5 * (q[k] + prev[0, k])
            vm[k] = 0.5 * (v[k] + prev[1, k])
            am[k] = (v[k] - prev[1, k]) * inv_dt
        slotine_li_kernel(qm, vm, vm, am, geo, work, Y)  # raises on a non-finite q or v
        if has_tau:
            s = 0.0
            for k in range(n):
                s += tau[k]
            if not math.isfinite(s):
                raise ValueError("filtered regressor: non-finite tau")
        for r in range(Y.shape[0]):
            for c in range(Y.shape[1]):
                W[r, c] = alpha * W[r, c] + beta * Y[r, c]
        h = 0.5 * beta
        for k in range(n):
            if has_tau:
                tau_f[k] = alpha * tau_f[k] + h * (tau[k] + prev[2, k])
                prev[2, k] = tau[k]
            prev[0, k] = q[k]
            prev[1, k] = v[k]

    filtered_step_kernel = filtered_step

    bsig = nb.void(mat, mat, mat, mat, mat, vec, nb.float64[:, :, ::1])

    @nb.njit(bsig, cache=cache, error_model="numpy")
    def regressor_batch(Q, V, VR, AR, geo, work, Y):  # pragma: no cover - compiled
        """``slotine_li_kernel`` at every row of ``Q, V, VR, AR`` (K x n) into ``Y``
        (K x n x ncols); with VR = V and AR = A the standard regressor of K samples."""
        K = Q.shape[0]
        if V.shape[0] != K or VR.shape[0] != K or AR.shape[0] != K or Y.shape[0] != K:
            raise ValueError("regressor_batch: inputs of different lengths")
        for k in range(K):
            slotine_li_kernel(Q[k], V[k], VR[k], AR[k], geo, work, Y[k])

    regressor_batch_kernel = regressor_batch

    @nb.njit(inline="always")
    def mcross(a, b, out):
        """Motion cross product a x b ([linear; angular]) into out."""
        out[0] = a[4] * b[2] - a[5] * b[1] + a[1] * b[5] - a[2] * b[4]
        out[1] = a[5] * b[0] - a[3] * b[2] + a[2] * b[3] - a[0] * b[5]
        out[2] = a[3] * b[1] - a[4] * b[0] + a[0] * b[4] - a[1] * b[3]
        out[3] = a[4] * b[5] - a[5] * b[4]
        out[4] = a[5] * b[3] - a[3] * b[5]
        out[5] = a[3] * b[4] - a[4] * b[3]

    @nb.njit(inline="always")
    def fcross_add(a, f, out):
        """out += a x* f (motion a acting on force f, [linear; angular])."""
        out[0] += a[4] * f[2] - a[5] * f[1]
        out[1] += a[5] * f[0] - a[3] * f[2]
        out[2] += a[3] * f[1] - a[4] * f[0]
        out[3] += a[4] * f[5] - a[5] * f[4] + a[1] * f[2] - a[2] * f[1]
        out[4] += a[5] * f[3] - a[3] * f[5] + a[2] * f[0] - a[0] * f[2]
        out[5] += a[3] * f[4] - a[4] * f[3] + a[0] * f[1] - a[1] * f[0]

    @nb.njit(inline="always")
    def inertia_act(Y, m, out, add):
        """out (+)= Y m for spatial inertia parameters Y = [m, h, Ixx, Ixy, Iyy, Ixz, Iyz,
        Izz] about the frame origin: (m v - h x w, h x v + I w).  Linear in Y, so any
        finite values (non-physical included)."""
        ms, hx, hy, hz = Y[0], Y[1], Y[2], Y[3]
        v0, v1, v2, w0, w1, w2 = m[0], m[1], m[2], m[3], m[4], m[5]
        f0 = ms * v0 - (hy * w2 - hz * w1)
        f1 = ms * v1 - (hz * w0 - hx * w2)
        f2 = ms * v2 - (hx * w1 - hy * w0)
        f3 = (hy * v2 - hz * v1) + Y[4] * w0 + Y[5] * w1 + Y[7] * w2
        f4 = (hz * v0 - hx * v2) + Y[5] * w0 + Y[6] * w1 + Y[8] * w2
        f5 = (hx * v1 - hy * v0) + Y[7] * w0 + Y[8] * w1 + Y[9] * w2
        if add:
            out[0] += f0
            out[1] += f1
            out[2] += f2
            out[3] += f3
            out[4] += f4
            out[5] += f5
        else:
            out[0], out[1], out[2], out[3], out[4], out[5] = f0, f1, f2, f3, f4, f5

    @nb.njit(inline="always")
    def dot6(a, b):
        return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3] + a[4] * b[4] + a[5] * b[5]

    @nb.njit(inline="always")
    def subtree_block(out, col0, iv, end, J, dFda, dYtJ, dA, dV, dF):
        """One joint's entries of a derivative block (columns ``col0 + ...``) over its
        subtree iv .. end-1 (pinocchio's backward step): the rows below it,
        ``d tau_c / d x_iv = dFda_c . dA + dYtJ_c . dV``, and its own row,
        ``d tau_iv / d x_c = J . dF_c``."""
        for c in range(iv + 1, end):
            out[c, col0 + iv] = dot6(dFda[c], dA) + dot6(dYtJ[c], dV)
        for c in range(iv, end):
            out[iv, col0 + c] = dot6(J, dF[c])

    @nb.njit(inline="always")
    def dy_act(G, x, out):
        """out = dY x for dY = [[0, [c]x], [0, AA]] stored as G = [c | AA row-major]."""
        x3, x4, x5 = x[3], x[4], x[5]
        out[0] = G[1] * x5 - G[2] * x4
        out[1] = G[2] * x3 - G[0] * x5
        out[2] = G[0] * x4 - G[1] * x3
        out[3] = G[3] * x3 + G[4] * x4 + G[5] * x5
        out[4] = G[6] * x3 + G[7] * x4 + G[8] * x5
        out[5] = G[9] * x3 + G[10] * x4 + G[11] * x5

    mat3 = nb.float64[:, :, ::1]
    dsig = nb.void(mat, mat, mat, mat, mat, mat, mat3)

    @nb.njit(dsig, cache=cache, error_model="numpy")
    def rnea_derivatives(Q, V, A, geo, P, tau, D):  # pragma: no cover - compiled
        """RNEA torque and its derivatives for arbitrary inertial parameters at K points.

        ``P`` (njoints x 10): per joint the parameters [m, h, I] about the joint frame
        (row 0 unused), any finite values; ``Q, V, A`` K x n; out: ``tau`` K x n and
        ``D`` K x n x 3n = [dtau/dq | dtau/dv | dtau/da].  pinocchio's
        computeRNEADerivatives algorithm (world-frame forward pass, subtree backward
        pass), with inertias kept as their 10 linear parameters instead of pinocchio's
        mass / centre-of-mass form, which needs a positive mass."""
        n = int(geo[0, _HDR_N])
        nj = n + 1
        K = Q.shape[0]
        if (Q.shape[1] != n or V.shape[0] != K or V.shape[1] != n or A.shape[0] != K or A.shape[1] != n
                or tau.shape[0] != K or tau.shape[1] != n or D.shape[0] != K or D.shape[1] != n
                or D.shape[2] != 3 * n or P.shape[0] != nj or P.shape[1] != 10
                or geo.shape[0] != nj or geo.shape[1] < _GEO_WIDTH):
            raise ValueError("rnea_derivatives: wrong input shape")
        oR = np.zeros((nj, 9))
        op = np.zeros((nj, 3))
        ov = np.zeros((nj, 6))
        oa = np.zeros((nj, 6))
        of = np.zeros((nj, 6))
        Yc = np.zeros((nj, 10))
        dY = np.zeros((nj, 12))   # doYcrb as [c | AA row-major], see the forward pass
        # per velocity index (pinocchio's Matrix6x columns)
        Jc = np.zeros((n, 6))
        dVdq = np.zeros((n, 6))
        dAdq = np.zeros((n, 6))
        dAdv = np.zeros((n, 6))
        dFda = np.zeros((n, 6))
        dFdq = np.zeros((n, 6))
        dFdv = np.zeros((n, 6))
        dYtJ = np.zeros((n, 6))
        t6 = np.zeros(6)
        u6 = np.zeros(6)
        oR[0, 0] = oR[0, 4] = oR[0, 8] = 1.0
        for k in range(6):
            oa[0, k] = -geo[0, _HDR_G + k]
        s_in = 0.0
        for i in range(1, nj):
            for c in range(10):
                s_in += P[i, c]
        if not math.isfinite(s_in):
            raise ValueError("rnea_derivatives: non-finite inertial parameters")
        for pt in range(K):
            q, v, a = Q[pt], V[pt], A[pt]
            s_in = 0.0
            for k in range(n):
                s_in += (q[k] + v[k]) + a[k]
            if not math.isfinite(s_in):
                raise ValueError("rnea_derivatives: non-finite input")
            out = D[pt]
            for r in range(n):
                for c in range(3 * n):
                    out[r, c] = 0.0
            # ---- forward pass (world frame)
            for i in range(1, nj):
                g = geo[i]
                p = int(g[_COL_PARENT])
                iv = int(g[_COL_IDXV])
                (r00, r01, r02, r10, r11, r12, r20, r21, r22, px, py, pz,
                 S0, S1, S2, S3, S4, S5) = joint_placement(g, q[iv])
                Rp = oR[p]
                R = oR[i]
                # oMi = oMi[parent] * liMi
                R[0], R[1], R[2], R[3], R[4], R[5], R[6], R[7], R[8] = mat3mul(
                    Rp[0], Rp[1], Rp[2], Rp[3], Rp[4], Rp[5], Rp[6], Rp[7], Rp[8],
                    r00, r01, r02, r10, r11, r12, r20, r21, r22)
                o0 = op[p, 0] + Rp[0] * px + Rp[1] * py + Rp[2] * pz
                o1 = op[p, 1] + Rp[3] * px + Rp[4] * py + Rp[5] * pz
                o2 = op[p, 2] + Rp[6] * px + Rp[7] * py + Rp[8] * pz
                op[i, 0], op[i, 1], op[i, 2] = o0, o1, o2
                # J = oMi.act(S)
                jw0 = R[0] * S3 + R[1] * S4 + R[2] * S5
                jw1 = R[3] * S3 + R[4] * S4 + R[5] * S5
                jw2 = R[6] * S3 + R[7] * S4 + R[8] * S5
                J = Jc[iv]
                J[0] = R[0] * S0 + R[1] * S1 + R[2] * S2 + (o1 * jw2 - o2 * jw1)
                J[1] = R[3] * S0 + R[4] * S1 + R[5] * S2 + (o2 * jw0 - o0 * jw2)
                J[2] = R[6] * S0 + R[7] * S1 + R[8] * S2 + (o0 * jw1 - o1 * jw0)
                J[3], J[4], J[5] = jw0, jw1, jw2
                vi, ai = v[iv], a[iv]
                for k in range(6):
                    ov[i, k] = ov[p, k] + J[k] * vi
                # dJ = ov x J; oa = oa_p + J a + dJ v
                mcross(ov[i], J, t6)
                for k in range(6):
                    oa[i, k] = oa[p, k] + J[k] * ai + t6[k] * vi
                    dAdv[iv, k] = t6[k]
                mcross(oa[p], J, dAdq[iv])
                mcross(ov[p], J, dVdq[iv])
                mcross(ov[p], dVdq[iv], t6)
                for k in range(6):
                    dAdq[iv, k] += t6[k]
                    dAdv[iv, k] += dVdq[iv, k]
                # link inertia in the world frame: m, h' = R h + m p,
                # I' = R I R^T - [h'_r]x[p]x - [p]x[h'_r]x - m [p]x[p]x  (h'_r = R h)
                L = P[i]
                m = L[0]
                hr0 = R[0] * L[1] + R[1] * L[2] + R[2] * L[3]
                hr1 = R[3] * L[1] + R[4] * L[2] + R[5] * L[3]
                hr2 = R[6] * L[1] + R[7] * L[2] + R[8] * L[3]
                I00, I01, I11, I02, I12, I22 = L[4], L[5], L[6], L[7], L[8], L[9]
                # R I (rows), then (R I) R^T
                a00 = R[0] * I00 + R[1] * I01 + R[2] * I02
                a01 = R[0] * I01 + R[1] * I11 + R[2] * I12
                a02 = R[0] * I02 + R[1] * I12 + R[2] * I22
                a10 = R[3] * I00 + R[4] * I01 + R[5] * I02
                a11 = R[3] * I01 + R[4] * I11 + R[5] * I12
                a12 = R[3] * I02 + R[4] * I12 + R[5] * I22
                a20 = R[6] * I00 + R[7] * I01 + R[8] * I02
                a21 = R[6] * I01 + R[7] * I11 + R[8] * I12
                a22 = R[6] * I02 + R[7] * I12 + R[8] * I22
                W00 = a00 * R[0] + a01 * R[1] + a02 * R[2]
                W01 = a00 * R[3] + a01 * R[4] + a02 * R[5]
                W02 = a00 * R[6] + a01 * R[7] + a02 * R[8]
                W11 = a10 * R[3] + a11 * R[4] + a12 * R[5]
                W12 = a10 * R[6] + a11 * R[7] + a12 * R[8]
                W22 = a20 * R[6] + a21 * R[7] + a22 * R[8]
                # -([h]x[p]x + [p]x[h]x) = 2 (h.p) E - h p^T - p h^T ... minus m [p]x[p]x
                # = m (|p|^2 E - p p^T); [a]x[b]x + [b]x[a]x = a b^T + b a^T - 2 (a.b) E
                hp = hr0 * o0 + hr1 * o1 + hr2 * o2
                pp = o0 * o0 + o1 * o1 + o2 * o2
                Y = Yc[i]
                Y[0] = m
                Y[1] = hr0 + m * o0
                Y[2] = hr1 + m * o1
                Y[3] = hr2 + m * o2
                Y[4] = W00 + 2.0 * hp - 2.0 * hr0 * o0 + m * (pp - o0 * o0)
                Y[5] = W01 - (hr0 * o1 + o0 * hr1) - m * o0 * o1
                Y[6] = W11 + 2.0 * hp - 2.0 * hr1 * o1 + m * (pp - o1 * o1)
                Y[7] = W02 - (hr0 * o2 + o0 * hr2) - m * o0 * o2
                Y[8] = W12 - (hr1 * o2 + o1 * hr2) - m * o1 * o2
                Y[9] = W22 + 2.0 * hp - 2.0 * hr2 * o2 + m * (pp - o2 * o2)
                # oh = Y ov, of = Y oa + ov x* oh
                inertia_act(Y, ov[i], u6, False)
                inertia_act(Y, oa[i], of[i], False)
                fcross_add(ov[i], u6, of[i])
                # dY = Y.variation(ov) + the force cross matrix of oh (pinocchio's doYcrb):
                # with ov = (vl, w), oh = (p, L) and Y = (m, h, I) it is [[0, [c]x], [0, AA]],
                # c = -2 p, AA = 2 (vl.h) E - vl h^T - h vl^T + B + B^T - [L]x, B = [w]x I
                vl0, vl1, vl2, w0, w1, w2 = ov[i, 0], ov[i, 1], ov[i, 2], ov[i, 3], ov[i, 4], ov[i, 5]
                h0, h1, h2 = Y[1], Y[2], Y[3]
                J00, J01, J11, J02, J12, J22 = Y[4], Y[5], Y[6], Y[7], Y[8], Y[9]
                B00 = w1 * J02 - w2 * J01
                B01 = w1 * J12 - w2 * J11
                B02 = w1 * J22 - w2 * J12
                B10 = w2 * J00 - w0 * J02
                B11 = w2 * J01 - w0 * J12
                B12 = w2 * J02 - w0 * J22
                B20 = w0 * J01 - w1 * J00
                B21 = w0 * J11 - w1 * J01
                B22 = w0 * J12 - w1 * J02
                vh = 2.0 * (vl0 * h0 + vl1 * h1 + vl2 * h2)
                L0, L1, L2 = u6[3], u6[4], u6[5]
                G = dY[i]
                G[0], G[1], G[2] = -2.0 * u6[0], -2.0 * u6[1], -2.0 * u6[2]
                G[3] = vh - 2.0 * vl0 * h0 + 2.0 * B00
                G[4] = -(vl0 * h1 + h0 * vl1) + B01 + B10 + L2
                G[5] = -(vl0 * h2 + h0 * vl2) + B02 + B20 - L1
                G[6] = -(vl1 * h0 + h1 * vl0) + B10 + B01 - L2
                G[7] = vh - 2.0 * vl1 * h1 + 2.0 * B11
                G[8] = -(vl1 * h2 + h1 * vl2) + B12 + B21 + L0
                G[9] = -(vl2 * h0 + h2 * vl0) + B20 + B02 + L1
                G[10] = -(vl2 * h1 + h2 * vl1) + B21 + B12 - L0
                G[11] = vh - 2.0 * vl2 * h2 + 2.0 * B22
            # ---- backward pass over the subtrees
            for i in range(nj - 1, 0, -1):
                g = geo[i]
                p = int(g[_COL_PARENT])
                iv = int(g[_COL_IDXV])
                end = int(g[_COL_SUBEND])
                J = Jc[iv]
                Y = Yc[i]
                G = dY[i]
                f = of[i]
                tau[pt, iv] = dot6(J, f)
                inertia_act(Y, J, dFda[iv], False)
                for c in range(iv, end):
                    out[iv, 2 * n + c] = out[c, 2 * n + iv] = dot6(J, dFda[c])
                # dFdq = dY dVdq + Y dAdq;  dYtJ = dY^T J
                dy_act(G, dVdq[iv], dFdq[iv])
                x = dYtJ[iv]
                x[0] = x[1] = x[2] = 0.0
                x[3] = -(G[1] * J[2] - G[2] * J[1]) + G[3] * J[3] + G[6] * J[4] + G[9] * J[5]
                x[4] = -(G[2] * J[0] - G[0] * J[2]) + G[4] * J[3] + G[7] * J[4] + G[10] * J[5]
                x[5] = -(G[0] * J[1] - G[1] * J[0]) + G[5] * J[3] + G[8] * J[4] + G[11] * J[5]
                inertia_act(Y, dAdq[iv], dFdq[iv], True)
                subtree_block(out, 0, iv, end, J, dFda, dYtJ, dAdq[iv], dVdq[iv], dFdq)
                fcross_add(J, f, dFdq[iv])
                # dFdv = dY J + Y dAdv
                dy_act(G, J, dFdv[iv])
                inertia_act(Y, dAdv[iv], dFdv[iv], True)
                subtree_block(out, n, iv, end, J, dFda, dYtJ, dAdv[iv], J, dFdv)
                if p > 0:
                    for k in range(10):
                        Yc[p, k] += Y[k]
                    for r in range(6):
                        of[p, r] += f[r]
                    for r in range(12):
                        dY[p, r] += G[r]

    rnea_derivatives_kernel = rnea_derivatives
    return kernel


def load_kernel():
    """The compiled kernel, or ``None`` (with a one-time warning) when numba is
    unavailable, disabled by ``ADAPTIVE_DYNAMICS_NO_NUMBA=1`` or fails to compile."""
    global _kernel, _load_error
    if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
        return None
    if _kernel is not None:
        return _kernel
    if _load_error is None:
        try:
            try:
                _kernel = _build_kernel(cache=True)
            except ImportError:
                raise
            except Exception:  # e.g. no writable cache location: compile in memory
                _kernel = _build_kernel(cache=False)
            return _kernel
        except Exception as exc:  # ImportError, numba TypingError/LoweringError, ...
            _load_error = f"{type(exc).__name__}: {exc}"
    warn_fallback(_load_error)
    return None


def load_regressor_batch():
    """The compiled batch regressor (``regressor_batch`` in :func:`_build_kernel`), or
    ``None`` where :func:`load_kernel` gives ``None``."""
    return regressor_batch_kernel if load_kernel() is not None else None


def load_filtered_step():
    """The compiled filtered-regressor step (see ``filtered_step`` in
    :func:`_build_kernel`), or ``None`` where :func:`load_kernel` gives ``None``."""
    return filtered_step_kernel if load_kernel() is not None else None


def warn_fallback(reason: str, what: str = "Slotine-Li regressor",
                  fallback: str = "the two-call polarisation implementation") -> None:
    """Warn once per process and kernel that its non-compiled implementation is used."""
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"compiled {what} unavailable (" + reason.splitlines()[0][:300]
                      + f"); using {fallback}", RuntimeWarning, stacklevel=3)


def geometry(model, friction_mode: int = 0, eps: float = 0.0):
    """Geometry table for :func:`kernel` from a ``pinocchio.Model`` of 1-DoF joints, or
    ``None`` if some joint type is not supported (revolute/prismatic, aligned or not).

    ``friction_mode``: 0 no friction columns, 1 Coulomb ``sign(v)``, 2 ``tanh(v / eps)``.
    """
    n = model.nv
    subtree = model.createData().nvSubtree  # (pinocchio numbers joints depth first)
    geo = np.zeros((model.njoints, _GEO_WIDTH))
    geo[0, _HDR_N] = n
    geo[0, _HDR_NCOLS] = 10 * n + (2 * n if friction_mode else 0)
    geo[0, _HDR_FRIC] = friction_mode
    geo[0, _HDR_EPS] = eps
    geo[0, _HDR_G: _HDR_G + 3] = model.gravity.linear
    geo[0, _HDR_G + 3: _HDR_G + 6] = model.gravity.angular
    for j in range(1, model.njoints):
        jm = model.joints[j]
        spec = _SUPPORTED.get(jm.shortname())
        if spec is None or jm.nv != 1 or jm.nq != 1:
            return None
        kind, axis = spec
        if axis is None:
            axis = np.asarray(jm.extract().axis, dtype=float).reshape(3)
            if abs(np.linalg.norm(axis) - 1.0) > 1e-12:
                return None
        M = model.jointPlacements[j]
        geo[j, _COL_PARENT] = model.parents[j]
        geo[j, _COL_KIND] = kind
        geo[j, _COL_IDXV] = model.idx_vs[j]
        geo[j, _COL_R: _COL_R + 9] = np.asarray(M.rotation).reshape(9)  # row-major
        geo[j, _COL_P: _COL_P + 3] = M.translation
        geo[j, _COL_AXIS: _COL_AXIS + 3] = axis
        geo[j, _COL_SUBEND] = model.idx_vs[j] + subtree[j]  # subtree: idx_v .. this - 1
    return geo


def workspace(model) -> np.ndarray:
    """Scratch buffer for :func:`kernel` (reused by every call on one model)."""
    nj = model.njoints
    return np.zeros(18 * nj + 6 * nj * nj)


__all__ = ["load_kernel", "load_filtered_step", "load_regressor_batch", "geometry", "workspace", "warn_fallback",
           "ENV_DISABLE"]
