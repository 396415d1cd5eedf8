"""The ``neural`` method: the per-session stage, its alignment and latency, and the engine around it.

These tests run on a randomly initialised vocoder exported to ONNX (the behaviour under test does not
depend on the weights); the shipped weights, when present, get a test of their own."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from rtanon.config import AnonymizerConfig, ConfigError, NeuralConfig  # noqa: E402
from rtanon.engine import Anonymizer  # noqa: E402


@pytest.fixture(scope="module")
def random_vocoder(tmp_path_factory):
    import torch

    from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig
    from rtanon.train.export import export_vocoder_onnx as export_onnx

    torch.manual_seed(0)  # the shipped architecture: envelope source, pre-net, upsampling stack
    model = HarmonicNoiseVocoder(VocoderConfig())
    with torch.no_grad():  # random envelopes and a non-zero residual, so every part of the graph matters
        model.env_head.weight.add_(0.1 * torch.randn_like(model.env_head.weight))
        model.conv_post.conv.parametrizations.weight.original0.fill_(0.1)
    return export_onnx(model, tmp_path_factory.mktemp("voc") / "vocoder.onnx")


@pytest.fixture(scope="module")
def model(random_vocoder):
    from rtanon.stages.neural import NeuralVoiceModel

    return NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(random_vocoder)))


@pytest.fixture(scope="module")
def model_unscaled(random_vocoder):
    from rtanon.stages.neural import NeuralVoiceModel

    return NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(random_vocoder), match_loudness=False))


@pytest.fixture(scope="module")
def identity(model):
    return model.new_identity(np.random.default_rng(1))


def _run_stage(model, identity, x: np.ndarray, hop: int) -> np.ndarray:
    stage = model.open_stream(hop, identity, np.random.default_rng(7))
    n = len(x) // hop * hop
    return np.concatenate([stage.process(x[i:i + hop]) for i in range(0, n, hop)])


def test_any_chunking_gives_the_same_audio(model, identity, speech):
    x = speech[:16000 * 2]  # 2 s, a multiple of 640
    outs, delays = {}, {}
    for hop in (160, 320, 480, 640):
        outs[hop] = _run_stage(model, identity, x, hop)
        delays[hop] = model.open_stream(hop, identity, np.random.default_rng(7)).latency_samples
        assert not outs[hop][:delays[hop]].any()  # silence until the first frame is ready
    assert delays == {160: 480, 320: 320, 480: 480, 640: 320}
    aligned = {hop: o[delays[hop]:] for hop, o in outs.items()}
    n = min(len(o) for o in aligned.values())
    for hop in (160, 480, 640):
        np.testing.assert_allclose(aligned[hop][:n], aligned[320][:n], atol=1e-4, err_msg=f"hop {hop}")


def test_stage_delay_covers_f0_and_content_lookahead():
    """A content lookahead of one frame waits no longer than the F0 tracker's 20 ms; two frames would."""
    from rtanon.stages.neural import stage_delay_samples

    for hop, delay in {160: 480, 320: 320, 480: 480, 640: 320}.items():
        assert stage_delay_samples(hop, 2) == stage_delay_samples(hop, 2, 1) == delay
    assert stage_delay_samples(320, 2, 2) == 640
    assert stage_delay_samples(320, 0, 0) == 0


