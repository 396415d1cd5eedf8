"""Privacy and utility metrics, pure numpy.

Verification scores (``tar``: same-speaker trials, ``non``: different-speaker
trials; 1-D float arrays, higher = more alike):

- ``eer(tar, non)``: equal error rate on the ROC convex hull (BOSARIS
  ``rocch2eer``), in [0, 0.5].
- ``cllr(tar_llr, non_llr)``: log-likelihood-ratio cost in bits (scores must be
  natural-log LRs); ``min_cllr(tar, non)``: Cllr after the optimal monotone
  (PAV) calibration, in [0, 1].
- ``linkability(tar, non)``: global linkability D<->sys of Gomez-Barrero et al.
  (paper 000 Eq. 3, histogram estimate as in Maouche's reference code), in [0, 1].
- ``fit_affine_calibration`` / ``AffineCalibration``: scores -> llr by
  prior-weighted logistic regression (BOSARIS-style linear calibration).
- ``closed_set_ranks(scores, true_index)``: rank of the true speaker per trial
  (paper 000 Sec. VI); ``top_k_precision(ranks, k)``.

Voice similarity matrices (paper 001 Eq. 2-5):

- ``similarity_matrix(llr, spk_rows, spk_cols, exclude)``: S(i, j) = sigmoid of
  the mean llr between the segments of speakers i and j.
- ``diagonal_dominance(M)``, ``deid(M_oo, M_op)``, ``gvd_db(M_oo, M_pp)``.

Utility: ``word_errors(ref, hyp)`` (Levenshtein on word lists; ``error_counts`` splits it) and
``pearson_voiced(f0_a, f0_b)`` (F0 correlation on frames voiced in both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------- helpers


def _as_scores(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{name}: no scores; a metric needs at least one target and one non-target trial")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: scores must be finite (got NaN or inf)")
    return a


def pav(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators isotonic regression of ``y`` (1-D, in the given
    order). Returns ``(fitted, widths)``: the non-decreasing fit (same length)
    and the width of each constant block, left to right."""
    y = np.asarray(y, dtype=np.float64)
    means: list[float] = []
    widths: list[int] = []
    for v in y:
        means.append(float(v))
        widths.append(1)
        while len(means) > 1 and means[-2] >= means[-1]:
            w = widths[-2] + widths[-1]
            means[-2] = (means[-2] * widths[-2] + means[-1] * widths[-1]) / w
            widths[-2] = w
            means.pop()
            widths.pop()
    w = np.asarray(widths, dtype=np.int64)
    return np.repeat(np.asarray(means), w), w


def _sorted_labels(tar: np.ndarray, non: np.ndarray) -> np.ndarray:
    """Labels (1 target, 0 non-target) sorted by ascending score. Ties put
    targets first, the pessimistic order (BOSARIS), so PAV pools them."""
    scores = np.concatenate([tar, non])
    labels = np.concatenate([np.ones(tar.size), np.zeros(non.size)])
    order = np.argsort(scores, kind="stable")
    return labels[order]


# --------------------------------------------------------------------------- verification


def rocch(tar, non) -> tuple[np.ndarray, np.ndarray]:
    """ROC convex hull: ``(p_miss, p_fa)`` at its vertices (BOSARIS ``rocch``)."""
    tar = _as_scores(tar, "target scores")
    non = _as_scores(non, "non-target scores")
    labels = _sorted_labels(tar, non)
    _, widths = pav(labels)
    n_tar, n_non = tar.size, non.size
    ends = np.concatenate([[0], np.cumsum(widths)])
    cum_tar = np.concatenate([[0.0], np.cumsum(labels)])
    miss = cum_tar[ends]  # targets at or below each block boundary
    fa = n_non - (ends - miss)  # non-targets above the boundary
    return miss / n_tar, fa / n_non


