"""Streaming content encoder on ONNX Runtime (numpy + onnxruntime only), or on PyTorch.

``ContentEncoderModel`` is the shared, immutable part: one ONNX Runtime
session over the exported graph (by default the one shipped as package data,
``rtanon/models/content/content_encoder.onnx``). ``model.open_stream()`` gives
a ``ContentEncoderStage``: the per-session stream holding the explicit state
tensors and the not-yet-complete 20 ms frame of samples.
``TorchContentEncoder`` is the same shared part on PyTorch, for a CUDA server: the
network from the torch weights shipped beside the graph (checked against the graph
when loaded), its state on the device, a batch of streams replayed as one CUDA graph.

Stage contract (see ``rtanon.stages``): ``process(chunk)`` takes ``hop``
float32 samples at 16 kHz in [-1, 1] and returns the 50 Hz frames completed
by this chunk, ``(n, D)`` float32 unit-space projections ``z`` (what the
vocoder reads); n is 0 or 1 for 10 ms chunks, 1 for 20 ms,
2 for 40 ms (30 ms alternates 1 and 2). The result does not depend on the
chunk size: frame ``i`` always depends on samples ``[0, 320 (i + 1 + L))``
only, ``L`` the model's ``lookahead_frames`` (stored in the graph's metadata,
0 for graphs without it). With ``L`` > 0 the network's output ``i + L`` is
frame ``i``'s: the stream drops its first ``L`` outputs, so each frame comes
``L`` frames (20 ms each) after it completes; ``encode`` pads the utterance
with ``L`` frames of silence to give every frame.
"""

from __future__ import annotations

import hashlib
import threading
import json
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np

from rtanon.batch import Call, Steps, run_alone
from rtanon.constants import FRAME_SAMPLES, HOP_SAMPLES, SAMPLE_RATE_HZ
from rtanon.stages.base import check_chunk

PACKAGED_ONNX = "content_encoder.onnx"
PACKAGED_WEIGHTS = "content_encoder.pt"
#: ONNX metadata key of the model config (written by ``rtanon.train.export``)
CONFIG_METADATA_KEY = "rtanon_content_config"


@contextmanager
def packaged_model_path(name: str = PACKAGED_ONNX) -> Iterator[Path]:
    """Path to the shipped ONNX content encoder (package data; ``PACKAGED_WEIGHTS``: its torch weights)."""
    ref = resources.files("rtanon") / "models" / "content" / name
    with resources.as_file(ref) as p:
        yield p


def _ort():
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - install hint
        raise ImportError("the content encoder runs on ONNX Runtime: pip install onnxruntime") from exc
    return onnxruntime


