"""Attack scenarios and the trial protocol (paper 000 Sec. IV-C), on embeddings.

- ``make_split``: per speaker, ``n_enroll`` enrolment utterances (drawn with a
  seeded shuffle) and the rest as trials.
- Verification trials: every trial utterance against every enrolled speaker of
  the same gender (target when it is the true speaker). Closed-set
  identification: every trial utterance against all enrolled speakers.
- Scorers: ``CosineScorer`` (mean of unit enrolment embeddings, cosine) for the
  ignorant and lazy-informed attackers; ``PldaScorer`` (LDA + PLDA trained on
  the attacker's anonymized training speakers) for the semi-informed one.
- The slicing attacker (paper 004) is the semi-informed one on word-level
  slices; its protocol is in :mod:`rtanon.eval.slicing`.
- ``evaluate_attack``: EER, Cllr (llrs from the attacker's own affine
  calibration, fitted on trials among held-out training speakers), min Cllr,
  linkability, closed-set rank and top-k precision.
- ``similarity_matrices``: M_OO, M_OP, M_PP of paper 001 with DeID and GVD.

Embeddings are ``dict[utt_id, (d,) float32 unit vector]``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from rtanon.eval import metrics

#: the systems and attacks an evaluation reports (``rtanon.eval.runner``)
ORIGINAL = "original"
BASELINE = "mcadams"
SCENARIOS = ("ignorant", "lazy_informed", "semi_informed")
SLICING = "slicing"  # the semi-informed attacker on word-level slices (paper 004)

TOP_K = (1, 5)


@dataclass(frozen=True)
class Split:
    """Enrolment/trial protocol over one Kaldi directory."""

    speakers: list[str]  # sorted
    gender: dict[str, str]  # speaker -> m/f
    enroll: dict[str, list[str]]  # speaker -> enrolment utterances
    trials: list[str]  # trial utterances
    utt2spk: dict[str, str] = field(repr=False)

    @property
    def enroll_utts(self) -> list[str]:
        return sorted(u for us in self.enroll.values() for u in us)


def seeded_shuffle(items: list[str], seed: int, key: str) -> list[str]:
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    items = sorted(items)
    return [items[i] for i in rng.permutation(len(items))]


def make_split(kaldi, n_enroll: int, seed: int) -> Split:
    """``n_enroll`` enrolment utterances per speaker, the others are trials.
    Speakers need at least ``n_enroll + 1`` utterances and a gender."""
    enroll, trials = {}, []
    for spk in kaldi.speakers:
        utts = kaldi.utterances_of(spk)
        if len(utts) <= n_enroll:
            raise ValueError(f"speaker {spk} has {len(utts)} utterances; the protocol needs more than "
                             f"--enroll-utts={n_enroll} (lower it or drop the speaker)")
        if spk not in kaldi.spk2gender:
            raise ValueError(f"speaker {spk} has no entry in spk2gender (same-gender trials need it)")
        utts = seeded_shuffle(utts, seed, spk)
        enroll[spk] = sorted(utts[:n_enroll])
        trials.extend(utts[n_enroll:])
    return Split(speakers=kaldi.speakers, gender={s: kaldi.spk2gender[s] for s in kaldi.speakers},
                 enroll=enroll, trials=sorted(trials), utt2spk=dict(kaldi.utt2spk))


# --------------------------------------------------------------------------- scorers


class CosineScorer:
    """Cosine between the normalised mean of the enrolment embeddings and the test embedding."""

    name = "cosine"

    def score(self, enroll: list[np.ndarray], test: np.ndarray) -> np.ndarray:
        """``enroll``: one (n_i, d) array per speaker; ``test`` (n_t, d) -> (n_spk, n_t)."""
        e = np.stack([_unit(np.asarray(x, np.float64)).mean(axis=0) for x in enroll])
        return _unit(e) @ _unit(np.asarray(test, np.float64)).T


class PldaScorer:
    """LDA + PLDA backend (see :mod:`rtanon.eval.backend`)."""

    name = "LDA+PLDA"

    def __init__(self, backend) -> None:
        self.backend = backend

    def score(self, enroll: list[np.ndarray], test: np.ndarray) -> np.ndarray:
        return self.backend.score(enroll, np.asarray(test))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-12)


def pairwise_trials(emb: np.ndarray, speakers: np.ndarray, genders: np.ndarray, scorer, groups=None):
    """Utterance-vs-utterance same-gender trials among a set of embeddings
    (n, d): returns (target scores, non-target scores), each pair once.
    ``groups`` (n,): pairs within one group (slices of one utterance) are left out."""
    s = scorer.score([e[None, :] for e in emb], emb)
    iu = np.triu_indices(len(emb), 1)
    same = (speakers[:, None] == speakers[None, :])[iu]
    same_gender = (genders[:, None] == genders[None, :])[iu]
    keep = np.ones_like(same) if groups is None else ~(groups[:, None] == groups[None, :])[iu]
    sc = s[iu]
    return sc[same & keep], sc[~same & same_gender & keep]


# --------------------------------------------------------------------------- attack evaluation


@dataclass
class AttackResult:
    metrics: dict
    tar: np.ndarray  # raw target scores (same-gender protocol)
    non: np.ndarray  # raw non-target scores


def evaluate_attack(split: Split, enroll_emb: dict, trial_emb: dict, scorer,
                    calibration: metrics.AffineCalibration) -> AttackResult:
    """Scores every trial utterance against every enrolled speaker and
    computes the verification and closed-set identification figures."""
    enroll = [np.stack([enroll_emb[u] for u in split.enroll[s]]) for s in split.speakers]
    test = np.stack([trial_emb[u] for u in split.trials])
    scores = scorer.score(enroll, test)  # (n_spk, n_trials)
    spk_index = {s: i for i, s in enumerate(split.speakers)}
    true = np.array([spk_index[split.utt2spk[u]] for u in split.trials])
    spk_gender = np.array([split.gender[s] for s in split.speakers])
    trial_gender = spk_gender[true]
    same_gender = spk_gender[:, None] == trial_gender[None, :]
    is_target = np.arange(len(split.speakers))[:, None] == true[None, :]
    tar = scores[is_target]
    non = scores[same_gender & ~is_target]
    ranks = metrics.closed_set_ranks(scores.T, true)
    n_spk = len(split.speakers)
    result = {
        "eer": metrics.eer(tar, non),
        "cllr": metrics.cllr(calibration(tar), calibration(non)),
        "cllr_min": metrics.min_cllr(tar, non),
        "linkability": metrics.linkability(tar, non),
        "rank_mean": float(ranks.mean()),
        "rank_chance": (n_spk + 1) / 2.0,
        **{f"top{k}": metrics.top_k_precision(ranks, k) for k in TOP_K},
        **{f"top{k}_chance": k / n_spk for k in TOP_K},
        "n_target": int(tar.size),
        "n_nontarget": int(non.size),
        "n_speakers": n_spk,
        "scorer": scorer.name,
    }
    return AttackResult(result, tar, non)


# --------------------------------------------------------------------------- voice similarity matrices


@dataclass
class SimilarityResult:
    speakers: list[str]
    m_oo: np.ndarray
    m_op: np.ndarray
    m_pp: np.ndarray
    deid: float
    gvd_db: float


def _oracle_llr(scores: np.ndarray, same_spk: np.ndarray, exclude: np.ndarray) -> np.ndarray:
    """Oracle calibration (paper 001 Sec. 3.1): an affine map fitted on the
    very pairs of this matrix (targets: same speaker), excluded pairs left out."""
    keep = ~exclude
    cal = metrics.fit_affine_calibration(scores[keep & same_spk], scores[keep & ~same_spk])
    return cal(scores)


def similarity_matrices(utts: list[str], utt2spk: dict, speakers: list[str], emb_o: dict,
                        emb_p: dict) -> SimilarityResult:
    """M_OO, M_OP, M_PP over ``utts`` (original ``emb_o`` and pseudonymised
    ``emb_p`` embeddings of the same utterances), cosine scores with an oracle
    affine calibration per matrix. Pairs of a segment with itself (or with
    its own pseudonymised version) are left out of the averages."""
    o = _unit(np.stack([emb_o[u] for u in utts]).astype(np.float64))
    p = _unit(np.stack([emb_p[u] for u in utts]).astype(np.float64))
    spk = np.array([utt2spk[u] for u in utts])
    same_spk = spk[:, None] == spk[None, :]
    same_seg = np.eye(len(utts), dtype=bool)
    mats = {}
    for name, a, b in (("oo", o, o), ("op", o, p), ("pp", p, p)):
        llr = _oracle_llr(a @ b.T, same_spk, same_seg)
        mats[name] = metrics.similarity_matrix(llr, spk, spk, speakers, exclude=same_seg)
    return SimilarityResult(speakers, mats["oo"], mats["op"], mats["pp"],
                            metrics.deid(mats["oo"], mats["op"]), metrics.gvd_db(mats["oo"], mats["pp"]))
