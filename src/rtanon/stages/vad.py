"""Voice activity detection with hangover (webrtcvad)."""

from __future__ import annotations

import numpy as np

from rtanon.config import VadConfig
from rtanon.constants import HOP_SAMPLES, SAMPLE_RATE_HZ
from rtanon.stages.base import check_chunk

_FLOOR_START_DBFS = -50.0  # noise-floor estimate before any audio
_FLOOR_MIN_DBFS = -80.0  # digital silence does not drag the floor lower


class VadStage:
    """Decides per chunk whether the gate is open (speech) or closed.

    ``process(chunk)`` takes ``hop`` samples of 16 kHz mono float32 in [-1, 1]
    and returns ``True`` when any 10 ms frame in it is speech, or when speech
    was seen less than ``hangover_ms`` ago. It never passes audio through: the
    engine plays comfort noise for closed chunks.

    A frame is speech when webrtcvad says so, or when its energy stands
    ``energy_margin_db`` above a tracked noise floor (and above
    ``energy_min_dbfs``): webrtcvad alone misses loud word onsets after
    background noise for up to half a second, which cut first words.
    """

    def __init__(self, config: VadConfig, hop: int) -> None:
        import webrtcvad  # from the webrtcvad-wheels distribution

        if hop % HOP_SAMPLES:
            raise ValueError(f"VAD hop must be a multiple of {HOP_SAMPLES} samples (10 ms), got {hop}")
        self._make_vad = lambda: webrtcvad.Vad(config.aggressiveness)
        self._vad = self._make_vad()
        self._hop = hop
        self._hangover_frames = config.hangover_ms * SAMPLE_RATE_HZ // 1000 // HOP_SAMPLES
        self._margin_db = config.energy_margin_db
        self._min_dbfs = config.energy_min_dbfs
        self.reset()

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        return 0

    def process(self, chunk: np.ndarray) -> bool:
        check_chunk(chunk, self._hop, "VadStage")
        pcm = (np.clip(chunk, -1.0, 1.0) * 32767.0).astype("<i2")
        energy_db = 10.0 * np.log10(np.mean(np.square(chunk.reshape(-1, HOP_SAMPLES), dtype=np.float64),
                                             axis=1) + 1e-12)
        for frame, e_db in zip(pcm.reshape(-1, HOP_SAMPLES), energy_db):
            # noise floor: follows drops at once, rises 0.05 dB per frame (5 dB/s)
            self._floor_db = max(min(e_db, self._floor_db + 0.05), _FLOOR_MIN_DBFS)
            loud = e_db > max(self._floor_db + self._margin_db, self._min_dbfs)
            if loud or self._vad.is_speech(frame.tobytes(), SAMPLE_RATE_HZ):
                self._frames_since_speech = 0
            else:
                self._frames_since_speech += 1
        return self._frames_since_speech <= self._hangover_frames

    def reset(self) -> None:
        self._vad = self._make_vad()  # webrtcvad adapts its noise estimate: start afresh
        self._frames_since_speech = self._hangover_frames + 1
        self._floor_db = _FLOOR_START_DBFS
