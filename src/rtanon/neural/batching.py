"""Several sessions' vocoder steps as one batched backend call.

Offline work (a corpus worker) runs the utterances of a batch in one thread
each; every session's :class:`rtanon.neural.backends.VocoderStream` steps
through one :class:`BatchedVocoder`. A step waits until every thread still
running has handed in its own, then the thread that completed the set runs
them as one call of the real backend, ``(B, L, ...)`` with one row per
session (calls with different frame counts ``L`` run as separate calls), and
each thread gets its rows of the audio and state back. The backends are
batch-invariant (each row is computed as if alone), so the audio is the same
as one session at a time; what changes is the number of backend calls, which
is what a GPU (or a CPU's wider matrix products) makes cheaper.

A step that fails a batched call is retried alone, so only its own session
sees the error (and fails closed). A thread that ends, normally or not, must call :meth:`BatchedVocoder.leave`
so the others stop waiting for it.
"""

from __future__ import annotations

import threading

import numpy as np


def _cat(parts: list):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=0)
    import torch  # GPU backends keep their state as torch tensors

    return torch.cat(parts, dim=0)


def step_rows(backend, rows) -> list:
    """Rows of ``backend.step`` arguments ``(units, f0_hz, speaker, noise, state)``, one or more sessions
    each, with one frame count -> their ``(audio, state)``, from one call of ``backend.step``: the
    sessions' inputs and states concatenated on the batch axis, the results split back."""
    if len(rows) == 1:
        return [backend.step(*rows[0])]
    ins = [_cat([r[i] for r in rows]) for i in range(4)]
    state = [_cat([r[4][j] for r in rows]) for j in range(len(rows[0][4]))]
    audio, new = backend.step(*ins, state)
    out, row = [], 0
    for r in rows:
        b = r[0].shape[0]
        out.append((audio[row:row + b], type(new)(x[row:row + b] for x in new)))
        row += b
    return out


class StepRunner:
    """The :class:`rtanon.batch.Runner` of one vocoder backend (``run_batch`` = :func:`step_rows`)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        #: ONNX Runtime on the CPU releases the GIL: a server's workers run parts of the batch at once
        self.splits = backend.name == "onnxruntime" and getattr(backend, "device", "cpu") == "cpu"

    def __eq__(self, other) -> bool:  # every stream's runner of one backend batches with the others
        return isinstance(other, StepRunner) and other.backend is self.backend

    def __hash__(self) -> int:
        return id(self.backend)

    def run_batch(self, rows) -> list:
        return step_rows(self.backend, rows)


class _Step:
    __slots__ = ("args", "result", "error", "done")

    def __init__(self, args: tuple) -> None:
        self.args, self.result, self.error, self.done = args, None, None, False


class BatchedVocoder:
    """A VocoderBackend for ``members`` threads: their ``step`` calls are gathered and run batched."""

    def __init__(self, backend, members: int) -> None:
        self.backend = backend
        self.name = backend.name
        self.device = getattr(backend, "device", "cpu")
        self._cv = threading.Condition()
        self._members = members
        self._pending: list[_Step] = []
        #: backend calls made, and session steps they carried (rows / calls = the mean batch)
        self.calls = 0
        self.rows = 0

    def init_state(self, batch: int):
        return self.backend.init_state(batch)

    def leave(self) -> None:
        """This thread makes no more steps."""
        with self._cv:
            self._members -= 1
            if self._pending and len(self._pending) >= self._members:
                self._flush()

    def step(self, units, f0_hz, speaker, noise, state):
        mine = _Step((units, f0_hz, speaker, noise, state))
        with self._cv:
            self._pending.append(mine)
            if len(self._pending) >= self._members:
                self._flush()
            while not mine.done:
                self._cv.wait()
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _flush(self) -> None:
        """Runs every pending step (the lock is held), grouped by frame count; wakes their threads."""
        pending, self._pending = self._pending, []
        groups: dict[int, list[_Step]] = {}
        for s in pending:
            groups.setdefault(s.args[0].shape[1], []).append(s)
        for group in groups.values():
            try:
                self._run(group)
            except Exception:  # one session's step failed the call: run each alone, so only that one fails
                for s in group:
                    try:
                        self._run([s])
                    except Exception as exc:
                        s.error = exc
            for s in group:
                s.done = True
        self._cv.notify_all()

    def _run(self, group: list[_Step]) -> None:
        results = step_rows(self.backend, [s.args for s in group])
        self.calls += 1
        self.rows += len(group)
        for s, result in zip(group, results):
            s.result = result
