"""Pitch conversion to a pseudo-speaker (Srivastava et al., TASLP 2022, Sec. V-D).

All conversions act on voiced frames only: 0 (unvoiced) stays 0 and a voiced
value stays voiced (> 0). The pseudo-speaker's F0 distribution arrives as
quantiles (``TargetPitch``, e.g. 101 quantiles in Hz at levels 0, 0.01, ..., 1).

- ``percentile`` (Eq. 5-6): the value's rank among the source values gives a
  level u; the output is the target quantile at u (linear between the given
  quantiles). One-dimensional optimal transport between the two distributions.
- ``log_gaussian`` (Eq. 4): ``log p* = (log p - mu_src) / sigma_src * sigma_tgt + mu_tgt``.
- ``minmax`` (Eq. 7): the source range [min, max] is mapped linearly onto the
  target range.

Batch (``convert_utterance``) takes the source statistics from the whole
utterance, as the paper does. Live (``StreamingPitchConverter``, one per
session) estimates them online with ``OnlineF0Distribution``: a histogram of
log-F0 (``bins_per_octave`` bins from ``min_hz`` to ``max_hz``) whose counts
decay with a time constant of ``memory_s`` seconds of voiced speech, started
from a prior of ``prior_s`` seconds of voiced speech drawn from a log-normal
around ``prior_median_hz`` (spread ``prior_spread_octaves``).

First seconds in a live call: before the first voiced frame the source
distribution is the prior alone (median 160 Hz, covering roughly 85-300 Hz),
so the first syllables are mapped as if the speaker had that typical range.
Each voiced frame adds weight 1 against the prior's ``prior_s * 100``; with the
defaults (1 s prior) the speaker's own frames carry half the weight after
1 s of voiced speech (about 2-3 s of talking) and about 80 % after 4 s,
and the mapping keeps following slow drifts with the ``memory_s`` time constant.
For minmax live, the source's estimated 1st-99th percentile range is mapped
onto the target's 1st-99th percentile range (a running min/max would be
ruled by single octave errors), and the result is clipped to the target's
min..max.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtanon.config import ConfigError

METHODS = ("percentile", "log_gaussian", "minmax")


@dataclass(frozen=True)
class PitchConversionConfig:
    """How the live source F0 distribution is estimated, and which mapping to use."""

    method: str = "percentile"
    prior_median_hz: float = 160.0
    prior_spread_octaves: float = 0.45
    prior_s: float = 1.0
    memory_s: float = 30.0
    min_hz: float = 40.0
    max_hz: float = 1000.0
    bins_per_octave: int = 48

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"pitch conversion method {self.method!r}; use one of {METHODS}")
        if not self.min_hz < self.prior_median_hz < self.max_hz:
            raise ConfigError(f"prior_median_hz={self.prior_median_hz} must lie in (min_hz, max_hz) = "
                              f"({self.min_hz}, {self.max_hz})")
        if not 0.05 <= self.prior_spread_octaves <= 2.0:
            raise ConfigError(f"prior_spread_octaves={self.prior_spread_octaves}; use 0.05 to 2")
        if not 0.0 < self.prior_s <= self.memory_s:
            raise ConfigError(f"prior_s={self.prior_s}, memory_s={self.memory_s}; use 0 < prior_s <= memory_s "
                              "(seconds of voiced speech)")
        if not 0.0 < self.min_hz < self.max_hz:
            raise ConfigError(f"[min_hz, max_hz] = [{self.min_hz}, {self.max_hz}]; use 0 < min_hz < max_hz")
        if not 4 <= self.bins_per_octave <= 240:
            raise ConfigError(f"bins_per_octave={self.bins_per_octave}; use 4 to 240")


@dataclass(frozen=True)
class TargetPitch:
    """The pseudo-speaker's F0 distribution: nondecreasing ``quantiles_hz`` at
    ``levels`` (both 1-D float64, same length >= 2, levels from 0 to 1)."""

    quantiles_hz: np.ndarray
    levels: np.ndarray

    @classmethod
    def from_quantiles(cls, quantiles_hz) -> "TargetPitch":
        """Quantiles at evenly spaced levels 0..1 (e.g. 101 values: every percentile)."""
        q = np.asarray(quantiles_hz, np.float64)
        t = cls(q, np.linspace(0.0, 1.0, q.shape[0]))
        t.validate()
        return t

    @classmethod
    def from_f0(cls, f0_hz, n_quantiles: int = 101) -> "TargetPitch":
        """Quantiles of the voiced values (> 0) of an F0 track or pool."""
        f0 = np.asarray(f0_hz, np.float64)
        v = f0[f0 > 0]
        if v.size == 0:
            raise ValueError("no voiced frames (F0 > 0) to take quantiles from")
        return cls.from_quantiles(np.quantile(v, np.linspace(0.0, 1.0, n_quantiles)))

    def validate(self) -> None:
        q, lv = self.quantiles_hz, self.levels
        if q.ndim != 1 or q.shape != lv.shape or q.shape[0] < 2:
            raise ValueError("target quantiles: need a 1-D array of at least 2 values in Hz")
        if not np.all(np.isfinite(q)) or q[0] <= 0 or np.any(np.diff(q) < 0):
            raise ValueError("target quantiles must be finite, > 0 Hz and nondecreasing")

    @property
    def log_mean_std(self) -> tuple[float, float]:
        """Mean and standard deviation of log F0 (natural log) implied by the quantiles."""
        lq = np.log(self.quantiles_hz)
        w = np.gradient(self.levels)
        w = w / w.sum()
        mu = float(np.sum(w * lq))
        return mu, float(np.sqrt(np.sum(w * (lq - mu) ** 2)))


def _apply(f0: np.ndarray, fn) -> np.ndarray:
    f0 = np.asarray(f0, np.float64)
    out = np.zeros_like(f0)
    voiced = f0 > 0
    if voiced.any():
        out[voiced] = np.maximum(fn(f0[voiced]), 1e-3)  # nonzero stays nonzero
    return out


def percentile_map(f0_hz, source_levels, target: TargetPitch) -> np.ndarray:
    """Voiced values with their source levels u in [0, 1] -> target quantile at u."""
    return np.interp(source_levels, target.levels, target.quantiles_hz)


def convert_utterance(f0_hz, target: TargetPitch, method: str = "percentile") -> np.ndarray:
    """Converts a whole F0 track (float64 Hz, 0 = unvoiced) with source
    statistics from the track itself (paper 000, Eq. 4-7); same shape out."""
    if method not in METHODS:
        raise ValueError(f"pitch conversion method {method!r}; use one of {METHODS}")
    target.validate()
    f0 = np.asarray(f0_hz, np.float64)

    def fn(p):
        if method == "percentile":
            # Eq. 5: rank of p[i] among the sorted values / length (ties share the lowest rank)
            ranks = np.searchsorted(np.sort(p), p, side="left")
            return percentile_map(p, ranks / p.shape[0], target)
        if method == "log_gaussian":
            lp = np.log(p)
            mu_t, sd_t = target.log_mean_std
            sd = lp.std()
            return np.exp((lp - lp.mean()) / sd * sd_t + mu_t) if sd > 0 else np.full_like(p, np.exp(mu_t))
        lo, hi = p.min(), p.max()
        t_lo, t_hi = target.quantiles_hz[0], target.quantiles_hz[-1]
        return (p - lo) * ((t_hi - t_lo) / (hi - lo)) + t_lo if hi > lo else np.full_like(p, 0.5 * (t_lo + t_hi))

    return _apply(f0, fn)


class OnlineF0Distribution:
    """Streaming estimate of a speaker's F0 distribution (see the module docstring).

    ``update(f0)`` adds the voiced values of a block of frames (0 ignored);
    ``cdf(values)``, ``quantile(levels)`` and ``log_mean_std`` read it. Cost
    per update: O(bins) (about 250 bins with the defaults)."""

    def __init__(self, config: PitchConversionConfig | None = None) -> None:
        self.config = config or PitchConversionConfig()
        self.config.validate()
        c = self.config
        n_bins = int(np.ceil(np.log2(c.max_hz / c.min_hz) * c.bins_per_octave))
        self._edges_log2 = np.log2(c.min_hz) + np.arange(n_bins + 1) / c.bins_per_octave
        self._centres = 0.5 * (self._edges_log2[1:] + self._edges_log2[:-1])
        self._decay = float(np.exp(-1.0 / (c.memory_s * 100.0)))
        z = (self._centres - np.log2(c.prior_median_hz)) / c.prior_spread_octaves
        prior = np.exp(-0.5 * z * z)
        self._prior = prior / prior.sum() * (c.prior_s * 100.0)
        self.reset()

    def reset(self) -> None:
        self._counts = self._prior.copy()
        self.voiced_frames = 0

    def update(self, f0_hz) -> None:
        f0 = np.asarray(f0_hz, np.float64)
        v = f0[f0 > 0]
        if v.size == 0:
            return
        idx = np.clip(np.searchsorted(self._edges_log2, np.log2(v)) - 1, 0, self._centres.shape[0] - 1)
        self._counts *= self._decay ** v.size
        np.add.at(self._counts, idx, 1.0)
        self.voiced_frames += int(v.size)

    def _cum(self) -> np.ndarray:
        c = np.concatenate(([0.0], np.cumsum(self._counts)))
        return c / c[-1]

    def cdf(self, f0_hz) -> np.ndarray:
        """Levels in [0, 1] of positive values (piecewise linear within bins)."""
        return np.interp(np.log2(np.asarray(f0_hz, np.float64)), self._edges_log2, self._cum())

    def quantile(self, levels) -> np.ndarray:
        """Values in Hz at ``levels`` in [0, 1]."""
        cum = self._cum()
        keep = np.concatenate(([True], np.diff(cum) > 0))  # strictly increasing for the inverse
        return 2.0 ** np.interp(levels, cum[keep], self._edges_log2[keep])

    @property
    def log_mean_std(self) -> tuple[float, float]:
        w = self._counts / self._counts.sum()
        lc = self._centres * np.log(2.0)
        mu = float(np.sum(w * lc))
        return mu, float(np.sqrt(np.sum(w * (lc - mu) ** 2)))


class StreamingPitchConverter:
    """Per-session live pitch conversion: ``process(f0)`` takes a block of F0
    frames (float64 Hz, 0 = unvoiced, e.g. the output of ``F0Tracker.process``),
    updates the online source distribution with its voiced frames and returns
    the converted block (same shape; 0 stays 0, voiced stays voiced).
    ``reset()`` returns to the prior; the target and method are kept."""

    def __init__(self, target: TargetPitch, config: PitchConversionConfig | None = None) -> None:
        self.config = config or PitchConversionConfig()
        self.config.validate()
        target.validate()
        self.target = target
        self.source = OnlineF0Distribution(self.config)
        self._t_mu, self._t_sd = target.log_mean_std
        self._t_range = np.interp([0.01, 0.99], target.levels, target.quantiles_hz)

    def reset(self) -> None:
        self.source.reset()

    def process(self, f0_hz) -> np.ndarray:
        f0 = np.asarray(f0_hz, np.float64)
        self.source.update(f0)
        method = self.config.method
        src = self.source

        def fn(p):
            if method == "percentile":
                return percentile_map(p, src.cdf(p), self.target)
            if method == "log_gaussian":
                mu, sd = src.log_mean_std
                return np.exp((np.log(p) - mu) / sd * self._t_sd + self._t_mu)
            lo, hi = src.quantile([0.01, 0.99])
            t_lo, t_hi = self._t_range
            q = self.target.quantiles_hz
            return np.clip((p - lo) * ((t_hi - t_lo) / (hi - lo)) + t_lo, q[0], q[-1])

        return _apply(f0, fn)