def eer(tar, non) -> float:
    """Equal error rate on the ROC convex hull (BOSARIS ``rocch2eer``).

    Identical target and non-target scores give 0.5; every target above every
    non-target gives 0.
    """
    p_miss, p_fa = rocch(tar, non)
    best = 0.0
    for i in range(p_miss.size - 1):
        xx = p_fa[i:i + 2]
        yy = p_miss[i:i + 2]
        if xx[0] == xx[1] or yy[0] == yy[1]:
            continue  # horizontal or vertical hull segment: candidate 0
        xy = np.array([[xx[0], yy[0]], [xx[1], yy[1]]])
        seg = np.linalg.solve(xy, np.ones(2))
        best = max(best, 1.0 / seg.sum())
    return float(best)


def cllr(tar_llr, non_llr) -> float:
    """Log-likelihood-ratio cost in bits; inputs are natural-log LRs.

    0 for perfect, 1 for an uninformative system that always says llr = 0,
    above 1 for a miscalibrated one.
    """
    tar = _as_scores(tar_llr, "target llrs")
    non = _as_scores(non_llr, "non-target llrs")
    c_tar = np.mean(np.logaddexp(0.0, -tar))
    c_non = np.mean(np.logaddexp(0.0, non))
    return float((c_tar + c_non) / (2.0 * np.log(2.0)))


def min_cllr(tar, non) -> float:
    """Cllr after the optimal monotone calibration (PAV), in [0, 1]."""
    tar = _as_scores(tar, "target scores")
    non = _as_scores(non, "non-target scores")
    labels = _sorted_labels(tar, non)
    posterior, _ = pav(labels)
    with np.errstate(divide="ignore"):
        llr = np.log(posterior) - np.log1p(-posterior) - np.log(tar.size / non.size)
    llr_tar = llr[labels == 1]
    llr_non = llr[labels == 0]
    c_tar = np.mean(np.logaddexp(0.0, -llr_tar))  # posterior of a target block is > 0: finite
    c_non = np.mean(np.logaddexp(0.0, llr_non))
    return float(min(1.0, (c_tar + c_non) / (2.0 * np.log(2.0))))


