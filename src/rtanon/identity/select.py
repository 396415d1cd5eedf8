"""Pseudo-speaker selection of paper 000 (Srivastava et al., Sec. III, IV-B).

Design choices, each a parameter of :func:`select_candidates`:

- distance ``cosine`` (Eq. 1) or ``plda`` (``-LLR`` of a two-covariance PLDA
  trained on the pool's utterance embeddings, Eq. 2);
- proximity ``random`` (N* speakers at random), ``near`` / ``far`` (N* at
  random among the N nearest / farthest from the user), ``dense`` / ``sparse``
  (Affinity Propagation clusters of the gender pool, damping 0.5, equal
  preference; drop the cluster closest to the user, pick one of the largest /
  smallest clusters at random, take half of its members at random);
- gender ``same`` / ``opposite`` / ``random``: the candidates come from one
  gender's pool only.

N and N* are scaled from the paper's 200 and 100 out of about 580 speakers per
gender (:class:`SelectionConfig`). The target embedding is the re-normalised
mean of the N* candidates; its F0 target is the quantiles of their
concatenated voiced F0 (Eq. 6), computed from the per-speaker quantiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rtanon.config import ConfigError
from rtanon.identity.pitch import mixture_quantiles_hz
from rtanon.identity.pool import SpeakerPool, unit_norm

DISTANCES = ("cosine", "plda")
PROXIMITIES = ("random", "near", "far", "dense", "sparse")
GENDER_CHOICES = ("same", "opposite", "random")
ASSIGNMENTS = ("speaker", "utterance")


@dataclass(frozen=True)
class SelectionConfig:
    """Sizes of paper 000's selection, as fractions of the gender pool.

    ``n_fraction`` (N = 200 of ~580 in the paper) speakers are ranked near/far
    and ``n_star_fraction`` of them (N* = 100 of 200) averaged; random proximity
    averages ``n_star_fraction * n_fraction`` of the gender pool (N* = 100);
    dense/sparse pick among the ``cluster_fraction`` largest/smallest clusters
    (10 of 80) and average ``cluster_member_fraction`` of the chosen one.
    """

    n_fraction: float = 200 / 580
    n_star_fraction: float = 0.5
    cluster_fraction: float = 10 / 80
    cluster_member_fraction: float = 0.5
    ap_damping: float = 0.5

    def validate(self) -> None:
        for name in ("n_fraction", "n_star_fraction", "cluster_fraction", "cluster_member_fraction"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ConfigError(f"{name}={v}; use a fraction in (0, 1]")
        if not 0.5 <= self.ap_damping < 1.0:
            raise ConfigError(f"ap_damping={self.ap_damping}; Affinity Propagation needs 0.5 <= damping < 1")

    def n(self, pool_size: int) -> tuple[int, int]:
        """(N, N*) for a gender pool of ``pool_size`` speakers."""
        n = max(2, min(pool_size, round(self.n_fraction * pool_size)))
        return n, max(1, round(self.n_star_fraction * n))


@dataclass(frozen=True)
class Selection:
    """Result of a selection: candidate indices into the pool, target embedding
    (D,) float32 unit norm and target F0 quantiles (Q,) float32 Hz."""

    candidates: np.ndarray
    embedding: np.ndarray
    f0_quantiles_hz: np.ndarray
    gender: str
    details: dict


class Selector:
    """Shared, immutable-after-construction selection model over one pool:
    the PLDA and the Affinity Propagation clusters are computed on first use."""

    def __init__(self, pool: SpeakerPool, config: SelectionConfig | None = None) -> None:
        config = config or SelectionConfig()
        config.validate()
        self.pool = pool
        self.config = config
        self._clusters: dict = {}  # (gender, metric) -> clusters, filled on first use
        self.ap_damping_used: dict = {}

    @cached_property
    def plda(self):
        from rtanon.identity.plda import TwoCovPlda

        return TwoCovPlda.fit(self.pool.utt_embeddings, self.pool.utt_speaker)

    def distance(self, a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
        """Distance between rows of ``a`` (A, D) and ``b`` (B, D) -> (A, B): 1 - cosine, or -LLR."""
        if metric == "cosine":
            return 1.0 - unit_norm(np.atleast_2d(a)) @ unit_norm(np.atleast_2d(b)).T
        if metric == "plda":
            return -self.plda.llr_pairs(a, b)
        raise ValueError(f"distance={metric!r}; use one of {DISTANCES}")

    def clusters(self, gender: str, metric: str) -> list[np.ndarray]:
        """Affinity Propagation clusters (pool indices) of one gender's speakers,
        similarity = -distance, equal (median) preference; computed once per key."""
        key = (gender, metric)
        if key not in self._clusters:
            self._clusters[key] = self._affinity_propagation(gender, metric)
        return self._clusters[key]

    def _affinity_propagation(self, gender: str, metric: str) -> list[np.ndarray]:
        import warnings

        from sklearn.cluster import AffinityPropagation
        from sklearn.exceptions import ConvergenceWarning

        idx = self.pool.gender_index(gender)
        emb = self.pool.embeddings[idx]
        sim = -self.distance(emb, emb, metric)
        labels = None
        for damping in (self.config.ap_damping, 0.7, 0.9):  # paper: 0.5; damp harder only if it oscillates
            ap = AffinityPropagation(damping=damping, affinity="precomputed", max_iter=2000,
                                     convergence_iter=50, random_state=0)
            with warnings.catch_warnings():
                warnings.simplefilter("error", ConvergenceWarning)
                try:
                    labels = ap.fit_predict(sim)
                except ConvergenceWarning:
                    continue
            self.ap_damping_used[(gender, metric)] = damping
            break
        if labels is None or labels.min() < 0:
            raise RuntimeError(f"Affinity Propagation did not converge on the {gender} pool ({metric})")
        return [idx[labels == k] for k in np.unique(labels)]

    def select(self, proximity: str, gender: str, rng: np.random.Generator, *, distance: str = "cosine",
               user_embedding: np.ndarray | None = None) -> Selection:
        """Chooses N* candidates of ``gender`` ('m'/'f') by ``proximity`` and averages them."""
        if proximity not in PROXIMITIES:
            raise ValueError(f"proximity={proximity!r}; use one of {PROXIMITIES}")
        if distance not in DISTANCES:
            raise ValueError(f"distance={distance!r}; use one of {DISTANCES}")
        idx = self.pool.gender_index(gender)
        n, n_star = self.config.n(idx.shape[0])
        details = {"proximity": proximity, "distance": distance}
        if proximity in ("near", "far"):
            if user_embedding is None:
                raise ValueError(f"proximity {proximity!r} needs the user's embedding (enrollment audio)")
            d = self.distance(user_embedding, self.pool.embeddings[idx], distance)[0]
            order = idx[np.argsort(d, kind="stable")]
            ranked = order[:n] if proximity == "near" else order[-n:]
            cand = rng.choice(ranked, size=n_star, replace=False)
            details.update(N=n, N_star=n_star)
        elif proximity == "random":
            cand = rng.choice(idx, size=n_star, replace=False)
            details.update(N_star=n_star)
        else:
            clusters = list(self.clusters(gender, distance))
            n_clusters = len(clusters)
            if user_embedding is not None and len(clusters) > 1:
                closest = np.argmin([self.distance(user_embedding, self.pool.embeddings[c], distance).mean()
                                     for c in clusters])
                clusters.pop(int(closest))
            sizes = np.array([c.shape[0] for c in clusters])
            k = max(1, round(self.config.cluster_fraction * len(clusters)))
            order = np.argsort(-sizes if proximity == "dense" else sizes, kind="stable")
            chosen = clusters[int(rng.choice(order[:k]))]
            m = max(1, round(self.config.cluster_member_fraction * chosen.shape[0]))
            cand = rng.choice(chosen, size=m, replace=False)
            details.update(n_clusters=n_clusters, cluster_size=int(chosen.shape[0]), N_star=m)
        cand = np.sort(cand)
        emb = unit_norm(self.pool.embeddings[cand].mean(axis=0))
        f0 = mixture_quantiles_hz(self.pool.f0_quantiles_hz[cand], self.pool.voiced_frames[cand],
                                  self.pool.quantile_levels)
        return Selection(cand, emb, f0, gender, details)
