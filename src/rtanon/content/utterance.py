"""Whole-utterance content for files and corpora (numpy + onnxruntime only).

A file or a corpus is read whole, so its content encoder need not be causal: every frame may hear the
entire utterance, as the VoicePrivacy systems read it. :class:`UtteranceContentModel` runs such an
encoder, Whisper's own (``rtanon lab export-whisper --utterance`` writes its graph, from the weights
``rtanon.train.whisper.UtteranceContent`` runs in training): :func:`encode_utterance` puts each utterance
alone in its window followed by :data:`PAD_SAMPLES` of silence (not Whisper's padding to 30 s, which costs
ten to fifteen times the compute for frames at cosine 0.96-0.98 to these), and cuts audio longer than a
window at pauses, each window reading a second more either side (:func:`plan_windows`).

The per-session part, :class:`UtteranceContentStage`, keeps the stage contract of
:class:`rtanon.content.stream.ContentEncoderStage` (the same frames completed by each chunk, with the same
lookahead, so the neural voice's delay and alignment are unchanged), but its frames come from the whole
signal given to :meth:`~UtteranceContentStage.prime` before the first chunk. Without it there is nothing
to read: ``steps`` raises, and the session plays comfort noise (the live path cannot use it).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from rtanon.batch import Steps, run_alone
from rtanon.constants import FRAME_SAMPLES, HOP_SAMPLES, SAMPLE_RATE_HZ
from rtanon.stages.base import check_chunk

#: silence after each utterance in its window
PAD_SAMPLES = SAMPLE_RATE_HZ
#: audio per window: Whisper's 1,500 positions (30 s at 50 Hz) less the silence after it
WINDOW_SAMPLES = 1500 * FRAME_SAMPLES - PAD_SAMPLES
#: ``kind`` in a graph's content metadata (``rtanon.content.stream.CONFIG_METADATA_KEY``)
KIND = "utterance"
#: the shipped graph (``--context utterance``) in ``rtanon/models/content/``: Whisper tiny.en's encoder as
#: ``rtanon lab export-whisper --utterance`` writes it, its weights float16 as in ``model.bin``
PACKAGED_ONNX = "whisper_tiny_en_utterance.onnx"


def packaged_ref():
    """The package resource of the shipped whole-utterance graph."""
    return resources.files("rtanon").joinpath("models", "content", PACKAGED_ONNX)


@contextmanager
def packaged_path() -> Iterator[Path]:
    from rtanon.config import ConfigError

    with resources.as_file(packaged_ref()) as p:
        if not p.exists():
            raise ConfigError(f"this rtanon has no whole-utterance content graph (models/content/{PACKAGED_ONNX} "
                                 "is missing): use --context causal, or write one with `rtanon lab export-whisper "
                                 "--utterance`")
        yield p


#: audio either side of a long signal's cut that its window also reads (context, not taken from it)
CONTEXT_SAMPLES = SAMPLE_RATE_HZ
#: how far before the latest possible cut the quietest place is looked for
SEARCH_SAMPLES = 5 * SAMPLE_RATE_HZ
#: the quietness measure: RMS over this many 20 ms frames
QUIET_FRAMES = 5


def plan_windows(audio: np.ndarray) -> list[tuple[int, int, int, int]]:
    """How :func:`encode_utterance` reads ``audio``: ``(start, end, read_start, read_end)`` per window, in
    samples on the 20 ms grid. The ``[start, end)`` cover the signal's whole frames once, in order; each is
    read with ``CONTEXT_SAMPLES`` more either side where the signal has them (``[read_start, read_end)`` at
    most ``WINDOW_SAMPLES``). A signal longer than a window is cut at the quietest ``QUIET_FRAMES`` frames
    (a pause, where there is one) of the last ``SEARCH_SAMPLES`` before the latest cut that fits."""
    n = len(audio) // FRAME_SAMPLES
    if n * FRAME_SAMPLES <= WINDOW_SAMPLES:
        return [(0, n * FRAME_SAMPLES, 0, n * FRAME_SAMPLES)]
    frames = np.asarray(audio[:n * FRAME_SAMPLES], np.float64).reshape(n, FRAME_SAMPLES)
    energy = np.convolve(np.mean(frames ** 2, axis=1), np.ones(QUIET_FRAMES) / QUIET_FRAMES, mode="same")
    f_window, f_ctx, f_search = (v // FRAME_SAMPLES for v in (WINDOW_SAMPLES, CONTEXT_SAMPLES, SEARCH_SAMPLES))
    plan, start = [], 0
    while True:
        read_start = max(0, start - f_ctx)
        if n - read_start <= f_window:  # the rest fits with its context before it
            plan.append((start, n, read_start, n))
            break
        latest = read_start + f_window - f_ctx  # the cut's context after it must fit too
        lo = max(start + 1, latest - f_search)
        cut = lo + int(np.argmin(energy[lo:latest + 1]))
        plan.append((start, cut, read_start, min(n, cut + f_ctx)))
        start = cut
    return [tuple(f * FRAME_SAMPLES for f in w) for w in plan]


def encode_utterance(audio: np.ndarray, run: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(T,) float32 at 16 kHz -> (T // 320, D) float32: ``run`` (samples, a multiple of 320 -> (samples //
    320, D)) on each window of :func:`plan_windows` followed by ``PAD_SAMPLES`` of silence, each window's
    own frames kept (neither its context's nor the silence's): a long signal's content changes windows in a
    pause, while the vocoder reading it runs on without a break."""
    out = []
    for start, end, read_start, read_end in plan_windows(audio):
        x = np.zeros(read_end - read_start + PAD_SAMPLES, np.float32)
        x[:read_end - read_start] = audio[read_start:read_end]
        z = run(x)
        out.append(z[(start - read_start) // FRAME_SAMPLES:(end - read_start) // FRAME_SAMPLES])
    return np.concatenate(out)


class UtteranceContentModel:
    """Shared ONNX Runtime session of a whole-utterance content graph (input ``audio`` (1, N), output ``z``
    (1, N // 320, D)). ``sha256`` names the content a vocoder was trained on: the graph's recorded
    ``content_sha256`` (its weights' digest, as the training shards recorded it), not the file's bytes."""

    #: frames come as late as the causal encoder's, so the neural voice's delay is the same
    lookahead_frames = 1
    #: its streams read a whole signal first: never a live stream (``Anonymizer.check_streams``)
    needs_whole_signal = True

    def __init__(self, onnx_path: str | Path, threads: int = 1) -> None:
        from rtanon.config import ConfigError

        loaded = self.load_if_utterance(onnx_path, threads)
        if loaded is None:
            raise ConfigError(f"{onnx_path}: not a whole-utterance content graph (rtanon lab export-whisper "
                              "--utterance writes one)")
        self.__dict__.update(loaded.__dict__)

    @classmethod
    def load_if_utterance(cls, onnx_path: str | Path, threads: int = 1) -> "UtteranceContentModel | None":
        """The model when ``onnx_path`` is a whole-utterance content graph, None for any other graph (a
        causal one: :class:`rtanon.content.stream.ContentEncoderModel`)."""
        from rtanon.content.stream import CONFIG_METADATA_KEY, _ort

        ort = _ort()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        graph = Path(onnx_path).read_bytes()
        session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
        raw = session.get_modelmeta().custom_metadata_map.get(CONFIG_METADATA_KEY)
        meta = json.loads(raw) if raw else {}
        if meta.get("kind") != KIND or [i.name for i in session.get_inputs()] != ["audio"]:
            return None
        model = cls.__new__(cls)
        model.session = session
        model.file_sha256 = hashlib.sha256(graph).hexdigest()
        model.sha256 = str(meta["content_sha256"])
        model.output_dim = int(session.get_outputs()[0].shape[-1])
        return model

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"audio": x[None]})[0][0]

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """A whole utterance -> its ``z`` (floor(len / 320), D)."""
        return encode_utterance(audio, self.run)

    def silence_frame(self) -> np.ndarray:
        """(D,): the frame of 20 ms of silence, computed once (what a stream's flush reads past a signal)."""
        if getattr(self, "_silence", None) is None:
            self._silence = self.encode(np.zeros(FRAME_SAMPLES, np.float32))[0]
        return self._silence

    def open_stream(self, hop: int) -> "UtteranceContentStage":
        return UtteranceContentStage(self, hop)


