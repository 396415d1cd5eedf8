"""Feature extraction into shards with stand-in extractors on real so762_train speech (the content
encoder, F0 tracker and speaker encoder plug in the same way)."""

from __future__ import annotations

import numpy as np
import pytest

from rtanon.train.shards import Extractors, build_shards, speed_perturbation
from rtanon.train.shards import ShardDataset

K, D = 8, 4


def _units(audio):
    """Stand-in content units: one-hot of the frame's log energy, 8 bins, at 50 Hz."""
    n = audio.size // 320
    e = np.log10(np.mean(audio[: 320 * n].reshape(n, 320) ** 2, axis=1) + 1e-10)
    idx = np.clip(((e + 8) / 8 * K).astype(int), 0, K - 1)
    return np.eye(K, dtype=np.float32)[idx]


def _f0(audio):
    """Stand-in F0 at 100 Hz, one frame longer than the audio (exercises the trimming)."""
    return np.full(audio.size // 160 + 1, 123.0, np.float32)


def _embedding(audios):
    x = np.concatenate(audios)
    return np.array([x.std(), len(audios), x.size / 16000, 1.0], np.float32)


EXTRACTORS = Extractors(units=_units, f0_hz=_f0, speaker_embedding=_embedding)


def test_build_shards_from_real_speech(shared_data, tmp_path):
    train = shared_data / "so762_train"
    spk = sorted({line.split()[1] for line in (train / "utt2spk").read_text().splitlines()})[:2]
    manifest = build_shards([train], tmp_path / "shards", EXTRACTORS, K, speakers=set(spk),
                            augmentations=(speed_perturbation(1.1),), progress=False)
    data = ShardDataset(manifest.parent, verify=True)
    ids = data.manifest["speakers"]
    assert ids == [spk[0], f"sp1.1-{spk[0]}", spk[1], f"sp1.1-{spk[1]}"]
    assert data.embeddings.shape == (4, D) and len(data) == 4 * 14
    # units, F0 and audio are frame-aligned; the perturbed copies are 1/1.1 as long
    assert data.units.shape[0] * 2 == data.f0_hz.shape[0] and data.units.shape[0] * 320 == data.audio.shape[0]
    frames = {s: data.frames[data.speaker == i].sum() for i, s in enumerate(ids)}
    assert frames[f"sp1.1-{spk[0]}"] / frames[spk[0]] == pytest.approx(1 / 1.1, rel=0.02)
    # the audio is the speech itself (int16), not silence
    assert np.abs(data.audio).max() > 3000
    b = data.batch(np.random.default_rng(0), 4, 20)
    assert b["units"].shape == (4, 20, K) and np.allclose(b["units"].sum(-1), 1.0)


def test_refuses_evaluation_data(shared_data, tmp_path):
    with pytest.raises(ValueError, match="evaluation"):
        build_shards([shared_data / "so762_dev"], tmp_path / "s", EXTRACTORS, K, progress=False)


def test_speed_perturbation_length():
    x = np.random.default_rng(0).standard_normal(16000).astype(np.float32)
    assert speed_perturbation(0.9).apply(x).size == pytest.approx(16000 / 0.9, abs=2)
    with pytest.raises(ValueError, match="0.5 to 2.0"):
        speed_perturbation(3.0)
