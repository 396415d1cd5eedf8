"""Vocoder training library: shard round trip, batches, embedding blending, and a smoke run of the
resumable loop on synthetic shards (a few CPU steps; resumed training equals uninterrupted training)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.neural.discriminators import DiscriminatorConfig  # noqa: E402
from rtanon.neural.train import (  # noqa: E402
    BlendWithOtherSpeaker,
    ShardDataset,
    ShardWriter,
    TrainConfig,
    load_generator,
    noisy_units,
    train_vocoder,
)
from rtanon.neural.vocoder import VocoderConfig  # noqa: E402

K, D = 8, 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _utterance(rng, frames, f0):
    t = np.arange(320 * frames) / 16000
    audio = 0.3 * np.sin(2 * np.pi * f0 * t) + 0.01 * rng.standard_normal(t.size)
    units = rng.dirichlet(np.ones(K), size=frames).astype(np.float32)
    return units, np.full(2 * frames, f0, np.float32), audio.astype(np.float32)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    w = ShardWriter(d, units_dim=K, max_shard_mib=0.05)  # tiny cap: several shards
    for i in range(6):
        w.add(f"utt{i}", i % 2, *_utterance(rng, 20 + 5 * i, 120.0 + 60 * (i % 2)))
    w.add("short", 1, *_utterance(rng, 3, 200.0))
    w.close(["spkA", "spkB"], rng.standard_normal((2, D)).astype(np.float32))
    return d


def test_shards_round_trip(shard_dir):
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    assert len(manifest["shards"]) >= 3 and manifest["units_dim"] == K
    assert all(e["bytes"] <= 0.05 * 2**20 + 4096 for e in manifest["shards"])
    data = ShardDataset(shard_dir, verify=True)
    assert len(data) == 7 and data.embeddings.shape == (2, D)
    assert data.total_seconds == pytest.approx((sum(20 + 5 * i for i in range(6)) + 3) / 50)
    # utterance 0 comes back (units float16, audio int16 precision)
    rng = np.random.default_rng(0)
    units, f0, audio = _utterance(rng, 20, 120.0)
    np.testing.assert_allclose(data.units[:20], units, atol=1e-3)
    np.testing.assert_allclose(data.audio[:6400] / 32768.0, audio, atol=1e-4)
    np.testing.assert_array_equal(data.f0_hz[:40], f0)
    subset = ShardDataset(shard_dir, shards=[manifest["shards"][0]["file"]])
    assert 0 < len(subset) < len(data)


def test_writer_rejects_misaligned_features(tmp_path):
    w = ShardWriter(tmp_path, units_dim=K)
    with pytest.raises(ValueError, match="whole number of 20 ms frames"):
        w.add("x", 0, np.zeros((5, K)), np.zeros(10), np.zeros(1601))


def test_batches_are_aligned_and_seeded(shard_dir):
    data = ShardDataset(shard_dir)
    b1 = data.batch(np.random.default_rng([0, 5]), 8, 10)
    b2 = data.batch(np.random.default_rng([0, 5]), 8, 10)
    for k in b1:
        np.testing.assert_array_equal(b1[k], b2[k])
    assert b1["units"].shape == (8, 10, K) and b1["f0_hz"].shape == (8, 20) and b1["audio"].shape == (8, 3200)
    # F0 and speaker agree (speaker 0 spoke at 120 Hz, speaker 1 at 180 or 200 Hz)
    for f0, spk in zip(b1["f0_hz"], b1["speaker"]):
        voiced = f0[f0 > 0]
        assert (voiced == 120.0).all() if spk == 0 else (voiced >= 180.0).all()


def test_config_needs_enough_loss_frames():
    from rtanon.config import ConfigError

    with pytest.raises(ConfigError, match="at least 4 frames"):
        TrainConfig(segment_frames=6, context_frames=4).validate()


def test_blend_keeps_norm_and_moves_towards_another_speaker():
    table = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 2.0, 0]], np.float32)
    emb = table[[0, 0, 2]]
    out = BlendWithOtherSpeaker(prob=1.0, max_weight=0.5)(emb, np.array([0, 0, 2]), table, np.random.default_rng(1))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), np.linalg.norm(emb, axis=1), rtol=1e-5)
    assert not np.allclose(out, emb)
    cos = np.sum(out * emb, 1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(emb, axis=1))
    assert (cos > np.cos(np.pi / 4) - 1e-6).all()  # weight <= 0.5: never past half-way
    assert np.array_equal(BlendWithOtherSpeaker(prob=0.0)(emb, np.array([0, 0, 2]), table,
                                                          np.random.default_rng(1)), emb)


def test_units_noise_is_relative_to_each_frame_and_drawn_per_segment():
    rng = np.random.default_rng(0)
    units = rng.standard_normal((64, 50, 256)).astype(np.float32)
    units[:, ::2] *= 10.0  # loud and quiet frames: the noise follows each frame's own norm
    out = noisy_units(units, 0.5, np.random.default_rng(1))
    assert out.dtype == np.float32 and out.shape == units.shape
    ratio = np.linalg.norm(out - units, axis=2) / np.linalg.norm(units, axis=2)  # (B, T)
    per_segment = ratio.mean(axis=1)
    assert ratio.std(axis=1).max() < 0.1 * per_segment.max()  # one fraction per segment, every frame alike
    assert 0.0 <= per_segment.min() < 0.1 and 0.4 < per_segment.max() <= 0.55  # spread over U(0, 0.5)
    assert 0.2 < per_segment.mean() < 0.3
    np.testing.assert_array_equal(out, noisy_units(units, 0.5, np.random.default_rng(1)))  # seeded
    np.testing.assert_array_equal(noisy_units(units, 0.0, rng), units)
    from rtanon.config import ConfigError

    with pytest.raises(ConfigError, match="units_noise"):
        TrainConfig(units_noise=-0.1).validate()


def test_units_noise_changes_training_and_stays_resumable(shard_dir, tmp_path):
    data = ShardDataset(shard_dir)
    noisy = dataclasses.replace(_config(2), units_noise=0.5)
    train_vocoder(_config(2), data, tmp_path / "clean", device="cpu")
    train_vocoder(noisy, data, tmp_path / "noisy", device="cpu")
    train_vocoder(noisy, data, tmp_path / "noisy_resumed", device="cpu", max_steps=1)
    train_vocoder(noisy, data, tmp_path / "noisy_resumed", device="cpu")
    a, b, c = (load_generator(tmp_path / r / "generator.pt").state_dict() for r in ("clean", "noisy", "noisy_resumed"))
    assert any((a[k] - b[k]).abs().max() > 0 for k in a)
    for k in b:
        torch.testing.assert_close(b[k], c[k], atol=1e-6, rtol=0, msg=k)


def _config(steps):
    return TrainConfig(
        vocoder=VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4,
                              prenet_dilations=(1, 2), aux_mel_bins=80),
        discriminators=DiscriminatorConfig(mpd_channels=(4, 4, 8, 8, 8), msd_channels=(4, 8, 16, 16, 16, 16, 16),
                                           msd_scales=2),
        steps=steps, batch_size=2, segment_frames=6, context_frames=2, checkpoint_every=2, log_every=1,
        adversarial_start_step=1, seed=3)


def test_training_smoke_and_exact_resume(shard_dir, tmp_path):
    data = ShardDataset(shard_dir)
    straight = tmp_path / "straight"
    last = train_vocoder(_config(3), data, straight, device="cpu",
                         speaker_augment=BlendWithOtherSpeaker(prob=0.5))
    assert last["step"] == 3 and np.isfinite(last["g_total"]) and last["d_total"] > 0
    lines = [json.loads(x) for x in (straight / "train.log").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and "g_adv" not in lines[0] and "g_adv" in lines[1]
    assert all(np.isfinite(r["g_aux_mel"]) and r["g_aux_mel"] > 0 for r in lines)
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["generator_step00000002.pt",
                                                                          "generator_step00000003.pt"]
    # two steps, stop, resume for the third: the same weights as three steps straight
    resumed = tmp_path / "resumed"
    train_vocoder(_config(3), data, resumed, device="cpu", max_steps=2,
                  speaker_augment=BlendWithOtherSpeaker(prob=0.5))
    assert json.loads((resumed / "train.log").read_text().splitlines()[-1])["step"] == 2
    train_vocoder(_config(3), data, resumed, device="cpu", speaker_augment=BlendWithOtherSpeaker(prob=0.5))
    a = load_generator(straight / "generator.pt")
    b = load_generator(resumed / "generator.pt")
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=0, msg=name)
    # the weights did move from their initialisation
    torch.manual_seed(3)
    init = type(a)(a.config)
    assert any((p0 - p1).abs().max() > 0 for p0, p1 in zip(init.state_dict().values(), a.state_dict().values()))


def test_command_line_trains_from_shards(shard_dir, tmp_path, capsys):
    from rtanon.neural.train import main

    main(["--shards", str(shard_dir), "--run", str(tmp_path / "run"), "--steps", "2", "--batch-size", "2",
          "--segment-frames", "8", "--context-frames", "2", "--log-every", "1", "--device", "cpu",
          "--vocoder-config", '{"initial_channels": 16, "min_channels": 4}',
          "--discriminator-config", '{"mpd_channels": [4, 4, 8, 8, 8], "msd_channels": [4, 8, 16, 16, 16, 16, 16], '
          '"msd_scales": 1}'])
    out = capsys.readouterr().out
    assert "7 utterances" in out and "stopped at step 2" in out
    model = load_generator(tmp_path / "run" / "generator.pt")
    assert model.config.units_dim == K and model.config.speaker_dim == D


def test_rtanon_train_vocoder_trains_resumes_and_exports(shard_dir, tmp_path, capsys):
    """``rtanon train vocoder`` on ready shards: trains, resumes from its own checkpoint and exports the
    graph with the config the neural method reads (the soft-unit temperature)."""
    from rtanon.cli import main
    from rtanon.stages.neural import read_onnx_config

    run = tmp_path / "run"
    argv = ["train", "vocoder", "--data", str(shard_dir), "--shards", str(shard_dir), "--out", str(run),
            "--batch-size", "1", "--segment-frames", "8", "--device", "cpu", "--checkpoint-every", "1"]
    assert main([*argv, "--steps", "1"]) == 2  # the default --units z does not match these soft-unit shards
    assert "holds content 'probs'" in capsys.readouterr().err
    argv += ["--units", "probs"]
    assert main([*argv, "--steps", "1"]) == 0
    assert main([*argv, "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 1" in out and "stopped at step 2" in out
    assert [json.loads(x)["step"] for x in (run / "train.log").read_text().splitlines()] == [1, 2]
    meta = read_onnx_config(run / "vocoder.onnx")
    assert meta["units_temperature"] == 0.05 and meta["units_dim"] == K and meta["speaker_dim"] == D


def test_warm_start_adds_a_prenet_that_starts_as_identity(tmp_path):
    """A checkpoint without the pre-net (the first CPU run's) warm-starts a model with one: the new residual
    convolutions start at zero, so the audio is unchanged; other shape changes are refused."""
    from dataclasses import replace

    from rtanon.config import ConfigError
    from rtanon.neural.train import warm_start
    from rtanon.neural.vocoder import CausalNsfHifiGan

    torch.manual_seed(0)
    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4)
    old = CausalNsfHifiGan(cfg)
    path = tmp_path / "old.pt"
    saved = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("prenet_dilations", "aux_mel_bins")}
    torch.save({"generator": old.state_dict(), "config": saved, "step": 7}, path)  # an old-format config
    new_cfg = replace(cfg, prenet_dilations=(1, 2), aux_mel_bins=80)
    ckpt = warm_start(path, new_cfg)
    assert ckpt["step"] == 7
    new = CausalNsfHifiGan(new_cfg)
    new.load_state_dict(ckpt["generator"])
    g = torch.Generator().manual_seed(1)
    units, f0 = torch.rand(1, 6, K, generator=g), torch.full((1, 12), 140.0)
    spk, noise = torch.randn(1, D, generator=g), torch.randn(1, 6 * 320, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(new(units, f0, spk, noise), old(units, f0, spk, noise), atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="does not fit"):
        warm_start(path, replace(new_cfg, initial_channels=32))


def test_envelope_source_trains_the_synthesiser_first_then_the_residual(shard_dir, tmp_path):
    """``residual_start_step``: before it the upsampling stack is not run (its output convolution, which
    starts at zero, gets no gradient and stays zero); from it on the stack's residual trains too."""
    from dataclasses import replace

    data = ShardDataset(shard_dir)
    cfg = replace(_config(2), vocoder=VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4,
                                                    prenet_dilations=(1, 2), source_type="envelope",
                                                    envelope_points=16, envelope_harmonics=16, noise_taps=16),
                  adversarial_start_step=10, residual_start_step=1, checkpoint_every=1)
    run = tmp_path / "run"

    def post_gain(step):
        model = load_generator(run / "checkpoints" / f"generator_step{step:08d}.pt")
        return float(model.conv_post.conv.parametrizations.weight.original0.detach().abs().max())

    def env_head(step):
        return load_generator(run / "checkpoints" / f"generator_step{step:08d}.pt").env_head.weight.detach().clone()

    last = train_vocoder(cfg, data, run, device="cpu")
    assert last["step"] == 2 and np.isfinite(last["g_total"])
    assert post_gain(1) == 0.0  # synthesiser only
    assert post_gain(2) > 0.0  # the residual joined
    assert not torch.equal(env_head(1), env_head(2))  # the envelopes train throughout