def test_stream_equals_offline_pipeline_with_stated_delay(model_unscaled, identity, speech):
    """Streaming parity: the stage's output equals the offline pipeline (whole-utterance content encoder, F0
    track, the same frame-by-frame pitch mapping, one vocoder call) delayed by ``latency_samples``."""
    model = model_unscaled
    from rtanon.f0.convert import PitchConversionConfig, StreamingPitchConverter, TargetPitch
    from rtanon.f0.tracker import track

    x = speech[:16000 * 2]
    hop = 320
    streamed = _run_stage(model, identity, x, hop)
    stage = model.open_stream(hop, identity, np.random.default_rng(7))
    delay = stage.latency_samples
    assert delay == 320

    units = model.content.analyze(x)[1]  # z; frame t: the network's output t + lookahead
    conv = StreamingPitchConverter(TargetPitch.from_quantiles(identity.f0_quantiles_hz),
                                   PitchConversionConfig(method="percentile"))
    f0 = np.concatenate([conv.process(v[None]) for v in track(x)]).astype(np.float32)
    frames = min(units.shape[0], f0.shape[0] // 2)
    rng = np.random.default_rng(7)
    noise = rng.standard_normal((1, 320 * frames), dtype=np.float32)
    backend = model.backend
    offline, _ = backend.step(units[None, :frames], f0[None, :2 * frames], identity.embedding[None].astype(np.float32),
                              noise, backend.init_state(1))
    offline = offline[0]
    np.testing.assert_array_equal(streamed[:delay], 0.0)  # the first 20 ms are silence, never input
    m = min(len(streamed) - delay, len(offline))
    assert m > 16000
    np.testing.assert_allclose(streamed[delay:delay + m], offline[:m], atol=1e-4)


def test_loudness_follows_the_input_frame_by_frame(model, model_unscaled, identity, speech):
    x = speech[:16000 * 2]
    scaled = _run_stage(model, identity, x, 320)[320:]
    raw = _run_stage(model_unscaled, identity, x, 320)[320:]
    n = len(scaled) // 320
    rms = lambda a: np.sqrt(np.mean(np.square(a[:n * 320].reshape(n, 320)), axis=1))  # noqa: E731
    r_in, r_raw, r_out = rms(x), rms(raw), rms(scaled)
    # where the gain is not clipped (12 dB) the frame's energy is the input's (the ramp from the previous
    # frame's gain blurs it a little); silence in gives silence out
    ok = (r_in[1:] < 3.9 * r_raw[1:]) & (r_in[:-1] < 3.9 * r_raw[:-1]) & (r_in[1:] > 1e-3)
    assert ok.sum() > 20
    ratio = r_out[1:][ok] / r_in[1:][ok]
    assert np.median(np.abs(20 * np.log10(ratio))) < 3.0
    silent = np.zeros(16000, np.float32)
    assert np.abs(_run_stage(model, identity, silent, 320)).max() == 0.0


def test_engine_session_latency_voice_and_length(random_vocoder, speech):
    cfg = replace(AnonymizerConfig(), method="neural", neural=NeuralConfig(vocoder_onnx=str(random_vocoder)))
    anon = Anonymizer(cfg)
    s1, s2 = anon.open_session(), anon.open_session()
    assert s1.algorithmic_latency_samples == 320 + 320  # 20 ms chunk + 20 ms (F0 lookahead of the last frame)
    assert s1.voice["method"] == "neural"
    # privacy by default: every session draws its own pseudo-speaker
    assert not np.allclose(s1.stages[0].identity.embedding, s2.stages[0].identity.embedding)
    y = s1.process_signal(speech)
    assert y.shape == speech.shape and np.isfinite(y).all()
    assert s1.counters.stage_errors == 0 and s1.stages[0].underruns == 0


def test_pinned_identity_is_used(random_vocoder, model, identity):
    cfg = replace(AnonymizerConfig(), method="neural", neural=NeuralConfig(vocoder_onnx=str(random_vocoder)))
    s = Anonymizer(cfg).open_session(identity=identity)
    np.testing.assert_array_equal(s.stages[0].identity.embedding, identity.embedding)
    assert s.voice["median_f0_hz"] == round(identity.median_f0_hz, 1)


def test_the_voice_tag_stays_with_an_identity_and_tells_twins_apart(random_vocoder, identity):
    from rtanon.live.control import describe_voice

    cfg = replace(AnonymizerConfig(), method="neural", neural=NeuralConfig(vocoder_onnx=str(random_vocoder)))
    anon = Anonymizer(cfg)
    a, b = (anon.open_session(identity=identity).voice for _ in range(2))
    assert a["tag"] == b["tag"] and a["tag"] in describe_voice(a)
    twin = anon.open_session(identity=replace(identity, embedding=-identity.embedding)).voice
    assert (twin["gender"], twin["median_f0_hz"]) == (a["gender"], a["median_f0_hz"])
    assert twin["tag"] != a["tag"] and describe_voice(twin) != describe_voice(a)


def test_a_new_voice_is_a_pseudo_speaker_unlike_the_old_one(random_vocoder):
    from rtanon.methods import NEW_VOICE_MAX_COSINE

    cfg = replace(AnonymizerConfig(), method="neural", neural=NeuralConfig(vocoder_onnx=str(random_vocoder)))
    anon = Anonymizer(cfg)
    plain, unlike = [], []
    for seed in range(30):
        old = anon.open_session(seed=seed)
        e_old = old.stages[0].identity.embedding
        for out, kwargs in ((plain, {}), (unlike, {"unlike": old})):
            e = anon.open_session(seed=seed + 1000, **kwargs).stages[0].identity.embedding
            out.append(float(e @ e_old) / float(np.linalg.norm(e) * np.linalg.norm(e_old)))
    assert max(unlike) <= NEW_VOICE_MAX_COSINE
    assert np.mean(np.array(plain) > NEW_VOICE_MAX_COSINE) > 0.2  # without it, close voices are common
    mcadams = Anonymizer(replace(cfg, method="mcadams")).open_session(seed=0)
    assert anon.open_session(seed=3, unlike=mcadams).voice == anon.open_session(seed=3).voice  # another method's


def test_missing_vocoder_is_a_clear_error(tmp_path):
    from rtanon.stages.neural import NeuralVoiceModel, VocoderMissing

    with pytest.raises(VocoderMissing, match="no such vocoder"):
        NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(tmp_path / "none.onnx")))