def linkability(tar, non, *, prior_ratio: float = 1.0, n_bins: int | None = None) -> float:
    """Global linkability D<->sys (paper 000 Eq. 3; Gomez-Barrero et al. 2017).

    D<->(s) = max(0, 2 w lr(s) / (1 + w lr(s)) - 1) with w = ``prior_ratio``
    p(Hs)/p(Hd) and lr(s) = p(s|Hs) / p(s|Hd) from histograms on shared bins
    (``n_bins`` defaults to min(#targets / 10, 100), at least 1);
    D<->sys is its mean over the target-score density. 0: unlinkable,
    1: fully linkable. Same estimator as Maouche's ``anonymization_metrics``.
    """
    tar = _as_scores(tar, "target scores")
    non = _as_scores(non, "non-target scores")
    if n_bins is None:
        n_bins = max(1, min(tar.size // 10, 100))
    lo = min(tar.min(), non.min())
    hi = max(tar.max(), non.max())
    if hi <= lo:  # every score equal: no information
        return 0.0
    edges = np.linspace(lo, hi, n_bins + 1)
    widths = np.diff(edges)
    y_tar = np.histogram(tar, bins=edges, density=True)[0]
    y_non = np.histogram(non, bins=edges, density=True)[0]
    lr = np.divide(y_tar, y_non, out=np.ones_like(y_tar), where=y_non != 0)
    d = 2.0 * (prior_ratio * lr / (1.0 + prior_ratio * lr)) - 1.0
    d[prior_ratio * lr <= 1.0] = 0.0
    d[y_non == 0] = 1.0
    return float(np.sum(widths * d * y_tar))


@dataclass(frozen=True)
class AffineCalibration:
    """llr = ``scale`` * score + ``offset`` (natural log)."""

    scale: float
    offset: float

    def __call__(self, scores) -> np.ndarray:
        return self.scale * np.asarray(scores, dtype=np.float64) + self.offset


def fit_affine_calibration(tar, non, *, prior: float = 0.5, l2: float = 1e-4,
                           iterations: int = 100) -> AffineCalibration:
    """Linear score-to-llr calibration by prior-weighted logistic regression
    (BOSARIS ``train_llr_fusion`` with one system), Newton's method.

    Targets and non-targets get total weights ``prior`` and ``1 - prior``;
    ``l2`` (a small ridge on the scale) keeps the fit finite when the classes
    are separable.
    """
    tar = _as_scores(tar, "target scores")
    non = _as_scores(non, "non-target scores")
    if not 0.0 < prior < 1.0:
        raise ValueError(f"prior={prior}; use a value strictly between 0 and 1")
    x = np.concatenate([tar, non])
    y = np.concatenate([np.ones(tar.size), np.zeros(non.size)])
    w = np.concatenate([np.full(tar.size, prior / tar.size), np.full(non.size, (1 - prior) / non.size)])
    logit_prior = np.log(prior / (1 - prior))
    # standardise for a well-conditioned Newton step
    mu, sd = x.mean(), x.std() or 1.0
    z = (x - mu) / sd
    X = np.stack([z, np.ones_like(z)], axis=1)
    theta = np.zeros(2)
    reg = np.diag([l2, 0.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(X @ theta + logit_prior)))
        grad = X.T @ (w * (p - y)) + reg @ theta
        hess = (X * (w * p * (1 - p))[:, None]).T @ X + reg + 1e-12 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    a, b = theta
    return AffineCalibration(scale=float(a / sd), offset=float(b - a * mu / sd))


# --------------------------------------------------------------------------- closed-set identification


def closed_set_ranks(scores: np.ndarray, true_index: np.ndarray) -> np.ndarray:
    """Rank (1 = best) of the true speaker for each trial.

    ``scores``: (n_trials, n_speakers) float, higher = more alike;
    ``true_index``: (n_trials,) int column of the true speaker. Ties count
    against the attacker (the true speaker is placed after every speaker with
    an equal score).
    """
    scores = np.asarray(scores, dtype=np.float64)
    true_index = np.asarray(true_index, dtype=np.int64)
    if scores.ndim != 2 or true_index.shape != (scores.shape[0],):
        raise ValueError(f"scores must be (n_trials, n_speakers) and true_index (n_trials,); got "
                         f"{scores.shape} and {true_index.shape}")
    true = scores[np.arange(scores.shape[0]), true_index]
    return (scores >= true[:, None]).sum(axis=1)


def top_k_precision(ranks: np.ndarray, k: int) -> float:
    """Fraction of trials whose true speaker is among the ``k`` best."""
    ranks = np.asarray(ranks)
    return float(np.mean(ranks <= k))


# --------------------------------------------------------------------------- voice similarity matrices


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def similarity_matrix(llr: np.ndarray, spk_rows, spk_cols, speakers, *,
                      exclude: np.ndarray | None = None) -> np.ndarray:
    """Voice similarity matrix M (paper 001 Eq. 2).

    ``llr``: (n_rows, n_cols) calibrated llrs between segments;
    ``spk_rows``/``spk_cols``: speaker label of each row/column segment;
    ``speakers``: the N speakers in matrix order; ``exclude``: optional
    (n_rows, n_cols) bool mask of pairs left out of the averages (same
    segment compared with itself). Returns (N, N) float64 in (0, 1):
    S(i, j) = sigmoid(mean llr over segments of speaker i x speaker j).
    """
    llr = np.asarray(llr, dtype=np.float64)
    spk_rows = np.asarray(spk_rows)
    spk_cols = np.asarray(spk_cols)
    keep = np.ones_like(llr, dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    m = np.empty((len(speakers), len(speakers)))
    rows = [spk_rows == s for s in speakers]
    cols = [spk_cols == s for s in speakers]
    for i, ri in enumerate(rows):
        for j, cj in enumerate(cols):
            block = llr[np.ix_(ri, cj)]
            mask = keep[np.ix_(ri, cj)]
            if not mask.any():
                raise ValueError(f"speakers {speakers[i]} x {speakers[j]}: no segment pair left to average "
                                 "(a speaker needs at least two segments)")
            m[i, j] = sigmoid(block[mask].mean())
    return m


def diagonal_dominance(m: np.ndarray) -> float:
    """D_diag(M) = |mean of the diagonal - mean off the diagonal| (paper 001 Eq. 3).
    1 for an identity matrix, 0 for a uniform one."""
    m = np.asarray(m, dtype=np.float64)
    n = m.shape[0]
    if m.shape != (n, n) or n < 2:
        raise ValueError(f"need a square matrix with at least 2 speakers; got shape {m.shape}")
    off_mask = ~np.eye(n, dtype=bool)
    diag = np.diag(m).mean()
    off = m[off_mask].mean()
    d = abs(diag - off)
    # a uniform matrix gives 0 exactly, not a rounding residue
    return 0.0 if d <= 1e-12 * max(1.0, abs(diag)) else float(d)


def deid(m_oo: np.ndarray, m_op: np.ndarray) -> float:
    """De-identification DeID = 1 - D_diag(M_OP) / D_diag(M_OO) (paper 001 Eq. 4):
    0 when pseudonymisation changes nothing, 1 when M_OP has no diagonal."""
    d_oo = diagonal_dominance(m_oo)
    if d_oo <= 0:
        raise ValueError("D_diag(M_OO) is 0: the original voices are not distinguishable, DeID is undefined")
    return 1.0 - diagonal_dominance(m_op) / d_oo


def gvd_db(m_oo: np.ndarray, m_pp: np.ndarray) -> float:
    """Gain of voice distinctiveness GVD = 10 log10(D_diag(M_PP) / D_diag(M_OO))
    in dB (paper 001 Eq. 5): 0 dB preserved, < 0 lost, -inf when M_PP is uniform."""
    d_oo = diagonal_dominance(m_oo)
    if d_oo <= 0:
        raise ValueError("D_diag(M_OO) is 0: the original voices are not distinguishable, GVD is undefined")
    d_pp = diagonal_dominance(m_pp)
    return float("-inf") if d_pp == 0 else float(10.0 * np.log10(d_pp / d_oo))


# --------------------------------------------------------------------------- utility


def error_counts(ref: list[str], hyp: list[str]) -> tuple[int, int, int]:
    """(substitutions, deletions, insertions) of one minimum-edit word alignment of ``hyp`` to ``ref``;
    their sum is the Levenshtein distance."""
    d = [[i + j if i == 0 or j == 0 else 0 for j in range(len(hyp) + 1)] for i in range(len(ref) + 1)]
    for i, r in enumerate(ref, 1):
        for j, h in enumerate(hyp, 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (r != h))
    i, j, subs, dels, ins = len(ref), len(hyp), 0, 0, 0
    while i > 0 or j > 0:  # trace one optimal path back
        if i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            subs += ref[i - 1] != hyp[j - 1]
            i, j = i - 1, j - 1
        elif i > 0 and d[i][j] == d[i - 1][j] + 1:
            dels, i = dels + 1, i - 1
        else:
            ins, j = ins + 1, j - 1
    return subs, dels, ins


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    return sum(error_counts(ref, hyp))


def asr_runaway(ref: list[str], hyp: list[str]) -> bool:
    """True when ``hyp`` has more than 3 x len(ref) + 5 words: the ASR decoder looped ("blue blue blue
    ...") instead of transcribing. One such utterance can add a hundred insertions and move a corpus WER
    by several points, so reports count them and give the WER without them beside the WER itself."""
    return len(hyp) > 3 * len(ref) + 5


def pearson_voiced(f0_a: np.ndarray, f0_b: np.ndarray, *, min_frames: int = 3) -> float | None:
    """Pearson correlation of two F0 tracks (Hz, 0 = unvoiced, same frame
    rate) on the frames voiced in both; ``None`` when fewer than
    ``min_frames`` such frames or a track is constant there. Tracks of
    different lengths are compared on their common prefix."""
    n = min(len(f0_a), len(f0_b))
    a = np.asarray(f0_a[:n], dtype=np.float64)
    b = np.asarray(f0_b[:n], dtype=np.float64)
    both = (a > 0) & (b > 0)
    if both.sum() < min_frames:
        return None
    a, b = a[both], b[both]
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])