def test_warm_start_keeps_a_trained_prenet(tmp_path):
    """``--init`` from a checkpoint of the same architecture continues it as it is."""
    from rtanon.neural.train import warm_start
    from rtanon.neural.vocoder import CausalNsfHifiGan

    torch.manual_seed(0)
    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4, prenet_dilations=(1, 2),
                        source_type="envelope", envelope_points=16, envelope_harmonics=16, noise_taps=16)
    old = CausalNsfHifiGan(cfg)
    path = tmp_path / "old.pt"
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(cfg), "step": 9}, path)
    ckpt = warm_start(path, cfg)
    for name, value in old.state_dict().items():
        torch.testing.assert_close(ckpt["generator"][name], value, atol=0, rtol=0, msg=name)


def test_shards_record_their_content_kind_and_training_checks_it(tmp_path):
    from dataclasses import replace

    from rtanon.config import ConfigError
    from rtanon.neural.train import ShardWriter

    w = ShardWriter(tmp_path / "z", units_dim=K, units_kind="z")
    rng = np.random.default_rng(0)
    for i in range(3):
        w.add(f"u{i}", 0, rng.standard_normal((12, K)).astype(np.float32), np.full(24, 120.0, np.float32),
              0.1 * rng.standard_normal(12 * 320).astype(np.float32))
    w.close(["s0"], rng.standard_normal((1, D)).astype(np.float32))
    data = ShardDataset(tmp_path / "z", units_temperature=0.05)  # nothing to sharpen in projections
    assert data.units_kind == "z"
    assert np.array_equal(data.units[:2], np.load(tmp_path / "z" / "shard_00000.npz")["units"][:2])
    cfg = replace(_config(1), adversarial_start_step=10)
    with pytest.raises(ConfigError, match="'z'"):
        train_vocoder(cfg, data, tmp_path / "run", device="cpu")
    z_cfg = replace(cfg, vocoder=replace(cfg.vocoder, units_kind="z", units_temperature=data.units_temperature))
    assert train_vocoder(z_cfg, data, tmp_path / "run", device="cpu")["step"] == 1


