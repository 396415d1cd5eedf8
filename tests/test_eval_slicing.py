"""Word-level slicing (paper 004, Algorithm 1) and the slicing attacker's protocol and scoring."""

import numpy as np
import pytest

from rtanon.eval import metrics, scenarios
from rtanon.eval.slicing import (clean_words, cut, slice_bounds, slice_embeddings, slice_id, slice_utt,
                                 sliced_split)


@pytest.fixture
def rng():
    return np.random.default_rng(26)


def test_algorithm_1_by_hand():
    # words at [0.2, 0.6] [0.7, 1.1] [1.3, 1.5] [1.6, 2.4] [2.5, 2.8], 3.0 s of audio, delta 1 s
    words = [(0.2, 0.6, "a"), (0.7, 1.1, "b"), (1.3, 1.5, "c"), (1.6, 2.4, "d"), (2.5, 2.8, "e")]
    # slice 1 from 0: next word after "a" starts at 0.7 (< 1), after "b" at 1.3 (>= 1): [0, 1.3], words a b
    # slice 2 from the end of "b" (1.1): after "c" 1.6 - 1.1 < 1, after "d" 2.5 - 1.1 >= 1: [1.1, 2.5], c d
    # rest from 2.4: after "e" the end of the audio, 3.0 - 2.4 < 1: discarded
    assert slice_bounds(words, 3.0, 1.0) == [(0.0, 1.3, 0, 2), (1.1, 2.5, 2, 4)]
    # the last word closes a slice at the end of the audio when it is long enough
    assert slice_bounds(words, 3.6, 1.0)[-1] == (2.4, 3.6, 4, 5)
    assert slice_bounds([], 5.0, 1.0) == []
    assert slice_bounds([(0.1, 0.4, "x")], 0.9, 1.0) == []  # too short for one slice
    with pytest.raises(ValueError, match="positive"):
        slice_bounds(words, 3.0, 0.0)


def test_slices_respect_word_boundaries_and_length(rng):
    for trial in range(50):
        n = int(rng.integers(1, 40))
        gaps = rng.uniform(0.0, 0.3, n)
        lens = rng.uniform(0.1, 0.7, n)
        starts = np.cumsum(gaps + np.concatenate([[0.0], lens[:-1]]))
        words = [(float(s), float(s + ln), f"w{i}") for i, (s, ln) in enumerate(zip(starts, lens))]
        duration = float(words[-1][1] + rng.uniform(0.0, 0.5))
        delta = float(rng.choice([0.5, 1.0, 1.5]))
        bounds = slice_bounds(words, duration, delta)
        assert bounds == slice_bounds(words, duration, delta)  # deterministic
        cuts = {0.0, duration} | {w[0] for w in words} | {w[1] for w in words}
        prev_last = 0
        for start, end, first, last in bounds:
            assert start in cuts and end in cuts  # cut only at word boundaries (or the ends)
            assert first == prev_last and last > first  # consecutive words, none skipped or repeated
            assert start == (0.0 if first == 0 else words[first - 1][1])  # from the previous word's end
            assert end == (words[last][0] if last < n else duration)  # to the next word's start
            assert end - start >= delta - 1e-9  # at least delta ...
            # ... and minimal: without its last word the slice would be shorter than delta
            assert last - 1 == first or words[last - 1][0] - start < delta
            prev_last = last
        # only a rest shorter than delta is discarded
        rest_start = 0.0 if prev_last == 0 else words[prev_last - 1][1]
        assert duration - rest_start < delta or prev_last == n


def test_whisper_like_timings_are_cleaned():
    # overlapping words and a word running past the end of the audio
    words = clean_words([(0.0, 0.9, "a"), (0.8, 1.5, "b"), (1.4, 2.6, "c")], 2.5)
    assert words == [(0.0, 0.9, "a"), (0.9, 1.5, "b"), (1.5, 2.5, "c")]


def test_cut_takes_the_samples_of_each_slice():
    x = np.arange(48000, dtype=np.float32)
    a, b = cut(x, [(0.0, 1.3, 0, 2), (1.1, 2.5, 2, 4)])
    assert a.shape == (20800,) and a[0] == 0 and a[-1] == 20799
    assert b.shape == (22400,) and b[0] == 17600


