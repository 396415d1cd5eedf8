"""Files in and out: formats, bad input, atomic writes, constant memory."""

import hashlib
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from rtanon import Anonymizer
from rtanon.io.audio import AudioWriter, AudioFileError, anonymize_file, probe, read_blocks


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def session_factory():
    a = Anonymizer()
    return lambda: a.open_session(seed=0)


@pytest.mark.parametrize("rate,channels,subtype", [(44100, 2, "PCM_16"), (48000, 1, "DOUBLE"),
                                                   (8000, 1, "PCM_24"), (16000, 3, "FLOAT")])
def test_any_rate_channels_and_format_gives_mono_output_of_the_same_length(
        tmp_path, speech, session_factory, rate, channels, subtype):
    import soxr

    x = soxr.resample(speech, 16000, rate)
    data = np.stack([x * (0.5 + 0.2 * c) for c in range(channels)], axis=1)
    src = tmp_path / "in.wav"
    sf.write(src, data, rate, subtype=subtype)
    before = _sha(src)
    dst = tmp_path / "out.wav"
    anonymize_file(session_factory(), src, dst)
    y, sr = sf.read(dst)
    assert sr == rate and y.ndim == 1 and y.shape[0] == data.shape[0]
    assert np.isfinite(y).all() and np.abs(y).max() > 0.05
    assert _sha(src) == before  # input untouched


def test_nan_inf_and_clipping_in_a_float_file_give_finite_bounded_output(tmp_path, speech, session_factory):
    x = speech.astype(np.float32) * 3.0
    x[100:200] = np.nan
    x[300] = np.inf
    src = tmp_path / "bad.wav"
    sf.write(src, x, 16000, subtype="FLOAT")
    anonymize_file(session_factory(), src, tmp_path / "out.flac")
    y, _ = sf.read(tmp_path / "out.flac")
    assert np.isfinite(y).all() and np.abs(y).max() <= 1.0 and y.shape[0] == x.shape[0]


def test_empty_non_audio_missing_and_truncated_files_raise_clear_errors(tmp_path, speech, session_factory):
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio\n" * 100)
    cut = tmp_path / "cut.wav"
    sf.write(cut, speech, 16000, subtype="PCM_16")
    cut.write_bytes(cut.read_bytes()[: 44 + 2 * 5000])  # header still claims the whole utterance
    for path, msg in [(empty, "no audio"), (text, "not a readable audio file"),
                      (tmp_path / "missing.wav", "no such file"), (tmp_path, "directory")]:
        with pytest.raises(AudioFileError, match=msg):
            anonymize_file(session_factory(), path, tmp_path / "out.wav")
    # libsndfile may trust the real size of a truncated file: either a clear error
    # or an output as long as what is really there
    try:
        anonymize_file(session_factory(), cut, tmp_path / "out_cut.wav")
        assert sf.info(tmp_path / "out_cut.wav").frames == sf.info(cut).frames
    except AudioFileError as exc:
        assert "truncated" in str(exc) or "unreadable" in str(exc)
    assert not list(tmp_path.glob("*.part"))


def test_failed_run_leaves_no_partial_output_and_keeps_an_existing_one(tmp_path, speech):
    dst = tmp_path / "out.wav"
    dst.write_bytes(b"previous result")
    with pytest.raises(RuntimeError):
        with AudioWriter(dst) as w:
            w.write(speech)
            raise RuntimeError("disk full")
    assert dst.read_bytes() == b"previous result"
    assert not list(tmp_path.glob("*.part"))


def test_outputs_get_normal_file_permissions(tmp_path, speech):
    import os

    dst = tmp_path / "o.wav"
    with AudioWriter(dst) as w:
        w.write(speech)
    mask = os.umask(0)
    os.umask(mask)
    assert dst.stat().st_mode & 0o777 == 0o666 & ~mask


def test_refuses_to_overwrite_the_input(tmp_path, speech, session_factory):
    src = tmp_path / "in.wav"
    sf.write(src, speech, 16000)
    with pytest.raises(AudioFileError, match="overwrite the input"):
        anonymize_file(session_factory(), src, src)


@pytest.mark.slow
def test_long_files_stream_in_constant_memory(tmp_path, session_factory):
    """Peak memory does not grow with the file's length (20 s vs 80 s)."""
    rng = np.random.default_rng(0)
    peaks = []
    for seconds in (20, 80):
        src = tmp_path / f"long{seconds}.flac"
        with sf.SoundFile(src, "w", 16000, 1, subtype="PCM_16") as f:
            for _ in range(seconds // 10):
                f.write((0.01 * rng.standard_normal(160000)).astype(np.float32))
        tracemalloc.start()
        anonymize_file(session_factory(), src, tmp_path / f"out{seconds}.flac")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert probe(tmp_path / f"out{seconds}.flac").frames == seconds * 16000
    assert peaks[1] < 1.2 * peaks[0]
    # under the decoded size of the long file (5.12 MB), which a reader that held it whole would exceed; the
    # rest is the session's own state (the default point's streaming Whisper content alone keeps 1.23 MB,
    # and a step holds its old and new copies)
    assert peaks[1] < 0.6 * 80 * 16000 * 4


def test_read_blocks_yields_bounded_blocks(tmp_path):
    src = tmp_path / "a.wav"
    sf.write(src, np.zeros(16000 * 25, np.float32), 16000)
    sizes = [b.shape[0] for b in read_blocks(src, block_seconds=10)]
    assert max(sizes) == 160000 and sum(sizes) == 16000 * 25


def test_cli_file_error_is_one_line_with_status_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rtanon", "file", str(tmp_path / "nope.wav"),
                           str(tmp_path / "o.wav")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("rtanon file: error:") and "Traceback" not in proc.stderr
