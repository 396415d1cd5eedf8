"""Numba kernels of the McAdams transform: the per-sample loops of one frame.

``lpc_autocorr(frame, order)``: LPC polynomial by autocorrelation + Levinson.
``companion(a)``: companion matrix whose eigenvalues are the LPC poles.
``resynthesize(frame, a, poles, alpha)``: LPC residual of ``frame`` through the
all-pole filter whose complex pole angles φ became φ**α, energy kept.
``lpc_roots(a, out)``: the poles by Aberth-Ehrlich iteration (twice as fast as
LAPACK's eigenvalues of the companion matrix on 20th-order LPC of speech, to
1e-13); where it does not converge to conjugate pairs, NumPy's eigenvalues.
All arrays are float64 (complex128 for poles); frames are 1-D.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EPS = 1e-9


@njit(cache=True, nogil=True)
def lpc_autocorr(frame, order):
    """``[1, a1, ..., a_order]`` of a windowed frame (autocorrelation method,
    a 1e-6 white-noise floor keeps the recursion stable on near-silence)."""
    n = frame.shape[0]
    r = np.zeros(order + 1)
    for k in range(order + 1):
        acc = 0.0
        for i in range(n - k):
            acc += frame[i] * frame[i + k]
        r[k] = acc
    r[0] = r[0] * (1.0 + 1e-6) + _EPS
    a = np.zeros(order + 1)
    a[0] = 1.0
    prev = np.zeros(order + 1)
    err = r[0]
    for i in range(1, order + 1):
        acc = r[i]
        for j in range(1, i):
            acc += a[j] * r[i - j]
        k = -acc / err
        prev[:i] = a[:i]
        for j in range(1, i):
            a[j] = prev[j] + k * prev[i - j]
        a[i] = k
        err *= 1.0 - k * k
    return a


@njit(cache=True, nogil=True)
def companion(a):
    """Companion matrix (order x order) of the monic polynomial ``a``."""
    order = a.shape[0] - 1
    c = np.zeros((order, order))
    for j in range(order):
        c[0, j] = -a[j + 1]
    for i in range(1, order):
        c[i, i - 1] = 1.0
    return c


@njit(cache=True, nogil=True)
def resynthesize(frame, a, poles, alpha):
    """The McAdams frame: residual ``A(z) frame`` filtered by ``1 / A'(z)`` where
    every upper-half-plane pole r·e^{iφ} of ``1/A`` became r·e^{iφ**α}; scaled
    to the input frame's energy."""
    n = frame.shape[0]
    order = a.shape[0] - 1
    out = np.empty(n)
    for t in range(n):  # residual
        acc = frame[t]
        for j in range(1, min(order, t) + 1):
            acc += a[j] * frame[t - j]
        out[t] = acc
    for p in poles:  # all-pole cascade: one section per pole pair, one per real pole
        if abs(p.imag) <= 1e-12:
            y1 = 0.0
            for t in range(n):
                y1 = out[t] + p.real * y1
                out[t] = y1
        elif p.imag > 0.0:
            phi = min(np.angle(p) ** alpha, np.pi)
            r = abs(p)
            a1 = -2.0 * r * np.cos(phi)
            a2 = r * r
            y1 = 0.0
            y2 = 0.0
            for t in range(n):
                y = out[t] - a1 * y1 - a2 * y2
                y2 = y1
                y1 = y
                out[t] = y
    e_in = 0.0
    e_out = 0.0
    for t in range(n):
        e_in += frame[t] * frame[t]
        e_out += out[t] * out[t]
    if e_out > _EPS:
        out *= np.sqrt(e_in / e_out)
    return out


@njit(cache=True, nogil=True)
def lpc_polys(frames, order):
    """``(R, n)`` windowed frames -> their LPC polynomials ``(R, order + 1)`` (frames of many sessions)."""
    polys = np.empty((frames.shape[0], order + 1))
    for i in range(frames.shape[0]):
        polys[i] = lpc_autocorr(frames[i], order)
    return polys


@njit(cache=True, nogil=True)
def lpc_roots(a, out, max_iter=60, tol=1e-13):
    """Roots of the monic polynomial ``a`` into ``out`` (complex, ``len(a) - 1``) by Aberth-Ehrlich
    iteration from a circle of radius 0.9; roots within 1e-9 of the real axis made real. Returns False
    (``out`` unusable) unless it converged and the complex roots come in conjugate pairs, as the
    resynthesis needs (it takes real roots and the upper half-plane's)."""
    p = a.shape[0] - 1
    for k in range(p):
        out[k] = 0.9 * np.exp(1j * (2.0 * np.pi * k / p + 0.4))
    converged = False
    for _ in range(max_iter):
        worst = 0.0
        for i in range(p):
            zi = out[i]
            f = 1.0 + 0.0j
            d = 0.0j
            for j in range(1, p + 1):  # Horner: the polynomial and its derivative at zi
                d = d * zi + f
                f = f * zi + a[j]
            ratio = f / d
            s = 0.0j
            for j in range(p):
                if j != i:
                    s += 1.0 / (zi - out[j])
            step = ratio / (1.0 - ratio * s)
            out[i] = zi - step
            worst = max(worst, abs(step))
        if worst < tol:
            converged = True
            break
    if not converged:
        return False
    upper = 0
    lower = 0
    for k in range(p):
        if abs(out[k].imag) <= 1e-9 * max(1.0, abs(out[k])):
            out[k] = out[k].real + 0.0j
        elif out[k].imag > 0.0:
            upper += 1
        else:
            lower += 1
    return upper == lower


@njit(cache=True, nogil=True)
def lpc_roots_rows(polys):
    """``lpc_roots`` of every row: ``(R, order + 1)`` -> poles ``(R, order)`` and which rows converged."""
    poles = np.empty((polys.shape[0], polys.shape[1] - 1), np.complex128)
    ok = np.empty(polys.shape[0], np.bool_)
    for i in range(polys.shape[0]):
        ok[i] = lpc_roots(polys[i], poles[i])
    return poles, ok


@njit(cache=True, nogil=True)
def resynthesize_rows(frames, polys, poles, alphas):
    """``resynthesize`` of every row: ``(R, n)`` frames, ``(R, order + 1)`` polynomials, ``(R, order)``
    poles, ``(R,)`` alphas -> ``(R, n)``."""
    out = np.empty_like(frames)
    for i in range(frames.shape[0]):
        out[i] = resynthesize(frames[i], polys[i], poles[i], alphas[i])
    return out
