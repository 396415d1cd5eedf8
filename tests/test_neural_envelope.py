"""The vocoder's envelope source (:class:`rtanon.neural.vocoder.EnvelopeSynth`):
streaming equals offline (torch and ONNX Runtime), the pitch is exactly the given F0, the formants stay
where the envelope puts them whatever the F0, unvoiced frames have no harmonics, and the upsampling
stack's residual starts at zero.

Parity tolerance as in test_neural_vocoder: 1e-5 absolute between chunkings of the same backend, 1e-4
between torch and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.constants import FRAME_SAMPLES  # noqa: E402
from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig  # noqa: E402
from rtanon.train.export import export_vocoder_onnx as export_onnx  # noqa: E402
# the vocoder tests' inputs, chunking and one-thread fixture (autouse)
from test_neural_vocoder import _chunked_torch, _inputs, _one_torch_thread  # noqa: E402,F401

FRAMES = 10
SMALL = VocoderConfig(units_dim=16, speaker_dim=8, initial_channels=32, min_channels=4, prenet_dilations=(1, 2),
                      envelope_points=24, envelope_harmonics=40, noise_taps=32)


@pytest.fixture(scope="module")
def model():
    """Random weights everywhere, the residual stack's output convolution included (it starts at zero)."""
    torch.manual_seed(0)
    m = HarmonicNoiseVocoder(SMALL)
    with torch.no_grad():
        m.env_head.weight.add_(0.3 * torch.randn_like(m.env_head.weight))
        m.env_head.bias.add_(2.0)
        m.conv_post.conv.parametrizations.weight.original0.fill_(0.5)
    return m.eval()


@pytest.mark.parametrize("frames_per_call", [1, 2, 4])
def test_torch_streaming_equals_offline(model, frames_per_call):
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        offline = model(units, f0, spk, noise)
    assert offline.abs().max() > 0.05  # the test means something: there is signal
    torch.testing.assert_close(_chunked_torch(model, units, f0, spk, noise, frames_per_call), offline, atol=1e-5, rtol=0)


def test_onnxruntime_streaming_equals_offline(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = export_onnx(model, tmp_path / "env.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        offline = model(units, f0, spk, noise).numpy()
    state = [s.numpy() for s in model.init_state(2)]
    outs = []
    for s in range(0, FRAMES, 2):
        feed = [units[:, s:s + 2].numpy(), f0[:, 2 * s:2 * s + 4].numpy(), spk.numpy(),
                noise[:, FRAME_SAMPLES * s:FRAME_SAMPLES * (s + 2)].numpy(), *state]
        out, *state = sess.run(None, dict(zip(names, feed)))
        outs.append(out)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), offline, atol=1e-4, rtol=0)


def _synth_with_envelopes(cfg: VocoderConfig, f0_hz: float, harm_db_at, noise_log_amp: float = -20.0,
                          frames: int = 20) -> np.ndarray:
    """Audio of the bare synthesiser with fixed envelopes: ``harm_db_at(hz)`` gives the harmonic envelope
    (natural log amplitude) at each envelope point."""
    from rtanon.neural.vocoder import EnvelopeSynth, _Slots

    synth = EnvelopeSynth(_Slots(), cfg)
    m = cfg.envelope_points
    mel = synth.mel_points.double()
    hz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    env_h = torch.tensor([harm_db_at(float(f)) for f in hz], dtype=torch.float32)[None, :, None].repeat(1, 1, frames)
    env_n = torch.full((1, m, frames), noise_log_amp)
    f0 = torch.full((1, frames), f0_hz)
    state = [torch.zeros(1, c, n) for c, n in _slots_shapes(cfg)]
    new = [None] * len(state)
    with torch.no_grad():
        y = synth(f0, env_h, env_n, torch.randn(1, 160 * frames), state, new)
    return y[0, 0].numpy()


def _slots_shapes(cfg):
    from rtanon.neural.vocoder import EnvelopeSynth, _Slots

    slots = _Slots()
    EnvelopeSynth(slots, cfg)
    return slots.shapes


@pytest.mark.parametrize("f0_hz", [95.0, 160.0, 240.0])
def test_pitch_is_the_given_f0(f0_hz):
    """With a flat envelope and quiet noise, the power sits at the multiples of the F0 and nowhere else."""
    y = _synth_with_envelopes(SMALL, f0_hz, lambda hz: -3.0, frames=40)[800:]  # after the first frames' ramp
    power = np.abs(np.fft.rfft(y * np.hanning(len(y)))) ** 2
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    nearest = np.abs(freqs / f0_hz - np.round(freqs / f0_hz)) * f0_hz
    at_harmonics = (nearest <= 2.5 * 16000 / len(y)) & (freqs > f0_hz / 2)
    assert power[at_harmonics].sum() > 0.97 * power.sum()
    assert power[np.abs(freqs - f0_hz) <= 2.5 * 16000 / len(y)].sum() > 0.01 * power.sum()  # the fundamental too


@pytest.mark.parametrize("f0_hz", [110.0, 210.0])
def test_formant_stays_put_when_the_pitch_moves(f0_hz):
    """Source-filter separation: a harmonic envelope peaking at 1 kHz gives the strongest harmonic within
    one F0 of 1 kHz, for a low and a high voice."""
    y = _synth_with_envelopes(SMALL, f0_hz, lambda hz: -1.0 - 3.0 * abs(np.log2(max(hz, 1.0) / 1000.0)))[800:]
    spec = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    peak = freqs[np.argmax(spec)]
    assert abs(peak - 1000.0) <= f0_hz


def test_unvoiced_frames_have_no_harmonics():
    quiet = _synth_with_envelopes(SMALL, 0.0, lambda hz: 0.0, noise_log_amp=-30.0)
    assert np.sqrt(np.mean(quiet ** 2)) < 1e-6
    noisy = _synth_with_envelopes(SMALL, 0.0, lambda hz: 0.0, noise_log_amp=-2.0)
    assert np.sqrt(np.mean(noisy ** 2)) > 1e-2


def test_residual_starts_at_zero_and_can_be_skipped():
    torch.manual_seed(1)
    fresh = HarmonicNoiseVocoder(SMALL).eval()
    units, f0, spk, noise = _inputs(SMALL)
    with torch.no_grad():
        full = fresh(units, f0, spk, noise)
        synth_only = fresh(units, f0, spk, noise, residual=False)
    torch.testing.assert_close(full, synth_only, atol=1e-7, rtol=0)


def test_projection_units_are_normalised_inside_the_graph():
    """The content encoder's projections are L2-normalised by the graph, so their scale does not matter."""
    cfg = VocoderConfig(units_dim=16, speaker_dim=8, initial_channels=32, min_channels=4, prenet_dilations=(1,),
                        envelope_points=16, envelope_harmonics=16, noise_taps=16)
    torch.manual_seed(0)
    m = HarmonicNoiseVocoder(cfg).eval()
    units, f0, spk, noise = _inputs(cfg)
    z = torch.randn_like(units)
    with torch.no_grad():
        torch.testing.assert_close(m(3.0 * z, f0, spk, noise), m(z, f0, spk, noise), atol=1e-6, rtol=0)
