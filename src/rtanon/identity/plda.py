"""Two-covariance PLDA (Ioffe 2006; Brümmer & de Villiers 2010; EM of Sizov et al. 2014).

Embeddings are centred and projected on their first ``dim`` principal axes,
then modelled as ``x = y + e`` with the speaker variable ``y ~ N(mu, Sb)`` and
the within-speaker term ``e ~ N(0, Sw)``. ``Plda.fit(x, speaker)`` runs EM on
utterance embeddings (speakers with one utterance inform ``Sb`` only through
the EM posteriors); ``plda.llr(a, b)`` is the closed-form log-likelihood ratio
of "same speaker" vs "different speakers" (paper 000 Eq. 2); paper 000 uses
``-llr`` as the distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Plda:
    mean: np.ndarray  # (D,) centre of the input space
    proj: np.ndarray  # (D, d) PCA projection
    mu: np.ndarray  # (d,)
    sb: np.ndarray  # (d, d) between-speaker covariance
    sw: np.ndarray  # (d, d) within-speaker covariance
    _q: np.ndarray  # (d, d) quadratic term of the LLR
    _p: np.ndarray  # (d, d) cross term of the LLR
    _const: float

    @classmethod
    def fit(cls, x: np.ndarray, speaker: np.ndarray, dim: int = 100, iters: int = 10,
            reg: float = 1e-4) -> "Plda":
        """``x``: (U, D) float utterance embeddings; ``speaker``: (U,) int labels."""
        x = np.asarray(x, dtype=np.float64)
        speaker = np.asarray(speaker)
        mean = x.mean(axis=0)
        xc = x - mean
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        dim = min(dim, vt.shape[0])
        proj = vt[:dim].T
        z = xc @ proj
        labels, inv, counts = np.unique(speaker, return_inverse=True, return_counts=True)
        sums = np.zeros((labels.shape[0], dim))
        np.add.at(sums, inv, z)
        means = sums / counts[:, None]
        multi = counts > 1
        resid = z - means[inv]
        sw = resid.T @ resid / max(1, int(np.sum(counts[multi] - 1)))
        sb = np.cov(means.T) + reg * np.eye(dim)
        sw = sw + reg * np.eye(dim)
        mu = means.mean(axis=0)
        zz = z.T @ z
        for _ in range(iters):
            b_inv, w_inv = np.linalg.inv(sb), np.linalg.inv(sw)
            ey, eyy_sum, cross = np.zeros_like(means), np.zeros((dim, dim)), np.zeros((dim, dim))
            for n in np.unique(counts):
                sel = counts == n
                cov = np.linalg.inv(b_inv + n * w_inv)
                ey[sel] = (cov @ (b_inv @ mu[:, None] + w_inv @ sums[sel].T)).T
                eyy_sum += sel.sum() * cov + ey[sel].T @ ey[sel]
                cross += n * (sel.sum() * cov + ey[sel].T @ ey[sel])
            mu = ey.mean(axis=0)
            sb = eyy_sum / labels.shape[0] - np.outer(mu, mu) + reg * np.eye(dim)
            fy = sums.T @ ey
            sw = (zz - fy - fy.T + cross) / z.shape[0] + reg * np.eye(dim)
        return cls._with_scoring(mean, proj, mu, sb, sw)

    @classmethod
    def _with_scoring(cls, mean, proj, mu, sb, sw) -> "Plda":
        st = sb + sw
        d = st.shape[0]
        joint = np.block([[st, sb], [sb, st]])
        jinv = np.linalg.inv(joint)
        st_inv = np.linalg.inv(st)
        a, b = jinv[:d, :d], jinv[:d, d:]
        q = 0.5 * (st_inv - a)
        p = -b
        const = -0.5 * np.linalg.slogdet(joint)[1] + np.linalg.slogdet(st)[1]
        return cls(mean, proj, mu, sb, sw, q, p, float(const))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) @ self.proj - self.mu

    def llr(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """LLR same vs different speaker between every row of ``a`` (A, D) and of ``b`` (B, D) -> (A, B)."""
        za, zb = self.transform(np.atleast_2d(a)), self.transform(np.atleast_2d(b))
        qa = np.einsum("ij,jk,ik->i", za, self._q, za)
        qb = np.einsum("ij,jk,ik->i", zb, self._q, zb)
        return qa[:, None] + qb[None, :] + za @ self._p @ zb.T + self._const
