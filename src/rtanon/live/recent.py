"""``RecentValues``: the last values one thread records (the worker, a callback) for another to
summarise (the status line), in a fixed array."""

from __future__ import annotations

import numpy as np


class RecentValues:
    """The last ``size`` values a thread records (the worker, a callback), for another thread to summarise
    (the status line); a fixed array, so recording never allocates."""

    def __init__(self, size: int = 512) -> None:
        self._values = np.zeros(size, np.float64)
        self._n = 0

    def add(self, value: float) -> None:
        self._values[self._n % self._values.shape[0]] = value
        self._n += 1

    @property
    def count(self) -> int:
        """How many values were recorded so far (a mark for ``percentile(since=...)``)."""
        return self._n

    def percentile(self, q: float, since: int | None = None) -> float | None:
        """The ``q``-th percentile of what was recorded lately (with ``since``: after ``count`` was that,
        as far as the array reaches back); None when nothing was."""
        size, n = self._values.shape[0], self._n
        k = min(n, size) if since is None else min(n - since, size)
        if k <= 0:
            return None
        idx = np.arange(n - k, n) % size
        return float(np.percentile(self._values[idx], q))
