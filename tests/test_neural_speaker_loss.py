"""The training speaker loss: resemblyzer's encoder re-run differentiably in torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("resemblyzer")
pytest.importorskip("librosa")

from rtanon.neural.speaker_loss import load_speaker_embedder, speaker_privacy_loss  # noqa: E402

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "so762_dev"


def _dev_audio(n: int) -> list[tuple[str, np.ndarray]]:
    import soundfile as sf

    if not (DEV / "wav.scp").exists():
        pytest.skip(f"{DEV} not found (the shared data sits beside the checkout)")
    lines = [line.split() for line in (DEV / "wav.scp").read_text().splitlines()]
    spk = dict(line.split() for line in (DEV / "utt2spk").read_text().splitlines())
    out, seen = [], set()
    for utt, rel in lines:  # one utterance of each of the first n speakers
        if spk[utt] in seen:
            continue
        seen.add(spk[utt])
        audio, sr = sf.read(DEV / rel, dtype="float32")
        assert sr == 16000
        out.append((spk[utt], audio[:32000]))
        if len(out) == n:
            break
    return out


def test_embedder_equals_resemblyzer_on_the_same_audio():
    from resemblyzer import VoiceEncoder
    from resemblyzer.audio import normalize_volume, wav_to_mel_spectrogram

    reference = VoiceEncoder("cpu", verbose=False)
    embedder = load_speaker_embedder()
    for _, audio in _dev_audio(3):
        mel = wav_to_mel_spectrogram(normalize_volume(audio, -30))
        expected = reference(torch.from_numpy(mel)[None])[0].detach().numpy()
        got = embedder(torch.from_numpy(audio)[None])[0].detach().numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)
        # the volume normalisation happens inside: a quieter copy embeds the same
        quiet = embedder(torch.from_numpy(0.1 * audio)[None])[0].detach().numpy()
        np.testing.assert_allclose(quiet, expected, atol=1e-5)


def test_loss_is_minus_one_plus_cos_for_the_target_itself_and_has_gradients():
    (_, a), (_, b) = _dev_audio(2)
    embedder = load_speaker_embedder()
    source = torch.from_numpy(np.stack([a[:11520], b[:11520]]))
    with torch.no_grad():
        e_src = embedder(source)
    # converted == source, target == another voice's embedding: loss = 1 - cos(src, other)
    converted = source.clone().requires_grad_(True)
    loss, cos_s, cos_t = speaker_privacy_loss(embedder, converted, source, e_src.flip(0))
    cross = float((e_src[0] * e_src[1]).sum())
    assert cos_s == pytest.approx(1.0, abs=1e-5) and cos_t == pytest.approx(cross, abs=1e-5)
    assert float(loss.detach()) == pytest.approx(1.0 - cross, abs=1e-5)
    loss.backward()
    assert converted.grad is not None and float(converted.grad.abs().sum()) > 0
    assert not any(p.requires_grad for p in embedder.parameters())
