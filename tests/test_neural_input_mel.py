"""The balanced vocoder's second content input, the input's own log-mel (``VocoderConfig.input_mel_bins``):
the streaming feature equals the offline one and reads no further ahead than stated, training perturbs it,
and a vocoder with it streams, exports, warm-starts, trains and runs in the neural method."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rtanon.neural.input_mel import (LOOKAHEAD, InputMelStream, frame_power, log_mel, log_mel_frames, mean_normalise,
                                     mel_filterbank)

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


def test_mean_normalisation_is_causal_and_averages_only_frames_that_exist():
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((3, 20, 4)).astype(np.float32)
    firsts = [0, 3, 7]
    got = mean_normalise(frames, 5, first=np.array(firsts))
    for b, first in enumerate(firsts):
        for t in range(20):
            want = frames[b, t] if t < first else frames[b, t] - frames[b, max(t - 4, first):t + 1].mean(0)
            np.testing.assert_allclose(got[b, t], want, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(mean_normalise(frames[0], 5), got[0])


@pytest.mark.parametrize("hop", [320, 1600, 7])
def test_streaming_mean_normalised_log_mel_equals_offline_and_drops_a_constant_shape(speech, hop):
    """With ``cmn_frames`` the stream gives :func:`mean_normalise` of the offline frames for any chunking;
    what is the same in every frame (a microphone's gain, a constant spectral tilt) is gone from it."""
    x = speech[:32000]
    offline = mean_normalise(log_mel_frames(x, BINS), 30)
    stream = InputMelStream(BINS, cmn_frames=30)
    got = np.concatenate([stream.process(x[i:i + hop]) for i in range(0, len(x), hop)])
    assert got.shape == (len(x) // 320 - 1, BINS)
    np.testing.assert_allclose(got, offline[:len(got)], atol=1e-4, rtol=0)
    stream.reset()
    np.testing.assert_allclose(stream.process(x[:3200]), offline[:9], atol=1e-4, rtol=0)
    louder = mean_normalise(log_mel_frames(2.0 * x, BINS) + np.linspace(-1, 1, BINS, dtype=np.float32), 30)
    np.testing.assert_allclose(louder, offline, atol=1e-3, rtol=0)
    assert np.abs(offline[40:] - log_mel_frames(x, BINS)[40:]).max() > 1.0


def _peak_hz(logmel):
    fb = mel_filterbank(BINS)
    centres = (fb * np.linspace(0, 8000, 257)).sum(1) / fb.sum(1)
    return centres[int(np.argmax(logmel))]


def test_training_warp_moves_formants_and_each_segment_gets_its_own_draw():
    """A 1 kHz tone read through filters warped by 1.2 peaks at 1000 / 1.2 Hz; the training perturbation
    draws a warp and tilt per segment, reproducibly, within its stated range."""
    from rtanon.train.vocoder import MAX_WARP, perturbed_log_mel

    tone = (0.3 * np.sin(2 * np.pi * 1000.0 * np.arange(3200) / 16000)).astype(np.float32)
    power = frame_power(tone, 8)[4]  # a frame inside the tone
    assert abs(_peak_hz(log_mel(power, mel_filterbank(BINS))) - 1000.0) < 120
    assert abs(_peak_hz(log_mel(power, mel_filterbank(BINS, warp=1.2))) - 1000.0 / 1.2) < 120
    audio = np.stack([tone] * 6)
    a = perturbed_log_mel(audio, BINS, 8, np.random.default_rng(5))
    np.testing.assert_array_equal(a, perturbed_log_mel(audio, BINS, 8, np.random.default_rng(5)))
    assert a.shape == (6, 8, BINS) and np.abs(a[0] - a[1]).max() > 0.1
    for row in a:  # a warp within range moves the peak at most by MAX_WARP, and the tilt does not move it
        assert 1000.0 / MAX_WARP - 120 < _peak_hz(row[4]) < 1000.0 * MAX_WARP + 120


# ---- the vocoder with the input log-mel --------------------------------------------------------

torch = pytest.importorskip("torch")

K, D = 16, 8


def _config(**kw):
    from rtanon.neural.config import VocoderConfig

    return VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=32, min_channels=4, prenet_dilations=(1, 2),
                         envelope_points=16, envelope_harmonics=16, noise_taps=16, input_mel_bins=BINS,
                         input_cepstra=12, **kw)


def _model(seed=0, config=None):
    from rtanon.neural.vocoder import HarmonicNoiseVocoder

    torch.manual_seed(seed)
    model = HarmonicNoiseVocoder(config or _config()).eval()
    with torch.no_grad():  # non-zero new convolutions and residual, so the whole graph matters
        model.conv_post.conv.parametrizations.weight.original0.fill_(0.1)
    return model


def _inputs(frames=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    units = torch.cat([torch.randn(2, frames, K, generator=g), -6 + torch.randn(2, frames, BINS, generator=g)], 2)
    return (units, torch.full((2, 2 * frames), 130.0), torch.randn(2, D, generator=g),
            torch.randn(2, 320 * frames, generator=g))


def test_the_input_log_mel_changes_the_voice_and_streams_exactly():
    from rtanon.config import ConfigError

    model = _model()
    units, f0, spk, noise = _inputs()
    with torch.no_grad():
        offline = model(units, f0, spk, noise)
        other = units.clone()
        other[:, :, K:] += torch.linspace(-2, 2, BINS)  # another spectral shape, the same content
        assert (model(other, f0, spk, noise) - offline).abs().max() > 1e-3
        state, outs = model.init_state(2), []
        for s in range(0, 8, 2):
            out, *state = model.forward_stream(units[:, s:s + 2], f0[:, 2 * s:2 * s + 4], spk,
                                               noise[:, 320 * s:320 * s + 640], *state)
            outs.append(out)
    np.testing.assert_allclose(torch.cat(outs, 1).numpy(), offline.numpy(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=rf"\(B, L, {K + BINS}\) \(content {K} \+ input log-mel {BINS}\)"):
        model(units[:, :, :K], f0, spk, noise)
    with pytest.raises(ConfigError, match="input_mel_bins"):
        dataclasses.replace(_config(), input_cepstra=BINS).validate()
    for bad in (dict(input_cmn_frames=1), dict(input_cmn_frames=50, input_mel_bins=0)):
        with pytest.raises(ConfigError, match="input_cmn_frames"):
            dataclasses.replace(_config(), **bad).validate()


def test_the_onnx_graph_takes_the_log_mel_with_the_units(tmp_path):
    pytest.importorskip("onnxruntime")
    from rtanon.neural.backends import make_backend
    from rtanon.train.export import export_vocoder_onnx

    model = _model()
    backend = make_backend("onnxruntime", onnx_path=export_vocoder_onnx(model, tmp_path / "v.onnx"))
    units, f0, spk, noise = _inputs()
    out, _ = backend.step(units.numpy(), f0.numpy(), spk.numpy(), noise.numpy(), backend.init_state(2))
    with torch.no_grad():
        np.testing.assert_allclose(out, model(units, f0, spk, noise).numpy(), atol=1e-4, rtol=0)


def test_warm_start_adds_the_log_mel_input_at_zero(tmp_path):
    """A checkpoint without the input log-mel (the strong point's) warm-starts a model with it that computes
    what it did, whatever the log-mel; training then grows the new convolution."""
    from rtanon.neural.vocoder import HarmonicNoiseVocoder
    from rtanon.train.vocoder import warm_start

    old_cfg = dataclasses.replace(_config(), input_mel_bins=0)
    old = _model(config=old_cfg)
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(old_cfg), "step": 5},
               tmp_path / "old.pt")
    new = HarmonicNoiseVocoder(_config()).eval()
    new.load_state_dict(warm_start(tmp_path / "old.pt", _config())["generator"])
    units, f0, spk, noise = _inputs()
    with torch.no_grad():
        np.testing.assert_allclose(new(units, f0, spk, noise).numpy(),
                                   old(units[:, :, :K], f0, spk, noise).numpy(), atol=1e-6, rtol=0)


def test_training_reads_the_normalised_log_mel_a_stream_would_have_read(tmp_path, speech, monkeypatch):
    """With ``input_cmn_frames`` a training segment's input log-mel is normalised over the frames before it in
    its utterance (fewer at the utterance's start), exactly what the stream computes there (perturbation off);
    the history changes none of the batch's other draws."""
    import rtanon.train.vocoder as tv
    from rtanon.train.shards import ShardDataset, ShardWriter

    monkeypatch.setattr(tv, "MAX_WARP", 1.0)
    monkeypatch.setattr(tv, "MAX_TILT", 0.0)
    audio = speech[:320 * 60]
    w = ShardWriter(tmp_path / "shards", units_dim=K)
    w.add("u0", 0, np.zeros((60, K), np.float32), np.full(120, 150.0, np.float32), audio)
    w.close(["a"], np.ones((1, D), np.float32))
    data = ShardDataset(tmp_path / "shards")
    cmn, s = 20, 9
    pcm = np.round(audio * 32767.0) / 32768.0  # what the shard holds
    stream = InputMelStream(BINS, cmn_frames=cmn)
    want = np.concatenate([stream.process(pcm.astype(np.float32)), stream.process(np.zeros(320, np.float32))])
    plain = data.batch(np.random.default_rng(4), 16, s + 1)
    b = data.batch(np.random.default_rng(4), 16, s + 1, history_frames=cmn)
    for key in plain:
        np.testing.assert_array_equal(b[key], plain[key])
    got = tv.input_log_mel(b, BINS, s, cmn, np.random.default_rng(0))
    starts = [int(np.argmin([np.abs(pcm[320 * t:320 * (t + s + 1)] - row).sum() for t in range(60 - s)]))
              for row in b["audio"]]
    assert min(starts) < cmn < max(starts)  # segments with a whole history and with part of one
    np.testing.assert_array_equal(b["history_frames"], np.minimum(starts, cmn))
    for row, t in zip(got, starts):
        np.testing.assert_allclose(row, want[t:t + s], atol=1e-3, rtol=0)


@pytest.mark.parametrize("cmn", [0, 6])
def test_training_feeds_the_perturbed_log_mel_and_resumes_exactly(tmp_path, cmn):
    """A few CPU steps on shards of tones: the batch gains the log-mel of its own audio (one frame more is
    read, for the last frame's lookahead; normalised over ``cmn`` frames when set), and resuming equals
    training straight through."""
    from rtanon.neural.vocoder import load_generator
    from rtanon.train.shards import ShardDataset, ShardWriter
    from rtanon.train.vocoder import train_vocoder
    from rtanon.train.vocoder_config import TrainConfig

    rng = np.random.default_rng(0)
    w = ShardWriter(tmp_path / "shards", units_dim=K)
    for i in range(3):
        audio = (0.2 * np.sin(2 * np.pi * (150 + 40 * i) * np.arange(320 * 30) / 16000)).astype(np.float32)
        w.add(f"u{i}", i % 2, rng.standard_normal((30, K)).astype(np.float32), np.full(60, 150.0, np.float32), audio)
    w.close(["a", "b"], rng.standard_normal((2, D)).astype(np.float32))
    data = ShardDataset(tmp_path / "shards")
    cfg = TrainConfig(vocoder=_config(input_cmn_frames=cmn), batch_size=2, segment_frames=8, context_frames=2,
                      checkpoint_every=1,
                      steps=2, adversarial_start_step=10**9, residual_start_step=0, seed=3)
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        last = train_vocoder(cfg, data, tmp_path / "straight", device="cpu", max_steps=2)
        assert last["step"] == 2 and np.isfinite(last["g_total"])
        train_vocoder(cfg, data, tmp_path / "resumed", device="cpu", max_steps=1)
        train_vocoder(cfg, data, tmp_path / "resumed", device="cpu", max_steps=1)
    a, b = (load_generator(tmp_path / d / "generator.pt") for d in ("straight", "resumed"))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=0, msg=name)
    assert a.mel_in.conv.parametrizations.weight.original0.abs().max() > 0  # the new input was trained