class UtteranceContentStage:
    """Per-session frames of a primed signal (stage contract; see the module docstring)."""

    #: a session streams a signal through it only after ``prime`` (``rtanon.engine.Session.iter_process``)
    needs_whole_signal = True

    def __init__(self, model: UtteranceContentModel, hop: int) -> None:
        if hop <= 0 or hop % HOP_SAMPLES:
            raise ValueError(f"hop={hop}: use a multiple of {HOP_SAMPLES} samples (10 ms at {SAMPLE_RATE_HZ} Hz)")
        self.model = model
        self._hop = hop
        self._z: np.ndarray | None = None
        self._received = self._given = 0

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        return (-self._hop) % FRAME_SAMPLES + FRAME_SAMPLES * self.model.lookahead_frames

    def prime(self, signal: np.ndarray) -> None:
        """The whole signal the next chunks will be (16 kHz float32): its frames, and a frame of silence for
        every frame the stream's flush reads past its end."""
        self._z, self._silence = self.model.encode(signal), self.model.silence_frame()
        self._received = self._given = 0

    def reset(self) -> None:
        """Keeps the primed frames and the place in them: they are the signal's, not history (a session
        resets its stages after a fault and goes on with the next chunk)."""

    def process(self, chunk: np.ndarray) -> np.ndarray:
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``hop`` samples -> (n, D) ``z`` of the frames completed now (frame ``i`` once ``320 (i + 1 + L)``
        samples have come), as the causal stage gives them."""
        check_chunk(chunk, self._hop, "UtteranceContentStage.process")
        if self._z is None:
            raise RuntimeError("the whole-utterance content needs the whole signal first (files and corpora "
                               "only, not a live stream)")
        self._received += chunk.shape[0]
        ready = max(0, self._received // FRAME_SAMPLES - self.model.lookahead_frames)
        z = self._z[self._given:ready]
        if ready - self._given > z.shape[0]:  # the flush after the signal: silence
            z = np.concatenate([z, np.repeat(self._silence[None], ready - self._given - z.shape[0], axis=0)])
        self._given = ready
        return np.ascontiguousarray(z, np.float32)
        yield  # a generator, as the other stages' steps: no shared call to batch
