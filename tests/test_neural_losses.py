"""Vocoder training losses and discriminators: shapes, zero for identical inputs, sign of the GAN terms."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.train.discriminators import Discriminators  # noqa: E402
from rtanon.train.vocoder_config import DiscriminatorConfig  # noqa: E402
from rtanon.train.losses import (  # noqa: E402
    MelLoss,
    MelSpectrogram,
    MultiResolutionStftLoss,
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    generator_loss,
    slaney_mel_filterbank,
)

SMALL_D = DiscriminatorConfig(mpd_channels=(4, 8, 8, 8, 8), msd_channels=(4, 8, 16, 16, 16, 16, 16))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _audio(seed=0, n=4000, batch=2):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 16000
    return 0.3 * torch.sin(2 * np.pi * 220 * t)[None].repeat(batch, 1) + 0.05 * torch.randn(batch, n, generator=g)


def test_mel_filterbank_matches_librosa_when_available():
    fb = slaney_mel_filterbank(16000, 1024, 80)
    assert fb.shape == (80, 513) and (fb >= 0).all() and (fb.sum(1) > 0).all()
    librosa = pytest.importorskip("librosa")
    ref = librosa.filters.mel(sr=16000, n_fft=1024, n_mels=80)
    np.testing.assert_allclose(fb, ref, atol=1e-6)


def test_mel_spectrogram_shape():
    mel = MelSpectrogram()(_audio())
    assert mel.shape == (2, 80, 4000 // 160 + 1) and torch.isfinite(mel).all()


def test_spectral_losses_zero_for_identical_and_positive_otherwise():
    a, b = _audio(0), _audio(1)
    mel, stft = MelLoss(), MultiResolutionStftLoss()
    assert float(mel(a, a)) == 0.0 and float(stft(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(mel(a, b)) > 0.01 and float(stft(a, b)) > 0.01
    assert float(mel(a, 0.5 * a)) == pytest.approx(np.log(2), rel=0.05)  # log-mel: a gain is a shift


def test_discriminators_shapes_and_feature_matching():
    d = Discriminators(SMALL_D)
    x = _audio(n=3200)[:, None]
    with torch.no_grad():
        scores, fmaps = d(x)
    assert len(scores) == len(fmaps) == 5 + 3
    assert all(s.shape[0] == 2 and s.ndim == 2 for s in scores)
    assert [len(f) for f in fmaps] == [6] * 5 + [8] * 3
    assert float(feature_matching_loss(fmaps, fmaps)) == 0.0
    with torch.no_grad():
        _, fmaps_b = d(_audio(seed=3, n=3200)[:, None])
    assert float(feature_matching_loss(fmaps, fmaps_b)) > 0.0


def test_gan_losses_follow_least_squares_targets():
    ones, zeros = [torch.ones(2, 5)], [torch.zeros(2, 5)]
    assert float(discriminator_loss(ones, zeros)) == 0.0  # perfect discriminator
    assert float(discriminator_loss(zeros, ones)) == 2.0
    assert float(generator_adversarial_loss(ones)) == 0.0
    assert float(generator_adversarial_loss(zeros)) == 1.0


def test_generator_loss_weights_eq2():
    mel = torch.tensor(0.5)
    total, parts = generator_loss(mel, fake_scores=[torch.zeros(1, 3)], real_fmaps=[[torch.ones(2)]],
                                  fake_fmaps=[[torch.zeros(2)]])
    assert parts["adv"] == 1.0 and parts["fm"] == 1.0
    assert float(total) == pytest.approx(45 * 0.5 + 1.0 + 2 * 1.0)
    total, parts = generator_loss(mel)
    assert float(total) == pytest.approx(22.5) and set(parts) == {"mel", "total"}


def test_gradients_reach_the_generated_audio():
    d = Discriminators(SMALL_D)
    g = _audio(5, n=3200).requires_grad_(True)
    r = _audio(6, n=3200)
    fs, ff = d(g[:, None])
    _, rf = d(r[:, None])
    total, _ = generator_loss(MelLoss()(g, r), fs, rf, ff, MultiResolutionStftLoss()(g, r))
    total.backward()
    assert g.grad is not None and torch.isfinite(g.grad).all() and g.grad.abs().sum() > 0
