"""The stage contract shared by every streaming stage."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Stage(Protocol):
    """A streaming stage. See :mod:`rtanon.stages` for the contract."""

    @property
    def hop(self) -> int: ...

    @property
    def latency_samples(self) -> int: ...

    def process(self, chunk: np.ndarray) -> Any: ...

    def reset(self) -> None: ...


def check_chunk(chunk: np.ndarray, hop: int, who: str) -> None:
    """Raises ValueError unless ``chunk`` is 1-D float32 with ``hop`` samples."""
    if not isinstance(chunk, np.ndarray) or chunk.dtype != np.float32 or chunk.ndim != 1:
        got = f"{type(chunk).__name__} {getattr(chunk, 'dtype', '')} {getattr(chunk, 'shape', '')}"
        raise ValueError(f"{who}: expected a 1-D float32 array of {hop} samples at 16 kHz, got {got}")
    if chunk.shape[0] != hop:
        raise ValueError(f"{who}: expected {hop} samples per chunk, got {chunk.shape[0]}; "
                         f"open the session with the chunk_ms that matches your buffer size")