def test_discriminator_width_scales_hifigan_channels_and_is_checked(shard_dir, tmp_path, capsys):
    """``--discriminator-width``: HiFi-GAN's MPD/MSD channel counts scaled and rounded to multiples of 16
    (the MSD's groups), so the adversarial losses fit a CPU; the run's config records them."""
    from rtanon.cli import main
    from rtanon.commands.train_vocoder import scaled_discriminators
    from rtanon.neural.discriminators import Discriminators

    small = scaled_discriminators(0.125)
    assert small.mpd_channels == (16, 16, 64, 128, 128)
    assert small.msd_channels == (16, 16, 32, 64, 128, 128, 128)
    assert scaled_discriminators(1.0) == DiscriminatorConfig()
    scores, fmaps = Discriminators(small)(torch.zeros(1, 1, 4000))
    assert len(scores) == len(small.periods) + small.msd_scales
    run = tmp_path / "run"
    argv = ["train", "vocoder", "--data", str(shard_dir), "--shards", str(shard_dir), "--out", str(run),
            "--units", "probs", "--batch-size", "1", "--segment-frames", "8", "--device", "cpu", "--steps", "1"]
    assert main([*argv, "--discriminator-width", "0"]) == 2
    assert "--discriminator-width 0.0" in capsys.readouterr().err
    assert main([*argv, "--discriminator-width", "0.125", "--adversarial-start-step", "0"]) == 0
    assert json.loads((run / "config.json").read_text())["discriminators"]["mpd_channels"] == [16, 16, 64, 128, 128]
    assert "g_adv" in json.loads((run / "train.log").read_text().splitlines()[-1])


