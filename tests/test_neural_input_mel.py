"""The input's log-mel as a second content input of the vocoder (``VocoderConfig.input_mel_bins``): the
streaming feature equals the offline one, reads no further ahead than stated, training perturbs it, and a
vocoder with it streams, exports, warm-starts and runs in the neural method."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rtanon.neural.input_mel import (LOOKAHEAD, MAX_TILT, MAX_WARP, InputMelStream, frame_power, log_mel_frames,
                                     perturbed_log_mel, voice_warp, warped_log_mel)

BINS = 40


@pytest.mark.parametrize("hop", [160, 320, 480, 1600, 7])
def test_streaming_log_mel_equals_offline_for_any_chunking(speech, hop):
    x = speech[:16000]
    offline = log_mel_frames(x, BINS)
    stream = InputMelStream(BINS)
    got = np.concatenate([stream.process(x[i:i + hop]) for i in range(0, len(x), hop)])
    # frame t needs samples up to 320 t + 416: all but the last frame of the second are out
    assert got.shape == (len(x) // 320 - 1, BINS)
    np.testing.assert_allclose(got, offline[:len(got)], atol=1e-4, rtol=0)
    stream.reset()
    np.testing.assert_allclose(stream.process(x[:3200]), offline[:9], atol=1e-4, rtol=0)


def test_a_session_reads_its_input_through_its_voice_s_warp(speech):
    """The stream's warp and tilt equal the offline warped log-mel; each pseudo-voice draws its own, in
    the training range, and the same voice always the same."""
    x = speech[:8000]
    rng = np.random.default_rng(0)
    voices = rng.standard_normal((20, 256)).astype(np.float32)
    draws = [voice_warp(v) for v in voices]
    assert draws[0] == voice_warp(voices[0].copy()) and len(set(draws)) == 20
    assert all(1 / MAX_WARP <= w <= MAX_WARP and abs(t) <= MAX_TILT for w, t in draws)
    warp, tilt = draws[0]
    stream = InputMelStream(BINS, warp, tilt)
    got = np.concatenate([stream.process(x[i:i + 320]) for i in range(0, len(x), 320)])
    want = warped_log_mel(frame_power(x, len(got)), BINS, warp, tilt)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(got - log_mel_frames(x, BINS)[:len(got)]).max() > 0.1


def test_frame_t_reads_96_samples_past_its_end_and_no_further(speech):
    x = speech[:6400].copy()
    t = 10
    base = log_mel_frames(x, BINS)
    late = x.copy()
    late[320 * t + 320 + LOOKAHEAD:] += 0.5  # only samples after frame t's window
    np.testing.assert_array_equal(log_mel_frames(late, BINS)[:t + 1], base[:t + 1])
    near = x.copy()
    near[320 * t + 320 + LOOKAHEAD - 1] += 0.5  # the window's last sample
    assert np.abs(log_mel_frames(near, BINS)[t] - base[t]).max() > 1e-3


def test_training_warp_moves_formants_and_tilt_tilts():
    """A 1 kHz tone read through filters warped by 1.2 appears at 1000 / 1.2 Hz; the tilt adds a ramp; the
    training perturbation draws both per segment, reproducibly."""
    sr = 16000
    tone = (0.3 * np.sin(2 * np.pi * 1000.0 * np.arange(3200) / sr)).astype(np.float32)
    power = frame_power(tone, 8)[4]  # a frame inside the tone

    def peak_hz(logmel):
        from rtanon.content.config import mel_filterbank

        centres = (mel_filterbank(BINS, 512) * np.linspace(0, 8000, 257)).sum(1) / mel_filterbank(BINS, 512).sum(1)
        return centres[int(np.argmax(logmel))]

    plain = warped_log_mel(power[None], BINS, 1.0, 0.0)[0]
    assert abs(peak_hz(plain) - 1000.0) < 120
    assert abs(peak_hz(warped_log_mel(power[None], BINS, 1.2, 0.0)[0]) - 1000.0 / 1.2) < 120
    tilted = warped_log_mel(power[None], BINS, 1.0, 2.0)[0] - plain
    np.testing.assert_allclose(tilted, np.linspace(-1.0, 1.0, BINS), atol=1e-5)
    audio = np.stack([tone, tone, tone])
    a = perturbed_log_mel(audio, BINS, 8, np.random.default_rng(5))
    b = perturbed_log_mel(audio, BINS, 8, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 8, BINS) and np.abs(a[0] - a[1]).max() > 0.1  # each segment its own draw


# ---- the vocoder with the input log-mel --------------------------------------------------------

torch = pytest.importorskip("torch")


def _config():
    from rtanon.neural.vocoder import VocoderConfig

    return VocoderConfig(units_dim=256, units_kind="z", source_type="envelope", prenet_dilations=(1, 2),
                         initial_channels=64, input_mel_bins=BINS, input_cepstra=12)


def _model(seed=0):
    from rtanon.neural.vocoder import CausalNsfHifiGan

    torch.manual_seed(seed)
    model = CausalNsfHifiGan(_config()).eval()
    with torch.no_grad():  # a non-zero residual, so the whole graph matters
        model.conv_post.conv.parametrizations.weight.original0.fill_(0.1)
    return model


def _inputs(frames=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    units = torch.cat([torch.randn(2, frames, 256, generator=g), -6 + torch.randn(2, frames, BINS, generator=g)], 2)
    return (units, torch.full((2, 2 * frames), 130.0), torch.randn(2, 256, generator=g),
            torch.randn(2, 320 * frames, generator=g))


def test_the_input_log_mel_changes_the_voice_and_streams_exactly():
    from rtanon.config import ConfigError

    model = _model()
    units, f0, spk, noise = _inputs()
    with torch.no_grad():
        offline = model(units, f0, spk, noise)
        other = units.clone()
        other[:, :, 256:] += torch.linspace(-2, 2, BINS)  # another spectral shape, the same content
        assert (model(other, f0, spk, noise) - offline).abs().max() > 1e-3
        state, outs = model.init_state(2), []
        for s in range(0, 8, 2):
            out, *state = model.forward_stream(units[:, s:s + 2], f0[:, 2 * s:2 * s + 4], spk,
                                               noise[:, 320 * s:320 * s + 640], *state)
            outs.append(out)
    np.testing.assert_allclose(torch.cat(outs, 1).numpy(), offline.numpy(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"\(B, L, 296\) \(content 256 \+ input log-mel 40\)"):
        model(units[:, :, :256], f0, spk, noise)
    with pytest.raises(ConfigError, match="input_mel_bins"):
        replace(_config(), input_cepstra=BINS).validate()


def test_the_onnx_graph_takes_the_log_mel_with_the_units(tmp_path):
    pytest.importorskip("onnxruntime")
    from rtanon.neural.backends import make_backend
    from rtanon.neural.vocoder import export_onnx

    model = _model()
    backend = make_backend("onnxruntime", onnx_path=export_onnx(model, tmp_path / "v.onnx"))
    units, f0, spk, noise = _inputs()
    out, _ = backend.step(units.numpy(), f0.numpy(), spk.numpy(), noise.numpy(), backend.init_state(2))
    with torch.no_grad():
        np.testing.assert_allclose(out, model(units, f0, spk, noise).numpy(), atol=1e-4, rtol=0)


def test_warm_start_adds_the_log_mel_input_at_zero(tmp_path):
    """The shipped kind of checkpoint (no input log-mel) warm-starts a model with one that computes what it
    did, whatever the log-mel; training then grows the new convolution."""
    from rtanon.neural.train import warm_start
    from rtanon.neural.vocoder import CausalNsfHifiGan

    old_cfg = replace(_config(), input_mel_bins=0)
    torch.manual_seed(0)
    old = CausalNsfHifiGan(old_cfg)
    torch.save({"generator": old.state_dict(), "config": __import__("dataclasses").asdict(old_cfg), "step": 5},
               tmp_path / "old.pt")
    new = CausalNsfHifiGan(_config())
    new.load_state_dict(warm_start(tmp_path / "old.pt", _config())["generator"])
    units, f0, spk, noise = _inputs()
    with torch.no_grad():
        np.testing.assert_allclose(new(units, f0, spk, noise).numpy(),
                                   old(units[:, :, :256], f0, spk, noise).numpy(), atol=1e-6, rtol=0)


def test_training_feeds_the_perturbed_log_mel_and_resumes_exactly(tmp_path):
    """A few CPU steps on shards of real speech: the batch gains the log-mel of its own audio (one frame
    more is read, for the last frame's lookahead), and resuming equals training straight through."""
    from rtanon.neural.train import ShardDataset, ShardWriter, TrainConfig, load_generator, train_vocoder

    rng = np.random.default_rng(0)
    w = ShardWriter(tmp_path / "shards", units_dim=256, units_kind="z")
    for i in range(3):
        audio = (0.2 * np.sin(2 * np.pi * (150 + 40 * i) * np.arange(320 * 30) / 16000)).astype(np.float32)
        w.add(f"u{i}", i % 2, rng.standard_normal((30, 256)).astype(np.float32), np.full(60, 150.0, np.float32),
              audio)
    w.close(["a", "b"], rng.standard_normal((2, 256)).astype(np.float32))
    data = ShardDataset(tmp_path / "shards")
    cfg = TrainConfig(vocoder=_config(), batch_size=2, segment_frames=8, context_frames=2, checkpoint_every=1,
                      adversarial_start_step=10**9, residual_start_step=0, seed=3)
    last = train_vocoder(cfg, data, tmp_path / "straight", device="cpu", max_steps=2)
    assert last["step"] == 2 and np.isfinite(last["g_total"])
    train_vocoder(cfg, data, tmp_path / "resumed", device="cpu", max_steps=1)
    train_vocoder(cfg, data, tmp_path / "resumed", device="cpu", max_steps=1)
    a, b = (load_generator(tmp_path / d / "generator.pt") for d in ("straight", "resumed"))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=0, msg=name)
    assert a.mel_in.conv.parametrizations.weight.original0.abs().max() > 0  # the new input was trained


