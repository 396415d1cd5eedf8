"""The streaming engine: a shared ``Anonymizer`` and per-session ``Session``.

``Anonymizer(config)`` is immutable and shared (method, models,
configuration); ``anonymizer.open_session(seed=None)`` returns a ``Session``
holding every piece of state (stage buffers, VAD, counters) and a fresh
pseudo-voice drawn from the OS random source unless a seed pins it.

``Session.process(chunk)`` takes one chunk of 16 kHz mono float32 and returns
one chunk of anonymized audio, ``algorithmic_latency_samples`` later: the
method's stages, then a per-session random all-pass filter (so the output
waveform does not match the input even where a method keeps its excitation). It fails
closed: non-speech, a stage exception, a non-finite stage output, or a method
output that repeats its input (``PassThroughGuard``: the input buffer itself,
or a copy, scaled or delayed by up to twice the declared latency plus a chunk) all give comfort noise
(or silence), never the input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from rtanon.batch import Call, Steps, run_alone
from rtanon.config import AnonymizerConfig
from rtanon.methods import METHODS, Method
from rtanon.paths import printable
from rtanon.stages import Stage, check_chunk
from rtanon.stages.vad import VadStage


@dataclass
class Counters:
    """Per-session event counters, shown in the live status line."""

    chunks: int = 0
    speech_chunks: int = 0
    rendered_chunks: int = 0  # speech chunks whose method output was not silence: real anonymized audio
    stage_errors: int = 0
    nonfinite_inputs: int = 0
    missed_deadlines: int = 0  # output needed before the worker had it (live)
    input_overflows: int = 0  # device-reported (live)
    output_underflows: int = 0  # device-reported (live)
    last_error: str = ""

    @property
    def nothing_rendered(self) -> bool:
        """Stages failed and no chunk carried anonymized speech: the output is comfort noise only, so it is
        a failed run, not an anonymization (a broken identity fails some chunks and silences the rest)."""
        return self.stage_errors > 0 and self.rendered_chunks == 0


@dataclass
class StageTimes:
    """Per-chunk compute times in ns, by stage name (filled when profiling)."""

    by_stage: dict[str, list[int]] = field(default_factory=dict)
    total: list[int] = field(default_factory=list)

    def add(self, name: str, ns: int) -> None:
        self.by_stage.setdefault(name, []).append(ns)


#: A method's output chunk whose normalised correlation with the input (at any lag up to twice the
#: method's declared delay plus a chunk) reaches this is treated as a pass-through fault: comfort noise
#: instead. Over every lag, McAdams (default alpha) gave no fault on all 320 so762_dev utterances.
#: A copy or a scaled copy of the input scores 1 (to float32 precision). Real output stays below it:
#: at lag 0 and the delay, over all 320 so762_dev utterances (124,812 checks), McAdams with its default
#: alpha 0.75-0.9 reached 0.9981, with alpha 0.95 (the mildest allowed; 80 utterances) 0.9989, and the
#: neural method 0.963 (80 utterances): McAdams near alpha 1 keeps the waveform on some chunks, which is
#: why an all-pass follows it.
PASSTHROUGH_CORRELATION = 0.9995
_MIN_GUARD_RMS = 1e-4  # below this (-80 dBFS) a chunk carries no voice to leak


class PassThroughGuard:
    """Compares a method's output chunk with the input it came from, by content: the same
    buffer, or a normalised correlation of at least ``PASSTHROUGH_CORRELATION`` with the
    input at any lag from 0 to ``2 * delay + hop`` samples (a stage that hands its input on,
    copied, scaled, or delayed by its declared latency or by another amount it did not
    declare). The correlations at every lag come from one FFT of the input history, with
    the history's norms from a running sum of squares. ``push`` each input chunk first."""

    def __init__(self, hop: int, delay: int) -> None:
        self.hop, self.delay = hop, delay
        self.max_lag = 2 * delay + hop
        self._hist = np.zeros(self.max_lag + hop, np.float32)

    def reset(self) -> None:
        self._hist[:] = 0.0

    def push(self, x: np.ndarray) -> None:
        n = self.hop
        self._hist[:-n] = self._hist[n:]
        self._hist[-n:] = x

    def fault(self, y: np.ndarray, x: np.ndarray) -> str | None:
        """Why ``y`` (the method's output for input chunk ``x``) is a pass-through, or None."""
        return run_alone(self.fault_steps(y, x))

    def fault_steps(self, y: np.ndarray, x: np.ndarray) -> Steps:
        """``fault`` with the correlation yielded (:mod:`rtanon.batch`: one FFT call for many sessions)."""
        if np.shares_memory(y, x):
            return "a stage returned its input buffer"
        ny = float(np.sqrt(np.dot(y, y)))
        floor = _MIN_GUARD_RMS * np.sqrt(self.hop)
        if ny <= floor:
            return None
        lag, corr = yield Call(_CORRELATION, (self._hist.shape[0], y.shape[0]), (self._hist, y, ny, floor))
        if corr >= PASSTHROUGH_CORRELATION:
            return f"the output repeats the input (correlation >= {PASSTHROUGH_CORRELATION} at lag {lag})"
        return None


