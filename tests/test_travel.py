"""Vocoder shards packed to travel to a GPU machine (``rtanon lab shards``): the unpacked shards hold the
packed F0, speakers and ids exactly, the decoded audio, and the shipped content graph's z of that audio;
an encoder that is not the graph's twin, and a partial copy, are refused."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.io.audio import read_audio  # noqa: E402
from rtanon.content.stream import ContentEncoderModel  # noqa: E402
from rtanon.train.shards import ShardDataset, ShardWriter  # noqa: E402
from rtanon.train.travel import TorchContentEncoder, pack_shards, unpack_shards  # noqa: E402

WEIGHTS = Path(__file__).resolve().parents[1] / "src" / "rtanon" / "models" / "content" / "content_encoder.pt"


@pytest.fixture(scope="module")
def content():
    return ContentEncoderModel()


@pytest.fixture(scope="module")
def packed(tmp_path_factory, content):
    """Shards of the demo speech in three utterances over two shards, and their pack."""
    root = tmp_path_factory.mktemp("travel")
    speech = read_audio(resources.files("rtanon") / "data" / "demo_speech.flac")
    rng = np.random.default_rng(0)
    w = ShardWriter(root / "shards", units_dim=content.output_dim, max_shard_mib=0.3)
    utts = []
    for i, t in enumerate((150, 110, 90)):  # frames
        start = 320 * 40 * i
        audio = speech[start:start + 320 * t]
        f0 = np.where(rng.random(2 * t) < 0.6, rng.uniform(80, 300, 2 * t), 0).astype(np.float32)
        w.add(f"utt{i}", i % 2, np.zeros((t, content.output_dim), np.float32), f0, audio)
        utts.append((f"utt{i}", i % 2, f0, audio))
    w.close(["spkA", "spkB"], rng.standard_normal((2, 256)).astype(np.float32))
    pack_shards(root / "shards", root / "pack", content, reference_seconds=2.0, progress=False)
    return root, utts


def test_unpacked_shards_hold_the_packed_features_and_the_graphs_z(packed, content, tmp_path):
    root, utts = packed
    manifest = json.loads((root / "pack" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 2 and not list((root / "pack").glob("*.npy"))
    encoder = TorchContentEncoder(WEIGHTS, content.lookahead_frames)
    unpack_shards(root / "pack", tmp_path / "shards", encoder, jobs=2, progress=False)
    data = ShardDataset(tmp_path / "shards")
    assert data.content_sha256 == content.sha256
    np.testing.assert_array_equal(data.embeddings, ShardDataset(root / "shards").embeddings)
    for u, (utt, spk, f0, audio) in enumerate(utts):
        t = len(f0) // 2
        assert data.frames[u] == t and data.speaker[u] == spk
        f = int(data.offsets[u])
        np.testing.assert_array_equal(data.f0_hz[2 * f:2 * (f + t)], f0)
        decoded = data.audio[320 * f:320 * (f + t)] / 32768.0
        # the codec changes the waveform, not the speech: strongly correlated with the original
        assert np.corrcoef(decoded, audio)[0, 1] > 0.9
        # z is the shipped graph's, of the decoded audio (what the vocoder will be asked to render)
        z = content.encode(decoded.astype(np.float32))
        got = data.units[f:f + t].astype(np.float32)
        cos = (z * got).sum(1) / (np.linalg.norm(z, axis=1) * np.linalg.norm(got, axis=1))
        assert cos.min() > 0.999


def test_an_encoder_that_is_not_the_graphs_twin_is_refused(packed, tmp_path):
    root, _ = packed
    lookahead = json.loads((root / "pack" / "manifest.json").read_text())["lookahead_frames"]
    encoder = TorchContentEncoder(WEIGHTS, lookahead)
    torch.manual_seed(0)
    with torch.no_grad():  # the same architecture, its weights moved: another encoder
        for p in encoder.model.parameters():
            p.add_(0.2 * p.std() * torch.randn_like(p))
    with pytest.raises(ValueError, match="not the packed graph"):
        unpack_shards(root / "pack", tmp_path / "a", encoder, progress=False)
    with pytest.raises(ValueError, match="frames ahead"):
        unpack_shards(root / "pack", tmp_path / "b", TorchContentEncoder(WEIGHTS, lookahead + 1), progress=False)
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_a_partial_copy_is_refused(packed, tmp_path):
    import shutil

    root, _ = packed
    copy = tmp_path / "pack"
    shutil.copytree(root / "pack", copy)
    opus = sorted(copy.glob("*.opus"))[-1]
    opus.write_bytes(opus.read_bytes()[:-100])
    lookahead = json.loads((copy / "manifest.json").read_text())["lookahead_frames"]
    with pytest.raises(ValueError, match="sha256"):
        unpack_shards(copy, tmp_path / "shards", TorchContentEncoder(WEIGHTS, lookahead), progress=False)


def test_train_vocoder_without_shards_or_data_says_what_to_pass(tmp_path, capsys):
    from rtanon.cli import main

    assert main(["train", "vocoder", "--out", str(tmp_path / "v")]) != 0
    assert "--data" in capsys.readouterr().err
