"""The shipped neural vocoders (both privacy points and the whole-utterance content's) on real speech
(so762_dev): what the method promises of the trained weights.

- the output's pitch is the F0 it was asked for (the input's intonation mapped to the pseudo-speaker's
  range): the rtanon F0 tracker run on the output finds it frame by frame;
- the output is speech-shaped where the input speaks and quiet where it does not;
- the output is not the input (waveform cross-correlation), and two sessions sound different.

These depend on the trained weights, so they fail when a retrained vocoder stops rendering pitch or
speech, which the random-weight tests of ``test_neural_method.py`` cannot see."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from rtanon.config import PRIVACY_POINTS, AnonymizerConfig, NeuralConfig  # noqa: E402
from rtanon.engine import Anonymizer  # noqa: E402


@pytest.fixture(scope="module", params=(*PRIVACY_POINTS, "utterance"))
def anonymizer(request):
    from rtanon.stages.neural import VocoderMissing

    point = {"context": "utterance"} if request.param == "utterance" else {"privacy": request.param}
    try:
        return Anonymizer(AnonymizerConfig(method="neural", neural=NeuralConfig(**point)))
    except VocoderMissing as exc:
        pytest.skip(str(exc))


def _frame_db(x: np.ndarray, frame: int = 320) -> np.ndarray:
    n = len(x) // frame
    return 10 * np.log10(np.mean(np.square(x[:n * frame].reshape(n, frame)), axis=1) + 1e-12)


def test_output_pitch_is_the_mapped_pitch(anonymizer, speech):
    """The rtanon tracker run on the output finds the F0 the stage asked the vocoder for (the input's
    intonation mapped to the pseudo-speaker's quantiles), frame by frame, in the pseudo-speaker's range."""
    from rtanon.f0.tracker import track

    model = anonymizer.method.model
    stage = model.open_stream(320, model.new_identity(np.random.default_rng(5)), np.random.default_rng(6))
    asked = []
    convert = stage.pitch.process

    def recording(f0):
        mapped = convert(f0)
        asked.append(np.array(mapped, np.float64))
        return mapped

    stage.pitch.process = recording
    if stage.needs_whole_signal:  # the whole-utterance content reads the signal first
        stage.prime(speech)
    n = len(speech) // 320 * 320
    out = np.concatenate([stage.process(speech[i:i + 320]) for i in range(0, n, 320)])
    assert np.isfinite(out).all()
    asked_f0 = np.concatenate(asked)
    got = track(out)[2:2 + len(asked_f0)]  # the stage delay: 320 samples = 2 F0 frames
    asked_f0 = asked_f0[:len(got)]
    voiced = asked_f0 > 0
    both = voiced & (got > 0)
    assert both.sum() >= 0.8 * voiced.sum() > 0, "the output lost the voicing it was asked for"
    ratio = got[both] / asked_f0[both]
    assert np.mean(np.abs(ratio - 1.0) < 0.2) > 0.85, np.mean(np.abs(ratio - 1.0) < 0.2)
    assert abs(np.median(ratio) - 1.0) < 0.03, np.median(ratio)
    q = np.asarray(stage.identity.f0_quantiles_hz, float)
    assert q[10] < np.median(got[both]) < q[90], (np.median(got[both]), q[10], q[90])


def test_output_is_speech_where_the_input_speaks_and_not_the_input(anonymizer, speech):
    from rtanon.eval.signal import max_xcorr

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
