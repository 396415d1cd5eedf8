"""Hyper-parameter search (paper 003 Sec. 3.4) and diversity report (paper 003 Fig. 2).

Both split the pool's speakers 50/50 within each gender (paper 003: train the
PCA+GMM on one half, compare with the other). ``search_gmm`` fits per gender
a PCA keeping each retained variance and a diagonal GMM of each size on the
train half, samples identities, and reports the KS statistic (Eq. 1) between
their cross-cosine-similarity distribution and the test half's, and the GMM
entropy (Eq. 2, Monte-Carlo, nats, in the PCA space: only comparable within
one PCA size). ``diversity_report`` draws N identities per strategy from a
model on the train half, using test-half speakers as the users, and reports
the KS statistic against the test half's cross-similarity distribution, the
mean pairwise cosine similarity, and how well the identity's F0 agrees with
its embedding (correlation of its median log-F0 with a ridge prediction from
the embedding, fitted on the test half's real speakers; the "real speakers
(train half)" row gives the same figure for real voices).
"""

from __future__ import annotations

import numpy as np

from rtanon.identity.generate import GenderGmm, GmmConfig, cross_similarities, ks_statistic
from rtanon.identity.pool import SpeakerPool


def split_pool(pool: SpeakerPool, seed: int = 0) -> tuple[SpeakerPool, SpeakerPool]:
    """Per-gender random 50/50 split of the speakers -> (train, test)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for g in ("f", "m"):
        idx = rng.permutation(pool.gender_index(g))
        train.append(idx[: idx.shape[0] // 2])
        test.append(idx[idx.shape[0] // 2:])
    return pool.subset(np.sort(np.concatenate(train))), pool.subset(np.sort(np.concatenate(test)))


def search_gmm(pool: SpeakerPool, variances=(0.8, 0.9, 0.95, 0.98, 0.99), components=(1, 2, 4, 8),
               pitch_weight: float = GmmConfig.pitch_weight, n_samples: int = 2000, n_ks: int = 400,
               repeats: int = 3, seed: int = 0) -> list[dict]:
    """Rows: gender, variance, n_pca, n_components, KS mean/sd over ``repeats`` splits, entropy."""
    rows = []
    for g in ("f", "m"):
        for v in variances:
            for k in components:
                ks, ent, npca, nn, nn_ref = [], [], [], [], []
                for r in range(repeats):
                    train, test = split_pool(pool, seed + r)
                    tr, te = train.gender_index(g), test.gender_index(g)
                    cfg = GmmConfig(pca_variance=v, n_components=k, pitch_weight=pitch_weight)
                    model = GenderGmm(train.embeddings[tr], train.f0_quantiles_hz[tr], train.quantile_levels,
                                      cfg, seed=r)
                    rng = np.random.default_rng(1000 + r)
                    ent.append(model.entropy(n_samples, rng))
                    emb, _ = model.decode(model.sample_scores(n_ks, rng))
                    ks.append(ks_statistic(cross_similarities(emb), cross_similarities(test.embeddings[te])))
                    npca.append(model.n_pca)
                    # memorisation check: similarity to the nearest training speaker, vs real held-out voices
                    nn.append(float((emb @ train.embeddings[tr].T).max(axis=1).mean()))
                    nn_ref.append(float((test.embeddings[te] @ train.embeddings[tr].T).max(axis=1).mean()))
                rows.append({"gender": g, "variance": v, "n_pca": int(np.median(npca)), "n_components": k,
                             "ks": float(np.mean(ks)), "ks_sd": float(np.std(ks)), "entropy": float(np.mean(ent)),
                             "nn_cos": float(np.mean(nn)), "nn_cos_real": float(np.mean(nn_ref))})
    return rows


def choose(rows: list[dict], memorisation_margin: float = 0.02) -> tuple[float, int]:
    """(variance, n_components) with the lowest KS averaged over genders among the
    configurations whose identities are not closer to their nearest training
    speaker than real held-out voices are (by more than ``memorisation_margin``
    cosine, in either gender): a GMM that copies its training speakers is not
    making new voices. Ties (within 0.005) go to fewer components, then less variance."""
    keys = sorted({(r["variance"], r["n_components"]) for r in rows})
    ok = [k for k in keys if all(r["nn_cos"] <= r["nn_cos_real"] + memorisation_margin
                                 for r in rows if (r["variance"], r["n_components"]) == k)] or keys
    mean_ks = {k: np.mean([r["ks"] for r in rows if (r["variance"], r["n_components"]) == k]) for k in ok}
    keys = ok
    best = min(mean_ks.values())
    near = [k for k in keys if mean_ks[k] <= best + 0.005]
    return min(near, key=lambda k: (k[1], k[0]))


def format_search(rows: list[dict]) -> str:
    lines = ["| gender | PCA variance | PCA dims | GMM components | KS (Eq. 1) mean ± sd | entropy (Eq. 2, nats) "
             "| cos to nearest train speaker (real held-out) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gender']} | {r['variance']:.2f} | {r['n_pca']} | {r['n_components']} | "
                     f"{r['ks']:.3f} ± {r['ks_sd']:.3f} | {r['entropy']:.1f} | {r['nn_cos']:.3f} ({r['nn_cos_real']:.3f}) |")
    return "\n".join(lines)


def _coherence(ref: SpeakerPool, emb: np.ndarray, f0_median_hz: np.ndarray, genders: np.ndarray) -> float:
    """Mean over genders of corr(ridge(embedding), log median F0) where the ridge
    regression (embedding -> log median F0, alpha by cross-validation) is fitted
    on the real speakers of ``ref``, which must be disjoint from the speakers the
    identities were made from (else the score is trivially high)."""
    from sklearn.linear_model import RidgeCV

    cors = []
    for g in ("f", "m"):
        tr, sel = ref.gender_index(g), genders == g
        if sel.sum() < 3 or np.ptp(f0_median_hz[sel]) == 0:
            continue
        ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(ref.embeddings[tr], np.log(ref.f0_quantiles_hz[tr, 50]))
        pred = ridge.predict(emb[sel])
        cors.append(np.corrcoef(pred, np.log(f0_median_hz[sel]))[0, 1])
    return float(np.mean(cors))


def diversity_report(pool: SpeakerPool, n: int = 200, seed: int = 0, gmm: GmmConfig | None = None,
                     strategies=None, progress: bool = True) -> list[dict]:
    """Rows: strategy, distance, KS vs the real test half, mean pairwise cosine, F0 coherence."""
    from tqdm import tqdm

    from rtanon.identity.speaker import IdentityModel

    gmm = gmm or GmmConfig()
    train, test = split_pool(pool, seed)
    model = IdentityModel(train, gmm=gmm)
    rng = np.random.default_rng(seed)
    real_sims = {g: cross_similarities(test.embeddings[test.gender_index(g)]) for g in ("f", "m")}
    strategies = strategies or [("random", "cosine", None), ("near", "cosine", None), ("far", "cosine", None),
                                ("dense", "cosine", None), ("sparse", "cosine", None), ("near", "plda", None),
                                ("far", "plda", None), ("dense", "plda", None), ("sparse", "plda", None),
                                ("gmm", "-", None), ("gmm", "-", gmm.theta_fd)]

    def summarise(name, dist, emb, f0med, genders):
        ks = [ks_statistic(cross_similarities(emb[genders == g]), real_sims[g]) for g in ("f", "m")]
        mc = [float(cross_similarities(emb[genders == g]).mean()) for g in ("f", "m")]
        return {"strategy": name, "distance": dist, "n": int(emb.shape[0]), "ks": float(np.mean(ks)),
                "ks_f": ks[0], "ks_m": ks[1], "mean_cos": float(np.mean(mc)),
                "f0_coherence": _coherence(test, emb, f0med, genders)}

    rows = [summarise("real speakers (train half)", "-", train.embeddings, train.f0_quantiles_hz[:, 50],
                      train.genders)]
    for name, dist, fd in tqdm(strategies, desc="identities", disable=not progress):
        users = rng.integers(0, len(test), size=n)
        ids = []
        for u in users:
            kw = {"user_embedding": test.embeddings[u], "user_gender": str(test.genders[u]), "gender": "same"}
            if name == "gmm":
                kw["theta_fd"] = fd if fd is not None else 1.0
            else:
                kw["distance"] = dist
            ids.append(model.new_identity(name, rng=rng, **kw))
        emb = np.stack([i.embedding for i in ids])
        f0med = np.array([i.f0_quantiles_hz[50] for i in ids])
        genders = np.array([i.gender for i in ids])
        label = name if name != "gmm" else ("gmm (PCA+GMM)" if fd is None else f"gmm, θ_FD={fd}")
        rows.append(summarise(label, dist, emb, f0med, genders))
    if gmm.pitch_weight > 0:  # ablation: the same GMM but pitch drawn independently of the voice
        ids = [model.new_identity("gmm", gender="same", user_gender=str(test.genders[u]), rng=rng)
               for u in rng.integers(0, len(test), size=n)]
        emb = np.stack([i.embedding for i in ids])
        genders = np.array([i.gender for i in ids])
        f0med = np.array([rng.choice(train.f0_quantiles_hz[train.genders == g, 50]) for g in genders])
        rows.append(summarise("gmm, F0 drawn independently", "-", emb, f0med, genders))
    return rows


def format_diversity(rows: list[dict]) -> str:
    lines = ["| identities | distance | N | KS vs real (mean f/m) | KS f | KS m | mean pairwise cos | F0-voice coherence |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['distance']} | {r['n']} | {r['ks']:.3f} | {r['ks_f']:.3f} | "
                     f"{r['ks_m']:.3f} | {r['mean_cos']:.3f} | {r['f0_coherence']:.2f} |")
    return "\n".join(lines)


def search_pitch_weight(pool: SpeakerPool, weights=(0.0, 0.05, 0.1, 0.2, 0.3), gmm: GmmConfig | None = None,
                        n: int = 400, repeats: int = 3, seed: int = 0) -> list[dict]:
    """The joint voice + pitch model over the pitch block's share of variance: KS of the
    embeddings' cross-similarities, KS of the median F0 against the test half's speakers,
    and F0-voice coherence (see :func:`_coherence`), averaged over genders and splits."""
    from dataclasses import replace

    gmm = gmm or GmmConfig()
    rows = []
    for w in weights:
        ks_e, ks_f0, coh = [], [], []
        for r in range(repeats):
            train, test = split_pool(pool, seed + r)
            rng = np.random.default_rng(2000 + r)
            embs, meds, gens = [], [], []
            for g in ("f", "m"):
                tr, te = train.gender_index(g), test.gender_index(g)
                m = GenderGmm(train.embeddings[tr], train.f0_quantiles_hz[tr], train.quantile_levels,
                              replace(gmm, pitch_weight=w), seed=r)
                emb, f0 = m.decode(m.sample_scores(n, rng))
                ks_e.append(ks_statistic(cross_similarities(emb), cross_similarities(test.embeddings[te])))
                ks_f0.append(ks_statistic(f0[:, 50], test.f0_quantiles_hz[te, 50]))
                embs.append(emb)
                meds.append(f0[:, 50])
                gens.append(np.full(n, g))
            coh.append(_coherence(test, np.concatenate(embs), np.concatenate(meds), np.concatenate(gens))
                       if w > 0 else float("nan"))
        rows.append({"pitch_weight": w, "ks_embedding": float(np.mean(ks_e)), "ks_median_f0": float(np.mean(ks_f0)),
                     "f0_coherence": float(np.nanmean(coh)) if w > 0 else float("nan")})
    return rows


def format_pitch_weight(rows: list[dict]) -> str:
    lines = ["| pitch weight | KS embeddings | KS median F0 vs real | F0-voice coherence |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pitch_weight']:.2f} | {r['ks_embedding']:.3f} | {r['ks_median_f0']:.3f} | "
                     f"{r['f0_coherence']:.2f} |")
    return "\n".join(lines)