def test_sliced_split_protocol():
    split = scenarios.Split(speakers=["s1", "s2", "s3"], gender={"s1": "f", "s2": "f", "s3": "m"},
                            enroll={"s1": ["u1"], "s2": ["u3"], "s3": ["u5"]}, trials=["u2", "u4", "u6"],
                            utt2spk={"u1": "s1", "u2": "s1", "u3": "s2", "u4": "s2", "u5": "s3", "u6": "s3"})
    sl = sliced_split(split, {"u1": 2, "u2": 3, "u3": 1, "u4": 0, "u6": 2})  # u5 has no slice: s3 is dropped
    assert sl.speakers == ["s1", "s2"]
    assert sl.enroll == {"s1": ["u1#0", "u1#1"], "s2": ["u3#0"]}
    assert sl.trials == ["u2#0", "u2#1", "u2#2"]
    assert all(sl.utt2spk[t] == "s1" for t in sl.trials)
    assert slice_utt(slice_id("so_01#x", 4)) == "so_01#x"
    emb = slice_embeddings({"u1": np.eye(3)[:2]})
    assert sorted(emb) == ["u1#0", "u1#1"] and emb["u1#1"][1] == 1.0


def _synthetic(rng, n_spk=8, dim=16, noise=0.3):
    """Speakers as orthogonal-ish directions; slices are noisy copies."""
    centres = rng.normal(size=(n_spk, dim))
    speakers = [f"s{i}" for i in range(n_spk)]
    gender = {s: "fm"[i % 2] for i, s in enumerate(speakers)}
    enroll, trials, utt2spk, per_utt = {}, [], {}, {}
    for i, s in enumerate(speakers):
        enroll[s] = [f"{s}e"]
        trials += [f"{s}t{j}" for j in range(2)]
        for u in [f"{s}e", f"{s}t0", f"{s}t1"]:
            utt2spk[u] = s
            per_utt[u] = centres[i] + noise * rng.normal(size=(3, dim))
    split = scenarios.Split(speakers=speakers, gender=gender, enroll=enroll, trials=sorted(trials),
                            utt2spk=utt2spk)
    return split, per_utt


def test_slice_scoring_finds_the_speakers_when_they_are_separable(rng):
    split, per_utt = _synthetic(rng)
    sl = sliced_split(split, {u: len(v) for u, v in per_utt.items()})
    emb = slice_embeddings(per_utt)
    cal = metrics.fit_affine_calibration(np.array([0.9, 0.8]), np.array([0.1, 0.0]))
    res = scenarios.evaluate_attack(sl, emb, emb, scenarios.CosineScorer(), cal)
    m = res.metrics
    assert m["n_target"] == 8 * 2 * 3  # every trial slice against its speaker (enrolled with 3 slices)
    assert m["n_nontarget"] == 8 * 2 * 3 * 3  # ... and the 3 other speakers of its gender
    assert m["eer"] == 0.0 and m["linkability"] > 0.95 and m["top1"] == 1.0 and m["rank_mean"] == 1.0
    # the enrolment side is the mean of the speaker's slices: the score of a trial slice is its cosine
    # with that mean
    e = np.mean([v / np.linalg.norm(v) for v in per_utt["s0e"]], axis=0)
    t = emb["s0t0#1"]
    expected = e @ t / np.linalg.norm(e) / np.linalg.norm(t)
    assert res.tar[1] == pytest.approx(expected)


def test_slice_scoring_is_at_chance_when_slices_carry_no_speaker(rng):
    split, per_utt = _synthetic(rng, n_spk=12)
    per_utt = {u: rng.normal(size=v.shape) for u, v in per_utt.items()}  # no speaker information left
    sl = sliced_split(split, {u: len(v) for u, v in per_utt.items()})
    emb = slice_embeddings(per_utt)
    cal = metrics.fit_affine_calibration(np.array([0.9, 0.8]), np.array([0.1, 0.0]))
    m = scenarios.evaluate_attack(sl, emb, emb, scenarios.CosineScorer(), cal).metrics
    assert m["eer"] > 0.3 and m["linkability"] < 0.35


def test_pairwise_trials_leave_out_pairs_within_a_group():
    emb = np.eye(4)
    spk = np.array(["a", "a", "a", "b"])
    gen = np.array(["f"] * 4)
    tar, non = scenarios.pairwise_trials(emb, spk, gen, scenarios.CosineScorer())
    assert tar.size == 3 and non.size == 3
    tar, non = scenarios.pairwise_trials(emb, spk, gen, scenarios.CosineScorer(),
                                         groups=np.array(["u1", "u1", "u2", "u3"]))
    assert tar.size == 2 and non.size == 3  # the pair of slices of u1 is gone
