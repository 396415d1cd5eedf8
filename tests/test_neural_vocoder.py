"""The harmonic-plus-noise vocoder: shapes, streaming-equals-offline parity (torch and ONNX Runtime),
its checkpoint loading, and the backend interface.

Parity tolerance: 1e-5 absolute on float32 audio in (-1, 1) between any chunking (1, 2, 4 frames of
20 ms per call, the 50 Hz frame being the vocoder's step) and the offline call, for the same
backend; torch against ONNX Runtime: 1e-4 (different kernels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.config import ConfigError  # noqa: E402
from rtanon.constants import FRAME_SAMPLES  # noqa: E402
from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig, load_generator  # noqa: E402

PARITY_ATOL = 1e-5
FRAMES = 10
# A small configuration keeps the tests fast; parity does not depend on the width.
SMALL = VocoderConfig(units_dim=16, speaker_dim=8, initial_channels=32, min_channels=4, prenet_dilations=(1, 2),
                      envelope_points=24, envelope_harmonics=40, noise_taps=32)


def _inputs(cfg: VocoderConfig, frames: int = FRAMES, batch: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    units = torch.softmax(3 * torch.randn(batch, frames, cfg.units_dim, generator=g), dim=-1)
    f0 = 80 + 220 * torch.rand(batch, 2 * frames, generator=g)
    f0[:, 3:7] = 0.0  # an unvoiced stretch across chunk boundaries
    spk = torch.randn(batch, cfg.speaker_dim, generator=g)
    noise = torch.randn(batch, FRAME_SAMPLES * frames, generator=g)
    return units, f0, spk, noise


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny convolutions: one thread is faster, and on a shared 2-core machine two threads spin."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HarmonicNoiseVocoder(SMALL).eval()


def _chunked_torch(model, units, f0, spk, noise, frames_per_call):
    state = model.init_state(units.shape[0])
    outs = []
    with torch.no_grad():
        for s in range(0, units.shape[1], frames_per_call):
            e = s + frames_per_call
            out, *state = model.forward_stream(units[:, s:e], f0[:, 2 * s:2 * e], spk,
                                               noise[:, FRAME_SAMPLES * s:FRAME_SAMPLES * e], *state)
            outs.append(out)
    return torch.cat(outs, dim=1)


def test_shapes_dtypes_and_range(model):
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        out = model(units, f0, spk, noise)
    assert out.shape == (2, FRAME_SAMPLES * FRAMES) and out.dtype == torch.float32
    assert torch.isfinite(out).all() and out.abs().max() < 1.0
    state = model.init_state(3)
    assert [tuple(s.shape) for s in state] == [(3, c, n) for c, n in model.state_shapes]
    assert all(s.dtype == torch.float32 for s in state)


def test_wrong_shapes_raise_with_the_expected_shape(model):
    units, f0, spk, noise = _inputs(SMALL)
    with pytest.raises(ValueError, match=r"f0_hz must be \(2, 20\)"):
        model(units, f0[:, :-1], spk, noise)
    with pytest.raises(ValueError, match="units must be"):
        model(units[..., :-1], f0, spk, noise)
    with pytest.raises(ValueError, match="init_state"):
        model.forward_stream(units, f0, spk, noise, *model.init_state(1))


def test_checkpoint_round_trip_and_retired_configs_are_refused(model, tmp_path):
    """``load_generator`` rebuilds the model from its config and weights; a checkpoint of a retired kind
    (the NSF source, soft units) is refused with a ConfigError that says to retrain."""
    from dataclasses import asdict

    torch.save({"generator": model.state_dict(), "config": asdict(SMALL), "step": 7}, tmp_path / "g.pt")
    again = load_generator(tmp_path / "g.pt")
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        torch.testing.assert_close(again(units, f0, spk, noise), model(units, f0, spk, noise), atol=0, rtol=0)
    shipped_era = {**asdict(SMALL), "units_kind": "z", "source_type": "envelope", "aux_mel_bins": 0}
    assert VocoderConfig.from_dict(shipped_era) == SMALL
    with pytest.raises(ConfigError, match="retrain"):
        VocoderConfig.from_dict({**asdict(SMALL), "source_type": "nsf"})
    with pytest.raises(ConfigError, match="retrain"):
        VocoderConfig.from_dict({**asdict(SMALL), "units_kind": "probs"})


def test_a_vocoder_that_reads_the_input_spectrum_is_refused():
    """The input spectrum's keys (retired on 2026-12-03) load at their off values, as the shipped vocoders
    store them; a vocoder that reads the input's log-mel is refused with a ConfigError that says how."""
    from dataclasses import asdict

    from rtanon.stages.neural import PACKAGED_CHECKPOINT, PACKAGED_DIRS, packaged_path

    keys = set()
    for point in PACKAGED_DIRS:
        with packaged_path(PACKAGED_CHECKPOINT, point) as path:
            keys |= set(torch.load(path, map_location="cpu", weights_only=True)["config"])
            load_generator(path)
    assert {"input_mel_bins", "input_cepstra", "input_cmn_frames"} <= keys  # balanced's and utterance's
    off = {**asdict(SMALL), "input_mel_bins": 0, "input_cepstra": 16, "input_cmn_frames": 0}
    assert VocoderConfig.from_dict(off) == SMALL
    for key, value in (("input_mel_bins", 40), ("input_cmn_frames", 100)):
        with pytest.raises(ConfigError, match=rf"trained with {key}={value}, an option this version of rtanon no "
                                              "longer runs"):
            VocoderConfig.from_dict({**off, key: value})