def test_the_neural_method_feeds_the_input_log_mel_for_any_chunking(tmp_path, speech):
    pytest.importorskip("onnxruntime")
    from rtanon.config import NeuralConfig
    from rtanon.neural.vocoder import export_onnx
    from rtanon.stages.neural import NeuralVoiceModel

    path = str(export_onnx(_model(), tmp_path / "v.onnx"))
    model = NeuralVoiceModel(NeuralConfig(vocoder_onnx=path, match_loudness=False))
    identity = model.new_identity(np.random.default_rng(0))
    stage = model.open_stream(320, identity, np.random.default_rng(7))
    assert (stage.input_mel.warp, stage.input_mel.tilt) == voice_warp(identity.embedding)
    plain = NeuralVoiceModel(NeuralConfig(vocoder_onnx=path, input_warp=False)).open_stream(
        320, identity, np.random.default_rng(7))
    assert (plain.input_mel.warp, plain.input_mel.tilt) == (1.0, 0.0)
    x = speech[:16000]
    outs = {}
    for hop in (160, 320, 640):
        stage = model.open_stream(hop, identity, np.random.default_rng(7))
        assert stage.input_mel is not None and stage.input_mel.bins == BINS
        out = np.concatenate([stage.process(x[i:i + hop]) for i in range(0, len(x), hop)])
        outs[hop] = out[stage.latency_samples:]
    n = min(len(o) for o in outs.values())
    assert np.abs(outs[320][:n]).max() > 1e-3
    for hop in (160, 640):
        np.testing.assert_allclose(outs[hop][:n], outs[320][:n], atol=1e-4, rtol=0)
