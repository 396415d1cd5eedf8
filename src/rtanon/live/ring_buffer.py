"""The live loop's ring buffer: ``rtanon._core.RingBuffer`` (lock-free, C++) when the extension is built,
else ``PyRingBuffer``, the same contract in numpy behind a lock (an install without a C++ compiler).

Contract (``src/rtanon/_core.pyi``): float32 samples, one producer and one consumer thread; ``write``
takes what fits and returns how many, ``read(n)`` / ``read_into(out)`` return at most what is readable,
``discard(n)`` drops the oldest, ``clear()`` empties it.
"""

from __future__ import annotations

import threading

import numpy as np


class PyRingBuffer:
    """``rtanon._core.RingBuffer`` in Python: a preallocated float32 array, a read and a write count."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._buf = np.zeros(int(capacity), np.float32)
        self._read = self._written = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._buf.shape[0]

    @property
    def readable(self) -> int:
        return self._written - self._read

    @property
    def writable(self) -> int:
        return self.capacity - self.readable

    @staticmethod
    def _check(samples: np.ndarray) -> None:
        if not isinstance(samples, np.ndarray) or samples.dtype != np.float32:
            raise TypeError("RingBuffer takes float32 numpy arrays")
        if samples.ndim != 1:
            raise ValueError(f"RingBuffer takes 1-D arrays, got shape {samples.shape}")

    def _copy(self, start: int, n: int, into: np.ndarray | None, src: np.ndarray | None) -> None:
        cap = self.capacity
        i = start % cap
        first = min(n, cap - i)
        if src is not None:
            self._buf[i : i + first] = src[:first]
            self._buf[: n - first] = src[first:n]
        else:
            into[:first] = self._buf[i : i + first]
            into[first:n] = self._buf[: n - first]

    def write(self, samples: np.ndarray) -> int:
        self._check(samples)
        with self._lock:
            n = min(samples.shape[0], self.writable)
            self._copy(self._written, n, None, samples)
            self._written += n
        return n

    def read_into(self, out: np.ndarray) -> int:
        self._check(out)
        with self._lock:
            n = min(out.shape[0], self.readable)
            self._copy(self._read, n, out, None)
            self._read += n
        return n

    def read(self, n: int) -> np.ndarray:
        out = np.empty(max(0, min(int(n), self.readable)), np.float32)
        got = self.read_into(out)
        return out[:got]

    def discard(self, n: int) -> int:
        with self._lock:
            k = max(0, min(int(n), self.readable))
            self._read += k
        return k

    def clear(self) -> None:
        with self._lock:
            self._read = self._written


try:
    from rtanon._core import RingBuffer
except ImportError:  # installed without a C++ compiler
    RingBuffer = PyRingBuffer
