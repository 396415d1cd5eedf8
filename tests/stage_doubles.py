"""Stage doubles shared by the tests (not collected: no ``test_`` prefix)."""

from __future__ import annotations

import time


class SlowStage:
    """Wraps a stage and takes ``delay_s`` per chunk, so the worker falls behind real time."""

    def __init__(self, inner, delay_s):
        self.inner, self.delay_s = inner, delay_s
        self.hop, self.latency_samples = inner.hop, inner.latency_samples

    def process(self, chunk):
        time.sleep(self.delay_s)
        return self.inner.process(chunk)

    def reset(self):
        self.inner.reset()
