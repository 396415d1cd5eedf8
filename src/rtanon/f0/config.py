"""Configuration of the F0 tracker (``F0Config``) and the constants derived from it.

``F0Config`` holds the user-facing settings (one set of defaults, ``validate()``
says how to fix a value). ``derive(config)`` turns it into the flat parameter
vectors, windows and filter coefficients that both kernels (C++ in
``rtanon._core.F0Kernel`` and Numba in :mod:`rtanon.f0.numba_kernel`) take, so
the two kernels can never disagree about a constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rtanon.config import ConfigError
from rtanon.constants import HOP_SAMPLES, SAMPLE_RATE_HZ  # noqa: F401  (HOP_SAMPLES: the tracker's frame hop)

#: Frame hop of the tracker: 10 ms at 16 kHz. Frame k is centred at sample k * HOP_SAMPLES.
#: The kernels analyse the band-passed signal at 8 kHz (NCCF) and 4 kHz (spectrum).
_RATE8_HZ = SAMPLE_RATE_HZ // 2
_RATE4_HZ = SAMPLE_RATE_HZ // 4
_NFFT4 = 512  # FFT size at 4 kHz: 7.8125 Hz per bin
#: Candidates per frame in the main dynamic programme: 4 NCCF, 1 spectral, 1 unvoiced.
N_CANDIDATES = 6

# Layout of the integer parameter vector (shared with csrc/f0_tracker.hpp).
I_H8, I_LAG, I_NFFT, I_KB0, I_KB1, I_SHC_MIN, I_SHC_MAX, I_SHC_HALF, I_SHC_NH, I_PK_MIN, I_PK_MAX, \
    I_PK_CENTER, I_LAG_MIN, I_LAG_MAX, I_NCCF_N, I_NBQ, I_TAU_E, I_TAU_P, I_B8, I_SW4, N_IPARAMS = range(21)
# Layout of the float parameter vector.
F_F0MIN, F_F0MAX, F_NLFER1, F_NLFER2, F_SHC_T1, F_SHC_T2, F_K1, F_NCCF_T1, F_NCCF_T2, F_BOOST, \
    F_PIVOT, F_W1, F_W2, F_W3, F_W4, F_PRIOR_F0, F_PRIOR_N, F_SEARCH_STD, F_E_FLOOR, F_DELTA4, \
    F_E_PRIOR, F_E_PRIOR_N, F_FH_MIN, F_HBC, F_HB1, F_HB3, F_SKIP2, N_FPARAMS = range(28)


@dataclass(frozen=True)
class F0Config:
    """Settings of the streaming YAAPT-style F0 tracker.

    Frame k is centred at ``k * 10 ms``; its analysis window (NCCF, energy)
    spans ``window_ms`` around the centre. The spectral-harmonics window
    (``spectral_window_ms``, longer for frequency resolution) ends where the
    analysis window ends, so it reaches further into the past, not the future.
    The tracker decides frame k when frame
    ``k + decision_lag_frames`` has been analysed, so each F0 value is final
    ``lookahead_ms = window_ms / 2 + 10 * decision_lag_frames`` after the
    frame centre (the stage's ``latency_samples``).

    With the defaults (40 ms window, lag 0) the lookahead is 20 ms. The
    input filter (7-tap half-band decimator to 8 kHz, then an IIR band-pass
    50-1500 Hz at 8 kHz) adds a group delay of 0.6 ms at 400 Hz, 1.1 ms at
    150 Hz and 1.9 ms at 100 Hz (2.7 ms at 80 Hz), not counted: the F0
    values lag the true contour by that much. ``decision_lag_frames`` > 0 lets the Viterbi
    decoder see later frames before deciding (fixed-lag decoding) at 10 ms of
    lookahead per frame; on so762_dev it did not lower the error against
    pYAAPT, so live use keeps 0.

    ``nccf_skip_squared`` is not in YAAPT (which always computes both
    NCCFs): the NCCF of the squared signal is skipped in frames where the
    filtered signal's best NCCF peak exceeds it. On so762_train 0.6 to 0.9
    changed GPE and VDE by at most 0.01 %; 0.7 saves about 9 % of the C++
    kernel's time.

    ``shc_first_harmonic_min`` is not in YAAPT: a spectral (SHC) peak keeps
    its merit only if the filtered or the squared spectrum has a peak of at
    least this share of its maximum at the candidate frequency itself (else
    the merit shrinks by ``(share / shc_first_harmonic_min)^2``). The SHC of
    the squared signal alone puts a pure tone at f on a sub-harmonic (2f/3,
    f/2: the squared tone has only 2f); on synthetic tones and harmonic
    complexes the share is about 1 at the true F0 and below 0.15 at
    sub-harmonics. On so762_train 1.0 gave a lower GPE than 0.3 (2.95 vs
    3.29 % with the other values tuned).

    The thresholds and dynamic-programming weights start from YAAPT
    (Zahorian & Hu 2008, defaults of pYAAPT); ``prior_f0_hz`` and
    ``energy_tau_s``/``pitch_tau_s`` drive the online estimates that replace
    YAAPT's whole-utterance statistics. pYAAPT smooths its spectral track
    over the whole utterance (Viterbi with backtracking, median filters,
    interpolation through frames without spectral peaks); this tracker
    decides online with 20 ms of lookahead, so it trusts spectral peaks less.
    Tuned against pYAAPT on 700 files of so762_train (GPE 4.62 -> 2.21 %,
    VDE 5.03 -> 6.33 %), where they differ from pYAAPT's defaults:
    ``shc_thresh1`` 10 (pYAAPT 5: a frame gives spectral candidates only if
    its SHC peak is 10 times the mean, else the track holds), ``shc_thresh2``
    1.0 (1.25), ``nccf_thresh1`` 0.2 (0.3), ``merit_boost`` 0 (0.2: with
    the online track, boosted NCCF merits voiced frames pYAAPT has unvoiced
    or at another octave), ``shc_first_harmonic_min`` 1.0 (a candidate whose
    first harmonic is not the strongest peak of either spectrum loses merit;
    also keeps harmonic complexes off 2 f0),
    ``search_std_ratio`` 0.12 (pYAAPT: the standard deviation of its
    utterance's spectral track, at least 0.05 of its mean; 0.12 lowered GPE
    from 2.27 to 2.21 % at VDE 6.05 -> 6.33 % and searches fewer NCCF lags
    than 0.15; 0.10 gave 2.17 % at VDE 6.66 %), and the energy normaliser
    (``energy_prior_dbfs`` -20, ``energy_prior_s`` 1, ``energy_tau_s``
    2): the running mean starts above the typical level of speech with
    pauses (so762_train: -24.5 dBFS median RMS), so the first second,
    before the statistics settle, is voiced only where it is clearly loud.
    (A higher prior lowers the GPE further at the cost of VDE, and lets a
    drop in low-band energy, as in a jump from 120 to 240 Hz, stop the
    spectral track.)
    """

    f0_min_hz: float = 60.0
    f0_max_hz: float = 400.0
    window_ms: int = 40
    spectral_window_ms: int = 80
    decision_lag_frames: int = 0
    nlfer_thresh1: float = 0.75
    nlfer_thresh2: float = 0.1
    shc_numharms: int = 3
    shc_window_hz: float = 40.0
    shc_pwidth_hz: float = 50.0
    shc_thresh1: float = 10.0
    shc_thresh2: float = 1.0
    shc_first_harmonic_min: float = 1.0
    dp5_k1: float = 11.0
    nccf_thresh1: float = 0.2
    nccf_thresh2: float = 0.9
    merit_boost: float = 0.0
    merit_pivot: float = 0.99
    nccf_skip_squared: float = 0.7
    dp_w1: float = 0.15
    dp_w2: float = 0.5
    dp_w3: float = 0.1
    dp_w4: float = 0.9
    prior_f0_hz: float = 160.0
    prior_f0_s: float = 0.2
    search_std_ratio: float = 0.12
    energy_tau_s: float = 2.0
    pitch_tau_s: float = 1.0
    energy_floor_dbfs: float = -60.0
    energy_prior_dbfs: float = -20.0
    energy_prior_s: float = 1.0

    @property
    def lookahead_ms(self) -> int:
        return self.window_ms // 2 + 10 * self.decision_lag_frames

    @property
    def latency_samples(self) -> int:
        return self.lookahead_ms * SAMPLE_RATE_HZ // 1000

    def validate(self) -> None:
        if not 40.0 <= self.f0_min_hz < self.f0_max_hz <= 600.0:
            raise ConfigError(f"F0 range [{self.f0_min_hz}, {self.f0_max_hz}] Hz; use "
                              "40 <= f0_min_hz < f0_max_hz <= 600 (speech: 60 to 400)")
        if self.window_ms not in (20, 40, 60):
            raise ConfigError(f"window_ms={self.window_ms}; use 20, 40 or 60 (a multiple of 20 ms, so the "
                              "lookahead is a whole number of 10 ms frames)")
        if not self.window_ms <= self.spectral_window_ms <= 120 or self.spectral_window_ms % 10:
            raise ConfigError(f"spectral_window_ms={self.spectral_window_ms}; use a multiple of 10 ms from "
                              f"window_ms ({self.window_ms}) to 120")
        if not 0 <= self.decision_lag_frames <= 50:
            raise ConfigError(f"decision_lag_frames={self.decision_lag_frames}; use 0 to 50 frames of 10 ms")
        lag8_max = int(np.ceil(_RATE8_HZ / self.f0_min_hz))
        if self.window_ms * _RATE8_HZ // 1000 - lag8_max < 24:
            raise ConfigError(f"window_ms={self.window_ms} is too short for f0_min_hz={self.f0_min_hz}: "
                              "raise window_ms or f0_min_hz")
        if not 10.0 <= self.shc_window_hz <= 80.0:
            raise ConfigError(f"shc_window_hz={self.shc_window_hz}; use 10 to 80 Hz (YAAPT: 40)")
        if not 1 <= self.shc_numharms <= 5:
            raise ConfigError(f"shc_numharms={self.shc_numharms}; use 1 to 5 (YAAPT: 3)")
        if not 0.0 < self.shc_first_harmonic_min <= 1.0:
            raise ConfigError(f"shc_first_harmonic_min={self.shc_first_harmonic_min}; use a value in (0, 1] "
                              "(1.0: spectral peaks whose first harmonic is below the spectrum's maximum "
                              "lose merit)")
        if not 50.0 <= self.prior_f0_hz <= 500.0:
            raise ConfigError(f"prior_f0_hz={self.prior_f0_hz}; use 50 to 500 Hz")
        if not 0.02 <= self.search_std_ratio <= 0.5:
            raise ConfigError(f"search_std_ratio={self.search_std_ratio}; use 0.02 to 0.5 (NCCF lags are searched "
                              "within +-2 of these standard deviations around the spectral track)")
        if not 0.0 <= self.prior_f0_s <= self.pitch_tau_s:
            raise ConfigError(f"prior_f0_s={self.prior_f0_s}; use 0 to pitch_tau_s seconds")
        if self.energy_tau_s <= 0 or self.pitch_tau_s <= 0:
            raise ConfigError("energy_tau_s and pitch_tau_s must be > 0 seconds")
        if not -90.0 <= self.energy_floor_dbfs < self.energy_prior_dbfs <= 0.0:
            raise ConfigError(f"energy_floor_dbfs={self.energy_floor_dbfs}, energy_prior_dbfs="
                              f"{self.energy_prior_dbfs}; use -90 <= floor < prior <= 0 dBFS")
        if not 0.0 <= self.energy_prior_s <= self.energy_tau_s:
            raise ConfigError(f"energy_prior_s={self.energy_prior_s}; use 0 to energy_tau_s seconds")
        if not 0.0 < self.nccf_skip_squared <= 2.0:
            raise ConfigError(f"nccf_skip_squared={self.nccf_skip_squared}; use (0, 2] (above 1: always compute "
                              "the NCCF of the squared signal, as YAAPT does)")
        if self.dp_w4 <= 0:
            raise ConfigError("dp_w4 must be > 0 (it divides the transition costs)")


@dataclass(frozen=True)
class Derived:
    """Flat constants for the kernels: see ``derive``."""

    iparams: np.ndarray  # int64 [N_IPARAMS]
    fparams: np.ndarray  # float64 [N_FPARAMS]
    sos: np.ndarray  # float64 [n_sections, 6]: band-pass 50-1500 Hz at 8 kHz
    hann4: np.ndarray  # float64 [window at 4 kHz]
    kaiser4: np.ndarray  # float64 [spectral window at 4 kHz]


@lru_cache(maxsize=16)
def derive(config: F0Config) -> Derived:
    """Constants of both kernels, computed once per ``config`` (cached; treat
    the arrays as read-only)."""
    from scipy.signal import butter, remez
    from scipy.signal.windows import hann, kaiser

    config.validate()
    c = config
    h8 = c.window_ms * _RATE8_HZ // 1000 // 2
    w4 = c.window_ms * _RATE4_HZ // 1000
    sw4 = c.spectral_window_ms * _RATE4_HZ // 1000
    delta = _RATE4_HZ / _NFFT4
    shc_len = int(np.trunc(c.shc_window_hz / delta))
    shc_half = shc_len // 2
    shc_min = int(np.ceil(c.f0_min_hz / delta))
    shc_max = int(np.trunc((c.f0_max_hz + 2 * c.shc_pwidth_hz) / delta))
    width = int(np.trunc(c.shc_pwidth_hz / delta))
    if width % 2 == 0:
        width += 1
    center = int(np.ceil(width / 2))
    pk_min = max(1, int(np.trunc(c.f0_min_hz / delta - center)))
    pk_max = int(np.trunc(c.f0_max_hz / delta + center))
    lag_min = max(2, int(np.floor(_RATE8_HZ / c.f0_max_hz)) - 2)
    lag_max = int(np.ceil(_RATE8_HZ / c.f0_min_hz)) + 2
    nccf_n = (2 * h8 - lag_max - 1) // 16 * 16  # a multiple of 16: the kernels sum in sixteen lanes
    kb0 = int(np.around(c.f0_min_hz * 2 / _RATE4_HZ * _NFFT4)) - 1
    kb1 = int(np.around(c.f0_max_hz / _RATE4_HZ * _NFFT4))
    # 16 kHz -> 8 kHz: 7-tap half-band low-pass (flat to 1500 Hz, -50 dB from 6500 Hz, so nothing
    # aliases into the band), then the band-pass at 8 kHz
    hb = remez(7, [0.0, 1500.0, 6500.0, SAMPLE_RATE_HZ / 2], [1.0, 0.0], fs=SAMPLE_RATE_HZ)
    hb[1] = hb[5] = 0.0
    hb /= hb.sum()
    sos = np.concatenate([butter(2, 50.0, "highpass", fs=_RATE8_HZ, output="sos"),
                          butter(6, 1500.0, "lowpass", fs=_RATE8_HZ, output="sos")]).astype(np.float64)
    ip = np.zeros(N_IPARAMS, np.int64)
    ip[I_H8], ip[I_LAG], ip[I_NFFT] = h8, c.decision_lag_frames, _NFFT4
    ip[I_KB0], ip[I_KB1] = kb0, kb1
    ip[I_SHC_MIN], ip[I_SHC_MAX], ip[I_SHC_HALF], ip[I_SHC_NH] = shc_min, shc_max, shc_half, c.shc_numharms + 1
    ip[I_PK_MIN], ip[I_PK_MAX], ip[I_PK_CENTER] = pk_min, pk_max, center
    ip[I_LAG_MIN], ip[I_LAG_MAX], ip[I_NCCF_N] = lag_min, lag_max, nccf_n
    ip[I_NBQ] = sos.shape[0]
    ip[I_TAU_E] = max(1, round(c.energy_tau_s * 100))
    ip[I_TAU_P] = max(1, round(c.pitch_tau_s * 100))
    ip[I_B8], ip[I_SW4] = max(2 * h8, 2 * sw4), sw4
    fp = np.zeros(N_FPARAMS, np.float64)
    fp[F_F0MIN], fp[F_F0MAX] = c.f0_min_hz, c.f0_max_hz
    fp[F_NLFER1], fp[F_NLFER2] = c.nlfer_thresh1, c.nlfer_thresh2
    fp[F_SHC_T1], fp[F_SHC_T2], fp[F_K1] = c.shc_thresh1, c.shc_thresh2, c.dp5_k1
    fp[F_NCCF_T1], fp[F_NCCF_T2] = c.nccf_thresh1, c.nccf_thresh2
    fp[F_BOOST], fp[F_PIVOT] = c.merit_boost, c.merit_pivot
    fp[F_W1], fp[F_W2], fp[F_W3], fp[F_W4] = c.dp_w1, c.dp_w2, c.dp_w3, c.dp_w4
    fp[F_PRIOR_F0], fp[F_PRIOR_N], fp[F_SEARCH_STD] = c.prior_f0_hz, c.prior_f0_s * 100.0, c.search_std_ratio
    # Low-band magnitude sum (NLFER numerator) of speech whose RMS over the utterance is 1,
    # measured on so762_dev: about 0.8 per sample of the 4 kHz window.
    e_per_rms = 0.8 * w4
    fp[F_E_FLOOR] = e_per_rms * 10.0 ** (c.energy_floor_dbfs / 20.0)
    fp[F_E_PRIOR] = e_per_rms * 10.0 ** (c.energy_prior_dbfs / 20.0)
    fp[F_E_PRIOR_N] = c.energy_prior_s * 100.0
    fp[F_DELTA4] = delta
    fp[F_FH_MIN] = c.shc_first_harmonic_min
    fp[F_HBC], fp[F_HB1], fp[F_HB3] = hb[3], hb[2], hb[0]
    fp[F_SKIP2] = c.nccf_skip_squared
    return Derived(ip, fp, np.ascontiguousarray(sos), hann(w4 + 2)[1:-1].astype(np.float64),
                   kaiser(sw4, 0.5).astype(np.float64))
