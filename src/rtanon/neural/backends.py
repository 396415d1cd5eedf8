"""Backends for the vocoder's streaming step, behind one interface.

``make_backend(name, ...)`` builds a :class:`VocoderBackend`:

- ``"onnxruntime"``: the exported ONNX graph (:func:`rtanon.neural.vocoder.export_onnx`)
  with ONNX Runtime; CPU by default, the CUDA execution provider when
  ``device`` is ``"cuda"`` or ``"auto"`` and ``onnxruntime-gpu`` provides it.
  Running it needs only onnxruntime and numpy: this module does not import
  torch (the torch and tensorrt factories do).
- ``"torch"``: the PyTorch model on CPU or CUDA; on CUDA the streaming step
  is captured once per (batch, frames) shape as a CUDA graph and replayed.
- ``"tensorrt"``: an fp16 TensorRT engine built from the ONNX graph on first
  use and cached under the user cache directory (:func:`user_cache_dir`),
  keyed by the model's hash, the GPU name and the TensorRT version. Used when
  ``import tensorrt`` works (``pip install tensorrt`` on a machine with an
  NVIDIA GPU and CUDA); it is not installable in the development
  environment, so its tests skip there.

Every backend takes and returns numpy float32 arrays (one call, ``L`` frames
of 20 ms, ``B`` sessions): ``units (B, L, K)``, ``f0_hz (B, 2L)``,
``speaker (B, S)``, ``noise (B, 320 L)`` -> ``audio (B, 320 L)``. The
state returned by ``init_state`` is opaque (numpy arrays, or device tensors
for the GPU backends) and is passed back to ``step``, which returns the new
one. :class:`VocoderStream` is the per-session object that hides it.

Each backend module is imported inside its factory; a missing one raises
``BackendUnavailable`` with the install command.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from rtanon import atomic
from rtanon.batch import Call, Steps, run_alone
from rtanon.constants import FRAME_SAMPLES
from rtanon.errors import UserError
from rtanon.neural.batching import StepRunner


class BackendUnavailable(UserError, RuntimeError):
    """The backend's package or device is missing; the message says what to install."""


class VocoderBackend(Protocol):
    name: str
    device: str

    def init_state(self, batch: int) -> Any:
        """Zero state for ``batch`` sessions (opaque; pass it to ``step``)."""
        ...

    def step(self, units: np.ndarray, f0_hz: np.ndarray, speaker: np.ndarray, noise: np.ndarray,
             state: Any) -> tuple[np.ndarray, Any]:
        """One streaming step; returns ``(audio (B, 320 L) float32, new_state)``."""
        ...


# ---- helpers ----------------------------------------------------------------------------------

def user_cache_dir() -> Path:
    """rtanon's per-user cache directory (created on demand by its users, never the working directory):
    ``$RTANON_CACHE_DIR`` if set, else ``%LOCALAPPDATA%\\rtanon\\Cache`` on Windows,
    ``~/Library/Caches/rtanon`` on macOS, ``$XDG_CACHE_HOME/rtanon`` or ``~/.cache/rtanon`` elsewhere."""
    env = os.environ.get("RTANON_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "rtanon" / "Cache"
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "rtanon"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache") / "rtanon"


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensorrt_engine_path(onnx_path: str | Path, gpu_name: str, trt_version: str, fp16: bool,
                         cache_dir: str | Path | None = None) -> Path:
    """Where the TensorRT engine for this model, GPU and TensorRT version is cached."""
    gpu = re.sub(r"[^A-Za-z0-9_.-]+", "_", gpu_name).strip("_") or "gpu"
    key = f"{file_sha256(onnx_path)[:20]}_{gpu}_trt{trt_version}_{'fp16' if fp16 else 'fp32'}"
    root = Path(cache_dir).expanduser().absolute() if cache_dir else user_cache_dir() / "tensorrt"
    return root / f"{key}.engine"


def _input_names() -> list[str]:
    return ["units", "f0_hz", "speaker", "noise"]


# ---- ONNX Runtime -----------------------------------------------------------------------------

class OnnxRuntimeBackend:
    """ONNX Runtime session over the exported streaming step. State: a list of numpy arrays."""

    name = "onnxruntime"

    def __init__(self, onnx_path: str | Path, device: str = "cpu", threads: int = 1) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise BackendUnavailable("the onnxruntime backend needs ONNX Runtime: pip install onnxruntime "
                                     "(or onnxruntime-gpu for CUDA)") from e
        available = ort.get_available_providers()
        want_cuda = device == "cuda" or (device == "auto" and "CUDAExecutionProvider" in available)
        if device == "cuda" and "CUDAExecutionProvider" not in available:
            raise BackendUnavailable("ONNX Runtime has no CUDA provider here: pip install onnxruntime-gpu "
                                     f"(available providers: {available})")
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if want_cuda else ["CPUExecutionProvider"]
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(onnx_path), so, providers=providers)
        self.device = "cuda" if self._session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        ins = self._session.get_inputs()
        self._names = [i.name for i in ins]
        if self._names[:4] != _input_names():
            raise ValueError(f"{onnx_path} is not a vocoder streaming graph (inputs {self._names})")
        self._state_shapes = [tuple(i.shape[1:]) for i in ins[4:]]
        #: the graph's custom metadata (``export_onnx`` stores the vocoder config there)
        self.metadata = dict(self._session.get_modelmeta().custom_metadata_map)

    def init_state(self, batch: int) -> list[np.ndarray]:
        return [np.zeros((batch, *s), np.float32) for s in self._state_shapes]

    def step(self, units, f0_hz, speaker, noise, state):
        feed = dict(zip(self._names, (units, f0_hz, speaker, noise, *state)))
        audio, *new = self._session.run(None, feed)
        return audio, new


