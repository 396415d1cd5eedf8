"""Content-encoder configuration and constants (numpy only, no torch).

Rates: 16 kHz audio in; log-mel at 100 Hz (10 ms hop, 25 ms window); soft
units out at 50 Hz (one frame per 320 samples).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WIN_SAMPLES = 400  # 25 ms analysis window
N_FFT = 512


@dataclass
class ContentModelConfig:
    """Network sizes. ``validate()`` says how to fix a bad value."""

    n_mels: int = 80
    channels: int = 256
    dilations: tuple[int, ...] = (1, 2, 4, 8)  # residual causal convs at 50 Hz, kernel 3
    gru_units: int = 0  # optional 1-layer GRU after the convolutions (0 = none)
    unit_dim: int = 256  # D, dimension of the soft-unit projection z
    n_units: int = 128  # K, discrete units (k-means on the teacher)
    temperature: float = 0.1  # tau in paper 002 Eq. 1
    # L: the network's output at frame t + L is frame t's (trained on frame t's targets), so each frame
    # also hears the L frames after it. The network stays causal; L * 20 ms is the lookahead it costs.
    lookahead_frames: int = 0
    # W > 1: causal cepstral-style mean normalisation inside the graph: every normalised log-mel frame minus
    # the mean of the last W frames (10 ms each; frames before the stream began count as 0, the training
    # mean), so a speaker's or channel's average spectrum is taken out after about W frames. 0 = off.
    cmn_frames: int = 0

    def validate(self) -> None:
        if not 20 <= self.n_mels <= 128:
            raise ValueError(f"n_mels={self.n_mels}: use 20..128 (80 is the default)")
        for name in ("channels", "unit_dim", "n_units"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 2")
        if self.gru_units < 0:
            raise ValueError(f"gru_units={self.gru_units}: use 0 (no GRU) or the GRU width")
        if any(int(d) < 1 for d in self.dilations):
            raise ValueError(f"dilations={self.dilations}: every dilation must be >= 1")
        if not 0 <= self.lookahead_frames <= 2:
            raise ValueError(f"lookahead_frames={self.lookahead_frames}: use 0, 1 or 2 (20 ms each)")
        if self.cmn_frames != 0 and not 2 <= self.cmn_frames <= 1000:
            raise ValueError(f"cmn_frames={self.cmn_frames}: use 0 (off) or 2..1000 frames of 10 ms")
        if not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"temperature={self.temperature}: use a value in (0, 10]; paper 002 uses 0.1")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dilations"] = list(self.dilations)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ContentModelConfig":
        d = dict(d)
        d["dilations"] = tuple(d.get("dilations", ()))
        return cls(**d)
