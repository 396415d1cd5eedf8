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

from rtanon.identity.plda import TwoCovPlda, class_stats, length_normalize  # noqa: F401  (one PLDA)


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
        means, counts, within = class_stats(xp, labels)
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