def test_bad_neural_settings_are_rejected():
    from rtanon.config import ConfigError

    for bad in (dict(backend="cuda"), dict(strategy="near"), dict(pitch_method="octave"), dict(gender="x")):
        with pytest.raises(ConfigError):
            NeuralConfig(**bad).validate()


def test_bench_reports_neural_parts_and_batched_streams(random_vocoder, speech):
    from rtanon import bench

    cfg = replace(AnonymizerConfig(), method="neural", neural=NeuralConfig(vocoder_onnx=str(random_vocoder)))
    anon = Anonymizer(cfg)
    result = bench.bench_compute(anon, speech[:16000])
    assert result["backend"] == "onnxruntime" and result["algorithmic_latency_ms"] == 40.0
    assert set(result["stages"]) >= {"NeuralVoiceStage"} and not any(k.startswith(" ") for k in result["stages"])
    assert set(result["stages"]["NeuralVoiceStage"]["parts"]) == {"content", "f0+pitch", "vocoder"}
    streams = bench.bench_streams(anon, max_streams=2, calls=3)
    assert [r["streams"] for r in streams["batches"]][0] == 1
    assert all(r["step_p99_ms"] > 0 for r in streams["batches"])
    with pytest.raises(ValueError, match="neural"):
        bench.bench_streams(Anonymizer(AnonymizerConfig(method="mcadams")), max_streams=1)


def test_bench_streams_bisects_between_the_doublings():
    """A fake backend whose batched step takes 0.7 ms per session on a fake clock: real-time (p99 < 20 ms)
    up to 28 sessions. Doubling stops at 32; bisection finds 28, not the power of two 16."""
    from types import SimpleNamespace

    from rtanon import bench

    now = [0]

    class Backend:
        def init_state(self, batch):
            return None

        def step(self, units, f0_hz, speaker, noise, state):
            now[0] += int(0.7e6) * units.shape[0]
            return np.zeros((units.shape[0], 320), np.float32), state

    model = SimpleNamespace(backend=Backend(), vocoder_config=SimpleNamespace(units_dim=8, speaker_dim=4))
    anon = SimpleNamespace(config=SimpleNamespace(method="neural", neural=SimpleNamespace(backend="fake")),
                           method=SimpleNamespace(model=model))
    result = bench.bench_streams(anon, max_streams=4096, calls=3, clock=lambda: now[0])
    assert result["max_realtime_streams"] == 28
    sizes = [r["streams"] for r in result["batches"]]
    assert sizes == sorted(sizes) and {1, 2, 4, 8, 16, 32, 28} <= set(sizes) and max(sizes) == 32
    assert all(r["realtime"] == (r["streams"] <= 28) for r in result["batches"])
    # a cap below the limit: every doubling passes, nothing to bisect
    assert bench.bench_streams(anon, max_streams=20, calls=3, clock=lambda: now[0])["max_realtime_streams"] == 16


def test_cli_vocoder_option_runs_given_weights_and_refuses_a_mismatch(random_vocoder, tmp_path):
    import soundfile as sf

    from rtanon.cli import main

    x = (0.1 * np.sin(2 * np.pi * 150 * np.arange(16000) / 16000)).astype(np.float32)
    sf.write(tmp_path / "in.wav", x, 16000)
    assert main(["file", str(tmp_path / "in.wav"), str(tmp_path / "out.wav"), "--method", "neural",
                 "--vocoder", str(random_vocoder), "--seed", "1"]) == 0
    assert sf.info(str(tmp_path / "out.wav")).frames == 16000
    assert main(["file", str(tmp_path / "in.wav"), str(tmp_path / "out2.wav"), "--method", "neural",
                 "--vocoder", str(tmp_path / "generator.pt")]) == 2  # onnxruntime runs graphs, not checkpoints
    assert not (tmp_path / "out2.wav").exists()


def test_a_vocoder_for_another_content_width_is_refused(tmp_path):
    """The content encoder feeds 256-dim projections; a vocoder that expects another width is refused with
    the widths in the message."""
    import torch

    from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig
    from rtanon.stages.neural import NeuralVoiceModel
    from rtanon.train.export import export_vocoder_onnx as export_onnx

    torch.manual_seed(0)
    bad = export_onnx(HarmonicNoiseVocoder(VocoderConfig(units_dim=100, prenet_dilations=(1,), initial_channels=64)),
                      tmp_path / "bad.onnx")
    with pytest.raises(ConfigError, match="256"):
        NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(bad)))


