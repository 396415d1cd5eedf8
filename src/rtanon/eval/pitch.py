"""F0 tracks for the intonation-preservation metric rho_F0.

``F0Tracker().track(signal)``: 16 kHz mono float32 (T,) -> (frames,) float64
F0 in Hz every 10 ms, 0 where unvoiced. By default it is the reference
tracker, pyworld's DIO refined by StoneMask (``pyworld-prebuilt``): an
independent judge of the intonation the methods keep, since the neural method
runs rtanon's own tracker inside. ``prefer_rtanon=True`` uses rtanon's
offline tracker (``rtanon.f0.tracker.track``) when it is importable and
behaves. ``name`` says which one ran, so a report always states its tracker.
"""

from __future__ import annotations

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ

FRAME_MS = 10
#: Search range of the reference tracker: children's voices reach 600 Hz.
F0_FLOOR_HZ = 60.0
F0_CEIL_HZ = 700.0


class F0Tracker:
    """The reference tracker; ``prefer_rtanon=True``: rtanon's own when it is importable and behaves."""

    def __init__(self, *, prefer_rtanon: bool = False) -> None:
        self._rtanon_track = None
        self.note = ""
        if prefer_rtanon:
            try:
                from rtanon.f0.tracker import track
                self._rtanon_track = track
                self._probe()
            except ImportError:
                self._rtanon_track = None
            except Exception as exc:  # present but not the expected contract: say so, use the reference
                self._rtanon_track = None
                self.note = f"rtanon.f0.tracker.track not used ({type(exc).__name__}: {exc})"
        if self._rtanon_track is None:
            try:
                import pyworld  # noqa: F401
            except ImportError:
                from rtanon.errors import install_hint

                raise ImportError("rho_F0 needs an F0 tracker: pyworld-prebuilt, of the [eval] extra: "
                                  f"{install_hint('eval')}") from None
        self.name = "rtanon.f0.tracker.track" if self._rtanon_track else "pyworld dio+stonemask (reference)"
        if self.note:
            self.name += f"; {self.note}"

    def _probe(self) -> None:
        """Checks rtanon's tracker on a 150 Hz tone: one value per 10 ms, about 150 Hz."""
        t = np.arange(SAMPLE_RATE_HZ // 2) / SAMPLE_RATE_HZ
        f0 = self.track((0.3 * np.sin(2 * np.pi * 150.0 * t)).astype(np.float32))
        if f0.ndim != 1 or abs(f0.size - 50) > 3:
            raise ValueError(f"expected one F0 value per 10 ms (about 50 for 0.5 s), got shape {f0.shape}")
        voiced = f0[f0 > 0]
        if voiced.size < 10 or abs(np.median(voiced) - 150.0) > 15.0:
            raise ValueError("a 150 Hz tone did not come out near 150 Hz")

    def track(self, signal: np.ndarray) -> np.ndarray:
        """(T,) float32 at 16 kHz -> (frames,) float64 Hz every 10 ms, 0 = unvoiced."""
        if self._rtanon_track is not None:
            return np.asarray(self._rtanon_track(np.asarray(signal, dtype=np.float32)), dtype=np.float64)
        import pyworld

        x = np.asarray(signal, dtype=np.float64)
        f0, t = pyworld.dio(x, SAMPLE_RATE_HZ, f0_floor=F0_FLOOR_HZ, f0_ceil=F0_CEIL_HZ, frame_period=FRAME_MS)
        return pyworld.stonemask(x, f0, t, SAMPLE_RATE_HZ)
