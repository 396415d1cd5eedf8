"""The rates every part of rtanon shares, in one place (no imports).

Audio is 16 kHz mono float32 in [-1, 1]. Two clocks run on it:

- the 10 ms **hop** (100 Hz): F0 frames, log-mel frames, VAD frames;
- the 20 ms **frame** (50 Hz): content units and the vocoder's conditioning frames.
"""

#: Sample rate of every stage, model and feature.
SAMPLE_RATE_HZ = 16_000
#: The 10 ms hop: F0, log-mel and VAD frames.
HOP_RATE_HZ = 100
HOP_SAMPLES = SAMPLE_RATE_HZ // HOP_RATE_HZ  # 160
#: The 20 ms frame: content units and vocoder conditioning.
FRAME_RATE_HZ = 50
FRAME_SAMPLES = SAMPLE_RATE_HZ // FRAME_RATE_HZ  # 320
