"""Fault injection for ``rtanon soak``: ``rtanon live --fault-injection`` places a ``FaultInjector`` last
in the session; SIGUSR1 starts a stage exception storm, SIGUSR2 ends it."""

from __future__ import annotations

import numpy as np

from rtanon.engine import Session


class FaultInjector:
    """A stage placed last in a session by ``rtanon live --fault-injection``
    (used by ``rtanon soak``): while ``active`` every chunk raises, as a stage
    exception storm would; otherwise it hands the chunk on unchanged (the
    method's stages after it transform it). SIGUSR1 starts a storm, SIGUSR2
    ends it."""

    latency_samples = 0

    def __init__(self, hop: int) -> None:
        self.hop = hop
        self.active = False

    def process(self, chunk: np.ndarray) -> np.ndarray:
        if self.active:
            raise RuntimeError("injected fault (rtanon soak: stage exception storm)")
        return chunk

    def reset(self) -> None:
        pass


def install_fault_injection(session: Session) -> FaultInjector:
    import signal

    injector = FaultInjector(session.chunk_samples)
    session.stages.append(injector)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(injector, "active", True))
    signal.signal(signal.SIGUSR2, lambda *_: setattr(injector, "active", False))
    return injector
