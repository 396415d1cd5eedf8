"""The semi-informed attacker's scoring backend: LDA + PLDA, pure numpy/scipy.

``PldaBackend.fit(embeddings, speakers)`` learns, on the attacker's training
speakers: centring, PCA (to a dimension the data supports), LDA (``lda_dim``
dimensions, within-class scatter shrunk towards its mean eigenvalue so that
few utterances per speaker are enough), length normalisation, and a two-covariance PLDA model (between-speaker
covariance B, within-speaker covariance W). ``score(enroll, n_enroll, test)``
returns natural-log likelihood ratios "test spoken by the enrolled speaker"
versus "by someone else", with the enrolment side being the mean of
``n_enroll`` embeddings (Ioffe 2006, Sec. 3: closed form per dimension after
the simultaneous diagonalisation W -> I, B -> diag(psi)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def length_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to norm sqrt(dim) (Garcia-Romero & Espy-Wilson 2011)."""
    x = np.asarray(x, dtype=np.float64)
    return x * (np.sqrt(x.shape[1]) / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12))


def _class_stats(x: np.ndarray, labels: np.ndarray):
    classes, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    means = np.zeros((classes.size, x.shape[1]))
    np.add.at(means, inv, x)
    means /= counts[:, None]
    within = x - means[inv]
    return means, counts, within


@dataclass
class TwoCovPlda:
    """x = mu + y + e, y ~ N(0, B) per speaker, e ~ N(0, W) per utterance,
    stored diagonalised: u = T (x - mu) has within covariance I and between
    covariance diag(psi)."""

    mu: np.ndarray  # (d,)
    transform: np.ndarray  # (d, d), rows are the diagonalising directions
    psi: np.ndarray  # (d,) between-speaker variances in the diagonal space

    @classmethod
    def fit(cls, x: np.ndarray, labels: np.ndarray, *, shrink: float = 1e-3) -> "TwoCovPlda":
        """Moment estimates: W from within-speaker deviations, B from the
        speaker means (less the part of W their averaging leaves in them)."""
        import scipy.linalg

        x = np.asarray(x, dtype=np.float64)
        means, counts, within = _class_stats(x, labels)
        if counts.size < 2 or (counts > 1).sum() < 1:
            raise ValueError("PLDA needs at least 2 speakers and one speaker with 2 or more embeddings")
        d = x.shape[1]
        w = within.T @ within / max(1, x.shape[0] - counts.size)
        mu = means.mean(axis=0)
        mc = means - mu
        b = mc.T @ mc / counts.size - w * np.mean(1.0 / counts)
        w = w + shrink * np.trace(w) / d * np.eye(d)
        b = (b + b.T) / 2
        vals, vecs = scipy.linalg.eigh(b, w)  # vecs.T W vecs = I, vecs.T B vecs = diag(vals)
        psi = np.maximum(vals, 1e-6)
        return cls(mu=mu, transform=vecs.T, psi=psi)

    def project(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mu) @ self.transform.T

    def llr(self, enroll_mean: np.ndarray, n_enroll, test: np.ndarray) -> np.ndarray:
        """(n_e, d) enrolment means of ``n_enroll`` (int or (n_e,)) embeddings
        each, (n_t, d) test embeddings -> (n_e, n_t) natural-log LRs."""
        ue = self.project(enroll_mean)  # (n_e, d)
        ut = self.project(test)  # (n_t, d)
        n = np.broadcast_to(np.asarray(n_enroll, dtype=np.float64), (ue.shape[0],))[:, None]
        psi = self.psi[None, :]
        gain = n * psi / (n * psi + 1.0)  # (n_e, d) posterior-mean shrinkage
        var_same = 1.0 + psi / (n * psi + 1.0)  # (n_e, d)
        var_diff = 1.0 + self.psi  # (d,)
        # log N(ut; gain*ue, var_same) - log N(ut; 0, var_diff), summed over d
        m = gain * ue  # (n_e, d)
        quad_same = ((ut[None, :, :] - m[:, None, :]) ** 2 / var_same[:, None, :]).sum(-1)
        quad_diff = (ut ** 2 / var_diff).sum(-1)[None, :]
        logdet = (np.log(var_same).sum(-1) - np.log(var_diff).sum())[:, None]
        return -0.5 * (quad_same - quad_diff + logdet)


@dataclass
class PldaBackend:
    """Centring + LDA + length normalisation + two-covariance PLDA."""

    mean: np.ndarray
    lda: np.ndarray  # (lda_dim, d)
    plda: TwoCovPlda

    @classmethod
    def fit(cls, embeddings: np.ndarray, speakers, *, lda_dim: int = 48, lda_shrink: float = 0.3,
            pca_dim: int | None = None) -> "PldaBackend":
        """``embeddings`` (n, d) float, ``speakers`` (n,) labels of the
        attacker's training data.

        A PCA to ``pca_dim`` dimensions comes first (default: half the
        within-speaker degrees of freedom, n - #speakers, so that the
        within-speaker scatter is estimable: without it LDA picks directions
        in which the few training utterances of each speaker happen to
        coincide, and the backend overfits). ``lda_dim`` is capped at
        #speakers - 1 and at the PCA dimension. The defaults (auto PCA, 48
        LDA dimensions, shrinkage 0.3) were chosen on original so762_train
        embeddings (83 training / 42 held-out speakers, 3 utterances each):
        EER 4.6 % against 5.7 % for plain cosine scoring.
        """
        import scipy.linalg

        x = np.asarray(embeddings, dtype=np.float64)
        labels = np.asarray(speakers)
        n_spk = np.unique(labels).size
        if n_spk < 3:
            raise ValueError(f"the PLDA backend needs at least 3 training speakers, got {n_spk}")
        mean = x.mean(axis=0)
        xc = x - mean
        d = x.shape[1]
        r = pca_dim if pca_dim is not None else max(2, (x.shape[0] - n_spk) // 2)
        r = int(min(r, d, x.shape[0] - 1))
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        pca = vt[:r]  # (r, d)
        xp = xc @ pca.T
        means, counts, within = _class_stats(xp, labels)
        sw = within.T @ within / x.shape[0]
        sw = (1 - lda_shrink) * sw + lda_shrink * np.trace(sw) / r * np.eye(r)
        sb = (means * counts[:, None]).T @ means / x.shape[0]
        k = int(min(lda_dim, n_spk - 1, r))
        vals, vecs = scipy.linalg.eigh(sb, sw)
        lda = vecs[:, ::-1][:, :k].T @ pca  # top-k discriminant directions, (k, d)
        z = length_normalize(xc @ lda.T)
        return cls(mean=mean, lda=lda, plda=TwoCovPlda.fit(z, labels))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return length_normalize((np.atleast_2d(np.asarray(x, dtype=np.float64)) - self.mean) @ self.lda.T)

    def score(self, enroll: list[np.ndarray], test: np.ndarray) -> np.ndarray:
        """``enroll``: one (n_i, d) array of raw embeddings per enrolled
        speaker; ``test``: (n_t, d). Returns (n_speakers, n_t) llrs."""
        means = np.stack([self.transform(e).mean(axis=0) for e in enroll])
        counts = np.array([len(e) for e in enroll])
        return self.plda.llr(means, counts, self.transform(test))