@dataclass
class ContentStreamConfig:
    """``threads``: ONNX Runtime intra-op threads (1 on the live path)."""

    threads: int = 1

    def validate(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads={self.threads}: use 1 (live path) or more")


class _ContentRunner:
    """What both runners of the content network share: offline analysis and streams over ``run``."""

    lookahead_frames: int
    unit_dim: int

    @property
    def output_dim(self) -> int:
        """Width D of what ``encode`` and the streams return (the projections ``z``)."""
        return self.unit_dim

    def analyze(self, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Offline: a whole utterance (float32, 16 kHz) -> soft units (n, K) and projections (n, D) of its
        n = floor(len/320) frames, from a zero state, the last ``lookahead_frames`` hearing silence after it."""
        n = (len(audio) // FRAME_SAMPLES) * FRAME_SAMPLES
        x = np.zeros(n + FRAME_SAMPLES * self.lookahead_frames, np.float32)
        x[:n] = audio[:n]
        probs, z, _ = self.run(x, self.init_state())
        return probs[self.lookahead_frames:], z[self.lookahead_frames:]

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Offline: a whole utterance -> ``z`` (floor(len/320), D), the stream's output (see ``analyze``)."""
        return self.analyze(audio)[1]

    def open_stream(self, hop: int) -> "ContentEncoderStage":
        return ContentEncoderStage(self, hop)


class ContentEncoderModel(_ContentRunner):
    """Shared ONNX Runtime session of the causal content encoder."""

    #: ONNX Runtime releases the GIL: a server's workers run parts of a batch at once (:mod:`rtanon.batch`)
    splits = True

    def __init__(self, onnx_path: str | Path | None = None, config: ContentStreamConfig | None = None) -> None:
        ort = _ort()
        self.config = config or ContentStreamConfig()
        self.config.validate()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.config.threads
        opts.inter_op_num_threads = 1
        if onnx_path is None:
            with packaged_model_path() as p:
                graph = p.read_bytes()
        else:
            graph = Path(onnx_path).read_bytes()
        #: sha256 of the graph file: names the encoder a vocoder was trained on (``VocoderConfig.content_sha256``)
        self.sha256 = hashlib.sha256(graph).hexdigest()
        self.session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
        self._graph, self._options, self._batched = graph, opts, None
        self._batched_lock = threading.Lock()
        inputs = self.session.get_inputs()
        if inputs[0].name != "audio":
            raise ValueError(f"{onnx_path}: not a content-encoder graph (first input {inputs[0].name!r})")
        self.state_names = [i.name for i in inputs[1:]]
        self.state_shapes = [tuple(1 if not isinstance(d, int) else d for d in i.shape) for i in inputs[1:]]
        self.n_units = int(self.session.get_outputs()[0].shape[-1])
        self.unit_dim = int(self.session.get_outputs()[1].shape[-1])
        raw = self.session.get_modelmeta().custom_metadata_map.get(CONFIG_METADATA_KEY)
        #: L: the graph's output ``t + L`` is frame ``t``'s (see the module docstring)
        self.lookahead_frames = int(json.loads(raw).get("lookahead_frames", 0)) if raw else 0

    def init_state(self) -> list[np.ndarray]:
        return [np.zeros(s, dtype=np.float32) for s in self.state_shapes]

    def run(self, audio: np.ndarray, state: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """audio (N,) float32 with N % 320 == 0 -> probs (N/320, K), z (N/320, D), new state."""
        feed = {"audio": audio[None, :]}
        feed.update(zip(self.state_names, state))
        out = self.session.run(None, feed)
        return out[0][0], out[1][0], out[2:]

    def run_batch(self, rows) -> list:
        """Several streams' ``run``: ``rows`` of ``(audio (N,), state)`` with one N -> their
        ``(probs, z, state)`` each, from one call of the graph with a batch axis (built from the
        packaged graph on first use; the :class:`rtanon.batch.Runner` of the content stage)."""
        if len(rows) == 1:
            return [self.run(*rows[0])]
        if self._batched is None:
            with self._batched_lock:  # workers may reach here at once
                if self._batched is None:
                    self._batched = self._batched_session()
        feed = {"audio": np.stack([audio for audio, _ in rows])}
        feed.update((name, np.concatenate([state[j] for _, state in rows]))
                    for j, name in enumerate(self.state_names))
        probs, z, *state = self._batched.run(None, feed)
        return [(probs[b], z[b], [s[b:b + 1] for s in state]) for b in range(len(rows))]

    def _batched_session(self):
        """The same graph with its batch axis (exported as 1) made free: needs the ``onnx`` package
        (the ``[serve]`` extra); without it every row runs alone."""
        try:
            import onnx
        except ImportError:
            return _RowByRow(self)
        graph = onnx.load_from_string(self._graph)
        for value in list(graph.graph.input) + list(graph.graph.output):
            dim = value.type.tensor_type.shape.dim[0]
            dim.ClearField("dim_value")
            dim.dim_param = "batch"
        del graph.graph.value_info[:]  # shapes inferred at export name the batch of 1
        return _ort().InferenceSession(graph.SerializeToString(), self._options,
                                       providers=["CPUExecutionProvider"])



class _RowByRow:
    """Stands in for the batched graph where ``onnx`` is missing: the rows one at a time."""

    def __init__(self, model: ContentEncoderModel) -> None:
        self.model = model

    def run(self, _, feed: dict) -> list:
        outs = []
        for b in range(feed["audio"].shape[0]):
            probs, z, state = self.model.run(feed["audio"][b], [feed[n][b:b + 1] for n in self.model.state_names])
            outs.append([probs[None], z[None], *state])
        return [np.concatenate(parts) for parts in zip(*outs)]


class TorchContentEncoder(_ContentRunner):
    """The content encoder on PyTorch (CPU or CUDA), a drop-in for :class:`ContentEncoderModel` as the
    streams' runner: the network (:class:`rtanon.content.model.ContentEncoder`) from ``weights`` (a
    ``rtanon lab export-content --weights`` checkpoint; for the packaged graph, the packaged weights), which
    must compute what ``reference`` (the graph's ONNX Runtime model) computes: checked when loaded on one
    second of noise (``ConfigError`` otherwise, so a vocoder never reads another encoder's ``z``). The
    streams' state lives on the device; on CUDA with ``cuda_graphs`` a batch of streams is one replay of a
    graph captured per (batch bucket, samples) (:class:`rtanon.neural.backends.CudaGraphStep`).
    ``sha256`` is the reference graph's, the name a vocoder's config records."""

    #: largest |z| difference from the ONNX graph accepted at load, relative to max |z|: float32 on a CPU
    #: agrees to about 1e-6, CUDA's TF32 convolutions to about 1e-3; another encoder's weights differ by O(1)
    TOLERANCE = 1e-2

    def __init__(self, weights: str | Path, reference: ContentEncoderModel, device: str = "cpu",
                 cuda_graphs: bool = True) -> None:
        from rtanon.config import ConfigError
        from rtanon.neural.backends import torch_device

        device = torch_device(device)
        import torch

        from rtanon.content.config import ContentModelConfig
        from rtanon.content.model import ContentEncoder

        self._torch = torch
        self.device = device
        ckpt = torch.load(weights, map_location="cpu", weights_only=True)
        self.net = ContentEncoder(ContentModelConfig.from_dict(ckpt["model_config"]))
        self.net.load_state_dict(ckpt["model"])
        self.net.eval().to(device)
        self.sha256 = reference.sha256
        self.lookahead_frames = reference.lookahead_frames
        self.unit_dim, self.n_units = reference.unit_dim, reference.n_units
        self._use_graphs = cuda_graphs and device.startswith("cuda")
        self._graphs: dict = {}
        x = np.random.default_rng(0).standard_normal(SAMPLE_RATE_HZ).astype(np.float32) * 0.1
        want = reference.run(x, reference.init_state())[1]
        got = self._run_rows([(x, self.init_state())], graphs=False)[0][1]  # no graph for this shape
        err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-6))
        if got.shape != want.shape or not err <= self.TOLERANCE:
            raise ConfigError(f"{weights}: these torch weights do not compute the content graph "
                              f"{self.sha256[:12]} (relative difference {err:.2g}); export both from one checkpoint")

    def init_state(self) -> tuple:
        return tuple(t.to(self.device) for t in self.net.init_state(1))

    def run(self, audio: np.ndarray, state: tuple) -> tuple[np.ndarray, np.ndarray, tuple]:
        """As :meth:`ContentEncoderModel.run`; the state stays on the device."""
        return self.run_batch([(audio, state)])[0]

    def run_batch(self, rows) -> list:
        """As :meth:`ContentEncoderModel.run_batch` (the streams' :class:`rtanon.batch.Runner`)."""
        return self._run_rows(rows, self._use_graphs)

    def _run_rows(self, rows, graphs: bool) -> list:
        torch = self._torch
        with torch.inference_mode():
            audio = torch.as_tensor(np.stack([a for a, _ in rows]), device=self.device)
            state = [torch.cat([s[j] for _, s in rows]) if len(rows) > 1 else rows[0][1][j]
                     for j in range(len(rows[0][1]))]
            if graphs:
                from rtanon.neural.backends import CudaGraphStep, batch_bucket

                key = (batch_bucket(len(rows)), audio.shape[1])
                if key not in self._graphs:
                    self._graphs[key] = CudaGraphStep(self.net, [audio, *state], key[0])
                probs, z, *new = self._graphs[key]([audio, *state])
            else:
                probs, z, *new = self.net(audio, *state)
            probs, z = probs.cpu().numpy(), z.cpu().numpy()
        return [(probs[b], z[b], tuple(t[b:b + 1] for t in new)) for b in range(len(rows))]


class ContentEncoderStage:
    """Per-session streaming content encoder (stage contract; see the module docstring)."""

    def __init__(self, model: "ContentEncoderModel | TorchContentEncoder", hop: int) -> None:
        if hop <= 0 or hop % HOP_SAMPLES:
            raise ValueError(f"hop={hop}: use a multiple of {HOP_SAMPLES} samples (10 ms at {SAMPLE_RATE_HZ} Hz)")
        self.model = model
        self._hop = hop
        self._dim = model.output_dim
        self.reset()

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        """Longest extra wait, beyond the chunk, before a 20 ms frame's output is known (its lookahead too)."""
        return (-self._hop) % FRAME_SAMPLES + FRAME_SAMPLES * self.model.lookahead_frames

    def reset(self) -> None:
        self._state = self.model.init_state()
        self._pending = np.zeros(0, dtype=np.float32)
        self._skip = self.model.lookahead_frames  # the network's first L outputs belong to no frame

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """``hop`` float32 samples (16 kHz) -> (n, D) float32 projections ``z`` of the frames completed now."""
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``process`` with the graph's call yielded (:mod:`rtanon.batch`), keyed by its sample count."""
        check_chunk(chunk, self._hop, "ContentEncoderStage.process")
        buf = np.concatenate([self._pending, chunk]) if len(self._pending) else chunk
        n = (len(buf) // FRAME_SAMPLES) * FRAME_SAMPLES
        pending = buf[n:].copy()
        if n == 0:
            self._pending = pending
            return np.zeros((0, self._dim), dtype=np.float32)
        _, z, state = yield Call(self.model, n, (np.ascontiguousarray(buf[:n]), self._state))
        self._pending, self._state = pending, state
        if self._skip:
            drop = min(self._skip, z.shape[0])
            z, self._skip = z[drop:], self._skip - drop
        return z