def _tiny_content_encoder():
    from rtanon.content.config import ContentModelConfig
    from rtanon.content.model import ContentEncoder

    torch.manual_seed(0)
    return ContentEncoder(ContentModelConfig(channels=16, dilations=(1, 2), unit_dim=8, n_units=4)).eval()


def test_content_consistency_loss_is_zero_on_the_target_and_trains_the_output():
    from rtanon.neural.train import content_consistency_loss

    model = _tiny_content_encoder().requires_grad_(False)  # frozen, as in training
    g = torch.Generator().manual_seed(0)
    real = 0.1 * torch.randn(2, 3200, generator=g)
    assert float(content_consistency_loss(model, real, real)) == pytest.approx(0.0, abs=1e-5)
    fake = (0.1 * torch.randn(2, 3200, generator=g)).requires_grad_(True)
    loss = content_consistency_loss(model, fake, real)
    loss.backward()
    assert float(loss.detach()) > 1e-4 and fake.grad.abs().max() > 0


def test_content_loss_layers_add_the_hidden_layers_and_leave_no_hooks():
    from rtanon.neural.train import content_consistency_loss

    model = _tiny_content_encoder().requires_grad_(False)  # frozen, as in training
    g = torch.Generator().manual_seed(1)
    real = 0.1 * torch.randn(2, 3200, generator=g)
    assert float(content_consistency_loss(model, real, real, layers=True)) == pytest.approx(0.0, abs=1e-5)
    fake = (real + 0.05 * torch.randn(2, 3200, generator=g)).requires_grad_(True)
    z_only = float(content_consistency_loss(model, fake, real).detach())
    loss = content_consistency_loss(model, fake, real, layers=True)
    loss.backward()
    assert float(loss.detach()) > z_only + 1e-3 and fake.grad.abs().max() > 0
    assert all(not layer._forward_hooks for layer in model.res)


