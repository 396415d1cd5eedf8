"""Rates shared by the vocoder, its features and its training data (no torch import)."""

from __future__ import annotations

from rtanon.config import SAMPLE_RATE_HZ

#: Conditioning frame rate (content units) and F0 rate.
FRAME_RATE_HZ = 50
F0_RATE_HZ = 100
#: Audio samples per 50 Hz frame and per 100 Hz F0 frame at 16 kHz.
HOP_SAMPLES = SAMPLE_RATE_HZ // FRAME_RATE_HZ
F0_HOP_SAMPLES = SAMPLE_RATE_HZ // F0_RATE_HZ
