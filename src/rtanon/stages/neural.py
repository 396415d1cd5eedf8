"""The neural voice: content + mapped F0 + pseudo-speaker -> the harmonic-plus-noise vocoder.

``NeuralVoiceModel`` is the shared part (built once per Anonymizer): the
content encoder's ONNX Runtime session, the vocoder backend and the identity
machinery. ``NeuralVoiceStage`` is one session's stage (the usual contract:
``process(chunk)``, ``reset()``, ``hop``, ``latency_samples``). Per chunk it

1. runs the causal content encoder (its unit-space projections ``z`` at 50 Hz),
2. runs the streaming F0 tracker (100 Hz, 20 ms lookahead) and maps each
   voiced value to the pseudo-speaker's F0 quantiles with the online
   percentile mapping (:class:`rtanon.f0.convert.StreamingPitchConverter`),
3. vocodes every 20 ms frame whose units and both F0 values are known, with
   the session's fixed pseudo-speaker embedding,
4. (``match_loudness``) scales each vocoded frame to the RMS of the input
   frame it renders, the gain ramped linearly across the frame,

and returns ``hop`` samples from an output queue that starts with
``latency_samples`` of silence. Frame ``t`` (samples ``[320 t, 320 t + 320)``)
needs F0 frame ``2 t + 1``; the tracker delivers frame ``k`` in the chunk
that contains sample ``160 (k + L)`` (``L`` = its ``latency_frames``, 2), so
frame ``t`` can be vocoded once the input reaches ``320 t + 320 + 160 L``,
rounded up to a whole chunk. The content encoder's units of frame ``t`` are
known at ``320 t + 320 + 320 A`` (``A`` its ``lookahead_frames``): with
``A`` = 1 that is the same 20 ms the F0 tracker waits anyway, so the units
hear the frame after theirs at no cost in latency. The stage delay is the
largest wait these imply (:func:`stage_delay_samples`): 20 ms for 20 and
40 ms chunks, 30 ms for 10 and 30 ms chunks, so the engine's algorithmic
latency is 40 ms with 20 ms chunks.

The audio is the vocoder's, made from content, pitch and the pseudo-speaker:
no input sample reaches the output. What the user sounds like is never
stored: the session keeps only the pseudo-speaker.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np

from rtanon.batch import Steps, run_alone
from rtanon.config import ConfigError, NeuralConfig
from rtanon.constants import FRAME_SAMPLES, HOP_SAMPLES
from rtanon.errors import UserError
from rtanon.neural.config import VocoderConfig
from rtanon.paths import check_regular
from rtanon.stages.base import check_chunk

#: The packaged vocoder of each privacy point (``NeuralConfig.privacy``) and of the whole-utterance content
#: (``NeuralConfig.context``), in the package's data.
PACKAGED_DIRS = {"strong": ("models", "neural"), "balanced": ("models", "neural", "balanced"),
                 "utterance": ("models", "neural", "utterance")}
#: The shipped content graph each privacy point's vocoder reads on the causal path, in the package's
#: ``models/content/``: balanced the streaming Whisper tiny.en encoder (``models/content/MODEL_CARD_WHISPER.md``),
#: strong content encoder version 4 (``models/content/MODEL_CARD.md``).
PACKAGED_CONTENT = {"strong": "content_encoder.onnx", "balanced": "whisper_tiny_en_stream.onnx"}
PACKAGED_ONNX = "vocoder.onnx"
PACKAGED_CHECKPOINT = "generator.pt"
#: ONNX metadata key holding the vocoder's config (JSON), written by ``rtanon.train.export``.
CONFIG_METADATA_KEY = "rtanon_vocoder_config"


class VocoderMissing(UserError, FileNotFoundError):
    """No vocoder weights where they were looked for; the message says how to get some."""


def packaged_ref(name: str, privacy: str):
    """The package resource of the shipped vocoder file ``name`` for the point ``privacy`` (a privacy point,
    or ``utterance``: :func:`vocoder_point`)."""
    return resources.files("rtanon").joinpath(*PACKAGED_DIRS[privacy], name)


def vocoder_point(cfg: NeuralConfig) -> str:
    """Which shipped vocoder ``cfg`` runs: the whole-utterance content's own, or the privacy point's."""
    return "utterance" if cfg.context == "utterance" else cfg.privacy


def packaged_vocoder_ref(cfg: NeuralConfig):
    """The shipped vocoder file ``cfg`` runs when it names none (the torch backend's checkpoint, the others'
    graph)."""
    return packaged_ref(PACKAGED_CHECKPOINT if cfg.backend == "torch" else PACKAGED_ONNX, vocoder_point(cfg))


def content_ref(cfg: NeuralConfig, recorded: str | None = None):
    """The content encoder graph ``cfg`` runs: ``content_onnx``; or the shipped one of its ``context``; on the
    causal path the shipped one a given vocoder records it was trained on (version 4 for a vocoder without
    the record), else the privacy point's. ``recorded``: that vocoder's ``content_sha256`` where the caller
    has already read it (None: read from the file)."""
    if cfg.content_onnx:
        return Path(cfg.content_onnx)
    if cfg.context == "utterance":
        from rtanon.content.utterance import packaged_ref as utterance_ref

        return utterance_ref()
    name = PACKAGED_CONTENT[cfg.privacy]
    vocoder = cfg.vocoder_checkpoint if cfg.backend == "torch" else cfg.vocoder_onnx
    if vocoder and Path(vocoder).is_file():
        recorded = _recorded_content(Path(vocoder)) if recorded is None else recorded
        by_digest = {_packaged_digest(n): n for n in PACKAGED_CONTENT.values()}
        name = by_digest.get(recorded, PACKAGED_CONTENT["strong"] if not recorded else name)
    return resources.files("rtanon").joinpath("models", "content", name)


def _recorded_content(vocoder: Path) -> str:
    """The ``content_sha256`` a vocoder file records ("" for none)."""
    if vocoder.suffix == ".pt":
        import torch

        return torch.load(vocoder, map_location="cpu", weights_only=True)["config"].get("content_sha256", "")
    return read_onnx_config(vocoder).content_sha256


@lru_cache(maxsize=None)
def _packaged_digest(name: str) -> str:
    from rtanon.neural.backends import file_sha256

    with resources.as_file(resources.files("rtanon").joinpath("models", "content", name)) as p:
        return file_sha256(p) if p.is_file() else ""


@contextmanager
def packaged_path(name: str, privacy: str) -> Iterator[Path]:
    with resources.as_file(packaged_ref(name, privacy)) as p:
        if not p.exists():
            where = "/".join((*PACKAGED_DIRS[privacy], name))
            option = "--context utterance" if privacy == "utterance" else f"--privacy {privacy}"
            raise VocoderMissing(f"this rtanon has no trained neural vocoder for {option} ({where} is "
                                 "missing): use --method mcadams, or train one with `rtanon train vocoder`")
        yield p


def read_onnx_config(onnx_path: str | Path) -> VocoderConfig:
    """The vocoder config stored in an exported graph's metadata (the defaults for graphs without it)."""
    import onnxruntime as ort

    meta = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).get_modelmeta()
    raw = meta.custom_metadata_map.get(CONFIG_METADATA_KEY)
    return VocoderConfig.from_dict(json.loads(raw) if raw else {})