def test_content_loss_joins_training_and_needs_the_encoder(shard_dir, tmp_path, capsys):
    from rtanon.cli import main
    from rtanon.config import ConfigError

    data = ShardDataset(shard_dir)
    config = dataclasses.replace(_config(2), content_loss_weight=1.0, adversarial_start_step=10)
    with pytest.raises(ConfigError, match="content_model"):
        train_vocoder(config, data, tmp_path / "none", device="cpu")
    encoder = _tiny_content_encoder()
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    last = train_vocoder(config, data, tmp_path / "run", device="cpu", content_model=encoder)
    assert np.isfinite(last["g_content"]) and last["g_content"] > 0
    for k, v in encoder.state_dict().items():  # frozen: only the vocoder learns
        torch.testing.assert_close(v, before[k], atol=0, rtol=0, msg=k)
    plain = train_vocoder(_config(2), data, tmp_path / "plain", device="cpu")
    assert "g_content" not in plain
    a, b = (load_generator(tmp_path / r / "generator.pt").state_dict() for r in ("run", "plain"))
    assert any((a[k] - b[k]).abs().max() > 0 for k in a)
    # the command line: the weights are required, and then used
    model = _tiny_content_encoder()
    weights = tmp_path / "content.pt"
    torch.save({"model": model.state_dict(), "model_config": model.cfg.to_dict()}, weights)
    argv = ["train", "vocoder", "--data", str(shard_dir), "--shards", str(shard_dir), "--out", str(tmp_path / "cli"),
            "--units", "probs", "--batch-size", "1", "--segment-frames", "8", "--device", "cpu", "--steps", "1",
            "--content-loss", "0.5"]
    assert main(argv) == 2 and "--content-weights" in capsys.readouterr().err
    assert main([*argv, "--content-weights", str(weights)]) == 0
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["content_loss_weight"] == 0.5


