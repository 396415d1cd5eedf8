"""PCA + GMM pseudo-speaker generation (paper 003, Turner et al.), with pitch.

Per gender: PCA keeping ``pca_variance`` of the variance, a diagonal-covariance
GMM with ``n_components`` on the PCA scores, sampling, inverse PCA. Paper 003
models the x-vector alone; here each speaker's vector is the embedding joined
with ``pitch_weight``-scaled, standardised log-F0 quantiles at
:data:`PITCH_LEVELS`, so the PCA axes capture how voice and pitch co-vary and
a sample comes with a coherent F0 target (a diagonal GMM on separate blocks
would sample pitch independently of the voice). Generated embeddings are
L2-normalised; ``clip_negative`` also zeroes negative entries (resemblyzer
ends in ReLU), which on our pool makes generated voices more alike than real
ones (KS 0.46 instead of 0.12 at 95-99 % variance), so it is off by default.

Forced dissimilarity (paper 003 Sec. 3.5): with the user's embedding known,
samples with ``cos(user, sample) > theta_fd`` are redrawn.

``ks_statistic`` (Eq. 1) and ``gmm_entropy`` (Eq. 2) drive the hyper-parameter
search in :mod:`rtanon.identity.report`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtanon.config import ConfigError
from rtanon.identity.pool import SpeakerPool, unit_norm

#: Quantile levels (fractions) whose log-F0 joins the embedding in the joint model.
PITCH_LEVELS = np.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])


@dataclass(frozen=True)
class GmmConfig:
    """PCA retained variance and GMM size (chosen with `rtanon identity search` on the
    shipped pool: 99 % variance, 76-77 PCA dims, 4 components; paper 003 chose 99 % and 1),
    pitch block weight (its share of the joint vector's total variance) and θ_FD.

    ``theta_fd``: paper 003 recommends 0.9 for its x-vectors; resemblyzer
    cosines live on another scale (in our pool different speakers: median 0.60,
    95th percentile 0.75; utterances of one speaker: median 0.78), so 0.75 keeps
    the paper's intent, no voice about as close to the user as their own."""

    pca_variance: float = 0.99
    n_components: int = 4
    pitch_weight: float = 0.1
    theta_fd: float = 0.75
    clip_negative: bool = False
    max_redraws: int = 1000

    def validate(self) -> None:
        if not 0.5 <= self.pca_variance < 1.0:
            raise ConfigError(f"pca_variance={self.pca_variance}; use 0.5 to 0.999 (paper 003 picks 0.99)")
        if not 1 <= self.n_components <= 64:
            raise ConfigError(f"n_components={self.n_components}; use 1 to 64 (paper 003 uses 1)")
        if not 0.0 <= self.pitch_weight <= 1.0:
            raise ConfigError(f"pitch_weight={self.pitch_weight}; use 0 (pitch not modelled) to 1")
        if not -1.0 <= self.theta_fd <= 1.0:
            raise ConfigError(f"theta_fd={self.theta_fd}; a cosine similarity in [-1, 1] (1 disables it)")


def pitch_features(f0_quantiles_hz: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """(S, Q) quantiles in Hz at ``levels`` -> (S, len(PITCH_LEVELS)) log-F0 at PITCH_LEVELS."""
    q = np.log(np.maximum(np.atleast_2d(f0_quantiles_hz), 1.0))
    return np.stack([np.interp(PITCH_LEVELS, levels, row) for row in q])


def quantiles_from_pitch_features(feat: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pitch_features` for one speaker: (P,) log-F0 -> (Q,) Hz, monotone.
    Levels outside [1 %, 99 %] are extrapolated linearly in log-F0."""
    feat = np.maximum.accumulate(np.asarray(feat, dtype=np.float64))
    lo = feat[0] - (feat[1] - feat[0]) / (PITCH_LEVELS[1] - PITCH_LEVELS[0]) * (PITCH_LEVELS[0] - levels[0])
    hi = feat[-1] + (feat[-1] - feat[-2]) / (PITCH_LEVELS[-1] - PITCH_LEVELS[-2]) * (levels[-1] - PITCH_LEVELS[-1])
    x = np.concatenate([[levels[0]], PITCH_LEVELS, [levels[-1]]])
    y = np.concatenate([[lo], feat, [hi]])
    return np.exp(np.interp(levels, x, y)).astype(np.float32)


def to_embedding_manifold(x: np.ndarray, clip_negative: bool = False) -> np.ndarray:
    """Unit-norm rows; with ``clip_negative`` also non-negative (like the encoder's ReLU output)."""
    x = np.atleast_2d(x)
    return unit_norm(np.maximum(x, 0.0) if clip_negative else x)


class GenderGmm:
    """PCA + diagonal GMM for one gender's speakers (shared, immutable after fit)."""

    def __init__(self, embeddings: np.ndarray, f0_quantiles_hz: np.ndarray, levels: np.ndarray,
                 config: GmmConfig, seed: int = 0) -> None:
        from sklearn.decomposition import PCA
        from sklearn.mixture import GaussianMixture

        self.config = config
        self.levels = np.asarray(levels, dtype=np.float64)
        self.dim = embeddings.shape[1]
        p = pitch_features(f0_quantiles_hz, self.levels)
        self.p_mean, self.p_std = p.mean(axis=0), p.std(axis=0) + 1e-6
        emb_var = float(np.var(embeddings, axis=0).sum())
        # the pitch block carries pitch_weight of the joint vector's total variance
        w = config.pitch_weight
        self.p_scale = 0.0 if w == 0 else np.sqrt(w / (1.0 - w) * emb_var / p.shape[1])
        joint = self._join(embeddings, p)
        n_max = min(joint.shape) - 1
        self.pca = PCA(n_components=config.pca_variance, svd_solver="full").fit(joint)
        if self.pca.n_components_ > n_max:  # pragma: no cover
            self.pca = PCA(n_components=n_max).fit(joint)
        scores = self.pca.transform(joint)
        self.gmm = GaussianMixture(config.n_components, covariance_type="diag", max_iter=500, tol=1e-6,
                                   reg_covar=1e-6, n_init=3, random_state=seed).fit(scores)

    @property
    def n_pca(self) -> int:
        return int(self.pca.n_components_)

    def _join(self, embeddings: np.ndarray, p: np.ndarray) -> np.ndarray:
        pz = (p - self.p_mean) / self.p_std * self.p_scale
        return np.concatenate([embeddings, pz], axis=1) if self.p_scale > 0 else np.asarray(embeddings)

    def sample_scores(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, n_pca) samples in PCA space, drawn with ``rng``."""
        k = rng.choice(self.gmm.n_components, size=n, p=self.gmm.weights_)
        return self.gmm.means_[k] + np.sqrt(self.gmm.covariances_[k]) * rng.standard_normal((n, self.n_pca))

    def decode(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """PCA scores (n, n_pca) -> (embeddings (n, D) float32 unit norm, F0 quantiles (n, Q) Hz)."""
        x = self.pca.inverse_transform(np.atleast_2d(scores))
        emb = to_embedding_manifold(x[:, : self.dim], self.config.clip_negative)
        if self.p_scale > 0:
            p = x[:, self.dim:] / self.p_scale * self.p_std + self.p_mean
        else:
            p = np.repeat(self.p_mean[None], x.shape[0], axis=0)
        f0 = np.stack([quantiles_from_pitch_features(row, self.levels) for row in p])
        return emb, f0

    def sample(self, n: int, rng: np.random.Generator, user_embedding: np.ndarray | None = None,
               theta_fd: float | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """``n`` identities; with ``user_embedding`` and ``theta_fd``, each has
        cos(user, identity) <= theta_fd (forced dissimilarity). Returns
        (embeddings (n, D), F0 quantiles (n, Q) Hz, number of redraws)."""
        embs, f0s, redraws = [], [], 0
        user = None if user_embedding is None or theta_fd is None else unit_norm(user_embedding)
        while len(embs) < n:
            emb, f0 = self.decode(self.sample_scores(n - len(embs), rng))
            ok = np.ones(emb.shape[0], bool) if user is None else (emb @ user.reshape(-1) <= theta_fd)
            redraws += int((~ok).sum())
            embs.extend(emb[ok])
            f0s.extend(f0[ok])
            if redraws > self.config.max_redraws * n:
                raise ConfigError(f"forced dissimilarity: no sample with cosine <= {theta_fd} after "
                                   f"{redraws} draws; raise theta_fd (default 0.75)")
        return np.stack(embs), np.stack(f0s), redraws

    def entropy(self, n: int, rng: np.random.Generator) -> float:
        """Monte-Carlo differential entropy of the GMM in nats (paper 003 Eq. 2: -E[log p(x)])."""
        return float(-self.gmm.score_samples(self.sample_scores(n, rng)).mean())


class Generator:
    """One :class:`GenderGmm` per gender of a pool."""

    def __init__(self, pool: SpeakerPool, config: GmmConfig | None = None, seed: int = 0) -> None:
        config = config or GmmConfig()
        config.validate()
        self.config = config
        self.models = {g: GenderGmm(pool.embeddings[pool.gender_index(g)],
                                    pool.f0_quantiles_hz[pool.gender_index(g)], pool.quantile_levels,
                                    config, seed) for g in ("f", "m")}


def cross_similarities(x: np.ndarray) -> np.ndarray:
    """Cosine similarities of all distinct pairs of rows of (N, D) -> (N(N-1)/2,)."""
    u = unit_norm(x)
    s = u @ u.T
    return s[np.triu_indices(s.shape[0], 1)]


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup |F_a - F_b| (paper 003 Eq. 1)."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / a.size - np.searchsorted(b, grid, "right") / b.size).max())
