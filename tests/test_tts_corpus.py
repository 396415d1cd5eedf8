"""`rtanon lab tts-corpus`: synthetic training speech, deterministic, never from evaluation texts."""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import pytest

from rtanon.errors import UserError
from rtanon.kaldi import KaldiDir, write_map
from rtanon.train import tts_corpus
from rtanon.train.tts_corpus import Voice, plan

VOICES = [Voice("flite", f"f{i}", "m") for i in range(5)] + [Voice("espeak-ng", f"en+m{i}", "m") for i in range(60)]
TEXTS = {f"u{i:04d}": f"sentence number {i}" for i in range(400)}


def test_plan_gives_each_sentence_distinct_voices_and_balances_the_engines():
    jobs = plan(TEXTS, VOICES, per_text=2, seed=0, rate_jitter=0.15)
    assert len(jobs) == 800
    by_text = {}
    for utt, voice, text, rate in jobs:
        by_text.setdefault(text, []).append(voice)
        assert 0.86 < rate < 1.17
    assert all(len(v) == 2 and v[0] != v[1] for v in by_text.values())
    # two voices per sentence, the engines taken in turn: one of each, though espeak-ng has 12x the voices
    assert all({v.engine for v in vs} == {"flite", "espeak-ng"} for vs in by_text.values())
    flite = Counter(v.name for _, v, _, _ in jobs if v.engine == "flite")
    assert len(flite) == 5 and min(flite.values()) > 50  # every flite voice used, about 80 sentences each
    assert len({u for u, _, _, _ in jobs}) == 800  # utterance ids are unique


def test_plan_depends_only_on_the_seed_and_each_sentence():
    a = plan(TEXTS, VOICES, per_text=3, seed=7, rate_jitter=0.15)
    assert a == plan(dict(reversed(TEXTS.items())), VOICES, per_text=3, seed=7, rate_jitter=0.15)
    fewer = plan({k: TEXTS[k] for k in list(TEXTS)[:50]}, VOICES, per_text=3, seed=7, rate_jitter=0.15)
    assert fewer == [j for j in a if j[0].rsplit("-", 1)[1] in list(TEXTS)[:50]]  # a sentence's draw is its own
    assert a != plan(TEXTS, VOICES, per_text=3, seed=8, rate_jitter=0.15)


def test_plan_with_more_voices_asked_than_installed():
    jobs = plan({"u": "hello"}, VOICES[:3], per_text=5, seed=0, rate_jitter=0.0)
    assert sorted(v.name for _, v, _, _ in jobs) == ["f0", "f1", "f2"] and all(r == 1.0 for *_, r in jobs)


def test_refuses_evaluation_texts(tmp_path):
    d = tmp_path / "so762_dev"
    d.mkdir()
    with pytest.raises(UserError, match="evaluation data"):
        tts_corpus.main(["--text", str(d), "--out", str(tmp_path / "out")])


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.skipif(not (shutil.which("flite") and shutil.which("espeak-ng")),
                    reason="needs Debian's flite and espeak-ng (./setup.sh test installs them)")
def test_writes_a_kaldi_dir_that_regenerates_byte_for_byte(tmp_path):
    src = tmp_path / "train_texts"
    src.mkdir()
    texts = {"a1": "THE CAT SAT ON THE MAT", "a2": "ZERO THREE FIVE ONE", "a3": "WE CALL IT BEAR"}
    write_map(src / "text", texts)
    write_map(src / "wav.scp", {k: f"{k}.flac" for k in texts})
    write_map(src / "utt2spk", {k: "s1" for k in texts})
    write_map(src / "spk2gender", {"s1": "f"})
    args = ["--text", str(src), "--voices-per-text", "2", "--jobs", "2"]
    assert tts_corpus.main(args + ["--out", str(tmp_path / "one")]) == 0
    kd = KaldiDir.load(tmp_path / "one")
    assert len(kd.wav) == 6 and set(kd.text.values()) == set(texts.values())
    assert set(kd.utt2spk.values()) <= set(kd.spk2gender) and all(p.exists() for p in kd.wav.values())
    import soundfile as sf
    for p in kd.wav.values():
        info = sf.info(p)
        assert info.samplerate == 16000 and info.channels == 1 and 0.5 < info.duration < 5.0
    assert tts_corpus.main(args + ["--out", str(tmp_path / "two")]) == 0
    assert _digest(tmp_path / "one") == _digest(tmp_path / "two")
    # resumable: a missing file is made again, the same bytes
    next(iter(kd.wav.values())).unlink()
    assert tts_corpus.main(args + ["--out", str(tmp_path / "one")]) == 0
    assert _digest(tmp_path / "one") == _digest(tmp_path / "two")