def test_config_validation_says_how_to_fix():
    with pytest.raises(ConfigError, match="multiply to 320"):
        VocoderConfig(upsample_rates=(2, 5, 4, 4)).validate()
    with pytest.raises(ConfigError, match="100 Hz"):
        VocoderConfig(upsample_rates=(4, 5, 4, 2, 2)).validate()
    VocoderConfig().validate()


@pytest.mark.parametrize("frames_per_call", [1, 2, 4])
def test_torch_streaming_equals_offline(model, frames_per_call):
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        offline = model(units, f0, spk, noise)
    chunked = _chunked_torch(model, units, f0, spk, noise, frames_per_call)
    assert offline.abs().max() > 1e-3  # the comparison is not between two silences
    np.testing.assert_allclose(chunked.numpy(), offline.numpy(), atol=PARITY_ATOL, rtol=0)


def test_state_carries_history(model):
    """A non-zero state changes the next output: the parity above is not trivial."""
    units, f0, spk, noise = _inputs(SMALL, frames=4)
    with torch.no_grad():
        _, *state = model.forward_stream(units[:, :2], f0[:, :4], spk, noise[:, :640], *model.init_state(2))
        warm = model.forward_stream(units[:, 2:], f0[:, 4:], spk, noise[:, 640:], *state)[0]
        cold = model.forward_stream(units[:, 2:], f0[:, 4:], spk, noise[:, 640:], *model.init_state(2))[0]
    assert (warm - cold).abs().max() > 1e-4


def test_folded_model_matches_weight_norm_model(model):
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        a = model(units, f0, spk, noise)
        b = model.folded()(units, f0, spk, noise)
    np.testing.assert_allclose(b.numpy(), a.numpy(), atol=PARITY_ATOL, rtol=0)
    assert any(torch.nn.utils.parametrize.is_parametrized(m) for m in model.modules())  # original untouched


def test_phase_is_continuous_across_chunks(model):
    """The harmonics chunked through forward_stream equal those of the whole run (the phase lives in the
    state): checked through the generator output with an F0 glide."""
    units, _, spk, noise = _inputs(SMALL, frames=8, batch=1)
    f0 = torch.linspace(90, 310, 16)[None]
    with torch.no_grad():
        offline = model(units, f0, spk, noise)
    chunked = _chunked_torch(model, units, f0, spk, noise, 1)
    np.testing.assert_allclose(chunked.numpy(), offline.numpy(), atol=PARITY_ATOL, rtol=0)


# ---- ONNX and backends ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def onnx_path(model, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")  # torch.onnx.export needs it
    from rtanon.train.export import export_vocoder_onnx

    return export_vocoder_onnx(model, tmp_path_factory.mktemp("voc") / "vocoder.onnx")


def _chunked_backend(backend, units, f0, spk, noise, frames_per_call):
    state = backend.init_state(units.shape[0])
    outs = []
    for s in range(0, units.shape[1], frames_per_call):
        e = s + frames_per_call
        out, state = backend.step(units[:, s:e], f0[:, 2 * s:2 * e], spk, noise[:, FRAME_SAMPLES * s:FRAME_SAMPLES * e],
                                  state)
        outs.append(out)
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("frames_per_call", [1, 2, 4])
def test_onnxruntime_streaming_equals_offline(model, onnx_path, frames_per_call):
    from rtanon.neural.backends import make_backend

    backend = make_backend("onnxruntime", onnx_path=onnx_path)
    assert backend.device == "cpu"
    units, f0, spk, noise = (t.numpy() for t in _inputs(SMALL))
    offline = _chunked_backend(backend, units, f0, spk, noise, FRAMES)
    chunked = _chunked_backend(backend, units, f0, spk, noise, frames_per_call)
    np.testing.assert_allclose(chunked, offline, atol=PARITY_ATOL, rtol=0)
    with torch.no_grad():
        ref = model(*(torch.from_numpy(a) for a in (units, f0, spk, noise))).numpy()
    np.testing.assert_allclose(offline, ref, atol=1e-4, rtol=0)


def test_torch_backend_cpu_matches_model(model):
    from rtanon.neural.backends import make_backend

    backend = make_backend("torch", model=model, device="cpu")
    units, f0, spk, noise = (t.numpy() for t in _inputs(SMALL))
    out = _chunked_backend(backend, units, f0, spk, noise, 2)
    with torch.no_grad():
        ref = model(*(torch.from_numpy(a) for a in (units, f0, spk, noise))).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=PARITY_ATOL, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA-graph path needs one")
