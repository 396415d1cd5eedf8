"""Speaker encoder, F0 interface and pool building on a few real so762_dev files."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("resemblyzer")


@pytest.fixture(scope="module")
def dev_by_speaker(shared_data) -> dict[str, list]:
    d = shared_data / "so762_dev"
    wav = dict(line.split() for line in (d / "wav.scp").read_text().splitlines())
    by = defaultdict(list)
    for line in (d / "utt2spk").read_text().splitlines():
        utt, spk = line.split()
        by[spk].append(d / wav[utt])
    return dict(sorted(by.items()))


@pytest.fixture(scope="module")
def encoder():
    from rtanon.identity.encoder import make_encoder

    return make_encoder("resemblyzer")


def test_encoder_same_speaker_closer_than_other_speakers(encoder, dev_by_speaker):
    from rtanon.io.audio import read_audio

    spks = list(dev_by_speaker)[:3]
    embs = {s: [encoder.embed(read_audio(p)) for p in dev_by_speaker[s][:2]] for s in spks}
    for s in spks:
        for e in embs[s]:
            assert e.shape == (256,) and e.dtype == np.float32 and abs(np.linalg.norm(e) - 1) < 1e-5
    same = [float(embs[s][0] @ embs[s][1]) for s in spks]
    diff = [float(embs[a][0] @ embs[b][0]) for a in spks for b in spks if a < b]
    assert min(same) > np.mean(diff)
    with pytest.raises(ValueError, match="float32"):
        encoder.embed(np.zeros(16000, dtype=np.float64))


def test_embed_first_speech_waits_for_enough_speech(encoder, speech):
    from rtanon.identity.encoder import embed_first_speech

    silence = np.zeros(16000 * 2, dtype=np.float32)
    assert embed_first_speech(silence, encoder) is None
    assert embed_first_speech(speech[:16000], encoder, speech_seconds=3.0) is None
    e = embed_first_speech(np.concatenate([silence, speech]), encoder, speech_seconds=1.5)
    assert e is not None
    assert float(e @ encoder.embed(speech)) > 0.8


def test_f0_interface_on_real_speech(speech):
    from rtanon.identity.pitch import QUANTILE_LEVELS, quantiles_hz, track_f0_hz

    f0, name = track_f0_hz(speech)
    assert name in ("rtanon", "pyworld-harvest")
    assert abs(f0.shape[0] - speech.shape[0] / 160) <= 2
    voiced = f0[f0 > 0]
    assert voiced.size > 0.2 * f0.size and voiced.min() >= 60 and voiced.max() <= 600
    q = quantiles_hz(f0)
    assert q.shape == QUANTILE_LEVELS.shape and np.all(np.diff(q) >= 0)


@pytest.mark.slow
def test_pool_build_from_kaldi_dir_and_cli_enroll(tmp_path, dev_by_speaker, encoder):
    from rtanon.cli import main
    from rtanon.identity.pool import SpeakerPool, build_pool

    kd = tmp_path / "data"
    kd.mkdir()
    spks = list(dev_by_speaker)[:2]
    scp, u2s = [], []
    for s in spks:
        for i, p in enumerate(dev_by_speaker[s][:2]):
            scp.append(f"{s}_{i} {p}")
            u2s.append(f"{s}_{i} {s}")
    (kd / "wav.scp").write_text("\n".join(scp) + "\n")
    (kd / "utt2spk").write_text("\n".join(u2s) + "\n")
    (kd / "spk2gender").write_text(f"{spks[0]} f\n{spks[1]} m\n")
    (kd / "spk2age").write_text(f"{spks[0]} 9\n")
    pool = build_pool([kd], encoder, f0_max_seconds_per_speaker=3.0, progress=False)
    assert list(pool.speaker_ids) == spks and list(pool.genders) == ["f", "m"]
    assert pool.ages_years[0] == 9 and np.isnan(pool.ages_years[1])
    assert pool.utt_embeddings.shape == (4, 256)
    expect = pool.utt_embeddings[:2].mean(axis=0)
    assert np.allclose(pool.embeddings[0], expect / np.linalg.norm(expect), atol=1e-3)
    pool.save(tmp_path / "p.npz")
    assert len(SpeakerPool.load(tmp_path / "p.npz")) == 2
    # enrollment from a real file: far identity from the shipped pool, user embedding not written
    out = tmp_path / "far.json"
    wav = str(dev_by_speaker[spks[0]][2])
    assert main(["identity", "new", "--strategy", "far", "--gender", "same", "--enroll", wav,
                 "--out", str(out), "--seed", "1"]) == 0
    d = json.loads(out.read_text())
    from rtanon.io.audio import read_audio

    user = encoder.embed(read_audio(wav))
    assert float(np.asarray(d["embedding"]) @ user) < 0.99
    assert d["strategy"]["name"] == "far"
