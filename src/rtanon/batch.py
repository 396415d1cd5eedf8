"""One session's code, run alone or batched with other sessions' over shared models.

A stage whose chunk of work calls a shared model (the content encoder, the vocoder, the
pass-through guard's correlation) writes that work once, as a generator ``steps(...)``: where
it needs the model it yields a :class:`Call` (the model's :class:`Runner`, a batching key and
this session's row of inputs) and receives the row's result; its return value is the chunk's
result. Two drivers run such generators:

- :func:`run_alone` answers every call at once as a batch of one: what ``process(chunk)`` does,
  so a session alone runs exactly the code it runs in a batch;
- :func:`run_batched` advances many sessions' generators in lockstep (sherpa-onnx's
  ``decode_streams``): each round it gathers the calls every generator is waiting on, runs one
  batched call per (runner, key), and scatters the rows back. A batched call that fails is retried
  row by row, and the row that still fails is raised inside its own generator only (where the
  session's fail-closed handler turns it into comfort noise); the other sessions never see it.

A :class:`Runner` turns a list of rows into a list of results (``run_batch``); its rows must
be row-independent (each result as if computed alone), which every runner here checks in its
tests against :func:`run_alone`.

On a CPU one batched call uses one core: a graph's operators are too small at these batch sizes
for ONNX Runtime's own threads to pay (measured: slower). A runner whose work releases the GIL
(ONNX Runtime on the CPU, the nogil Numba kernels) says so with ``splits = True``; given
:class:`Workers`, :func:`run_batched` cuts its rows into one contiguous part per worker thread and
runs the parts at once. Rows being independent, the results are the same; the sessions' Python
stays on the calling thread.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generator, Protocol, Sequence


class Runner(Protocol):
    #: optional: ``run_batch`` releases the GIL for its work and may run on several threads at once
    splits: bool

    def run_batch(self, rows: Sequence[tuple]) -> list:
        """Results of ``len(rows)`` independent rows of inputs, in order."""
        ...


class Workers:
    """``threads`` threads that run the parts of a splitting runner's batched call at once (a server's
    scheduler owns one; ``threads=1`` runs every call on the caller's thread). :meth:`close` ends them."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads={threads}: use 1 or more")
        self.threads = threads
        self._pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="rtanon-batch")
                      if threads > 1 else None)

    def map(self, fn, parts: list) -> list:
        """``[fn(p) for p in parts]``, the first part on this thread and the others on the pool."""
        if self._pool is None or len(parts) == 1:
            return [fn(p) for p in parts]
        futures = [self._pool.submit(fn, p) for p in parts[1:]]
        first = fn(parts[0])
        return [first, *(f.result() for f in futures)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Call:
    """A request for one row of a shared model's work: ``runner.run_batch([args])[0]``.
    Calls with the same runner and ``key`` (e.g. a frame count) can share a batched call."""

    __slots__ = ("runner", "key", "args")

    def __init__(self, runner: Runner, key: Any, args: tuple) -> None:
        self.runner, self.key, self.args = runner, key, args


Steps = Generator[Call, Any, Any]


def run_alone(gen: Steps):
    """Drives ``gen`` to its end, answering each call alone; returns its value (its exceptions pass)."""
    try:
        call = next(gen)
        while True:
            try:
                result = call.runner.run_batch([call.args])[0]
            except Exception as exc:  # raised where the generator asked, as a direct call would
                call = gen.throw(exc)
            else:
                call = gen.send(result)
    except StopIteration as stop:
        return stop.value


class Failed:
    """What :func:`run_batched` returns for a generator that raised instead of returning."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def run_batched(gens: Sequence[Steps], stats: dict | None = None, workers: Workers | None = None) -> list:
    """Drives every generator to its end with batched calls; returns their values in order (a
    :class:`Failed` for one that raised). ``stats`` (optional) counts ``calls`` made and ``rows``
    carried, by the runner's type name. ``workers``: a splitting runner's rows run as one call per
    worker thread (see the module docstring)."""
    results: list = [None] * len(gens)
    waiting: list[tuple[int, Call]] = []

    def advance(i: int, send=None, error: BaseException | None = None, first: bool = False) -> None:
        try:
            if first:
                call = next(gens[i])
            elif error is not None:
                call = gens[i].throw(error)
            else:
                call = gens[i].send(send)
        except StopIteration as stop:
            results[i] = stop.value
        except Exception as exc:  # pragma: no cover - sessions catch their own; kept so one cannot stop all
            results[i] = Failed(exc)
        else:
            waiting.append((i, call))

    for i in range(len(gens)):
        advance(i, first=True)
    while waiting:
        rounds, waiting[:] = list(waiting), []
        groups: dict[tuple[Runner, Any], list[tuple[int, Call]]] = {}
        for i, call in rounds:  # runners that compare equal share a call (every stream's of one model)
            groups.setdefault((call.runner, call.key), []).append((i, call))
        for group in groups.values():
            runner = group[0][1].runner
            answers = _run_split(runner, [call.args for _, call in group], stats, workers)
            for (i, _), (ok, value) in zip(group, answers):
                advance(i, send=value) if ok else advance(i, error=value)
    return results


def _run_split(runner: Runner, rows: list[tuple], stats: dict | None,
               workers: Workers | None) -> list[tuple[bool, Any]]:
    """``_run_group`` over the rows, in one part per worker where the runner splits; counts the calls."""
    n = min(workers.threads, len(rows)) if workers is not None and getattr(runner, "splits", False) else 1
    size = -(-len(rows) // n)
    done = workers.map(lambda part: _run_group(runner, part), [rows[i:i + size] for i in range(0, len(rows), size)]) \
        if n > 1 else [_run_group(runner, rows)]
    answers = []
    for part, sizes in done:
        answers += part
        if stats is not None:
            entry = stats.setdefault(type(runner).__name__, {"calls": 0, "rows": 0})
            entry["calls"] += len(sizes)
            entry["rows"] += sum(sizes)
    return answers


def _run_group(runner: Runner, rows: list[tuple]) -> tuple[list[tuple[bool, Any]], list[int]]:
    """Each row's ``(ok, result or error)``, and the sizes of the calls that succeeded."""
    try:
        values = runner.run_batch(rows)
    except Exception as exc:
        if len(rows) == 1:
            return [(False, exc)], []
    else:
        return [(True, v) for v in values], [len(rows)]
    answers, sizes = [], []
    for row in rows:  # one row failed the batch: each alone, so only that one fails
        try:
            answers.append((True, runner.run_batch([row])[0]))
            sizes.append(1)
        except Exception as exc:
            answers.append((False, exc))
    return answers, sizes
