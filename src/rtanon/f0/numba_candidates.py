"""The Numba F0 kernel's per-frame searches (see :mod:`rtanon.f0.numba_kernel`, which calls them): the
in-place radix-2 FFT, the running means, the spectral harmonics correlation's peaks (the spectral
candidates) and the NCCF candidates around them. Same operation order and constants as the C++ kernel in
``csrc/f0_tracker.hpp``; every function is ``@njit(cache=True)`` and only reads and writes the arrays it is
given."""

from __future__ import annotations

import numpy as np
from numba import njit

from rtanon.f0.config import F_DELTA4, F_FH_MIN, F_NCCF_T1, F_NCCF_T2, F_SHC_T1, F_SHC_T2, I_PK_CENTER, I_PK_MAX, I_PK_MIN

NCCF_CENTER = 2  # YAAPT nccf_pwidth = 5
NCCF_PER_SIGNAL = 3
SPEC_CANDS = 4


@njit(cache=True)
def fft(re, im, twr, twi, brev, ren, imn, n):
    """Radix-2 FFT, decimation in frequency, exp(-2πi kn/N), of re + i im
    (overwritten); the spectrum goes to ren, imn in natural order (N + 1
    bins, bin N = bin 0, so bin N - k reads without a wrap). The stage with
    half-size h reads its twiddles exp(-2πi k / 2h), k < h, at twr[h + k],
    twi[h + k], so its inner loop runs over contiguous memory (and
    vectorises); the last two stages run as one radix-4 pass."""
    half = n // 2
    while half >= 4:
        for start in range(0, n, 2 * half):
            for k in range(half):
                j = start + k
                m = j + half
                ur = re[j]
                ui = im[j]
                vr = re[m]
                vi = im[m]
                re[j] = ur + vr
                im[j] = ui + vi
                dr = ur - vr
                di = ui - vi
                re[m] = dr * twr[half + k] - di * twi[half + k]
                im[m] = dr * twi[half + k] + di * twr[half + k]
        half //= 2
    for s in range(0, n, 4):
        r0 = re[s]
        r1 = re[s + 1]
        r2 = re[s + 2]
        r3 = re[s + 3]
        i0 = im[s]
        i1 = im[s + 1]
        i2 = im[s + 2]
        i3 = im[s + 3]
        ar = r0 + r2
        ai = i0 + i2
        br = r1 + r3
        bi = i1 + i3
        cr = r0 - r2
        ci = i0 - i2
        dr = i1 - i3  # (r1 - r3, i1 - i3) times -i
        di = -(r1 - r3)
        ren[brev[s]] = ar + br
        imn[brev[s]] = ai + bi
        ren[brev[s + 1]] = ar - br
        imn[brev[s + 1]] = ai - bi
        ren[brev[s + 2]] = cr + dr
        imn[brev[s + 2]] = ci + di
        ren[brev[s + 3]] = cr - dr
        imn[brev[s + 3]] = ci - di
    ren[n] = ren[0]
    imn[n] = imn[0]


@njit(cache=True)
def running_mean(mean, count, value, tau):
    """Mean of all values so far until ``tau`` of them were seen, then an
    exponential average with time constant ``tau`` values."""
    count += 1.0
    n_eff = count if count < tau else tau
    return mean + (value - mean) / n_eff, count


@njit(cache=True)
def harmonic_peak(mag, n):
    """Largest local maximum of ``mag`` among bins n-1..n+1 (0 if none): the
    spectrum has a component at the candidate frequency itself, not only the
    leakage skirt of a neighbour."""
    best = 0.0
    for q in range(n - 1, n + 2):
        if mag[q] >= mag[q - 1] and mag[q] >= mag[q + 1] and mag[q] > best:
            best = mag[q]
    return best


