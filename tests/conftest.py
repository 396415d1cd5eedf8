"""Shared fixtures: real speech from ../shared/data (never copied into the repo)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _dev_wavs() -> list[Path]:
    scp = SHARED_DATA / "so762_dev" / "wav.scp"
    if not scp.exists():
        return []
    return [SHARED_DATA / "so762_dev" / line.split()[1] for line in scp.read_text().splitlines()[:64:8]]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"speech data not found at {SHARED_DATA} (CI puts ../shared beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def speech_paths(shared_data) -> list[Path]:
    """Eight so762_dev utterances from eight different speakers."""
    return _dev_wavs()


@pytest.fixture(scope="session")
def speech(speech_paths) -> np.ndarray:
    """One real utterance, 16 kHz mono float32."""
    from rtanon.io.audio import read_audio

    return read_audio(speech_paths[0])


@pytest.fixture()
def mini_train(tmp_path, shared_data) -> Path:
    """A Kaldi-style folder of three so762_train utterances (paths into ../shared, nothing copied), for a
    recipe's few steps."""
    from rtanon.io.kaldi import KaldiDir, write_map

    src = KaldiDir.load(shared_data / "so762_train")
    utts = sorted(src.wav)[:3]
    data = tmp_path / "mini_train"
    data.mkdir()
    write_map(data / "wav.scp", {u: str(src.wav[u]) for u in utts})
    write_map(data / "utt2spk", {u: src.utt2spk[u] for u in utts})
    write_map(data / "spk2gender", {s: src.spk2gender[s] for s in {src.utt2spk[u] for u in utts}})
    return data


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray of 2 CPUs for one test module."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (the [corpus] extra)")
    from rtanon.corpus.on_ray import start_ray, stop_ray

    start_ray(None, 2)
    yield ray
    stop_ray()