def test_the_vocoder_runs_only_with_the_content_encoder_it_was_trained_on(tmp_path):
    """A vocoder whose config names a content encoder (sha256 of its graph) runs with that encoder, packaged
    or given with ``--content``, and is refused with any other: another encoder's content would come out as
    noise, not as speech."""
    import hashlib

    import onnx
    import soundfile as sf
    import torch

    from rtanon.cli import main
    from rtanon.content.stream import ContentEncoderModel, packaged_model_path
    from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig
    from rtanon.train.export import export_vocoder_onnx as export_onnx
    from rtanon.stages.neural import NeuralVoiceModel

    packaged = ContentEncoderModel().sha256
    with packaged_model_path() as p:
        assert packaged == hashlib.sha256(p.read_bytes()).hexdigest()
        graph = onnx.load(str(p))
    prop = graph.metadata_props.add()
    prop.key, prop.value = "note", "a retrained encoder"
    other = tmp_path / "other_content.onnx"
    onnx.save(graph, str(other))
    other_sha = hashlib.sha256(other.read_bytes()).hexdigest()
    assert other_sha != packaged

    def vocoder(content_sha256: str, name: str):
        torch.manual_seed(0)
        return export_onnx(HarmonicNoiseVocoder(VocoderConfig(prenet_dilations=(1,), initial_channels=64,
                                                              content_sha256=content_sha256)), tmp_path / name)

    for_packaged, for_other = vocoder(packaged, "a.onnx"), vocoder(other_sha, "b.onnx")
    NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(for_packaged)))
    NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(for_other), content_onnx=str(other)))
    with pytest.raises(ConfigError, match="trained on the output of content encoder"):
        NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(for_other)))
    with pytest.raises(ConfigError, match="trained on the output of content encoder"):
        NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(for_packaged), content_onnx=str(other)))
    with pytest.raises(ConfigError, match="trained on the output of content encoder"):
        NeuralVoiceModel(NeuralConfig(content_onnx=str(other)))  # the shipped vocoder records none: packaged
    with pytest.raises(ConfigError, match="no such content encoder"):
        NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(for_packaged), content_onnx=str(tmp_path / "none.onnx")))
    with pytest.raises(ConfigError, match=".onnx"):
        NeuralConfig(content_onnx="encoder.pt").validate()

    x = (0.1 * np.sin(2 * np.pi * 150 * np.arange(8000) / 16000)).astype(np.float32)
    sf.write(tmp_path / "in.wav", x, 16000)
    run = ["file", str(tmp_path / "in.wav"), str(tmp_path / "out.wav"), "--method", "neural", "--seed", "1",
           "--vocoder", str(for_other)]
    assert main(run) == 2 and not (tmp_path / "out.wav").exists()
    assert main([*run, "--content", str(other)]) == 0
    assert sf.info(str(tmp_path / "out.wav")).frames == 8000


def test_each_privacy_point_runs_its_own_shipped_content_encoder_and_a_vocoder_its_recorded_one():
    """balanced reads the streaming Whisper encoder's 384-dim z, strong version 4's 256-dim z; a vocoder
    given without --content runs with the shipped encoder it records (version 4 when it records none)."""
    import hashlib
    from importlib import resources

    from rtanon.stages.neural import PACKAGED_CONTENT, NeuralVoiceModel, packaged_ref

    def digest(name):
        return hashlib.sha256((resources.files("rtanon") / "models" / "content" / name).read_bytes()).hexdigest()

    balanced, strong = NeuralVoiceModel(NeuralConfig()), NeuralVoiceModel(NeuralConfig(privacy="strong"))
    assert balanced.content.sha256 == digest(PACKAGED_CONTENT["balanced"]) == balanced.vocoder_config.content_sha256
    assert strong.content.sha256 == digest(PACKAGED_CONTENT["strong"]) != balanced.content.sha256
    assert (balanced.content.output_dim, strong.content.output_dim) == (384, 256)
    assert balanced.content.lookahead_frames == strong.content.lookahead_frames == 1
    with resources.as_file(packaged_ref("vocoder.onnx", "balanced")) as p:
        given = NeuralVoiceModel(NeuralConfig(privacy="strong", vocoder_onnx=str(p)))
    assert given.content.sha256 == balanced.content.sha256
    with resources.as_file(packaged_ref("vocoder.onnx", "strong")) as p:  # records none: version 4
        assert NeuralVoiceModel(NeuralConfig(vocoder_onnx=str(p))).content.sha256 == strong.content.sha256
