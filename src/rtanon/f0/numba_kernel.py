"""The F0 tracker kernel in Numba (the fallback when ``rtanon._core`` is absent).

Same algorithm, same operation order and same constants as the C++ kernel in
``csrc/f0_tracker.hpp`` (the parity test holds them together). All state lives
in NumPy arrays owned by :class:`NumbaF0Kernel`; the ``@njit(cache=True)``
functions below (and the per-frame searches they call, in :mod:`rtanon.f0.numba_candidates`) only
read and write them, so a kernel instance is one stream.

Per 10 ms hop: the signal and its square go through a 7-tap half-band
low-pass that decimates them to 8 kHz, then an IIR band-pass (50-1500 Hz) at
8 kHz (float64), and are kept in float32. Per 10 ms frame (window centred on
the frame): one 512-point float32 FFT at 4 kHz carries both signals (the
filtered one with a Hann window in the real part, the squared one with a
Kaiser window in the imaginary part); the low-band energy ratio (NLFER)
comes from the first,
the spectral harmonics correlation (SHC) from the second. The SHC peaks feed
an online Viterbi (YAAPT's ``dynamic5``) that gives the spectral F0 track;
NCCF candidates of both signals (float32 dot products) are searched around it
at 8 kHz, refined as in
YAAPT's ``refine``, and a fixed-lag Viterbi over 6 candidates per frame
(4 NCCF, spectral, unvoiced) makes the final decision.

First call compiles (a few seconds); ``cache=True`` stores the machine code
beside this file (``__pycache__``) so later processes load it in well under a
second.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rtanon.f0.config import (
    F_BOOST, F_E_FLOOR, F_E_PRIOR, F_E_PRIOR_N, F_F0MAX, F_F0MIN, F_HB1, F_HB3, F_HBC, F_K1, F_NLFER1, F_NLFER2,
    F_PIVOT, F_PRIOR_F0, F_PRIOR_N, F_SEARCH_STD, F_SKIP2, F_W1, F_W2, F_W3, F_W4, HOP_SAMPLES, I_B8, I_H8, I_KB0,
    I_KB1, I_LAG, I_LAG_MAX, I_LAG_MIN, I_NBQ, I_NCCF_N, I_NFFT, I_PK_CENTER, I_PK_MAX, I_SHC_HALF, I_SHC_MAX,
    I_SHC_MIN, I_SHC_NH, I_SW4, I_TAU_E, I_TAU_P, N_CANDIDATES, Derived,
)
from rtanon.f0.numba_candidates import (
    NCCF_CENTER, NCCF_PER_SIGNAL, SPEC_CANDS, fft, nccf_candidates, running_mean, spectral_peaks,
)

# Scalar state slots (float64), shared layout with the C++ kernel.
S_MEANE, S_NE, S_SPEC_AVG, _S_FREE, S_NSPEC, S_H0, S_H1, S_H2, S_PREV_E, S_MEANP, S_NP, S_HELD = range(12)
N_SCALARS = 12
# Integer state slots.
V_FILL, _V_FREE, V_T, V_SPEC_PREV = range(4)
N_IVARS = 4
_NC = N_CANDIDATES
_HB_HIST = 3  # half-band decimator history per phase (7 taps)


@njit(cache=True)
def _analyse_frame(ip, fp, hann, kais, twr, twi, brev, buf8, sc, iv, spv, dpacc, ringp, ringb, work, fbuf):
    """Analyses the frame whose window is ``buf8`` and returns the decided F0 (Hz,
    0 = unvoiced) of frame t - lag, or -1.0 while t < lag."""
    nfft = ip[I_NFFT]
    h8 = ip[I_H8]
    w4 = h8
    nh = nfft // 2
    # work layout
    re = fbuf[0, :nfft]
    im = fbuf[1, :nfft]
    mb_len = _mag_b_len(ip)
    mag_a = work[0:nh + 1]
    mag_b = work[nh + 1:nh + 1 + mb_len]  # zeros beyond Nyquist, never written
    pow_a = work[nh + 1 + mb_len:2 * nh + 2 + mb_len]
    o = 2 * nh + 2 + mb_len
    shc_len = max(ip[I_SHC_MAX], ip[I_PK_MAX] + ip[I_PK_CENTER]) + 2
    shc = work[o:o + shc_len]
    o += shc_len
    cs = work[o:o + ip[I_B8] + 1]
    o += ip[I_B8] + 1
    phi = work[o:o + ip[I_LAG_MAX] + 2]
    o += ip[I_LAG_MAX] + 2
    cp = work[o:o + 2 * NCCF_PER_SIGNAL]
    o += 2 * NCCF_PER_SIGNAL
    cm = work[o:o + 2 * NCCF_PER_SIGNAL]
    o += 2 * NCCF_PER_SIGNAL
    sp = work[o:o + SPEC_CANDS]
    o += SPEC_CANDS
    sm = work[o:o + SPEC_CANDS]
    o += SPEC_CANDS
    dp_p = work[o:o + _NC]
    o += _NC
    dp_m = work[o:o + _NC]
    o += _NC
    newacc = work[o:o + _NC]

    # --- spectrum at 4 kHz: filtered signal (Hann, analysis window) + j * squared signal
    # (Kaiser, spectral window ending with the analysis window, mean removed)
    b8 = ip[I_B8]
    sw4 = ip[I_SW4]
    off_a = b8 - 2 * h8
    off_b = b8 - 2 * sw4
    # (float32 from here to the magnitudes, as in the C++ kernel)
    for i in range(nfft):
        re[i] = 0.0
        im[i] = 0.0
    for i in range(w4):
        re[i] = buf8[0, off_a + 2 * i] * hann[i]
    for i in range(sw4):
        im[i] = buf8[1, off_b + 2 * i] * kais[i]
    # eight partial sums (sw4 % 8 == 0), as in the C++ kernel
    m0 = np.float32(0.0)
    m1 = np.float32(0.0)
    m2 = np.float32(0.0)
    m3 = np.float32(0.0)
    m4 = np.float32(0.0)
    m5 = np.float32(0.0)
    m6 = np.float32(0.0)
    m7 = np.float32(0.0)
    for i in range(0, sw4, 8):
        m0 += im[i]
        m1 += im[i + 1]
        m2 += im[i + 2]
        m3 += im[i + 3]
        m4 += im[i + 4]
        m5 += im[i + 5]
        m6 += im[i + 6]
        m7 += im[i + 7]
    mean_b = (((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 + m7))) / np.float32(sw4)
    for i in range(sw4):
        im[i] -= mean_b
    ren = fbuf[2]
    imn = fbuf[3]
    fft(re, im, twr, twi, brev, ren, imn, nfft)
    # |A| in the energy band here (the rest below, only where the spectral peaks need it)
    kb0 = ip[I_KB0]
    kb1 = ip[I_KB1]
    for k in range(kb0, kb1):
        ar = np.float64(ren[k] + ren[nfft - k])
        ai = np.float64(imn[k] - imn[nfft - k])
        mag_a[k] = 0.5 * np.sqrt(ar * ar + ai * ai)

    # --- NLFER: low-band energy over its running mean
    e = 0.0
    for k in range(ip[I_KB0], ip[I_KB1]):
        e += mag_a[k]
    sc[S_MEANE], sc[S_NE] = running_mean(sc[S_MEANE], sc[S_NE], e, float(ip[I_TAU_E]))
    norm = sc[S_MEANE] if sc[S_MEANE] > fp[F_E_FLOOR] else fp[F_E_FLOOR]
    en = e / norm
    t = iv[V_T]
    prev_e = sc[S_PREV_E] if t > 0 else en

    # --- spectral track: SHC peaks, online Viterbi, held through unvoiced frames, 3-tap mean
    avg = sc[S_SPEC_AVG]
    std = fp[F_SEARCH_STD] * avg
    nspec = 0
    if en > fp[F_NLFER1]:
        # |2A|^2 on every bin, for the first-harmonic check of the spectral peaks (which compares
        # and scales by the maximum, so the power does without the square roots)
        for k in range(nh + 1):
            ar = np.float64(ren[k] + ren[nfft - k])
            ai = np.float64(imn[k] - imn[nfft - k])
            pow_a[k] = ar * ar + ai * ai
        # |B| on every bin (the SHC reads up to Nyquist)
        for k in range(nh + 1):
            br = np.float64(ren[k] - ren[nfft - k])
            bi = np.float64(imn[k] + imn[nfft - k])
            mag_b[k] = 0.5 * np.sqrt(br * br + bi * bi)
        for f in range(shc_len):
            shc[f] = 0.0
        half = ip[I_SHC_HALF]
        for f in range(ip[I_SHC_MIN], ip[I_SHC_MAX] + 1):
            s = 0.0
            for w in range(-half, half + 1):
                prod = 1.0
                for r in range(1, ip[I_SHC_NH] + 1):
                    prod *= mag_b[r * f + w]  # zeros beyond Nyquist
                s += prod
            shc[f] = s
        nspec = spectral_peaks(ip, fp, shc, pow_a, mag_b, nh, sp, sm)
    if nspec > 0:
        k1w = fp[F_K1] * std / avg
        f0min = fp[F_F0MIN]
        for j in range(SPEC_CANDS):
            local = 1.0 - sm[j]
            if iv[V_SPEC_PREV] == 0:
                newacc[j] = local
            else:
                best = 1e300
                for i in range(SPEC_CANDS):
                    d = abs(spv[0, i] - sp[j]) / f0min
                    c = spv[1, i] + k1w * (0.05 * d + d * d)
                    if c < best:
                        best = c
                newacc[j] = best + local
        jbest = 0
        for j in range(SPEC_CANDS):
            if newacc[j] <= newacc[jbest]:
                jbest = j
        base = newacc[jbest]
        for j in range(SPEC_CANDS):
            spv[0, j] = sp[j]
            spv[1, j] = newacc[j] - base
        iv[V_SPEC_PREV] = 1
        raw = sp[jbest]
        sc[S_SPEC_AVG], sc[S_NSPEC] = running_mean(sc[S_SPEC_AVG], sc[S_NSPEC], raw, float(ip[I_TAU_P]))
        sc[S_HELD] = raw
    sc[S_H0] = sc[S_H1]
    sc[S_H1] = sc[S_H2]
    sc[S_H2] = sc[S_HELD]
    spec = (sc[S_H0] + sc[S_H1] + sc[S_H2]) / 3.0

    # --- NCCF candidates of both signals around the spectral track
    f0min = fp[F_F0MIN]
    f0max = fp[F_F0MAX]
    lo_hz = spec - 2.0 * std
    if lo_hz < f0min:
        lo_hz = f0min
    hi_hz = spec + 2.0 * std
    if hi_hz > f0max:
        hi_hz = f0max
    if lo_hz >= hi_hz:
        lo_hz = 0.5 * hi_hz
    lag_lo = int(np.floor(8000.0 / hi_hz)) - NCCF_CENTER
    lag_hi = int(np.floor(8000.0 / lo_hz)) + NCCF_CENTER
    if lag_lo < ip[I_LAG_MIN]:
        lag_lo = ip[I_LAG_MIN]
    if lag_hi > ip[I_LAG_MAX] - 1:
        lag_hi = ip[I_LAG_MAX] - 1
    for q in range(2 * NCCF_PER_SIGNAL):
        cp[q] = 0.0
        cm[q] = 0.0
    # (definitely unvoiced frames, en <= nlfer_thresh2, discard the NCCF: skip it)
    if lag_hi - lag_lo >= 2 * NCCF_CENTER + 1 and en > fp[F_NLFER2]:
        for q in range(ip[I_LAG_MAX] + 2):
            phi[q] = 0.0
        nccf_candidates(fp, buf8, 0, off_a, 2 * h8, cs, phi, ip[I_NCCF_N], ip[I_LAG_MAX], lag_lo, lag_hi, cp, cm, 0)
        # (the squared signal only where the filtered one has no peak above nccf_skip_squared)
        if not cm[0] > fp[F_SKIP2]:
            for q in range(ip[I_LAG_MAX] + 2):
                phi[q] = 0.0
            nccf_candidates(fp, buf8, 1, off_a, 2 * h8, cs, phi, ip[I_NCCF_N], ip[I_LAG_MAX], lag_lo, lag_hi, cp,
                             cm, NCCF_PER_SIGNAL)
    # merit: boosted near the spectral track, zero beyond 5 std
    fth = 5.0 * std
    for q in range(2 * NCCF_PER_SIGNAL):
        diff = abs(cp[q] - spec)
        cm[q] = (1.0 + fp[F_BOOST]) * cm[q] * (1.0 - diff / fth) if diff < fth else 0.0
    # stable sort of the 6 by merit, descending
    for q in range(1, 2 * NCCF_PER_SIGNAL):
        mq = cm[q]
        pq = cp[q]
        r = q
        while r > 0 and cm[r - 1] < mq:
            cm[r] = cm[r - 1]
            cp[r] = cp[r - 1]
            r -= 1
        cm[r] = mq
        cp[r] = pq

    # --- refine (YAAPT): rows 0-2 NCCF, 3 spectral, 4 best NCCF of a voiced frame, 5 unvoiced
    for q in range(3):
        dp_p[q] = cp[q]
        dp_m[q] = cm[q]
    dp_p[3] = 0.0
    dp_m[3] = 0.0
    dp_p[4] = 0.0
    dp_m[4] = 0.0
    dp_p[5] = 0.0
    dp_m[5] = 0.0
    if en <= fp[F_NLFER2]:
        for q in range(_NC):
            dp_p[q] = 0.0
            dp_m[q] = fp[F_PIVOT]
    elif dp_p[0] > 0.0:
        dp_m[5] = 1.0 - dp_m[0]
        for q in range(1, 3):
            if dp_p[q] == 0.0:
                dp_m[q] = 0.0
    else:
        # no NCCF peak: YAAPT offers the spectral track with merit min(1, en / 2); here only when
        # this frame itself has spectral harmonic peaks (white noise would be voiced otherwise)
        dp_p[0] = spec
        dp_m[0] = (en / 2.0 if en < 2.0 else 1.0) if nspec > 0 else 0.0
        for q in range(1, _NC):
            dp_p[q] = 0.0
            dp_m[q] = 1.0 - dp_m[0]
    if en > fp[F_NLFER1] and cp[0] > 0.0:
        dp_p[4] = cp[0]
        dp_m[4] = dp_m[0]
    else:
        dp_p[4] = 0.0
        dp_m[4] = 1.0 - (en / 2.0 if en < 2.0 else 1.0)
    dp_p[3] = spec
    dp_m[3] = en / 5.0
    if en > fp[F_NLFER1] and cp[0] > 0.0 and cm[0] > 0.0:
        sc[S_MEANP], sc[S_NP] = running_mean(sc[S_MEANP], sc[S_NP], cp[0], float(ip[I_TAU_P]))

    # --- fixed-lag Viterbi over the candidates
    lag = ip[I_LAG]
    ring = lag + 1
    slot = t % ring
    pslot = (t - 1) % ring
    w4c = fp[F_W4]
    benefit = abs(en - prev_e)
    if benefit > 1.0:
        benefit = 1.0
    c_vu = fp[F_W2] * (1.0 - benefit) / w4c
    c_uu = fp[F_W3] / w4c
    c_vv = fp[F_W1] / sc[S_MEANP] / w4c
    for j in range(_NC):
        local = 1.0 - dp_m[j]
        if t == 0:
            newacc[j] = local
            ringb[slot, j] = j
            continue
        pj = dp_p[j]
        best = 1e300
        bi = 0
        for i in range(_NC):
            pi = ringp[pslot, i]
            if pi > 0.0 and pj > 0.0:
                c = dpacc[i] + c_vv * abs(pi - pj)
            elif pi > 0.0 or pj > 0.0:
                c = dpacc[i] + c_vu
            else:
                c = dpacc[i] + c_uu
            if c <= best:
                best = c
                bi = i
        newacc[j] = best + local
        ringb[slot, j] = bi
    jbest = 0
    for j in range(_NC):
        if newacc[j] <= newacc[jbest]:
            jbest = j
    base = newacc[jbest]
    for j in range(_NC):
        dpacc[j] = newacc[j] - base
        ringp[slot, j] = dp_p[j]
    sc[S_PREV_E] = en
    iv[V_T] = t + 1
    if t < lag:
        return -1.0
    s = jbest
    for d in range(lag):
        s = ringb[(t - d) % ring, s]
    return ringp[(t - lag) % ring, s]


@njit(cache=True)
def run_hops(ip, fp, sos, hann, kais, twr, twi, brev, zst, hb, dec, buf8, sc, iv, spv, dpacc, ringp, ringb,
             work, fbuf, x, out):
    """Feeds ``x`` (float32, 16 kHz, a multiple of 160 samples) and writes one
    value per 10 ms hop into ``out``: the F0 (Hz, 0 = unvoiced) of the frame
    finalized by that hop, 0 for the frames before the stream began."""
    nbq = ip[I_NBQ]
    w8 = ip[I_B8]
    hop8 = HOP_SAMPLES // 2
    nhops = x.shape[0] // HOP_SAMPLES
    h3 = fp[F_HB3]
    h1 = fp[F_HB1]
    hc = fp[F_HBC]
    for h in range(nhops):
        # the signal (row 0) and its square (row 1), split into even (hb[r, 0]) and odd (hb[r, 1])
        # samples after _HB_HIST samples of history per phase
        x0 = h * HOP_SAMPLES
        for m in range(hop8):
            a = np.float64(x[x0 + 2 * m])
            b = np.float64(x[x0 + 2 * m + 1])
            hb[0, 0, _HB_HIST + m] = a
            hb[0, 1, _HB_HIST + m] = b
            hb[1, 0, _HB_HIST + m] = a * a
            hb[1, 1, _HB_HIST + m] = b * b
        # half-band low-pass and decimation to 8 kHz: output m is the input at 16 kHz sample 2m (this
        # hop) through the 7-tap half-band filter (h3, 0, h1, hc, h1, 0, h3)
        for r in range(2):
            for m in range(hop8):
                dec[r, m] = (h3 * (hb[r, 0, m + 3] + hb[r, 0, m]) + h1 * (hb[r, 0, m + 2] + hb[r, 0, m + 1])
                             + hc * hb[r, 1, m + 1])
            for j in range(_HB_HIST):
                hb[r, 0, j] = hb[r, 0, hop8 + j]
                hb[r, 1, j] = hb[r, 1, hop8 + j]
        # band-pass at 8 kHz (transposed direct form II), both signals
        for m in range(hop8):
            a = dec[0, m]
            b = dec[1, m]
            for s in range(nbq):
                y = sos[s, 0] * a + zst[0, s, 0]
                zst[0, s, 0] = (sos[s, 1] * a + zst[0, s, 1]) - sos[s, 4] * y
                zst[0, s, 1] = sos[s, 2] * a - sos[s, 5] * y
                a = y
                y = sos[s, 0] * b + zst[1, s, 0]
                zst[1, s, 0] = (sos[s, 1] * b + zst[1, s, 1]) - sos[s, 4] * y
                zst[1, s, 1] = sos[s, 2] * b - sos[s, 5] * y
                b = y
            buf8[0, iv[V_FILL]] = a
            buf8[1, iv[V_FILL]] = b
            iv[V_FILL] += 1
        val = 0.0
        if iv[V_FILL] == w8:
            r = _analyse_frame(ip, fp, hann, kais, twr, twi, brev, buf8, sc, iv, spv, dpacc, ringp, ringb,
                               work, fbuf)
            if r > 0.0:
                val = r
            for i in range(w8 - hop8):
                buf8[0, i] = buf8[0, i + hop8]
                buf8[1, i] = buf8[1, i + hop8]
            iv[V_FILL] = w8 - hop8
        out[h] = val
    return nhops


@njit(cache=True)
def _mag_b_len(ip):
    """|B| bins: up to Nyquist, then zeros up to the highest harmonic the SHC reads."""
    return max(ip[I_NFFT] // 2 + 1, ip[I_SHC_NH] * ip[I_SHC_MAX] + ip[I_SHC_HALF] + 1)


def work_size(ip: np.ndarray) -> int:
    nfft = int(ip[I_NFFT])
    shc_len = max(int(ip[I_SHC_MAX]), int(ip[I_PK_MAX] + ip[I_PK_CENTER])) + 2
    return (2 * (nfft // 2 + 1) + int(_mag_b_len(ip)) + shc_len + int(ip[I_B8]) + 1 + int(ip[I_LAG_MAX]) + 2
            + 4 * NCCF_PER_SIGNAL + 2 * SPEC_CANDS + 3 * _NC)


def fft_tables(nfft: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-stage twiddles and the bit-reversal permutation: for each stage
    half-size h (1, 2, 4, ... N/2), ``twr[h + k], twi[h + k]`` = cos, -sin of
    2πk/(2h), k < h, taken from the same N/2-entry table as the C++ kernel
    (so both hold bit-identical values)."""
    k = np.arange(nfft // 2)
    twc, tws = np.cos(2 * np.pi * k / nfft), -np.sin(2 * np.pi * k / nfft)
    twr, twi = np.zeros(nfft), np.zeros(nfft)
    h = 1
    while h < nfft:
        idx = np.arange(h) * (nfft // (2 * h))
        twr[h:2 * h], twi[h:2 * h] = twc[idx], tws[idx]
        h *= 2
    bits = int(np.log2(nfft))
    brev = np.array([int(format(i, f"0{bits}b")[::-1], 2) for i in range(nfft)], np.int64)
    return twr.astype(np.float32), twi.astype(np.float32), brev


class NumbaF0Kernel:
    """One stream of the Numba kernel. ``process(x)``: float32 16 kHz, a multiple
    of 160 samples -> float64 F0 per 10 ms hop (see ``run_hops``)."""

    def __init__(self, derived: Derived) -> None:
        self._d = derived
        ip = derived.iparams
        self._twr, self._twi, self._brev = fft_tables(int(ip[I_NFFT]))
        n_bq = int(ip[I_NBQ])
        lag = int(ip[I_LAG])
        self._zst = np.zeros((2, n_bq, 2))
        self._hb = np.zeros((2, 2, _HB_HIST + HOP_SAMPLES // 2))
        self._dec = np.zeros((2, HOP_SAMPLES // 2))
        self._buf8 = np.zeros((2, int(ip[I_B8])), np.float32)
        self._fbuf = np.zeros((4, int(ip[I_NFFT]) + 1), np.float32)  # re, im; spectrum in natural order
        self._hann = derived.hann4.astype(np.float32)
        self._kais = derived.kaiser4.astype(np.float32)
        self._sc = np.zeros(N_SCALARS)
        self._iv = np.zeros(N_IVARS, np.int64)
        self._spv = np.zeros((2, SPEC_CANDS))
        self._dpacc = np.zeros(_NC)
        self._ringp = np.zeros((lag + 1, _NC))
        self._ringb = np.zeros((lag + 1, _NC), np.int64)
        self._work = np.zeros(work_size(ip))
        self.reset()

    def reset(self) -> None:
        fp, ip = self._d.fparams, self._d.iparams
        for a in (self._zst, self._hb, self._buf8, self._sc, self._iv, self._spv, self._dpacc, self._ringp,
                  self._ringb, self._work, self._fbuf):
            a.fill(0)
        self._iv[V_FILL] = ip[I_B8] - ip[I_H8]
        prior = fp[F_PRIOR_F0]
        self._sc[S_SPEC_AVG] = prior
        self._sc[S_H0] = self._sc[S_H1] = self._sc[S_H2] = self._sc[S_HELD] = prior
        self._sc[S_MEANP] = prior
        self._sc[S_NSPEC] = fp[F_PRIOR_N]
        self._sc[S_NP] = fp[F_PRIOR_N]
        self._sc[S_MEANE] = fp[F_E_PRIOR]
        self._sc[S_NE] = fp[F_E_PRIOR_N]

    def process_into(self, x: np.ndarray, out: np.ndarray) -> None:
        d = self._d
        run_hops(d.iparams, d.fparams, d.sos, self._hann, self._kais, self._twr, self._twi, self._brev,
                 self._zst, self._hb, self._dec, self._buf8, self._sc, self._iv, self._spv, self._dpacc,
                 self._ringp, self._ringb,
                 self._work, self._fbuf, x, out)