def _tone_shards(path, speakers=2):
    from rtanon.train.shards import ShardDataset, ShardWriter

    rng = np.random.default_rng(0)
    w = ShardWriter(path, units_dim=K)
    for i in range(3):
        audio = (0.2 * np.sin(2 * np.pi * (150 + 40 * i) * np.arange(320 * 30) / 16000)).astype(np.float32)
        w.add(f"u{i}", i % speakers, rng.standard_normal((30, K)).astype(np.float32),
              np.full(60, 150.0, np.float32), audio)
    w.close([f"s{i}" for i in range(speakers)], rng.standard_normal((speakers, D)).astype(np.float32))
    return ShardDataset(path)


def test_gradient_reversal_negates_the_gradient_only():
    from rtanon.train.discriminators import SpeakerAdversary, reverse_gradient

    x = torch.randn(3, 4, requires_grad=True)
    y = reverse_gradient(x)
    torch.testing.assert_close(y, x)
    (y * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(x.grad, -torch.arange(4.0).expand(3, 4))
    # the classifier pools the valid frames over time, and shrinking one channel hides nothing from it
    adv = SpeakerAdversary(channels=4, speakers=5)
    h = torch.randn(3, 4, 7)
    assert adv(h).shape == (3, 5)
    shrunk = h.clone()
    shrunk[:, 2] *= 0.1
    torch.testing.assert_close(adv(shrunk), adv(h), atol=1e-3, rtol=1e-3)
    valid = torch.arange(7)[None].expand(3, 7) >= torch.tensor([[0], [2], [4]])
    changed = h.clone()
    changed[1, :, :2] = 100.0
    changed[2, :, :4] = -100.0
    torch.testing.assert_close(adv(changed, valid), adv(h, valid))
    assert not torch.allclose(adv(changed), adv(h))


def test_the_speaker_adversary_moves_only_the_input_spectrum_reading(tmp_path):
    """One step with the adversary from the same start as one without: every generator weight but the input
    spectrum convolution's gets the same update (the adversary reads that convolution alone); the run logs the
    classifier's loss, keeps the classifier in its trainer checkpoint and resumes exactly. Without an input
    spectrum there is nothing to read: refused."""
    from rtanon.config import ConfigError
    from rtanon.neural.vocoder import load_generator
    from rtanon.train.vocoder import train_vocoder
    from rtanon.train.vocoder_config import TrainConfig

    data = _tone_shards(tmp_path / "shards", speakers=3)
    base = TrainConfig(vocoder=_config(input_cmn_frames=6), batch_size=2, segment_frames=8, context_frames=2,
                       checkpoint_every=1, steps=2, adversarial_start_step=10**9, residual_start_step=0, seed=3)
    cfg = dataclasses.replace(base, speaker_adversary_weight=5.0)
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        train_vocoder(base, data, tmp_path / "plain", device="cpu", max_steps=1)
        last = train_vocoder(cfg, data, tmp_path / "adv", device="cpu", max_steps=1)
        assert np.isfinite(last["g_speaker_ce"]) and 0 <= last["g_speaker_acc"] <= 1
        assert "adversary" in torch.load(tmp_path / "adv" / "trainer.pt", weights_only=False)
        a, p = (load_generator(tmp_path / d / "generator.pt").state_dict() for d in ("adv", "plain"))
        moved = {k for k in a if not torch.equal(a[k], p[k])}
        assert moved and all(k.startswith("mel_in.") for k in moved), moved
        train_vocoder(cfg, data, tmp_path / "adv", device="cpu", max_steps=1)
        train_vocoder(cfg, data, tmp_path / "straight", device="cpu", max_steps=2)
    a, b = (load_generator(tmp_path / d / "generator.pt") for d in ("adv", "straight"))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=0, msg=name)
    with pytest.raises(ConfigError, match="speaker_adversary_weight"):
        dataclasses.replace(cfg, vocoder=dataclasses.replace(_config(), input_mel_bins=0)).validate()


