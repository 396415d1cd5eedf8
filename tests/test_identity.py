"""Pseudo-speaker identities (issue 4): pool, paper 000 selection, paper 003 generation,
session identities. Uses the shipped pool; only the encoder tests embed real audio."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rtanon.identity.generate import GmmConfig, cross_similarities, ks_statistic
from rtanon.identity.pitch import QUANTILE_LEVELS, mixture_quantiles_hz
from rtanon.identity.pool import POOL_FORMAT_VERSION, PoolError, SpeakerPool
from rtanon.identity.speaker import IdentityError, IdentityModel, PseudoSpeaker, new_identity


@pytest.fixture(scope="module")
def pool() -> SpeakerPool:
    return SpeakerPool.load_default()


@pytest.fixture(scope="module")
def model(pool) -> IdentityModel:
    return IdentityModel(pool)


def test_shipped_pool_is_complete(pool):
    assert len(pool) > 300 and pool.dim == 256
    assert set(np.unique(pool.genders)) == {"f", "m"}
    assert np.allclose(np.linalg.norm(pool.embeddings, axis=1), 1.0, atol=1e-4)
    assert np.all(np.diff(pool.f0_quantiles_hz, axis=1) >= 0)
    assert 50 < np.median(pool.f0_quantiles_hz[:, 50]) < 400
    assert pool.meta["format_version"] == POOL_FORMAT_VERSION
    assert pool.meta["encoder"].startswith("resemblyzer") and pool.meta["f0_tracker"]
    assert np.isfinite(pool.ages_years).sum() > 0  # so762 has ages, libri does not
    # utterance embeddings belong to the speakers whose means they form
    s = 0
    mean = pool.utt_embeddings[pool.utt_speaker == s].mean(axis=0)
    assert float(mean @ pool.embeddings[s]) / np.linalg.norm(mean) > 0.999


def test_pool_roundtrip_and_version_check(pool, tmp_path):
    small = pool.subset(np.arange(10))
    small.save(tmp_path / "p.npz")
    back = SpeakerPool.load(tmp_path / "p.npz")
    assert np.array_equal(back.speaker_ids, small.speaker_ids)
    assert np.allclose(back.embeddings, small.embeddings)
    assert back.utt_embeddings.shape[0] == (pool.utt_speaker < 10).sum()
    bad = SpeakerPool(**{**small.__dict__, "meta": dict(small.meta)})
    bad.save(tmp_path / "v.npz")
    with np.load(tmp_path / "v.npz") as z:
        arrays = dict(z)
    meta = json.loads(str(arrays["meta"]))
    meta["format_version"] = POOL_FORMAT_VERSION + 1
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "v.npz", **arrays)
    with pytest.raises(PoolError, match="format version"):
        SpeakerPool.load(tmp_path / "v.npz")
    with pytest.raises(PoolError, match="pool build"):
        SpeakerPool.load(tmp_path / "missing.npz")


def test_mixture_quantiles_equal_quantiles_of_concatenated_f0():
    rng = np.random.default_rng(0)
    a = rng.lognormal(np.log(120), 0.15, 3000)
    b = rng.lognormal(np.log(230), 0.1, 1000)
    qa, qb = np.quantile(a, QUANTILE_LEVELS), np.quantile(b, QUANTILE_LEVELS)
    got = mixture_quantiles_hz(np.stack([qa, qb]), np.array([a.size, b.size]))
    want = np.quantile(np.concatenate([a, b]), QUANTILE_LEVELS)
    assert np.all(np.diff(got) >= 0)
    assert np.max(np.abs(got[2:-2] - want[2:-2]) / want[2:-2]) < 0.03


@pytest.mark.parametrize("distance", ["cosine", "plda"])
def test_far_candidates_are_farther_than_near_ones(model, pool, distance):
    rng = np.random.default_rng(1)
    for user in rng.choice(len(pool), 6, replace=False):
        u, g = pool.embeddings[user], str(pool.genders[user])
        near = model.selector.select("near", g, rng, distance=distance, user_embedding=u)
        far = model.selector.select("far", g, rng, distance=distance, user_embedding=u)
        dn = model.selector.distance(u, pool.embeddings[near.candidates], distance)[0]
        df = model.selector.distance(u, pool.embeddings[far.candidates], distance)[0]
        assert dn.max() < df.min()
        assert near.details["N_star"] < near.details["N"] < (pool.genders == g).sum()
        # the averaged target inherits the ordering
        assert (model.selector.distance(u, near.embedding, "cosine")[0, 0]
                < model.selector.distance(u, far.embedding, "cosine")[0, 0])


def test_dense_and_sparse_pick_half_of_one_cluster_not_the_users(model, pool):
    rng = np.random.default_rng(2)
    user = int(pool.gender_index("f")[0])
    u = pool.embeddings[user]
    clusters = model.selector.clusters("f", "cosine")
    assert 3 <= len(clusters) < (pool.genders == "f").sum() // 2
    closest = int(np.argmin([model.selector.distance(u, pool.embeddings[c], "cosine").mean() for c in clusters]))
    sizes = {}
    for prox in ("dense", "sparse"):
        sel = model.selector.select(prox, "f", rng, distance="cosine", user_embedding=u)
        owners = {i for i, c in enumerate(clusters) if np.isin(sel.candidates, c).any()}
        assert len(owners) == 1 and closest not in owners
        k = owners.pop()
        assert sel.candidates.shape[0] == max(1, round(clusters[k].shape[0] / 2))
        sizes[prox] = clusters[k].shape[0]
    assert sizes["dense"] > sizes["sparse"]


def test_gender_choice_is_respected(model, pool):
    rng = np.random.default_rng(3)
    for strategy in ("random", "dense", "sparse", "gmm"):
        for user_gender in ("m", "f"):
            same = model.new_identity(strategy, gender="same", user_gender=user_gender, rng=rng)
            opp = model.new_identity(strategy, gender="opposite", user_gender=user_gender, rng=rng)
            assert same.gender == user_gender and opp.gender != user_gender
    sel = model.selector.select("random", "m", rng)
    assert set(pool.genders[sel.candidates]) == {"m"}
    drawn = {model.new_identity("random", rng=rng).gender for _ in range(20)}
    assert drawn == {"m", "f"}
    # the gender inferred from a voice agrees with the label for most held-out speakers
    from rtanon.identity.report import split_pool

    train, test = split_pool(pool, 0)
    half = IdentityModel(train)
    guess = np.array([half.infer_gender(e) for e in test.embeddings])
    assert (guess == test.genders).mean() > 0.8
    with pytest.raises(IdentityError, match="enroll"):
        model.new_identity("gmm", gender="same", rng=rng)


def test_selection_pitch_target_follows_candidates(model, pool):
    rng = np.random.default_rng(4)
    for g in ("m", "f"):
        sel = model.selector.select("random", g, rng)
        med = pool.f0_quantiles_hz[sel.candidates, 50]
        assert med.min() <= sel.f0_quantiles_hz[50] <= med.max()
        assert sel.f0_quantiles_hz[0] == pytest.approx(pool.f0_quantiles_hz[sel.candidates, 0].min())


def test_forced_dissimilarity_is_respected(model, pool):
    rng = np.random.default_rng(5)
    user = int(pool.gender_index("m")[3])
    u = pool.embeddings[user]
    free = np.stack([model.new_identity("gmm", gender="same", user_gender="m", rng=rng, theta_fd=1.0).embedding
                     for _ in range(200)])
    theta = float(np.quantile(free @ u, 0.3))  # binding: 70 % of free samples would violate it
    forced = [model.new_identity("gmm", gender="same", user_embedding=u, theta_fd=theta, rng=rng)
              for _ in range(50)]
    assert all(float(f.embedding @ u) <= theta for f in forced)
    assert all(f.strategy["theta_fd"] == theta for f in forced)
    emb, _, redraws = model.generator.models["m"].sample(50, rng, u, theta_fd=theta)
    assert redraws > 0 and float((emb @ u).max()) <= theta
    from rtanon.config import ConfigError

    with pytest.raises(ConfigError, match="forced dissimilarity"):  # a one-line CLI error, not a traceback
        model.generator.models["m"].sample(1, rng, u, theta_fd=-1.0)


def test_gmm_identity_has_coherent_pitch_and_valid_embedding(model):
    rng = np.random.default_rng(6)
    ids = [model.new_identity("gmm", gender="random", rng=rng) for _ in range(200)]
    for i in ids:
        assert abs(np.linalg.norm(i.embedding) - 1) < 1e-5
        assert np.all(np.diff(i.f0_quantiles_hz) >= 0) and 40 < i.f0_quantiles_hz[50] < 700
    med = {g: np.median([i.median_f0_hz for i in ids if i.gender == g]) for g in ("m", "f")}
    assert med["f"] > med["m"]
    # pitch is modelled jointly: across identities, median F0 varies and follows the voice
    # (a ridge regression fitted on real speakers predicts it from the embedding)
    from sklearn.linear_model import RidgeCV

    for g in ("m", "f"):
        idx = model.pool.gender_index(g)
        ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(model.pool.embeddings[idx],
                                                         np.log(model.pool.f0_quantiles_hz[idx, 50]))
        mine = [i for i in ids if i.gender == g]
        pred = ridge.predict(np.stack([i.embedding for i in mine]))
        assert np.corrcoef(pred, np.log([i.median_f0_hz for i in mine]))[0, 1] > 0.5
    clipped = IdentityModel(model.pool, gmm=GmmConfig(clip_negative=True)).new_identity("gmm", rng=rng)
    assert clipped.embedding.min() >= 0


def test_gmm_identities_match_real_similarities_better_than_averages(pool):
    from rtanon.identity.report import split_pool

    train, test = split_pool(pool, 0)
    model = IdentityModel(train)
    rng = np.random.default_rng(7)
    real = cross_similarities(test.embeddings[test.gender_index("f")])
    gmm = np.stack([model.new_identity("gmm", gender="same", user_gender="f", rng=rng).embedding for _ in range(80)])
    avg = np.stack([model.new_identity("random", gender="same", user_gender="f", rng=rng).embedding for _ in range(80)])
    ks_gmm, ks_avg = ks_statistic(cross_similarities(gmm), real), ks_statistic(cross_similarities(avg), real)
    assert ks_gmm < ks_avg
    assert cross_similarities(avg).mean() > cross_similarities(gmm).mean()  # averaging collapses diversity


def test_fresh_identity_per_session_unless_pinned(model, tmp_path):
    a = model.new_identity("gmm")
    b = model.new_identity("gmm")
    assert not np.allclose(a.embedding, b.embedding)
    c = model.new_identity("dense", rng=np.random.default_rng(11))
    d = model.new_identity("dense", rng=np.random.default_rng(11))
    assert np.array_equal(c.embedding, d.embedding) and np.array_equal(c.f0_quantiles_hz, d.f0_quantiles_hz)
    a.save(tmp_path / "id.json")
    pinned = PseudoSpeaker.load(tmp_path / "id.json")
    assert np.allclose(pinned.embedding, a.embedding, atol=1e-6)
    assert np.allclose(pinned.f0_quantiles_hz, a.f0_quantiles_hz, atol=1e-2)
    assert pinned.gender == a.gender and pinned.strategy == a.strategy


def test_identity_file_never_holds_the_user_embedding(model, pool, tmp_path):
    u = pool.embeddings[5]
    for strategy in ("near", "far", "gmm"):
        ident = model.new_identity(strategy, user_embedding=u, gender="same", rng=np.random.default_rng(0))
        ident.save(tmp_path / "x.json")
        d = json.loads((tmp_path / "x.json").read_text())
        assert set(d) >= {"embedding", "f0_quantiles_hz", "gender", "strategy", "created_utc"}
        assert len(d["embedding"]) == 256 and len(d["f0_quantiles_hz"]) == 101
        assert float(np.asarray(d["embedding"]) @ u) < 0.999
        assert not any(isinstance(v, list) and len(v) == 256 for v in d["strategy"].values())


def test_identity_file_errors(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"embedding": [0, 0], "f0_quantiles_hz": [100, 200]}')
    with pytest.raises(IdentityError, match="all zeros"):
        PseudoSpeaker.load(p)
    p.write_text("not json")
    with pytest.raises(IdentityError, match="not an rtanon identity"):
        PseudoSpeaker.load(p)
    with pytest.raises(IdentityError, match="identity new"):
        PseudoSpeaker.load(tmp_path / "none.json")


def test_needs_user_strategies_refuse_without_voice(model):
    with pytest.raises(IdentityError, match="enroll"):
        new_identity("far", model=model)
    with pytest.raises(IdentityError, match="strategy"):
        new_identity("loud", model=model)


def test_plda_separates_same_and_different_speakers(pool, model):
    from rtanon.identity.plda import TwoCovPlda

    so = np.flatnonzero(pool.corpora == "so762_train")[:40]
    train_spk = so[:20]
    keep = np.isin(pool.utt_speaker, train_spk)
    plda = TwoCovPlda.fit(pool.utt_embeddings[keep], pool.utt_speaker[keep])
    held = np.isin(pool.utt_speaker, so[20:])
    x, lab = pool.utt_embeddings[held], pool.utt_speaker[held]
    llr = plda.llr_pairs(x, x)
    same = lab[:, None] == lab[None, :]
    off = ~np.eye(lab.shape[0], dtype=bool)
    assert np.median(llr[same & off]) > np.median(llr[~same])
    # the shipped-pool selector's PLDA distance ranks a speaker's own mean nearest among most speakers
    d = model.selector.distance(pool.utt_embeddings[:50], pool.embeddings, "plda")
    assert (np.argmin(d, axis=1) == pool.utt_speaker[:50]).mean() > 0.5


def test_cli_identity_new_and_show(tmp_path, capsys):
    from rtanon.cli import main

    for strategy in ("random", "dense", "sparse", "gmm"):
        out = tmp_path / f"{strategy}.json"
        assert main(["identity", "new", "--strategy", strategy, "--distance", "plda", "--out", str(out)]) == 0
        d = json.loads(out.read_text())
        assert len(d["embedding"]) == 256 and len(d["f0_quantiles_hz"]) == 101
        assert main(["identity", "show", str(out)]) == 0
        assert strategy in capsys.readouterr().out
    assert main(["identity", "new", "--strategy", "near", "--out", str(tmp_path / "n.json")]) == 2
    assert "--enroll" in capsys.readouterr().err


def test_enroll_without_the_speaker_encoder_is_a_missing_tool(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import rtanon

    import soundfile

    wav = tmp_path / "me.wav"
    soundfile.write(wav, np.zeros(16000, np.float32), 16000)
    code = ("import sys; sys.modules['resemblyzer'] = None\n"  # as if it were not installed
            "from rtanon.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "identity", "new", "--enroll", str(wav), "--out",
                        str(tmp_path / "id.json")], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(Path(rtanon.__file__).parents[1]), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    assert "resemblyzer" in r.stderr and "RTANON_EXTRAS=identity" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "id.json").exists()
