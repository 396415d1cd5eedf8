"""Streaming F0 tracking stage and whole-signal API, with run-time kernel choice.

``F0Tracker(config, hop, kernel)`` is the per-session stage: ``process(chunk)``
takes ``hop`` samples (a multiple of 160) of 16 kHz mono float32 and returns
``hop // 160`` F0 values (float64, Hz, 0 = unvoiced), one per 10 ms frame, for
the frames that chunk finalized. Frame k is centred at ``k * 10 ms``; it is
final once the input reaches ``k * 10 ms + lookahead`` (``latency_samples``),
so the value stream is the F0 track delayed by ``latency_samples // 160``
frames, the first of which (frames before the stream began) are 0.

``track(signal, config, kernel)`` runs the same kernel over a whole signal and
returns ``ceil(len(signal) / 160)`` values, frame k centred at ``k * 10 ms``,
exactly what the stream gives once its delay is removed.

Kernels: ``"cpp"`` (``rtanon._core.F0Kernel``, the real-time path), ``"numba"``
(:mod:`rtanon.f0.numba_kernel`, first use compiles for a few seconds, cached
afterwards), ``"auto"`` (C++ when the extension is built, else Numba).
"""

from __future__ import annotations

import numpy as np

from rtanon.constants import HOP_RATE_HZ
from rtanon.f0.config import HOP_SAMPLES, F0Config, derive
from rtanon.stages.base import check_chunk

KERNELS = ("auto", "cpp", "numba")


def cpp_available() -> bool:
    """True when the native extension with the F0 kernel is importable."""
    try:
        from rtanon import _core
    except ImportError:
        return False
    return hasattr(_core, "F0Kernel")


def resolve_kernel(kernel: str = "auto") -> str:
    """``"auto"`` -> ``"cpp"`` if built, else ``"numba"``; checks the name.
    Asking for ``"cpp"`` without the extension raises ImportError with the fix."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown F0 kernel {kernel!r}; use one of {KERNELS}")
    if kernel == "auto":
        return "cpp" if cpp_available() else "numba"
    if kernel == "cpp" and not cpp_available():
        raise ImportError("the C++ F0 kernel (rtanon._core.F0Kernel) is not built: reinstall rtanon with "
                          "`pip install .` (needs a C++17 compiler and CMake) or, in a source tree, run "
                          "scripts/dev-build.sh; or use kernel='numba'")
    return kernel


def _make_kernel(config: F0Config, kernel: str):
    d = derive(config)
    if kernel == "cpp":
        from rtanon._core import F0Kernel

        return F0Kernel(d.iparams, d.fparams, d.sos, d.hann4, d.kaiser4)
    from rtanon.f0.numba_kernel import NumbaF0Kernel

    return NumbaF0Kernel(d)


class F0Tracker:
    """Streaming F0 stage for one session (see the module docstring).

    ``process(chunk)``: ``hop`` float32 samples at 16 kHz in [-1, 1] ->
    ``hop // 160`` float64 F0 values in Hz (0 = unvoiced), delayed by
    ``latency_samples``. ``reset()`` forgets the stream (filters, buffers,
    running statistics, decoder) and keeps the configuration and kernel.
    """

    def __init__(self, config: F0Config | None = None, hop: int = HOP_SAMPLES, kernel: str = "auto") -> None:
        self.config = config or F0Config()
        self.config.validate()
        if hop <= 0 or hop % HOP_SAMPLES:
            raise ValueError(f"F0Tracker hop must be a positive multiple of {HOP_SAMPLES} samples (10 ms), "
                             f"got {hop}")
        self._hop = hop
        self.kernel = resolve_kernel(kernel)
        self._k = _make_kernel(self.config, self.kernel)
        self._out = np.zeros(hop // HOP_SAMPLES)

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        """Lookahead: frame k's value is returned by the chunk that ends at
        sample ``160 * k + latency_samples``."""
        return self.config.latency_samples

    @property
    def latency_frames(self) -> int:
        return self.config.latency_samples // HOP_SAMPLES

    def reset(self) -> None:
        self._k.reset()

    def process(self, chunk: np.ndarray) -> np.ndarray:
        check_chunk(chunk, self._hop, "F0Tracker")
        self._k.process_into(chunk, self._out)
        return self._out.copy()


def track(signal: np.ndarray, config: F0Config | None = None, kernel: str = "auto") -> np.ndarray:
    """F0 of a whole signal: 1-D float32 (any float dtype is converted) at
    16 kHz -> float64 array of ``ceil(len / 160)`` values in Hz, 0 = unvoiced,
    frame k centred at ``k * 10 ms``. Same kernel and result as the stream."""
    config = config or F0Config()
    config.validate()
    x = np.asarray(signal)
    if x.ndim != 1:
        raise ValueError(f"track expects a 1-D 16 kHz signal, got shape {x.shape}")
    n_frames = -(-x.shape[0] // HOP_SAMPLES)
    lat = config.latency_samples // HOP_SAMPLES
    padded = np.zeros((n_frames + lat) * HOP_SAMPLES, np.float32)
    padded[: x.shape[0]] = x
    k = _make_kernel(config, resolve_kernel(kernel))
    out = np.zeros(n_frames + lat)
    k.process_into(padded, out)
    return out[lat:]


def frame_times_s(n_frames: int) -> np.ndarray:
    """Centre times (s) of frames 0..n_frames-1: ``k * 0.01``."""
    return np.arange(n_frames) / HOP_RATE_HZ  # frame k centred at k / 100 s