# ---- PyTorch ----------------------------------------------------------------------------------

def torch_device(device: str) -> str:
    """``device`` ("cpu", "cuda[:N]" or "auto") checked against this PyTorch: "auto" becomes "cuda" when CUDA
    works, else "cpu"; a CUDA device without CUDA, or no PyTorch, raises :class:`BackendUnavailable`."""
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable("the torch backend needs PyTorch: pip install torch==2.13.0") from e
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable("CUDA is not available to PyTorch here; install a CUDA build of torch "
                                 "and an NVIDIA driver, or use --accelerator cpu")
    return device


class TorchBackend:
    """The PyTorch generator (weight norm folded, eval mode). On CUDA with ``cuda_graphs`` the step is
    captured as a CUDA graph per (batch bucket, frames) shape and replayed (:class:`CudaGraphStep`); the
    state then lives on the GPU."""

    name = "torch"

    def __init__(self, model: Any, device: str = "cpu", cuda_graphs: bool = True, threads: int | None = None) -> None:
        device = torch_device(device)
        import torch

        self._torch = torch
        self.device = device
        if threads is not None and device == "cpu":
            # process-wide: intra-op threads that fight other busy threads cost ~10x per step (measured)
            torch.set_num_threads(threads)
        self._model = model.folded().to(device)
        self._graphs: dict[tuple[int, int], CudaGraphStep] = {}
        self._use_graphs = cuda_graphs and device.startswith("cuda")

    @property
    def uses_cuda_graphs(self) -> bool:
        """Whether steps replay captured CUDA graphs (CUDA with ``cuda_graphs``)."""
        return self._use_graphs

    def init_state(self, batch: int):
        return self._model.init_state(batch, self.device)

    def step(self, units, f0_hz, speaker, noise, state):
        torch = self._torch
        ins = [torch.as_tensor(a, device=self.device) for a in (units, f0_hz, speaker, noise)]
        with torch.inference_mode():
            if self._use_graphs:
                key = (batch_bucket(units.shape[0]), units.shape[1])
                if key not in self._graphs:
                    self._graphs[key] = CudaGraphStep(self._model.forward_stream, [*ins, *state], key[0])
                audio, *new = self._graphs[key]([*ins, *state])
            else:
                audio, *new = self._model.forward_stream(*ins, *state)
        return audio.cpu().numpy(), tuple(new)


def batch_bucket(rows: int) -> int:
    """The batch a CUDA graph is captured at for ``rows`` sessions: the next power of two, so that sessions
    joining and leaving a server reuse a handful of graphs (at most 2x the rows' work, padded)."""
    return 1 << max(0, rows - 1).bit_length()