def stage_delay_samples(hop: int, f0_latency_frames: int, content_lookahead_frames: int = 0) -> int:
    """The smallest output delay at which every vocoder frame is ready before it is played (see the module
    docstring): ``max_t ceil(R_t / hop) * hop - hop - 320 t`` with
    ``R_t = 320 t + 320 + max(160 L, 320 A)``."""
    period = np.lcm(hop, FRAME_SAMPLES) // FRAME_SAMPLES
    wait = max(HOP_SAMPLES * f0_latency_frames, FRAME_SAMPLES * content_lookahead_frames)
    ready = [FRAME_SAMPLES * t + FRAME_SAMPLES + wait for t in range(period + 1)]
    return max(-(-r // hop) * hop - hop - FRAME_SAMPLES * t for t, r in enumerate(ready))


def _torch_content(cfg: NeuralConfig, reference, device: str):
    """The content encoder on the vocoder's CUDA device (:class:`rtanon.content.stream.TorchContentEncoder`):
    the packaged torch weights, or for ``--content X.onnx`` the ``X.pt`` beside it."""
    from rtanon.content.stream import PACKAGED_WEIGHTS, TorchContentEncoder, packaged_model_path

    if not cfg.content_onnx:
        with packaged_model_path(PACKAGED_WEIGHTS) as p:
            return TorchContentEncoder(p, reference, device=device, cuda_graphs=cfg.cuda_graphs)
    weights = Path(cfg.content_onnx).with_suffix(".pt")
    if not weights.is_file():
        raise ConfigError(f"{cfg.content_onnx}: the torch backend on CUDA runs the content encoder from its torch "
                          f"weights, {weights}, which is missing (rtanon lab export-content --weights writes it)")
    return TorchContentEncoder(weights, reference, device=device, cuda_graphs=cfg.cuda_graphs)


class NeuralVoiceModel:
    """Shared, read-only models of the neural method (thread-safe to share between sessions)."""

    def __init__(self, config: NeuralConfig | None = None) -> None:
        from rtanon.content.stream import PACKAGED_ONNX as CONTENT_ONNX
        from rtanon.content.stream import ContentEncoderModel, ContentStreamConfig, packaged_model_path
        from rtanon.identity.speaker import IdentityModel
        from rtanon.neural.backends import file_sha256, make_backend

        self.config = config or NeuralConfig()
        self.config.validate()
        cfg = self.config
        if cfg.backend == "torch":
            from rtanon.neural.backends import torch_device
            from rtanon.neural.vocoder import load_generator

            device = torch_device(cfg.device)  # before loading: a missing CUDA gets a clear error
            if cfg.vocoder_checkpoint:
                model = load_generator(cfg.vocoder_checkpoint, device)
            else:
                with packaged_path(PACKAGED_CHECKPOINT, vocoder_point(cfg)) as p:
                    model = load_generator(p, device)
            self.vocoder_config = model.config
            self.backend = make_backend("torch", model=model, device=device, threads=cfg.threads,
                                        cuda_graphs=cfg.cuda_graphs)
        else:
            if cfg.vocoder_onnx:
                onnx_path = Path(cfg.vocoder_onnx)
                check_regular(onnx_path, "vocoder graph (.onnx)")
                if not onnx_path.exists():
                    raise VocoderMissing(f"{onnx_path}: no such vocoder graph")
                self._build_onnx(onnx_path)
            else:
                with packaged_path(PACKAGED_ONNX, vocoder_point(cfg)) as p:
                    self._build_onnx(p)
        if cfg.content_onnx:
            check_regular(cfg.content_onnx, "content encoder graph (.onnx)")
        if cfg.content_onnx and not Path(cfg.content_onnx).exists():
            raise ConfigError(f"{cfg.content_onnx}: no such content encoder graph")
        utterance = None
        if cfg.context == "utterance" and not cfg.content_onnx:
            from rtanon.content.utterance import UtteranceContentModel, packaged_path as utterance_path

            with utterance_path() as p:
                utterance = UtteranceContentModel(p, cfg.threads)
        elif cfg.content_onnx:  # a whole-utterance graph (files and corpora) or a causal one
            from rtanon.content.utterance import UtteranceContentModel

            utterance = UtteranceContentModel.load_if_utterance(cfg.content_onnx, cfg.threads)
            if utterance is None and cfg.context == "utterance":
                raise ConfigError(f"{cfg.content_onnx} is a causal content graph: --context utterance needs a "
                                  "whole-utterance one (`rtanon lab export-whisper --utterance`)")
        if utterance is not None:
            self.content = utterance  # on ONNX Runtime's CPU provider whatever runs the vocoder
        else:
            with resources.as_file(content_ref(cfg, self.vocoder_config.content_sha256)) as p:
                if not p.exists():
                    raise UserError(f"this rtanon lacks the content encoder of --privacy {cfg.privacy} ({p}): "
                                    "reinstall it, or use --method mcadams")
                self.content = ContentEncoderModel(p, ContentStreamConfig(threads=cfg.threads))
                # version 4 has torch weights for CUDA; the streaming Whisper encoder stays on ONNX Runtime's CPU
                v4 = bool(cfg.content_onnx) or p.name == CONTENT_ONNX
            if v4 and cfg.backend == "torch" and self.backend.device.startswith("cuda"):
                self.content = _torch_content(cfg, self.content, self.backend.device)
        trained_on = self.vocoder_config.content_sha256
        if not trained_on and cfg.content_onnx:
            # vocoders from before the record (the shipped one among them) were trained on the packaged encoder
            with packaged_model_path() as p:
                trained_on = file_sha256(p)
        if trained_on and trained_on != self.content.sha256:
            raise ConfigError(f"the vocoder was trained on the output of content encoder {trained_on[:12]}, not of "
                              f"{cfg.content_onnx or 'the packaged one'} ({self.content.sha256[:12]}): pass the "
                              "encoder it was trained on with --content, or a vocoder trained on this one")
        given = self.content.output_dim
        if given != self.vocoder_config.units_dim:
            raise ConfigError(f"the vocoder expects {self.vocoder_config.units_dim}-dim content, the content "
                              f"encoder gives {given}: retrain the vocoder on this encoder's output")
        self.identities = IdentityModel()

    def _build_onnx(self, path: Path) -> None:
        from rtanon.neural.backends import make_backend

        cfg = self.config
        if cfg.backend == "tensorrt":
            self.vocoder_config = read_onnx_config(path)
            self.backend = make_backend("tensorrt", onnx_path=path)
        else:  # the backend's own session already holds the metadata: no second load of the graph
            self.backend = make_backend("onnxruntime", onnx_path=path, device=cfg.device, threads=cfg.threads)
            raw = self.backend.metadata.get(CONFIG_METADATA_KEY)
            self.vocoder_config = VocoderConfig.from_dict(json.loads(raw) if raw else {})

    def new_identity(self, rng: np.random.Generator, unlike: np.ndarray | None = None,
                     max_cosine: float | None = None):
        """A fresh pseudo-speaker for one session (``strategy`` and ``gender`` from the config); with
        ``unlike`` (another pseudo-speaker's embedding) its cosine to that one is at most ``max_cosine``
        (the GMM's forced dissimilarity, its θ_FD when None; the dense and sparse pool strategies
        leave that speaker's cluster out, random ignores it)."""
        return self.identities.new_identity(self.config.strategy, gender=self.config.gender, rng=rng,
                                            user_embedding=unlike, theta_fd=max_cosine)

    def open_stream(self, hop: int, identity, rng: np.random.Generator) -> "NeuralVoiceStage":
        from rtanon.identity.speaker import check_fits

        check_fits(identity, self.vocoder_config.speaker_dim)  # a wrong one would fail every chunk
        return NeuralVoiceStage(self, hop, identity, rng)


class NeuralVoiceStage:
    """One session's neural voice (see the module docstring). ``identity`` is a
    :class:`rtanon.identity.speaker.PseudoSpeaker`; ``rng`` drives the vocoder's noise."""

    def __init__(self, model: NeuralVoiceModel, hop: int, identity, rng: np.random.Generator) -> None:
        from rtanon.f0.convert import PitchConversionConfig, StreamingPitchConverter, TargetPitch
        from rtanon.f0.tracker import F0Tracker
        from rtanon.neural.backends import VocoderStream

        if hop <= 0 or hop % HOP_SAMPLES:
            raise ValueError(f"hop={hop}: use a multiple of {HOP_SAMPLES} samples (10 ms at 16 kHz)")
        self._hop = hop
        self.identity = identity
        self.content = model.content.open_stream(hop)
        self.f0 = F0Tracker(hop=hop)
        self.pitch = StreamingPitchConverter(TargetPitch.from_quantiles(identity.f0_quantiles_hz),
                                             PitchConversionConfig(method=model.config.pitch_method))
        self.vocoder = VocoderStream(model.backend, identity.embedding, rng)
        self._delay = stage_delay_samples(hop, self.f0.latency_frames, model.content.lookahead_frames)
        self._match = model.config.match_loudness
        self._max_gain = float(10.0 ** (model.config.max_gain_db / 20.0))
        self.underruns = 0
        #: set to {} to collect per-part compute times (ns) of every call: content, f0, vocoder
        self.part_times: dict[str, list[int]] | None = None
        self.reset()

    @property
    def hop(self) -> int:
        return self._hop

    @property
    def latency_samples(self) -> int:
        return self._delay

    @property
    def needs_whole_signal(self) -> bool:
        """True with a whole-utterance content encoder: ``prime(signal)`` before the signal's chunks."""
        return getattr(self.content, "needs_whole_signal", False)

    def prime(self, signal: np.ndarray) -> None:
        self.content.prime(signal)

    def reset(self) -> None:
        self.content.reset()
        self.f0.reset()
        self.pitch.reset()
        self.vocoder.reset()
        self._units = np.zeros((0, self.content.model.output_dim), np.float32)
        self._f0 = np.zeros(0, np.float32)
        self._f0_skip = self.f0.latency_frames  # the stream's first values are frames before it began
        self._out = np.zeros(self._delay, np.float32)
        self._in_pending = np.zeros(0, np.float32)
        self._in_rms = np.zeros(0, np.float32)
        self._gain = 0.0

    def _scale(self, audio: np.ndarray, n: int) -> np.ndarray:
        """Frames of ``audio`` scaled to the RMS of the ``n`` input frames they render (gain ramped)."""
        frames = audio.reshape(n, FRAME_SAMPLES)
        out_rms = np.sqrt(np.mean(np.square(frames), axis=1))
        target = np.minimum(self._in_rms[:n] / np.maximum(out_rms, 1e-6), self._max_gain)
        self._in_rms = self._in_rms[n:]
        gains = np.concatenate([[self._gain], target])
        ramp = np.arange(1, FRAME_SAMPLES + 1, dtype=np.float32) / FRAME_SAMPLES
        g = gains[:-1, None] + (gains[1:] - gains[:-1])[:, None] * ramp[None, :]
        self._gain = float(gains[-1])
        return (frames * g).astype(np.float32).reshape(-1)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        return run_alone(self.steps(chunk))

    def steps(self, chunk: np.ndarray) -> Steps:
        """``process`` with the content encoder's and the vocoder's calls yielded (:mod:`rtanon.batch`)."""
        check_chunk(chunk, self._hop, "NeuralVoiceStage.process")
        t0 = time.perf_counter_ns()
        if self._match:  # RMS of every completed 20 ms input frame, in the vocoder's frame grid
            buf = np.concatenate([self._in_pending, chunk])
            k = buf.shape[0] // FRAME_SAMPLES
            rms = np.sqrt(np.mean(np.square(buf[:k * FRAME_SAMPLES].reshape(k, FRAME_SAMPLES)), axis=1))
            self._in_rms = np.concatenate([self._in_rms, rms.astype(np.float32)])
            self._in_pending = buf[k * FRAME_SAMPLES:]
        units = yield from self.content.steps(chunk)
        t1 = time.perf_counter_ns()
        f0 = self.f0.process(chunk)
        if self._f0_skip:
            drop = min(self._f0_skip, f0.shape[0])
            f0, self._f0_skip = f0[drop:], self._f0_skip - drop
        if f0.shape[0]:  # one frame at a time, so any chunking maps every frame alike
            mapped = [self.pitch.process(f0[i:i + 1]) for i in range(f0.shape[0])]
            self._f0 = np.concatenate([self._f0, *[m.astype(np.float32) for m in mapped]])
        if units.shape[0]:
            self._units = np.concatenate([self._units, units])
        t2 = time.perf_counter_ns()
        n = min(self._units.shape[0], self._f0.shape[0] // 2)
        if n:
            audio = yield from self.vocoder.steps(self._units[:n], self._f0[:2 * n])
            self._units, self._f0 = self._units[n:], self._f0[2 * n:]
            if self._match:
                audio = self._scale(audio, n)
            self._out = np.concatenate([self._out, audio])
        if self._out.shape[0] < self._hop:  # cannot happen with the stated delay; never emit input
            self.underruns += 1
            self._out = np.concatenate([self._out, np.zeros(self._hop - self._out.shape[0], np.float32)])
        y, self._out = self._out[:self._hop], self._out[self._hop:]
        if self.part_times is not None:
            t3 = time.perf_counter_ns()
            for name, ns in (("content", t1 - t0), ("f0+pitch", t2 - t1), ("vocoder", t3 - t2)):
                self.part_times.setdefault(name, []).append(ns)
        return y