class _Correlation:
    """The guard's correlations of output chunks with input histories, a batch at once: rows of
    ``(history (h,), y (n,), |y|, floor)`` with one h and n -> ``(lag, correlation)`` of each row's
    most correlated input window."""

    def run_batch(self, rows) -> list[tuple[int, float]]:
        import scipy.fft  # here, not at import: `rtanon --help` need not load it

        hist = np.stack([r[0] for r in rows])
        y = np.stack([r[1] for r in rows])
        ny = np.array([r[2] for r in rows])[:, None]
        floor = rows[0][3]
        h, n = hist.shape[1], y.shape[1]
        nfft = scipy.fft.next_fast_len(h + n - 1, real=True)  # 1280 for McAdams: 5x faster than numpy's 2048
        # dots[:, k] = <h[k:k + n], y>: the input window that ends `lag` = h - n - k samples before now
        spec = scipy.fft.rfft(hist, nfft, axis=1) * np.conj(scipy.fft.rfft(y, nfft, axis=1))  # float32
        dots = scipy.fft.irfft(spec, nfft, axis=1)[:, : h - n + 1]
        energy = np.concatenate((np.zeros((len(rows), 1)), np.cumsum(hist.astype(np.float64) ** 2, axis=1)), axis=1)
        norms = np.sqrt(np.maximum(energy[:, n:] - energy[:, :-n], 0.0))
        corr = np.abs(dots) / np.maximum(norms * ny, 1e-30)
        corr[norms <= floor] = 0.0
        k = np.argmax(corr, axis=1)
        return [(h - n - int(k[b]), float(corr[b, k[b]])) for b in range(len(rows))]


_CORRELATION = _Correlation()


class Anonymizer:
    """Shared, immutable part of rtanon: configuration and method models."""

    def __init__(self, config: AnonymizerConfig | None = None) -> None:
        config = config or AnonymizerConfig()
        config.validate()
        self.config = config
        self.method: Method = METHODS[config.method](config)
        self._warm = False

    @property
    def chunk_samples(self) -> int:
        return self.config.stream.chunk_samples

    def check_streams(self) -> None:
        """``ConfigError`` when this anonymizer cannot run a live stream: its content encoder reads whole
        utterances (``--content`` a whole-utterance graph), for files and corpora only."""
        from rtanon.config import ConfigError

        content = getattr(getattr(self.method, "model", None), "content", None)
        if getattr(content, "needs_whole_signal", False):
            which = self.config.neural.content_onnx or "of --context utterance"
            raise ConfigError(f"the content encoder {which} reads whole utterances: use it with `rtanon file`, "
                              "`anonymize-dir` or `eval`; a live stream needs a causal one (--context causal, "
                              "without --content: the packaged encoder)")

    def warm_up(self, chunks: int = 3) -> None:
        """Runs a throwaway session over a few chunks of faint noise: the models' first call (graph
        optimisation, JIT, allocations: 200 ms for the neural voice) then happens before a live stream
        opens, not as a 200 ms backlog in its first second. Once per anonymizer (every live start calls it)."""
        if self._warm:
            return
        self._warm = True
        session = self.open_session(seed=0)
        noise = np.random.default_rng(0).standard_normal((chunks, self.chunk_samples)).astype(np.float32)
        for chunk in 0.003 * noise:
            session.process(chunk)

    def open_session(self, seed: int | None = None, *, identity=None, unlike: "Session | None" = None,
                     profile: bool = False) -> "Session":
        """A new stream with its own pseudo-voice. ``seed=None`` draws the voice
        from the OS random source (the default: unlinkable across sessions);
        ``identity`` (a PseudoSpeaker, e.g. from ``rtanon identity new``) pins it;
        ``unlike`` (a session of the same method) makes the drawn voice clearly
        differ from that session's, as a user asking for a new voice expects."""
        return Session(self, np.random.default_rng(seed), identity=identity, unlike=unlike, profile=profile)