@pytest.mark.parametrize("cmn", [0, 50])
def test_the_neural_method_feeds_the_input_log_mel_for_any_chunking(tmp_path, speech, cmn):
    """A graph with the input log-mel, in the neural method: its stage computes the log-mel stream (mean-
    normalised as the graph's config says), and any chunk size gives the same audio (the log-mel never holds
    a frame back)."""
    pytest.importorskip("onnxruntime")
    from rtanon.config import NeuralConfig
    from rtanon.neural.vocoder import HarmonicNoiseVocoder, load_generator
    from rtanon.stages.neural import PACKAGED_CHECKPOINT, NeuralVoiceModel, packaged_path
    from rtanon.train.export import export_vocoder_onnx

    with packaged_path(PACKAGED_CHECKPOINT, "strong") as p:
        shipped = load_generator(p)
    cfg = dataclasses.replace(shipped.config, input_mel_bins=BINS, input_cepstra=12, input_cmn_frames=cmn)
    torch.manual_seed(0)
    model = HarmonicNoiseVocoder(cfg).eval()
    model.load_state_dict(shipped.state_dict(), strict=False)  # all but the new input convolution
    path = str(export_vocoder_onnx(model, tmp_path / "v.onnx"))
    neural = NeuralVoiceModel(NeuralConfig(vocoder_onnx=path, match_loudness=False))
    identity = neural.new_identity(np.random.default_rng(0))
    x = speech[:16000]
    outs = {}
    for hop in (160, 320, 640):
        stage = neural.open_stream(hop, identity, np.random.default_rng(7))
        assert stage.input_mel is not None and (stage.input_mel.bins, stage.input_mel.cmn_frames) == (BINS, cmn)
        out = np.concatenate([stage.process(x[i:i + hop]) for i in range(0, len(x), hop)])
        outs[hop] = out[stage.latency_samples:]
    n = min(len(o) for o in outs.values())
    assert np.abs(outs[320][:n]).max() > 1e-3
    for hop in (160, 640):
        np.testing.assert_allclose(outs[hop][:n], outs[320][:n], atol=1e-4, rtol=0)