def test_shift_f0_to_median_moves_voiced_frames_only():
    from rtanon.neural.train import shift_f0_to_median

    f0 = np.array([[0.0, 100.0, 200.0, 0.0, 400.0], [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    out = shift_f0_to_median(f0, np.array([150.0, 300.0], np.float32))
    assert np.median(out[0][f0[0] > 0]) == pytest.approx(150.0)
    np.testing.assert_allclose(out[0][f0[0] > 0], [75.0, 150.0, 300.0], rtol=1e-6)  # ratios kept
    assert (out[0][f0[0] == 0] == 0).all() and (out[1] == 0).all()
    assert f0[0, 1] == 100.0  # the input is not changed


def test_pseudo_speaker_targets_draw_voices_like_the_method():
    from rtanon.identity.speaker import IdentityModel
    from rtanon.neural.train import PseudoSpeakerTargets

    targets = PseudoSpeakerTargets(IdentityModel())
    emb, median = targets(np.random.default_rng(0), 3)
    assert emb.shape == (3, 256) and emb.dtype == np.float32 and median.shape == (3,)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    assert (median > 50).all() and (median < 500).all() and len(set(median.tolist())) == 3
    again, _ = targets(np.random.default_rng(0), 3)
    np.testing.assert_array_equal(emb, again)


def test_converted_content_loss_renders_other_voices_and_needs_targets(shard_dir, tmp_path):
    from rtanon.config import ConfigError

    data = ShardDataset(shard_dir)
    config = dataclasses.replace(_config(2), converted_content_weight=1.0, converted_fraction=0.5,
                                 adversarial_start_step=10)
    encoder = _tiny_content_encoder()
    with pytest.raises(ConfigError, match="conversion_targets"):
        train_vocoder(config, data, tmp_path / "none", device="cpu", content_model=encoder)
    calls = []

    def targets(rng, n):
        calls.append(n)
        emb = rng.standard_normal((n, data.embeddings.shape[1])).astype(np.float32)
        return emb / np.linalg.norm(emb, axis=1, keepdims=True), np.full(n, 220.0, np.float32)

    last = train_vocoder(config, data, tmp_path / "run", device="cpu", content_model=encoder,
                         conversion_targets=targets)
    assert calls == [max(1, round(0.5 * config.batch_size))] * 2  # one draw per step, half the batch
    assert np.isfinite(last["g_content_converted"]) and last["g_content_converted"] > 0
    assert "g_content" not in last  # the own-voice content loss stays off
    plain = train_vocoder(_config(2), data, tmp_path / "plain", device="cpu")
    a, b = (load_generator(tmp_path / r / "generator.pt").state_dict() for r in ("run", "plain"))
    assert any((a[k] - b[k]).abs().max() > 0 for k in a)


def test_the_vocoder_records_the_content_encoder_of_its_shards(tmp_path, capsys):
    """The shards' manifest names the content encoder that made them (sha256 of its graph); ``rtanon train
    vocoder`` writes it into the exported graph's config, refuses a run directory trained on other content,
    and refuses ``--content-onnx`` when the shards were made by another encoder."""
    import hashlib

    from rtanon.cli import main
    from rtanon.stages.neural import read_onnx_config

    encoder = tmp_path / "content.onnx"
    encoder.write_bytes(b"stands in for a content encoder graph")
    digest = hashlib.sha256(encoder.read_bytes()).hexdigest()
    rng = np.random.default_rng(0)
    shards = tmp_path / "shards"
    w = ShardWriter(shards, units_dim=K, content_sha256=digest)
    for i in range(3):
        w.add(f"u{i}", i % 2, *_utterance(rng, 12, 150.0))
    w.close(["s0", "s1"], rng.standard_normal((2, D)).astype(np.float32))
    assert ShardDataset(shards).content_sha256 == digest

    argv = ["train", "vocoder", "--data", str(shards), "--shards", str(shards), "--units", "probs",
            "--batch-size", "1", "--segment-frames", "8", "--device", "cpu", "--steps", "1"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--content-onnx", str(encoder)]) == 0
    assert read_onnx_config(tmp_path / "run" / "vocoder.onnx")["content_sha256"] == digest
    assert load_generator(tmp_path / "run" / "generator.pt").config.content_sha256 == digest

    other = tmp_path / "other.onnx"
    other.write_bytes(b"another encoder")
    assert main([*argv, "--out", str(tmp_path / "run2"), "--content-onnx", str(other)]) == 2
    assert "was not made with --content-onnx" in capsys.readouterr().err
    assert not (tmp_path / "run2" / "generator.pt").exists()

    w = ShardWriter(tmp_path / "shards_b", units_dim=K, content_sha256="b" * 64)
    w.add("u0", 0, *_utterance(rng, 12, 150.0))
    w.close(["s0"], rng.standard_normal((1, D)).astype(np.float32))
    resume = ["--shards", str(tmp_path / "shards_b"), "--out", str(tmp_path / "run")]
    assert main([*argv[:4], *argv[6:], *resume]) == 2  # run/ was trained on the first encoder's output
    assert "another content encoder" in capsys.readouterr().err


class _TinySpeakerEmbedder(torch.nn.Module):
    """A stand-in for resemblyzer's encoder in the D-dimensional test space: mean |frame| per 20 ms -> unit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.proj = torch.nn.Linear(320, D)

    def forward(self, audio):
        frames = audio[:, :audio.shape[1] // 320 * 320].reshape(audio.shape[0], -1, 320)
        return torch.nn.functional.normalize(self.proj(frames).abs().mean(dim=1), dim=1)


def test_speaker_loss_trains_on_the_converted_pass_and_needs_its_model(shard_dir, tmp_path):
    from rtanon.config import ConfigError

    data = ShardDataset(shard_dir)
    config = dataclasses.replace(_config(2), speaker_loss_weight=1.0, converted_fraction=0.5,
                                 adversarial_start_step=10)

    def targets(rng, n):
        emb = rng.standard_normal((n, data.embeddings.shape[1])).astype(np.float32)
        return emb / np.linalg.norm(emb, axis=1, keepdims=True), np.full(n, 220.0, np.float32)

    with pytest.raises(ConfigError, match="conversion_targets"):
        train_vocoder(config, data, tmp_path / "none", device="cpu", speaker_model=_TinySpeakerEmbedder())
    with pytest.raises(ConfigError, match="speaker_model"):
        train_vocoder(config, data, tmp_path / "none2", device="cpu", conversion_targets=targets)
    with pytest.raises(ConfigError, match="speaker_loss_weight"):
        dataclasses.replace(config, speaker_loss_weight=-1.0).validate()
    embedder = _TinySpeakerEmbedder()
    last = train_vocoder(config, data, tmp_path / "run", device="cpu", conversion_targets=targets,
                         speaker_model=embedder)
    # the logged loss is cos(source) - cos(target), both cosines of unit vectors
    assert last["g_speaker"] == pytest.approx(last["g_cos_source"] - last["g_cos_target"], abs=1e-4)
    assert -1 <= last["g_cos_target"] <= 1 and 0 <= last["g_cos_source"] <= 1
    assert "g_content_converted" not in last and "g_content" not in last  # no content model needed
    assert not any(p.requires_grad for p in embedder.parameters())  # frozen
    plain = train_vocoder(_config(2), data, tmp_path / "plain", device="cpu")
    a, b = (load_generator(tmp_path / r / "generator.pt").state_dict() for r in ("run", "plain"))
    assert any((a[k] - b[k]).abs().max() > 0 for k in a)


def test_converted_pass_on_the_synthesis_skips_the_upsampling_stack(shard_dir, tmp_path, monkeypatch):
    """``converted_pass="synthesis"``: the converted half-batch is rendered without the stack's residual (so
    its speaker loss can only move the envelopes), while the speaker's own pass keeps it."""
    from rtanon.config import ConfigError
    from rtanon.neural.vocoder import CausalNsfHifiGan

    data = ShardDataset(shard_dir)
    calls = []
    original = CausalNsfHifiGan.forward_with_mel

    def recording(self, units, f0_hz, speaker, noise, residual=True):
        calls.append((units.shape[0], residual))
        return original(self, units, f0_hz, speaker, noise, residual=residual)

    monkeypatch.setattr(CausalNsfHifiGan, "forward_with_mel", recording)

    def targets(rng, n):
        emb = rng.standard_normal((n, data.embeddings.shape[1])).astype(np.float32)
        return emb / np.linalg.norm(emb, axis=1, keepdims=True), np.full(n, 220.0, np.float32)

    base = _config(1)
    base = dataclasses.replace(base, vocoder=dataclasses.replace(base.vocoder, source_type="envelope"),
                               speaker_loss_weight=1.0, converted_fraction=0.5, residual_start_step=0,
                               adversarial_start_step=10)
    for where, want in (("output", [(2, True), (1, True)]), ("synthesis", [(2, True), (1, False)])):
        calls.clear()
        train_vocoder(dataclasses.replace(base, converted_pass=where), data, tmp_path / where, device="cpu",
                      conversion_targets=targets, speaker_model=_TinySpeakerEmbedder())
        assert calls == want, (where, calls)
    with pytest.raises(ConfigError, match="converted_pass"):
        dataclasses.replace(base, converted_pass="stack").validate()
    with pytest.raises(ConfigError, match="envelope source"):
        dataclasses.replace(_config(1), converted_pass="synthesis").validate()