@njit(cache=True)
def spectral_peaks(ip, fp, shc, pow_a, mag_b, nh, out_p, out_m):
    """YAAPT ``peaks``: up to 4 SHC peaks (Hz, merit); returns how many.

    The merit of a peak is its normalised SHC times
    ``min(1, fh / shc_first_harmonic_min)^2``, fh = the larger of the filtered
    (``mag_a``) and squared (``mag_b``) spectra, each over its maximum, at a
    spectral peak within one bin of the candidate. The SHC of the
    squared signal alone favours sub-harmonics when it has few components (a
    pure tone squared has only 2f, and the products over 4 harmonics peak at
    2f/3 or f/2 through window leakage); a true F0 has its first harmonic in
    the filtered spectrum or, as the difference tone, in the squared one. The
    voicing tests (peak threshold, best over mean) use the plain SHC as in
    YAAPT."""
    pk_min = ip[I_PK_MIN]
    pk_max = ip[I_PK_MAX]
    center = ip[I_PK_CENTER]
    delta = fp[F_DELTA4]
    maxd = 0.0
    for n in range(pk_min, pk_max + 1):
        if shc[n] > maxd:
            maxd = shc[n]
    scale = 1.0 / maxd if maxd > 1e-14 else 1.0
    s = 0.0
    for n in range(pk_min, pk_max + 1):
        s += shc[n] * scale
    avg = s / (pk_max - pk_min + 1)
    if avg > 1.0 / fp[F_SHC_T1] or avg <= 0.0:
        return 0
    amax = 0.0
    bmax = 0.0
    for k in range(nh + 1):
        if pow_a[k] > amax:
            amax = pow_a[k]
        if mag_b[k] > bmax:
            bmax = mag_b[k]
    inva = 1.0 / amax if amax > 1e-60 else 0.0
    invb = 1.0 / bmax if bmax > 1e-30 else 0.0
    num = 0
    bestm = 0.0
    for n in range(pk_min + center + 1, pk_max - center + 1):
        v = shc[n] * scale
        if v > shc[n - 1] * scale and v > shc[n + 1] * scale and v > fp[F_SHC_T2] * avg:
            ok = True
            for q in range(n - center, n + center + 1):
                w = shc[q] * scale
                if (q < n and w >= v) or (q > n and w > v):
                    ok = False
                    break
            if ok:
                fh_a = np.sqrt(harmonic_peak(pow_a, n) * inva)
                fh_b = harmonic_peak(mag_b, n) * invb
                fh = fh_a if fh_a > fh_b else fh_b
                g = fh / fp[F_FH_MIN] if fh < fp[F_FH_MIN] else 1.0
                ve = v * (g * g)
                # keep the best SPEC_CANDS by insertion (descending merit, stable)
                pos = num if num < SPEC_CANDS else SPEC_CANDS
                while pos > 0 and out_m[pos - 1] < ve:
                    if pos < SPEC_CANDS:
                        out_m[pos] = out_m[pos - 1]
                        out_p[pos] = out_p[pos - 1]
                    pos -= 1
                if pos < SPEC_CANDS:
                    out_m[pos] = ve
                    out_p[pos] = n * delta
                num += 1
                if v > bestm:
                    bestm = v
    if num == 0 or bestm / avg < fp[F_SHC_T1]:
        return 0
    if num > SPEC_CANDS:
        num = SPEC_CANDS
    for q in range(num, SPEC_CANDS):
        out_p[q] = out_p[0]
        out_m[q] = out_m[0]
    return num


