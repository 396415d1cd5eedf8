"""Evaluation metrics on synthetic scores with known answers."""

import numpy as np
import pytest

from rtanon.eval import metrics
from rtanon.eval.backend import PldaBackend, TwoCovPlda
from rtanon.eval.textnorm import normalize


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------ verification metrics


def test_identical_distributions_give_chance(rng):
    s = rng.normal(size=400)
    assert metrics.eer(s, s.copy()) == pytest.approx(0.5)
    assert metrics.linkability(s, s.copy()) == 0.0
    assert metrics.min_cllr(s, s.copy()) == pytest.approx(1.0)


def test_separated_distributions_give_perfect_attacker(rng):
    tar = rng.uniform(2, 3, size=300)
    non = rng.uniform(-1, 1, size=900)
    assert metrics.eer(tar, non) == 0.0
    assert metrics.linkability(tar, non) == pytest.approx(1.0)
    assert metrics.min_cllr(tar, non) == pytest.approx(0.0)


def test_eer_of_gaussians_matches_theory(rng):
    # tar ~ N(d, 1), non ~ N(0, 1): EER = Phi(-d/2)
    from scipy.stats import norm

    d = 2.0
    tar = rng.normal(d, 1, 20000)
    non = rng.normal(0, 1, 20000)
    assert metrics.eer(tar, non) == pytest.approx(norm.cdf(-d / 2), abs=0.01)
    # swapping the classes gives the worst case: the hull EER stays at 0.5
    assert metrics.eer(non, tar) == pytest.approx(0.5, abs=0.01)


def test_eer_small_example_by_hand():
    # labels by score 0 1 0 1: ROC points (P_fa, P_miss) (0.5, 0) and (0, 0.5) lie on the hull,
    # whose crossing with P_fa = P_miss is at 0.25
    assert metrics.eer([1.0, 3.0], [0.0, 2.0]) == pytest.approx(0.25)
    # labels 1 0 1 1: hull from (1, 0) to (0, 1/3), crossing the diagonal at 1/4
    assert metrics.eer([0.0, 2.0, 3.0], [1.0]) == pytest.approx(0.25)


def test_linkability_is_monotone_in_separation(rng):
    non = rng.normal(0, 1, 5000)
    values = [metrics.linkability(rng.normal(d, 1, 5000), non) for d in (0.0, 1.0, 2.0, 4.0)]
    assert values[0] < 0.1 and values == sorted(values) and values[-1] > 0.9


def test_linkability_prior_ratio():
    # 2 bins [-0.5, 0.5) and [0.5, 1.5]: every target is in the upper bin (density 1),
    # one non-target of four too (density 0.25): LR = 4 there, D = 2 * 4 / 5 - 1 = 0.6
    tar = np.array([0.5] * 3 + [1.5] * 1)
    non = np.array([0.5] * 1 + [-0.5] * 3)
    assert metrics.linkability(tar, non, n_bins=2) == pytest.approx(0.6)
    # prior ratio 0.5: D = 2 * 2 / 3 - 1 = 1/3; prior ratio 0.2: 0.2 * 4 <= 1, so D = 0
    assert metrics.linkability(tar, non, n_bins=2, prior_ratio=0.5) == pytest.approx(1 / 3)
    assert metrics.linkability(tar, non, n_bins=2, prior_ratio=0.2) == 0.0


def test_cllr_known_values(rng):
    assert metrics.cllr([0.0], [0.0]) == pytest.approx(1.0)
    assert metrics.cllr([50.0], [-50.0]) == pytest.approx(0.0, abs=1e-12)
    # confidently wrong costs more than 1 bit
    assert metrics.cllr([-5.0], [5.0]) > 1
    # perfectly calibrated Gaussian llrs: Cllr close to min Cllr
    d = 2.0
    tar = rng.normal(d, 1, 20000)
    non = rng.normal(0, 1, 20000)

    def llr(s):
        return d * s - d * d / 2  # exact log LR of N(d,1) vs N(0,1)

    c = metrics.cllr(llr(tar), llr(non))
    assert c == pytest.approx(metrics.min_cllr(tar, non), abs=0.02)
    # a miscalibrated shift costs extra
    assert metrics.cllr(llr(tar) + 3, llr(non) + 3) > c + 0.1