class Session:
    """One anonymized stream. Not thread-safe: one worker calls ``process``."""

    def __init__(self, anonymizer: Anonymizer, rng: np.random.Generator, *, identity=None,
                 unlike: "Session | None" = None, profile: bool = False) -> None:
        cfg = anonymizer.config
        self.anonymizer = anonymizer
        self.chunk_samples = cfg.stream.chunk_samples
        self._method = anonymizer.method
        self.vad = VadStage(cfg.vad, self.chunk_samples)
        self.identity = identity
        same_method = unlike is not None and unlike._method.name == anonymizer.method.name
        self.stages: list[Stage] = anonymizer.method.make_stages(
            rng, identity, unlike=unlike.stages[:unlike._method_stages] if same_method else None)
        self._method_stages = len(self.stages)  # checked by the guard; the all-pass after them is not
        self.guard = PassThroughGuard(self.chunk_samples, sum(s.latency_samples for s in self.stages))
        if cfg.allpass_sections:
            from rtanon.stages.allpass import AllPassStage

            self.stages.append(AllPassStage(self.chunk_samples, cfg.allpass_sections, rng))
        self.counters = Counters()
        self.times = StageTimes() if profile else None
        self._noise_rng = np.random.default_rng(rng.integers(2**63))
        level = cfg.vad.comfort_noise_dbfs
        self._noise_rms = 0.0 if level is None else float(10.0 ** (level / 20.0))
        self._gain = 0.0
        self._gated = None  # the chunk drop_if_pause found speech in
        self.last_speech = False  # the gate of the last chunk (a live UI shows it; voice changes wait for it)

    @property
    def algorithmic_latency_samples(self) -> int:
        """Buffering (one chunk) plus every stage's own delay."""
        return self.chunk_samples + self.stage_latency_samples

    @property
    def stage_latency_samples(self) -> int:
        return self.vad.latency_samples + sum(s.latency_samples for s in self.stages)

    @property
    def voice(self) -> dict:
        """Description of this session's pseudo-voice."""
        voice = self._method.describe_voice(self.stages)
        if self.identity is not None:
            voice["identity"] = {"strategy": printable(self.identity.strategy.get("name"), 40),
                                 "created_utc": printable(self.identity.created_utc, 40)}
        return voice

    def comfort_noise(self, n: int) -> np.ndarray:
        """``n`` samples of the session's comfort noise (float32, 16 kHz)."""
        if self._noise_rms == 0.0:
            return np.zeros(n, dtype=np.float32)
        return self._noise_rng.standard_normal(n, dtype=np.float32) * np.float32(self._noise_rms)

    def reset(self) -> None:
        """Forgets the audio history; keeps the pseudo-voice and counters."""
        self.vad.reset()
        self.guard.reset()
        for stage in self.stages:
            stage.reset()
        self._gain = 0.0

    def drop_if_pause(self, chunk: np.ndarray) -> bool:
        """Runs the gate on ``chunk`` (as ``process`` takes it); when the gate stays closed (the chunk would
        only give comfort noise) the chunk is consumed unrendered and True returned: what ``rtanon live``
        drops to catch up when compute falls behind, never a word. Otherwise ``process(chunk)`` must come
        next with this very chunk, and renders it without running the gate again."""
        check_chunk(chunk, self.chunk_samples, "Session.drop_if_pause")
        x = np.clip(np.nan_to_num(chunk, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
        if self.vad.process(x):
            self._gated = chunk
            return False
        self.last_speech = False
        self._gain = 0.0  # the next rendered chunk fades in from comfort noise
        return True

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """One chunk in (``chunk_samples`` float32 at 16 kHz, mono), one chunk of
        anonymized audio out (same shape, float32 in [-1, 1])."""
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``process`` with the shared models' calls yielded (:mod:`rtanon.batch`): what a server runs
        for many sessions at once, with every fail-closed rule of ``process``."""
        check_chunk(chunk, self.chunk_samples, "Session.process")
        t0 = time.perf_counter_ns()
        if not np.isfinite(chunk).all():
            self.counters.nonfinite_inputs += 1
            chunk = np.nan_to_num(chunk, nan=0.0, posinf=1.0, neginf=-1.0)
        x = np.clip(chunk, -1.0, 1.0)
        try:
            t1 = time.perf_counter_ns()
            gated, self._gated = self._gated, None
            speech = True if gated is chunk else self.vad.process(x)  # drop_if_pause ran the gate on it
            self._took("vad", t1)
            self.guard.push(x)
            y = x
            for i, stage in enumerate(self.stages):
                t1 = time.perf_counter_ns()
                y = (yield from stage.steps(y)) if hasattr(stage, "steps") else stage.process(y)
                self._took(type(stage).__name__, t1)
                if y.shape != x.shape or not np.isfinite(y).all():
                    raise FloatingPointError("stage output is not a finite chunk of the input's shape")
                if i == self._method_stages - 1:
                    t1 = time.perf_counter_ns()
                    why = yield from self.guard.fault_steps(y, x)
                    self._took("guard", t1)
                    if why:
                        raise FloatingPointError(why)
            if np.shares_memory(y, x) or np.shares_memory(y, chunk):
                raise FloatingPointError("a stage returned its input buffer")
        except Exception as exc:  # fail closed: anything wrong in a stage gives comfort noise
            self.counters.stage_errors += 1
            self.counters.last_error = f"{type(exc).__name__}: {exc}"
            self.reset()
            speech, y = False, np.zeros_like(x)
        self.counters.chunks += 1
        self.counters.speech_chunks += bool(speech)
        self.counters.rendered_chunks += bool(speech) and bool(np.any(y))
        self.last_speech = bool(speech)
        target = 1.0 if speech else 0.0
        if self._gain == target:  # steady: the voice, or comfort noise, alone
            mixed = y if speech else self.comfort_noise(self.chunk_samples)
        else:  # a ramp between the two over this chunk
            ramp = np.linspace(self._gain, target, self.chunk_samples, endpoint=False, dtype=np.float32)
            mixed = ramp * y + (1.0 - ramp) * self.comfort_noise(self.chunk_samples)
        self._gain = target
        out = np.clip(mixed, -1.0, 1.0).astype(np.float32, copy=False)  # clip makes a new array: never y itself
        if self.times is not None:
            self.times.total.append(time.perf_counter_ns() - t0)
        return out

    def _took(self, name: str, t0: int) -> None:
        if self.times is not None:
            self.times.add(name, time.perf_counter_ns() - t0)

    @property
    def needs_whole_signal(self) -> bool:
        """True when a stage reads the whole signal before its first chunk (a whole-utterance content
        encoder): ``process_signal``/``iter_process`` only, never a live stream (whose chunks alone give
        comfort noise)."""
        return any(getattr(stage, "needs_whole_signal", False) for stage in self.stages)

    def process_signal(self, signal: np.ndarray) -> np.ndarray:
        """Whole-signal helper (16 kHz mono float32): chunks it, compensates the
        stage delay, and returns exactly ``len(signal)`` samples, equal to what
        the live path would play ``stage_latency_samples`` later."""
        return np.concatenate(list(self.iter_process(iter([signal]))) or [np.zeros(0, np.float32)])

    def iter_process(self, blocks):
        """Streams any iterable of 16 kHz float32 blocks (any sizes) through the
        session; yields delay-compensated output blocks whose total length
        equals the total input length. Memory stays constant (but for a stage that
        ``needs_whole_signal``: the blocks are joined first)."""
        if self.needs_whole_signal:  # a whole-utterance content encoder reads the signal first
            signal = np.concatenate([np.asarray(b, np.float32) for b in blocks] or [np.zeros(0, np.float32)])
            clean = np.clip(np.nan_to_num(signal, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
            for stage in self.stages:
                if getattr(stage, "needs_whole_signal", False):
                    stage.prime(clean)
            blocks = [signal]
        n = self.chunk_samples
        skip = self.stage_latency_samples
        buf = np.zeros(0, dtype=np.float32)
        total_in = total_out = 0
        for block in blocks:
            block = np.asarray(block, dtype=np.float32)
            total_in += block.shape[0]
            buf = np.concatenate((buf, block))
            usable = buf.shape[0] // n * n
            if usable:
                out, skip, total_out = self._run(buf[:usable], skip, total_out, total_in)
                buf = buf[usable:]
                if out.size:
                    yield out
        # flush: pad the last partial chunk, then push zeros until the delayed tail is out
        tail_needed = total_in - total_out
        pad_chunks = -(-(buf.shape[0] + self.stage_latency_samples) // n)
        flush = np.concatenate((buf, np.zeros(pad_chunks * n - buf.shape[0], np.float32)))
        out, _, _ = self._run(flush, skip, total_out, total_in)
        yield out[:tail_needed]

    def _run(self, x: np.ndarray, skip: int, total_out: int, total_in: int):
        outs = [self.process(c) for c in x.reshape(-1, self.chunk_samples)]
        out = np.concatenate(outs)
        drop = min(skip, out.shape[0])
        out = out[drop:]
        out = out[: max(0, total_in - total_out)]
        return out, skip - drop, total_out + out.shape[0]
