"""F0 extraction behind one function, for the speaker pool's pitch statistics.

``track_f0_hz(audio, tracker="auto")`` returns per-10 ms F0 in Hz (0 where
unvoiced) and the name of the tracker that produced it. ``"auto"`` uses
rtanon's own tracker (``rtanon.f0.track``) when that module is importable and
otherwise the reference tracker, WORLD's Harvest (``pyworld``), which is
robust on children's and adult voices (DIO misses whole voiced stretches on
some of our clips). ``"pyaapt"`` is YAAPT (amfm-decompy), slow.

``quantiles_hz(f0_hz, levels)`` summarises voiced frames;
``mixture_quantiles_hz`` gives the quantiles of several speakers' concatenated
F0 from their per-speaker quantiles and voiced-frame counts (paper 000 Eq. 6).
"""

from __future__ import annotations

import numpy as np

from rtanon.constants import SAMPLE_RATE_HZ

F0_FLOOR_HZ = 60.0
F0_CEIL_HZ = 600.0
FRAME_MS = 10
#: 101 levels 0, 1, ..., 100 %: the percentiles of paper 000 Eq. 5-6.
QUANTILE_LEVELS = np.linspace(0.0, 1.0, 101)
TRACKERS = ("auto", "rtanon", "pyworld-harvest", "pyaapt")


def resolve_tracker(tracker: str = "auto") -> str:
    if tracker not in TRACKERS:
        raise ValueError(f"unknown F0 tracker {tracker!r}; choose one of {TRACKERS}")
    if tracker != "auto":
        return tracker
    try:
        from rtanon.f0 import track  # noqa: F401  (lands with the F0 issue)
        return "rtanon"
    except ImportError:
        return "pyworld-harvest"


def track_f0_hz(audio: np.ndarray, tracker: str = "auto") -> tuple[np.ndarray, str]:
    """(T,) float32 16 kHz mono in [-1, 1] -> ((frames,) float32 F0 in Hz at 10 ms hop,
    0 where unvoiced; the tracker's name)."""
    name = resolve_tracker(tracker)
    audio = np.asarray(audio, dtype=np.float32)
    if name == "rtanon":
        from rtanon.f0 import track

        out = track(audio)
        f0 = np.asarray(getattr(out, "f0_hz", out), dtype=np.float32).reshape(-1)
    elif name == "pyworld-harvest":
        try:
            import pyworld
        except ImportError as exc:  # pragma: no cover
            raise ImportError(f"{exc}; the reference F0 tracker needs pyworld: pip install pyworld-prebuilt") from exc
        f0, _ = pyworld.harvest(audio.astype(np.float64), SAMPLE_RATE_HZ, f0_floor=F0_FLOOR_HZ,
                                f0_ceil=F0_CEIL_HZ, frame_period=FRAME_MS)
        f0 = f0.astype(np.float32)
    else:
        try:
            import amfm_decompy.basic_tools as basic
            import amfm_decompy.pYAAPT as pyaapt
        except ImportError as exc:  # pragma: no cover
            raise ImportError(f"{exc}; YAAPT needs amfm-decompy: pip install amfm-decompy") from exc
        sig = basic.SignalObj(audio.astype(np.float64), SAMPLE_RATE_HZ)
        f0 = pyaapt.yaapt(sig, frame_length=25, frame_space=FRAME_MS, f0_min=F0_FLOOR_HZ,
                          f0_max=F0_CEIL_HZ).samp_values.astype(np.float32)
    f0 = np.where(np.isfinite(f0) & (f0 > 0), f0, 0.0).astype(np.float32)
    return f0, name


def quantiles_hz(f0_hz: np.ndarray, levels: np.ndarray = QUANTILE_LEVELS) -> np.ndarray:
    """Quantiles (len(levels),) float32 in Hz of the voiced (> 0) frames of ``f0_hz``."""
    voiced = np.asarray(f0_hz, dtype=np.float64)
    voiced = voiced[voiced > 0]
    if voiced.size == 0:
        raise ValueError("no voiced frames: cannot compute F0 quantiles")
    return np.quantile(voiced, levels).astype(np.float32)


def mixture_quantiles_hz(quantiles: np.ndarray, weights: np.ndarray | None = None,
                         levels: np.ndarray = QUANTILE_LEVELS) -> np.ndarray:
    """Quantiles of the concatenation of several speakers' voiced F0.

    ``quantiles``: (S, Q) per-speaker quantiles in Hz at ``levels``;
    ``weights``: (S,) voiced-frame counts (equal when None). Each speaker's
    CDF is the piecewise-linear interpolation of its quantiles; the mixture CDF
    is their weighted mean, inverted on a fine grid. Returns (Q,) float32 Hz.
    """
    q = np.atleast_2d(np.asarray(quantiles, dtype=np.float64))
    w = np.ones(q.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    grid = np.unique(np.concatenate([q.ravel(), np.linspace(q.min(), q.max(), 2048)]))
    cdf = np.zeros_like(grid)
    for qs, ws in zip(q, w):
        qs = np.maximum.accumulate(qs)
        cdf += ws * np.interp(grid, qs, levels, left=0.0, right=1.0)
    cdf = np.maximum.accumulate(cdf)
    out = np.interp(levels, cdf, grid)
    out[0], out[-1] = q[:, 0].min(), q[:, -1].max()
    return out.astype(np.float32)
