"""The shipped neural vocoder on real speech (so762_dev): what the method promises of the trained weights.

- the output's intonation is the input's, moved to the pseudo-speaker's range: the rtanon F0 tracker run
  on the output follows the mapped F0 contour (log-F0 correlation over frames voiced in both);
- the output is speech-shaped where the input speaks and quiet where it does not;
- the output is not the input (waveform cross-correlation), and two sessions sound different.

These depend on the trained weights, so they fail when a retrained vocoder stops rendering pitch or
speech, which the random-weight tests of ``test_neural_method.py`` cannot see."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from rtanon.config import AnonymizerConfig  # noqa: E402
from rtanon.engine import Anonymizer  # noqa: E402


@pytest.fixture(scope="module")
def anonymizer():
    from rtanon.stages.neural import VocoderMissing

    try:
        return Anonymizer(AnonymizerConfig(method="neural"))
    except VocoderMissing as exc:
        pytest.skip(str(exc))


def _frame_db(x: np.ndarray, frame: int = 320) -> np.ndarray:
    n = len(x) // frame
    return 10 * np.log10(np.mean(np.square(x[:n * frame].reshape(n, frame)), axis=1) + 1e-12)


def test_output_follows_the_mapped_intonation(anonymizer, speech):
    from rtanon.f0.tracker import track

    session = anonymizer.open_session(seed=5)
    out = session.process_signal(speech)
    assert out.shape == speech.shape and np.isfinite(out).all()
    f0_in, f0_out = track(speech), track(out)
    n = min(len(f0_in), len(f0_out))
    both = (f0_in[:n] > 0) & (f0_out[:n] > 0)
    assert both.sum() > 0.5 * (f0_in[:n] > 0).sum(), "the output lost most of the input's voicing"
    r = np.corrcoef(np.log(f0_in[:n][both]), np.log(f0_out[:n][both]))[0, 1]
    assert r > 0.6, f"log-F0 correlation input/output {r:.2f}"
    # the pseudo-speaker's range, not the user's: the output's median F0 lies within its central quantiles
    q = np.asarray(session.stages[0].identity.f0_quantiles_hz, float)
    assert q[10] < np.median(f0_out[:n][both]) < q[90], (np.median(f0_out[:n][both]), q[10], q[90])


def test_output_is_speech_where_the_input_speaks_and_not_the_input(anonymizer, speech):
    from rtanon.analysis import max_xcorr

    out = anonymizer.open_session(seed=3).process_signal(speech)
    db_in, db_out = _frame_db(speech), _frame_db(out)
    loud = db_in > np.percentile(db_in, 70)
    quiet = db_in < np.percentile(db_in, 15)
    assert np.median(db_out[loud]) > np.median(db_out[quiet]) + 20.0  # syllables stand out of the pauses
    assert np.corrcoef(np.maximum(db_in, -70), np.maximum(db_out, -70))[0, 1] > 0.6
    assert max_xcorr(speech, out) < 0.3


def test_two_sessions_give_two_voices(anonymizer, speech):
    a = anonymizer.open_session(seed=1).process_signal(speech)
    b = anonymizer.open_session(seed=2).process_signal(speech)
    n = min(len(a), len(b))
    assert np.corrcoef(a[:n], b[:n])[0, 1] < 0.5