def test_affine_calibration_recovers_the_llr(rng):
    d = 2.0
    tar = rng.normal(d, 1, 20000)
    non = rng.normal(0, 1, 20000)
    cal = metrics.fit_affine_calibration(tar, non)
    assert cal.scale == pytest.approx(d, rel=0.05)
    assert cal.offset == pytest.approx(-d * d / 2, abs=0.1)
    sep = metrics.fit_affine_calibration([5.0, 6.0], [0.0, 1.0])  # separable: stays finite
    assert np.isfinite(sep.scale) and sep.scale > 0


def test_pav_is_isotonic():
    fit, widths = metrics.pav(np.array([1, 3, 2, 2, 5, 0, 6.0]))
    assert np.all(np.diff(fit) >= 0)
    assert widths.sum() == 7
    np.testing.assert_allclose(fit[:1], [1.0])


def test_metric_inputs_are_checked():
    with pytest.raises(ValueError, match="no scores"):
        metrics.eer([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        metrics.linkability([np.nan], [1.0])


# ------------------------------------------------------------------ closed set


def test_closed_set_rank_and_topk():
    scores = np.array([[0.9, 0.1, 0.2],   # true 0 -> rank 1
                       [0.5, 0.4, 0.6],   # true 1 -> rank 3
                       [0.3, 0.3, 0.1]])  # true 0, tie with 1 -> rank 2 (ties count against the attacker)
    ranks = metrics.closed_set_ranks(scores, np.array([0, 1, 0]))
    np.testing.assert_array_equal(ranks, [1, 3, 2])
    assert metrics.top_k_precision(ranks, 1) == pytest.approx(1 / 3)
    assert metrics.top_k_precision(ranks, 2) == pytest.approx(2 / 3)


def test_random_scores_give_chance_rank(rng):
    n_spk = 20
    scores = rng.normal(size=(5000, n_spk))
    ranks = metrics.closed_set_ranks(scores, rng.integers(0, n_spk, 5000))
    assert ranks.mean() == pytest.approx((n_spk + 1) / 2, abs=0.3)
    assert metrics.top_k_precision(ranks, 5) == pytest.approx(5 / n_spk, abs=0.02)


# ------------------------------------------------------------------ similarity matrices


def test_diagonal_dominance_limits():
    n = 6
    assert metrics.diagonal_dominance(np.eye(n)) == pytest.approx(1.0)
    assert metrics.diagonal_dominance(np.full((n, n), 0.37)) == 0.0
    assert metrics.diagonal_dominance(1 - np.eye(n)) == pytest.approx(1.0)


def test_deid_and_gvd_limits():
    n = 5
    eye, uniform = np.eye(n), np.full((n, n), 0.5)
    assert metrics.deid(eye, eye) == pytest.approx(0.0)  # pseudonymisation that does nothing
    assert metrics.deid(eye, uniform) == pytest.approx(1.0)  # no diagonal left in M_OP
    assert metrics.gvd_db(eye, eye) == pytest.approx(0.0)  # distinctiveness preserved
    assert metrics.gvd_db(eye, uniform) == float("-inf")  # all pseudo-voices alike
    half = 0.5 * eye + 0.25
    assert metrics.gvd_db(eye, half) == pytest.approx(10 * np.log10(0.5))
    with pytest.raises(ValueError, match="undefined"):
        metrics.deid(uniform, eye)


def test_similarity_matrix_averages_llrs_per_speaker_pair():
    spk = np.array(["a", "a", "b", "b"])
    llr = np.array([[9, 2, -1, -1],
                    [2, 9, -1, -1],
                    [-1, -1, 9, 4],
                    [-1, -1, 4, 9.0]])
    same = np.eye(4, dtype=bool)
    m = metrics.similarity_matrix(llr, spk, spk, ["a", "b"], exclude=same)
    np.testing.assert_allclose(m, metrics.sigmoid(np.array([[2, -1], [-1, 4.0]])))
    m_all = metrics.similarity_matrix(llr, spk, spk, ["a", "b"])  # without exclusion the self-pairs count
    assert m_all[0, 0] == pytest.approx(metrics.sigmoid(5.5))


# ------------------------------------------------------------------ utility


def test_asr_runaway_flags_a_looping_transcript_only():
    ref = "nearly all republicans voted against the measure".split()
    assert not metrics.asr_runaway(ref, ref)
    assert not metrics.asr_runaway(ref, ("yummy all red purple " * 6).split())  # 24 words: long, not a loop
    assert metrics.asr_runaway(ref, ["yummy"] + ["blue"] * 26)  # 27 > 3 x 7 + 5
    assert not metrics.asr_runaway([], "a b c d e".split()) and metrics.asr_runaway([], "a b c d e f".split())


def test_utility_splits_errors_and_leaves_runaways_out_beside_the_wer():
    from rtanon.eval.utility import utility_scores as _utility

    refs = {"u1": "bill likes yellow".split(), "u2": "a b c d".split()}
    anon = {"text:tiny.en": {"u1": "here likes yellow", "u2": "a b " + "blue " * 40},
            "text:base": {"u1": "bill likes yellow", "u2": "a b c"}, "f0": {},
            "phones": {"u1": "b u l l aɪ k s j ɛ l oʊ".split(), "u2": ["eɪ"]}}
    ref_phones = {"u1": "b ɪ l l aɪ k s j ɛ l oʊ".split(), "u2": ["eɪ", "b", "i"]}
    out = _utility({"f0": {}}, anon, refs, ("tiny.en", "base"), ref_phones)
    assert out["wer_words"] == 7 and out["asr_runaways"] == ["u2"]
    assert out["wer"] == pytest.approx((1 + 2 + 38) / 7)  # u2: c, d substituted, 38 blues inserted
    assert out["wer_split"] == pytest.approx({"substitutions": 3 / 7, "deletions": 0.0, "insertions": 38 / 7})
    assert out["wer_without_runaways"] == pytest.approx(1 / 3)
    assert out["asr"]["tiny.en"]["wer"] == out["wer"]  # the first model is the headline
    assert out["asr"]["base"]["wer"] == pytest.approx(1 / 7) and out["asr"]["base"]["asr_runaways"] == []
    assert out["per"] == pytest.approx((1 + 2) / 14) and out["per_phones"] == 14


def test_word_errors():
    assert metrics.word_errors("a b c".split(), "a b c".split()) == 0
    assert metrics.word_errors("a b c".split(), "a x c d".split()) == 2
    assert metrics.word_errors([], "a b".split()) == 2
    assert metrics.word_errors("a b".split(), []) == 2
    assert metrics.error_counts("a b c".split(), "a x c d".split()) == (1, 0, 1)
    assert metrics.error_counts("a b c".split(), "a c".split()) == (0, 1, 0)
    assert metrics.error_counts([], "a b".split()) == (0, 0, 2)


def test_pearson_voiced_uses_frames_voiced_in_both():
    a = np.array([0, 100, 110, 120, 130, 0, 140.0])
    b = np.array([90, 200, 220, 240, 260, 250, 0.0])  # exactly 2x on the shared voiced frames
    assert metrics.pearson_voiced(a, b) == pytest.approx(1.0)
    assert metrics.pearson_voiced(a, -b + 1000 * (b > 0)) == pytest.approx(-1.0)
    assert metrics.pearson_voiced(a, np.zeros(7)) is None


@pytest.mark.parametrize("ref, hyp", [
    ("TWO TWO ZERO FOUR", "2, 2, 0, 4."),
    ("TWO TWO ZERO FOUR", "2204"),
    ("TWENTY ONE", "21"),
    ("TWENTY ONE", "twenty-one"),
    ("ONE HUNDRED AND FIVE DOGS", "105 dogs"),
    ("IT'S NINETEEN EIGHTY FOUR", "It's 1984!"),
    ("HERE IS LYNDA'S PEN", "Here is Lynda's pen."),
    ("A THOUSAND PEOPLE", "a 1,000 people"),
])
def test_text_normalisation_equates_spellings(ref, hyp):
    assert normalize(ref) == normalize(hyp)


def test_text_normalisation_keeps_real_differences():
    assert normalize("TWENTY ONE") != normalize("20")
    assert normalize("TWO TWO ZERO FOUR") == ["2", "2", "0", "4"]
    # a misheard digit is one error, not the whole digit string
    assert metrics.word_errors(normalize("TWO NINE SIX FOUR"), normalize("two nice six four.")) == 1
    assert normalize("BILL LIKES YELLOW") == ["bill", "likes", "yellow"]
    assert normalize("no one knows") == ["no", "1", "knows"]


# ------------------------------------------------------------------ PLDA backend


def _two_cov_data(rng, n_spk, n_utt, d=6, between=2.0, within=0.5):
    a = rng.normal(size=(d, d))
    b = between * (a @ a.T / d + np.eye(d) * 0.1)
    w = within * np.eye(d)
    y = rng.multivariate_normal(np.zeros(d), b, size=n_spk)
    x = np.repeat(y, n_utt, axis=0) + rng.multivariate_normal(np.zeros(d), w, size=n_spk * n_utt)
    return x + 3.0, np.repeat(np.arange(n_spk), n_utt), b, w


def test_plda_llr_matches_the_gaussian_formula(rng):
    x, labels, b, w = _two_cov_data(rng, 300, 5)
    plda = TwoCovPlda.fit(x, labels, shrink=0.0)
    # brute force llr for one enrolment of n vectors (mean) against one test vector
    from scipy.stats import multivariate_normal as mvn

    bm = np.linalg.inv(plda.transform)  # back to the original space: B = T^-1 diag(psi) T^-T, W = T^-1 T^-T
    B = bm @ np.diag(plda.psi) @ bm.T
    W = bm @ bm.T
    n = 3
    enroll = x[:n].mean(axis=0, keepdims=True)
    test = x[10:11]
    joint = np.block([[B + W / n, B], [B, B + W]])
    mu2 = np.concatenate([plda.mu, plda.mu])
    brute = (mvn(mu2, joint).logpdf(np.concatenate([enroll[0], test[0]]))
             - mvn(plda.mu, B + W / n).logpdf(enroll[0]) - mvn(plda.mu, B + W).logpdf(test[0]))
    assert plda.llr(enroll, n, test)[0, 0] == pytest.approx(brute, rel=1e-6, abs=1e-6)
    # the moment estimates recover the generating covariances
    np.testing.assert_allclose(W, w, atol=0.08)
    np.testing.assert_allclose(B, b, atol=0.5)


def test_plda_backend_separates_held_out_speakers(rng):
    x, labels, _, _ = _two_cov_data(rng, 260, 4, d=10)
    train = labels < 200
    backend = PldaBackend.fit(x[train], labels[train], lda_dim=8)
    test_x, test_l = x[~train], labels[~train]
    enroll = [test_x[test_l == s][:2] for s in np.unique(test_l)]
    trials = np.concatenate([test_x[test_l == s][2:] for s in np.unique(test_l)])
    truth = np.repeat(np.arange(len(enroll)), 2)
    llr = backend.score(enroll, trials)
    is_tar = np.arange(len(enroll))[:, None] == truth[None, :]
    tar, non = llr[is_tar], llr[~is_tar]
    assert metrics.eer(tar, non) < 0.05
    # PLDA outputs are llrs: already roughly calibrated
    assert metrics.cllr(tar, non) < 0.5