@njit(cache=True)
def nccf_candidates(fp, buf, row, off, w8, cs, phi, nccf_n, lag_max_g, lag_lo, lag_hi, out_p, out_m, k0):
    """NCCF of one 8 kHz window (``buf[row]``) for lags lag_lo..lag_hi, centred
    on the window centre for every lag; YAAPT ``cmp_rate`` peak picking with
    parabolic refinement. The window is ``buf[row, off:off + w8]``. Writes up
    to 3 (Hz, merit) at out[k0:]; returns count."""
    # prefix sums of squares as four independent running sums over quarters (w8 % 4 == 0), each
    # quarter then offset by the total before it (the C++ kernel sums alike)
    qn = w8 // 4
    p0 = 0.0
    p1 = 0.0
    p2 = 0.0
    p3 = 0.0
    cs[0] = 0.0
    for i in range(qn):
        v = np.float64(buf[row, off + i])
        p0 += v * v
        cs[i + 1] = p0
        v = np.float64(buf[row, off + qn + i])
        p1 += v * v
        cs[qn + i + 1] = p1
        v = np.float64(buf[row, off + 2 * qn + i])
        p2 += v * v
        cs[2 * qn + i + 1] = p2
        v = np.float64(buf[row, off + 3 * qn + i])
        p3 += v * v
        cs[3 * qn + i + 1] = p3
    for c in range(1, 4):
        base = cs[c * qn]
        for i in range(1, qn + 1):
            cs[c * qn + i] += base
    maxphi = 0.0
    for lag in range(lag_lo, lag_hi + 1):
        s0 = (lag_max_g - lag) // 2
        # sixteen float32 partial sums (independent add chains; the C++ kernel sums alike),
        # nccf_n % 16 == 0
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        a4 = np.float32(0.0)
        a5 = np.float32(0.0)
        a6 = np.float32(0.0)
        a7 = np.float32(0.0)
        a8 = np.float32(0.0)
        a9 = np.float32(0.0)
        a10 = np.float32(0.0)
        a11 = np.float32(0.0)
        a12 = np.float32(0.0)
        a13 = np.float32(0.0)
        a14 = np.float32(0.0)
        a15 = np.float32(0.0)
        ia = off + s0
        ib = off + s0 + lag
        for i in range(0, nccf_n, 16):
            a0 += buf[row, ia + i] * buf[row, ib + i]
            a1 += buf[row, ia + i + 1] * buf[row, ib + i + 1]
            a2 += buf[row, ia + i + 2] * buf[row, ib + i + 2]
            a3 += buf[row, ia + i + 3] * buf[row, ib + i + 3]
            a4 += buf[row, ia + i + 4] * buf[row, ib + i + 4]
            a5 += buf[row, ia + i + 5] * buf[row, ib + i + 5]
            a6 += buf[row, ia + i + 6] * buf[row, ib + i + 6]
            a7 += buf[row, ia + i + 7] * buf[row, ib + i + 7]
            a8 += buf[row, ia + i + 8] * buf[row, ib + i + 8]
            a9 += buf[row, ia + i + 9] * buf[row, ib + i + 9]
            a10 += buf[row, ia + i + 10] * buf[row, ib + i + 10]
            a11 += buf[row, ia + i + 11] * buf[row, ib + i + 11]
            a12 += buf[row, ia + i + 12] * buf[row, ib + i + 12]
            a13 += buf[row, ia + i + 13] * buf[row, ib + i + 13]
            a14 += buf[row, ia + i + 14] * buf[row, ib + i + 14]
            a15 += buf[row, ia + i + 15] * buf[row, ib + i + 15]
        a0 += a8
        a1 += a9
        a2 += a10
        a3 += a11
        a4 += a12
        a5 += a13
        a6 += a14
        a7 += a15
        acc = np.float64(((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)))
        ex = cs[s0 + nccf_n] - cs[s0]
        ey = cs[s0 + lag + nccf_n] - cs[s0 + lag]
        den = ex * ey
        v = acc / np.sqrt(den) if den > 1e-30 else 0.0
        phi[lag] = v
        if v > maxphi:
            maxphi = v
    c = NCCF_CENTER
    t1 = fp[F_NCCF_T1]
    num = 0
    best_n = -1
    best_v = -1.0
    for n in range(lag_lo + c, lag_hi - c + 1):
        v = phi[n]
        if v > phi[n - 1] and v > phi[n + 1] and v > t1:
            if v > best_v:
                best_v = v
                best_n = n
    if best_n < 0:
        return 0
    single = maxphi > fp[F_NCCF_T2]
    for n in range(lag_lo + c, lag_hi - c + 1):
        v = phi[n]
        if not (v > phi[n - 1] and v > phi[n + 1] and v > t1):
            continue
        if single and n != best_n:
            continue
        if not single:
            ok = True
            for q in range(n - c, n + c + 1):
                if (q < n and phi[q] >= v) or (q > n and phi[q] > v):
                    ok = False
                    break
            if not ok:
                continue
        a = phi[n - 1]
        b = phi[n + 1]
        den = a - 2.0 * v + b
        d = 0.5 * (a - b) / den if den < 0.0 else 0.0
        pitch = 8000.0 / (n + d)
        pos = num if num < NCCF_PER_SIGNAL else NCCF_PER_SIGNAL
        while pos > 0 and out_m[k0 + pos - 1] < v:
            if pos < NCCF_PER_SIGNAL:
                out_m[k0 + pos] = out_m[k0 + pos - 1]
                out_p[k0 + pos] = out_p[k0 + pos - 1]
            pos -= 1
        if pos < NCCF_PER_SIGNAL:
            out_m[k0 + pos] = v
            out_p[k0 + pos] = pitch
        num += 1
    return num if num < NCCF_PER_SIGNAL else NCCF_PER_SIGNAL
