"""Two-covariance PLDA (Ioffe 2006; Brümmer & de Villiers 2010), the one PLDA of rtanon.

``x = mu + y + e`` with the speaker variable ``y ~ N(0, B)`` and the within-speaker term ``e ~ N(0, W)``,
fitted from moments (W from within-speaker deviations, B from the speaker means) and stored diagonalised
(W -> I, B -> diag(psi)), so the log-likelihood ratio "same speaker" vs "different speakers" has a closed
form per dimension. Used by pseudo-speaker selection (paper 000's ``plda`` distance, ``-llr``) and by the
evaluation's semi-informed attacker (:mod:`rtanon.eval.backend`, after LDA and length normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def length_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to norm sqrt(dim) (Garcia-Romero & Espy-Wilson 2011)."""
    x = np.asarray(x, dtype=np.float64)
    return x * (np.sqrt(x.shape[1]) / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12))


def class_stats(x: np.ndarray, labels: np.ndarray):
    """Per-class means (C, d), counts (C,) and the within-class deviations (N, d) of ``x`` (N, d)."""
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
        means, counts, within = class_stats(x, labels)
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

    def llr_pairs(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """LLR same vs different speaker between every row of ``a`` (A, d) and of ``b`` (B, d), one
        embedding each side -> (A, B) (paper 000 Eq. 2; ``-llr`` is its distance)."""
        return self.llr(a, 1, b)
