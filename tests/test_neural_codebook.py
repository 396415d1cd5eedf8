"""The vector-quantised content input (``VocoderConfig.units_codebook``, the balanced privacy point): each
``z`` frame is rendered as its nearest codeword, in torch and in the exported graph, and the codebook is a
reproducible spherical k-means of the training ``z``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtanon.config import ConfigError  # noqa: E402
from rtanon.neural.vocoder import HarmonicNoiseVocoder, VocoderConfig, load_generator  # noqa: E402
from rtanon.train.vocoder import fit_codebook, warm_start  # noqa: E402

K, D, WORDS = 8, 4, 5
CFG = VocoderConfig(units_dim=K, speaker_dim=D, initial_channels=16, min_channels=4, prenet_dilations=(1,),
                    envelope_points=16, envelope_harmonics=16, noise_taps=16)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _unit_rows(a):
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(old model without a codebook, its checkpoint, the codebook, the warm-started model with it)."""
    torch.manual_seed(0)
    old = HarmonicNoiseVocoder(CFG)
    with torch.no_grad():  # a trained residual stack, so that the audio is not the synthesiser's alone
        old.conv_post.conv.parametrizations.weight.original0.fill_(0.3)
    path = tmp_path_factory.mktemp("vq") / "old.pt"
    torch.save({"generator": old.state_dict(), "config": dataclasses.asdict(CFG), "step": 3}, path)
    codebook = _unit_rows(np.random.default_rng(0).standard_normal((WORDS, K)))
    ckpt = warm_start(path, dataclasses.replace(CFG, units_codebook=WORDS), codebook)
    new_path = path.parent / "new.pt"
    torch.save(ckpt, new_path)
    return old.eval(), path, codebook, load_generator(new_path)


def _inputs(frames=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, frames, K, generator=g), torch.full((1, 2 * frames), 140.0),
            torch.randn(1, D, generator=g), torch.randn(1, 320 * frames, generator=g))


def test_each_frame_is_rendered_as_its_nearest_codeword(models):
    old, _, codebook, new = models
    units, f0, spk, noise = _inputs()
    nearest = codebook[(units.numpy()[0] @ codebook.T).argmax(1)][None]  # the codeword of largest cosine
    with torch.no_grad():
        out = new(units, f0, spk, noise)
        # the warm-started model renders the frames as the old model renders their codewords
        torch.testing.assert_close(out, old(torch.from_numpy(nearest), f0, spk, noise), atol=1e-5, rtol=0)
        # scale and small moves inside a codeword's cell change nothing: only the codeword passes
        moved = 3.0 * (units + 0.05 * torch.randn(units.shape, generator=torch.Generator().manual_seed(3)))
        assert ((moved.numpy()[0] @ codebook.T).argmax(1) == (units.numpy()[0] @ codebook.T).argmax(1)).all()
        torch.testing.assert_close(new(moved, f0, spk, noise), out, atol=1e-6, rtol=0)
        assert (old(moved, f0, spk, noise) - old(units, f0, spk, noise)).abs().max() > 1e-4  # z alone: moves
    np.testing.assert_array_equal(new.codebook.numpy(), codebook)  # kept through the checkpoint


def test_the_exported_graph_quantises_too(models, tmp_path):
    pytest.importorskip("onnxruntime")
    from rtanon.neural.backends import make_backend
    from rtanon.stages.neural import read_onnx_config
    from rtanon.train.export import export_vocoder_onnx

    _, _, _, new = models
    path = export_vocoder_onnx(new, tmp_path / "v.onnx")
    assert read_onnx_config(path).units_codebook == WORDS
    backend = make_backend("onnxruntime", onnx_path=path)
    units, f0, spk, noise = _inputs(seed=2)
    out, _ = backend.step(units.numpy(), f0.numpy(), spk.numpy(), noise.numpy(), backend.init_state(1))
    with torch.no_grad():
        np.testing.assert_allclose(out, new(units, f0, spk, noise).numpy(), atol=1e-4, rtol=0)


def test_a_codebook_model_needs_its_codebook(models):
    _, path, codebook, _ = models
    cfg = dataclasses.replace(CFG, units_codebook=WORDS)
    with pytest.raises(ConfigError, match=f"needs a codebook of shape \\({WORDS}, {K}\\)"):
        warm_start(path, cfg)
    with pytest.raises(ConfigError, match="needs a codebook"):
        warm_start(path, cfg, codebook[:3])
    with pytest.raises(ConfigError, match="units_codebook=1"):
        dataclasses.replace(CFG, units_codebook=1).validate()


def test_fit_codebook_finds_the_directions_of_the_frames_and_is_reproducible():
    rng = np.random.default_rng(0)
    directions = _unit_rows(rng.standard_normal((3, K)))
    # frames around three directions, at random lengths (the fit must ignore length)
    z = np.concatenate([rng.uniform(0.5, 5.0, (400, 1)) * (d + 0.05 * rng.standard_normal((400, K)))
                        for d in directions]).astype(np.float32)
    c = fit_codebook(z, 3)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-5)
    assert (c @ directions.T).max(0).min() > 0.99  # every direction has its codeword
    np.testing.assert_array_equal(fit_codebook(z, 3), c)
    with pytest.raises(ConfigError, match="2 <= k <= 1200"):
        fit_codebook(z, 5000)