class CudaGraphStep:
    """``fn`` (a pure function of tensors, each with the batch on axis 0, returning a tuple of such
    tensors) captured as a CUDA graph over static buffers of ``batch`` rows. A call with ``n <= batch``
    rows copies them into the first ``n`` rows (the rest zeroed: rows are independent, padding changes no
    real row) and returns the first ``n`` rows of each output. ``fn`` is pure, so the warm-up calls change
    nothing. ``capture=False`` calls ``fn`` eagerly on the same buffers (the padding checked on a CPU)."""

    def __init__(self, fn: Callable, example: list, batch: int, capture: bool = True) -> None:
        import torch

        self._fn = fn
        self._static = [torch.zeros((batch, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in example]
        self.batch = batch
        self._graph = None
        if not capture:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*self._static)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._out = fn(*self._static)

    def __call__(self, tensors: list) -> tuple:
        n = tensors[0].shape[0]
        if n > self.batch:
            raise ValueError(f"{n} rows for a graph of {self.batch}")
        for dst, src in zip(self._static, tensors):
            dst[:n].copy_(src)
            dst[n:].zero_()
        if self._graph is None:
            out = self._fn(*self._static)
        else:
            self._graph.replay()
            out = self._out
        return tuple(o[:n].clone() for o in out)


# ---- TensorRT ---------------------------------------------------------------------------------

class TensorRtBackend:
    """fp16 TensorRT engine built from the ONNX graph, cached by :func:`tensorrt_engine_path`. Buffers
    are torch CUDA tensors; the state lives on the GPU. The optimisation profile covers batch
    1..``max_batch`` and 1..``max_frames`` frames per call (optimum: batch 1, 1 frame)."""

    name = "tensorrt"
    device = "cuda"

    def __init__(self, onnx_path: str | Path, max_batch: int = 16, max_frames: int = 4, fp16: bool = True,
                 cache_dir: str | Path | None = None) -> None:
        try:
            import tensorrt as trt
        except ImportError as e:
            raise BackendUnavailable("the tensorrt backend needs TensorRT and an NVIDIA GPU: pip install "
                                     "tensorrt (plus a CUDA build of torch for the buffers)") from e
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable("the tensorrt backend needs CUDA, which PyTorch cannot see here")
        self._torch, self._trt = torch, trt
        logger = trt.Logger(trt.Logger.WARNING)
        engine_path = tensorrt_engine_path(onnx_path, torch.cuda.get_device_name(), trt.__version__, fp16, cache_dir)
        if not engine_path.exists():
            engine_path.parent.mkdir(parents=True, exist_ok=True)
            plan = self._build(onnx_path, logger, max_batch, max_frames, fp16)
            atomic.write_bytes(engine_path, plan)
        self.engine_path = engine_path
        self._engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
        self._context = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self._state_shapes = [tuple(self._engine.get_tensor_shape(n))[1:] for n in self._inputs[4:]]

    def _build(self, onnx_path, logger, max_batch: int, max_frames: int, fp16: bool) -> bytes:
        trt = self._trt
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(Path(onnx_path).read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
        config = builder.create_builder_config()
        if fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            shape = list(t.shape)

            def dims(batch: int, frames: int) -> tuple[int, ...]:
                per_frame = {"units": None, "f0_hz": 2, "noise": FRAME_SAMPLES}
                out = []
                for k, d in enumerate(shape):
                    if k == 0:
                        out.append(batch)
                    elif d == -1:
                        f = per_frame.get(t.name)
                        out.append(frames if f is None else f * frames)
                    else:
                        out.append(d)
                return tuple(out)

            profile.set_shape(t.name, dims(1, 1), dims(1, 1), dims(max_batch, max_frames))
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError("TensorRT failed to build the vocoder engine (see the TensorRT log above)")
        return bytes(plan)

    def init_state(self, batch: int):
        torch = self._torch
        return tuple(torch.zeros((batch, *s), device="cuda", dtype=torch.float32) for s in self._state_shapes)

    def step(self, units, f0_hz, speaker, noise, state):
        torch = self._torch
        ins = [torch.as_tensor(a, device="cuda").contiguous() for a in (units, f0_hz, speaker, noise)]
        ins += [s.contiguous() for s in state]
        for name, t in zip(self._inputs, ins):
            self._context.set_input_shape(name, tuple(t.shape))
            self._context.set_tensor_address(name, t.data_ptr())
        outs = [torch.empty(tuple(self._context.get_tensor_shape(n)), device="cuda", dtype=torch.float32)
                for n in self._outputs]
        for name, t in zip(self._outputs, outs):
            self._context.set_tensor_address(name, t.data_ptr())
        stream = torch.cuda.current_stream()
        if not self._context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return outs[0].cpu().numpy(), tuple(outs[1:])


# ---- factory ----------------------------------------------------------------------------------

def _make_onnxruntime(onnx_path=None, device="cpu", threads=1, **_):
    if onnx_path is None:
        raise ValueError("the onnxruntime backend needs onnx_path (export with rtanon.neural.vocoder.export_onnx)")
    return OnnxRuntimeBackend(onnx_path, device=device, threads=threads)


def _make_torch(model=None, device="cpu", cuda_graphs=True, threads=None, **_):
    if model is None:
        raise ValueError("the torch backend needs model= (a HarmonicNoiseVocoder)")
    return TorchBackend(model, device=device, cuda_graphs=cuda_graphs, threads=threads)


def _make_tensorrt(onnx_path=None, cache_dir=None, max_batch=16, max_frames=4, **_):
    if onnx_path is None:
        raise ValueError("the tensorrt backend needs onnx_path (export with rtanon.neural.vocoder.export_onnx)")
    return TensorRtBackend(onnx_path, max_batch=max_batch, max_frames=max_frames, cache_dir=cache_dir)


#: Backend name -> factory. Each factory imports its backend lazily.
BACKENDS: dict[str, Callable[..., VocoderBackend]] = {
    "onnxruntime": _make_onnxruntime,
    "torch": _make_torch,
    "tensorrt": _make_tensorrt,
}


def make_backend(name: str, **kwargs: Any) -> VocoderBackend:
    """Builds backend ``name`` (see :data:`BACKENDS`). Keywords: ``onnx_path`` (onnxruntime, tensorrt),
    ``model`` (torch), ``device`` ("cpu", "cuda", "auto"), ``threads`` (onnxruntime; torch on CPU, process-wide), ``cuda_graphs``
    (torch), ``cache_dir``, ``max_batch``, ``max_frames`` (tensorrt)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown vocoder backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](**kwargs)


# ---- per-session stream -----------------------------------------------------------------------

class VocoderStream:
    """One session's vocoder: a fixed pseudo-speaker embedding, its own noise generator and state.

    ``process(units, f0_hz)``: ``units`` (L, K) float32 at 50 Hz and ``f0_hz`` (2L,) float32 at
    100 Hz (0 = unvoiced) -> audio (320 L,) float32 at 16 kHz. ``reset()`` zeroes the state and keeps
    the speaker. The vocoder adds no algorithmic latency beyond its 20 ms frame.
    """

    hop_samples = FRAME_SAMPLES
    latency_samples = 0

    def __init__(self, backend: VocoderBackend, speaker: np.ndarray, rng: np.random.Generator) -> None:
        speaker = np.asarray(speaker, np.float32)
        if speaker.ndim != 1:
            raise ValueError(f"speaker must be a 1-D embedding, got shape {speaker.shape}")
        self._backend = backend
        self._runner = StepRunner(backend)
        self._speaker = speaker[None, :]
        self._rng = rng
        self.reset()

    def reset(self) -> None:
        self._state = self._backend.init_state(1)

    @property
    def backend(self) -> VocoderBackend:
        return self._backend

    def use_backend(self, backend: VocoderBackend) -> None:
        """Steps through ``backend`` from now on (the same model behind another front, e.g. a
        :class:`rtanon.neural.batching.BatchedVocoder` that batches several sessions' steps)."""
        self._backend = backend
        self._runner = StepRunner(backend)

    def process(self, units: np.ndarray, f0_hz: np.ndarray) -> np.ndarray:
        return run_alone(self.steps(units, f0_hz))

    def steps(self, units: np.ndarray, f0_hz: np.ndarray) -> Steps:
        """``process`` with the backend's step yielded (:mod:`rtanon.batch`), keyed by the frame count;
        every session of one backend shares its runner, so a batch calls the backend once."""
        if units.ndim != 2 or f0_hz.shape != (2 * units.shape[0],):
            raise ValueError(f"expected units (L, K) at 50 Hz and f0_hz (2L,) at 100 Hz, got {units.shape} "
                             f"and {f0_hz.shape}")
        n = units.shape[0]
        noise = self._rng.standard_normal((1, FRAME_SAMPLES * n), dtype=np.float32)
        audio, self._state = yield Call(self._runner, n, (units[None].astype(np.float32, copy=False),
                                                          f0_hz[None].astype(np.float32, copy=False),
                                                          self._speaker, noise, self._state))
        return np.asarray(audio[0], np.float32)
