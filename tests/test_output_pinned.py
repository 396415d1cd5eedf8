"""`rtanon file` with a fixed --seed gives bit-identical output for every method and privacy point: a refactor
that moves code must not move a sample. The McAdams and strong digests were taken from the tree before the
run-time/training split (efa72ec) on the embedded demo sample; a deliberate change of the shipped models or
their DSP updates them here, in the same commit, with the reason."""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest
import soundfile as sf

from rtanon.cli import main

#: sha256 of the int16 PCM of `rtanon file demo_speech.flac OUT --seed 0 --method M [--privacy P]`.
PINNED_PCM_SHA256 = {
    "mcadams": "405d127dd509c5c8d15bc147cfb8ed4b257c6c17fcbffbd8e417a38bfcfc9209",
    "neural strong": "3fc4dc79a67c11c261209523e8517cecb79620fb20e585cc8b4df85bbae383c4",
    # the balanced vocoder (the default since 2026-11-25), taken when it shipped trained against a speaker
    # adversary on its input spectrum's reading (2026-11-26)
    "neural balanced": "d52d27e72f4510c835955d65f11145d3a297281f4822a7adb83b5a4b2533327b",
}


@pytest.mark.parametrize("setting", sorted(PINNED_PCM_SHA256))
def test_file_output_is_pinned_for_a_fixed_seed(setting, tmp_path):
    method, *privacy = setting.split()
    if method == "neural":
        pytest.importorskip("onnxruntime")
    demo = resources.files("rtanon") / "data" / "demo_speech.flac"
    out = tmp_path / f"{method}.wav"
    args = ["--seed", "0", "--method", method] + (["--privacy", *privacy] if privacy else [])
    with resources.as_file(demo) as src:
        assert main(["file", str(src), str(out), *args]) == 0
    pcm, rate = sf.read(out, dtype="int16")
    assert rate == 16000
    assert hashlib.sha256(pcm.tobytes()).hexdigest() == PINNED_PCM_SHA256[setting]