def test_torch_backend_cuda_graphs_match_cpu(model):
    from rtanon.neural.backends import make_backend

    gpu = make_backend("torch", model=model, device="cuda", cuda_graphs=True)
    cpu = make_backend("torch", model=model, device="cpu")
    units, f0, spk, noise = (t.numpy() for t in _inputs(SMALL))
    np.testing.assert_allclose(_chunked_backend(gpu, units, f0, spk, noise, 1),
                               _chunked_backend(cpu, units, f0, spk, noise, 1), atol=1e-4, rtol=0)


def test_tensorrt_backend(onnx_path, tmp_path):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pytest.skip("TensorRT is not installable in this environment (pip install tensorrt needs an NVIDIA "
                    "GPU machine); the engine build and run are exercised there")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT needs a CUDA device")
    from rtanon.neural.backends import make_backend

    trt = make_backend("tensorrt", onnx_path=onnx_path, cache_dir=tmp_path)
    ort = make_backend("onnxruntime", onnx_path=onnx_path)
    units, f0, spk, noise = (t.numpy() for t in _inputs(SMALL))
    np.testing.assert_allclose(_chunked_backend(trt, units, f0, spk, noise, 1),
                               _chunked_backend(ort, units, f0, spk, noise, 1), atol=2e-2, rtol=0)  # fp16
    assert list(tmp_path.glob("*.engine"))


def test_tensorrt_cache_path_is_per_user_and_keyed(onnx_path, tmp_path, monkeypatch):
    from rtanon.neural.backends import tensorrt_engine_path, user_cache_dir

    monkeypatch.delenv("RTANON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    p = tensorrt_engine_path(onnx_path, "NVIDIA H100 80GB HBM3", "10.3.0", True)
    assert p.parent == tmp_path / "xdg" / "rtanon" / "tensorrt"
    assert " " not in p.name and "NVIDIA_H100_80GB_HBM3" in p.name and p.name.endswith("_fp16.engine")
    assert tensorrt_engine_path(onnx_path, "NVIDIA A10", "10.3.0", True) != p
    monkeypatch.setenv("RTANON_CACHE_DIR", str(tmp_path / "custom"))
    assert user_cache_dir() == tmp_path / "custom"


def test_unknown_backend_and_missing_arguments():
    from rtanon.neural.backends import make_backend

    with pytest.raises(ValueError, match="choose one of"):
        make_backend("openvino")
    with pytest.raises(ValueError, match="onnx_path"):
        make_backend("onnxruntime")


def test_vocoder_stream_hides_state_and_matches_offline(model, onnx_path):
    from rtanon.neural.backends import VocoderStream, make_backend

    backend = make_backend("onnxruntime", onnx_path=onnx_path)
    units, f0, spk, _ = (t.numpy() for t in _inputs(SMALL, batch=1))
    stream = VocoderStream(backend, spk[0], np.random.default_rng(7))
    chunked = np.concatenate([stream.process(units[0, s:s + 2], f0[0, 2 * s:2 * s + 4]) for s in range(0, FRAMES, 2)])
    noise = np.random.default_rng(7)
    noise = np.concatenate([noise.standard_normal((1, 640), dtype=np.float32) for _ in range(FRAMES // 2)], axis=1)
    offline, _ = backend.step(units, f0, spk, noise, backend.init_state(1))
    assert chunked.shape == (FRAME_SAMPLES * FRAMES,) and chunked.dtype == np.float32
    np.testing.assert_allclose(chunked, offline[0], atol=PARITY_ATOL, rtol=0)
    stream.reset()
    again = stream.process(units[0, :2], f0[0, :4])
    assert again.shape == (640,)
    with pytest.raises(ValueError, match="f0_hz"):
        stream.process(units[0, :2], f0[0, :3])


def test_bench_prints_figures(capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from rtanon.train.bench_vocoder import main

    main(["--iters", "3", "--reference-reps", "1", "--config", '{"initial_channels": 16, "units_dim": 8, "speaker_dim": 4}'])
    out = capsys.readouterr().out
    assert "p99" in out and "load reference" in out and "16" in out


def test_onnxruntime_path_does_not_import_torch(onnx_path):
    """The CPU live path must not need torch: the backends module and an ORT backend run without it."""
    code = ("import sys, numpy as np\n"
            "from rtanon.neural.backends import make_backend\n"
            f"b = make_backend('onnxruntime', onnx_path={str(onnx_path)!r})\n"
            "s = b.init_state(1)\n"
            f"a, s = b.step(np.zeros((1, 1, {SMALL.units_dim}), np.float32), np.full((1, 2), 150, np.float32), "
            f"np.zeros((1, {SMALL.speaker_dim}), np.float32), np.zeros((1, 320), np.float32), s)\n"
            "assert a.shape == (1, 320) and 'torch' not in sys.modules, sorted(sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