def test_package_vocoder_ships_half_precision_weights_and_their_own_graph(tmp_path):
    """`rtanon lab package-vocoder`: generator.pt stores float16 weights (half the bytes), and the ONNX graph
    is exported from exactly those weights, so both backends render the same audio."""
    pytest.importorskip("onnxruntime")
    from rtanon.cli import main
    from rtanon.neural.backends import make_backend
    from rtanon.neural.vocoder import load_generator

    model = _model()
    torch.save({"generator": model.state_dict(), "config": dataclasses.asdict(model.config), "step": 7},
               tmp_path / "run.pt")
    assert main(["lab", "package-vocoder", str(tmp_path / "run.pt"), str(tmp_path / "ship")]) == 0
    saved = torch.load(tmp_path / "ship" / "generator.pt", weights_only=True)
    assert saved["step"] == 7 and {v.dtype for v in saved["generator"].values()} == {torch.float16}
    assert (tmp_path / "ship" / "generator.pt").stat().st_size < 0.6 * (tmp_path / "run.pt").stat().st_size
    shipped = load_generator(tmp_path / "ship" / "generator.pt")
    backend = make_backend("onnxruntime", onnx_path=tmp_path / "ship" / "vocoder.onnx")
    units, f0, spk, noise = _inputs()
    out, _ = backend.step(units.numpy(), f0.numpy(), spk.numpy(), noise.numpy(), backend.init_state(2))
    with torch.no_grad():
        np.testing.assert_allclose(out, shipped(units, f0, spk, noise).numpy(), atol=1e-4, rtol=0)
        assert (shipped(units, f0, spk, noise) - model(units, f0, spk, noise)).abs().max() < 0.05
