"""The streaming engine: lengths, parity, sessions, and failing closed."""

import numpy as np
import pytest

from rtanon import Anonymizer, AnonymizerConfig
from rtanon.eval.signal import max_xcorr
from rtanon.config import ConfigError, StreamConfig, VadConfig

RAW_COPY = 0.9  # max_xcorr of a signal with a copy of itself is 1.0


def _rms_dbfs(x):
    return 20 * np.log10(np.sqrt(np.mean(np.square(x, dtype=np.float64))) + 1e-12)


@pytest.fixture(scope="module")
def anonymizer():
    return Anonymizer(AnonymizerConfig(method="mcadams"))


def test_output_has_input_length_is_finite_and_not_the_input(anonymizer, speech):
    y = anonymizer.open_session(seed=1).process_signal(speech)
    assert y.shape == speech.shape and y.dtype == np.float32
    assert np.isfinite(y).all() and np.abs(y).max() <= 1.0
    assert _rms_dbfs(y) > _rms_dbfs(speech) - 10  # speech came out, not just comfort noise
    assert max_xcorr(speech, y) < 0.5
    assert max_xcorr(speech, speech) > RAW_COPY  # the detector does see a raw copy


@pytest.mark.parametrize("chunk_ms", [10, 20, 30, 40])
def test_file_mode_equals_chunked_live_output_delayed(speech, chunk_ms):
    """process_signal (file mode) is the live chunk stream minus the stage delay."""
    anonymizer = Anonymizer(AnonymizerConfig(method="mcadams", stream=StreamConfig(chunk_ms=chunk_ms)))
    offline = anonymizer.open_session(seed=7).process_signal(speech)
    live = anonymizer.open_session(seed=7)
    n = live.chunk_samples
    padded = np.concatenate((speech, np.zeros(2 * n + live.stage_latency_samples, np.float32)))
    chunks = padded[: padded.shape[0] // n * n].reshape(-1, n)
    stream = np.concatenate([live.process(c) for c in chunks])
    d = live.stage_latency_samples
    np.testing.assert_array_equal(stream[d : d + speech.shape[0]], offline)


def test_iter_process_any_block_sizes_gives_identical_output(anonymizer, speech):
    whole = anonymizer.open_session(seed=3).process_signal(speech)
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.integers(0, speech.shape[0], 12))
    blocks = np.split(speech, cuts)
    pieces = list(anonymizer.open_session(seed=3).iter_process(iter(blocks)))
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


def test_fresh_voice_per_session_unless_seeded(anonymizer):
    # the stages' own alpha: ``voice`` rounds it to 4 decimals, where 8 draws collide about 2 % of the time
    voices = {anonymizer.open_session().stages[0].alpha for _ in range(8)}
    assert len(voices) == 8
    assert anonymizer.open_session(seed=5).voice == anonymizer.open_session(seed=5).voice
    mc = anonymizer.config.mcadams
    assert all(mc.alpha_min <= a <= mc.alpha_max for a in voices)


def test_a_new_voice_keeps_clear_of_the_one_it_replaces(anonymizer):
    from rtanon.methods import NEW_VOICE_MIN_ALPHA_GAP, uniform_away_from

    mc = anonymizer.config.mcadams
    gap = NEW_VOICE_MIN_ALPHA_GAP * (mc.alpha_max - mc.alpha_min)
    plain, unlike = [], []
    for seed in range(200):
        old = anonymizer.open_session(seed=seed)
        a_old = old.stages[0].alpha
        plain.append(abs(anonymizer.open_session(seed=seed + 1000).stages[0].alpha - a_old))
        a_new = anonymizer.open_session(seed=seed + 1000, unlike=old).stages[0].alpha
        assert mc.alpha_min <= a_new <= mc.alpha_max
        unlike.append(abs(a_new - a_old))
    assert min(unlike) >= gap - 1e-12
    assert np.mean(np.array(plain) < gap) > 0.25  # without it, close voices are common
    # uniform over what is left: a gap around the middle leaves both ends, equally likely
    draws = np.array([uniform_away_from(np.random.default_rng(i), 0.0, 1.0, 0.5, 0.25) for i in range(2000)])
    assert ((draws <= 0.25) | (draws >= 0.75)).all() and abs(np.mean(draws < 0.5) - 0.5) < 0.05
    assert uniform_away_from(np.random.default_rng(0), 0.0, 1.0, 0.4, 2.0) == 1.0  # nothing left: the far end


def test_reset_keeps_the_voice(speech):
    anonymizer = Anonymizer(AnonymizerConfig(method="mcadams", vad=VadConfig(comfort_noise_dbfs=None)))
    s = anonymizer.open_session(seed=11)
    first = s.process_signal(speech)
    voice = s.voice
    s.reset()
    assert s.voice == voice
    np.testing.assert_array_equal(s.process_signal(speech), first)


@pytest.mark.parametrize("bad", [15, 0, 50])
def test_chunk_size_outside_10_to_40_ms_is_refused_with_the_allowed_values(bad):
    with pytest.raises(ConfigError, match="10, 20, 30, 40"):
        Anonymizer(AnonymizerConfig(stream=StreamConfig(chunk_ms=bad)))


def test_unknown_method_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="mcadams"):
        Anonymizer(AnonymizerConfig(method="passthrough"))


def test_wrong_chunk_contract_raises(anonymizer):
    s = anonymizer.open_session()
    with pytest.raises(ValueError, match="320 samples"):
        s.process(np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="float32"):
        s.process(np.zeros(320, np.float64))


class _Raising:
    hop, latency_samples = 320, 0

    def process(self, chunk):
        raise RuntimeError("injected")

    def reset(self):
        pass


class _Passthrough(_Raising):
    def process(self, chunk):
        return chunk


class _NaN(_Raising):
    def process(self, chunk):
        return np.full_like(chunk, np.nan)


@pytest.mark.parametrize("bad_stage", [_Raising, _Passthrough, _NaN])
def test_a_failing_stage_gives_comfort_noise_never_the_input(anonymizer, speech, bad_stage):
    s = anonymizer.open_session(seed=2)
    s.stages = [bad_stage()]
    y = s.process_signal(speech)
    assert y.shape == speech.shape and np.isfinite(y).all()
    level = anonymizer.config.vad.comfort_noise_dbfs
    assert _rms_dbfs(y) < level + 3
    assert max_xcorr(speech, y) < 0.2
    assert s.counters.stage_errors > 0 and s.counters.last_error


def test_non_speech_is_replaced_by_comfort_noise(anonymizer):
    """Room noise closes the gate: comfort noise plays instead."""
    rng = np.random.default_rng(0)
    room = np.cumsum(rng.standard_normal(16000 * 2)).astype(np.float32)
    room = 0.003 * (room - np.convolve(room, np.ones(64) / 64, "same")) / room.std()  # -50 dBFS brown-ish
    s = anonymizer.open_session(seed=0)
    y = s.process_signal(room.astype(np.float32))
    assert s.counters.speech_chunks < s.counters.chunks // 4
    assert max_xcorr(room[:8000], y) < 0.2


def test_silence_config_gives_exact_zeros_for_non_speech():
    a = Anonymizer(AnonymizerConfig(method="mcadams", vad=VadConfig(comfort_noise_dbfs=None)))
    y = a.open_session().process_signal(np.zeros(16000, np.float32))
    assert not y.any()


def test_non_finite_and_clipped_input_gives_finite_bounded_output(anonymizer, speech):
    x = speech.copy() * 4.0  # hard clipping
    x[1000:1100] = np.nan
    x[5000] = np.inf
    s = anonymizer.open_session(seed=0)
    y = s.process_signal(x)
    assert np.isfinite(y).all() and np.abs(y).max() <= 1.0
    assert s.counters.nonfinite_inputs >= 1


def test_algorithmic_latency_is_computed_from_the_stages(anonymizer):
    s = anonymizer.open_session()
    assert s.algorithmic_latency_samples == s.chunk_samples + s.vad.latency_samples + sum(
        st.latency_samples for st in s.stages)
    assert s.algorithmic_latency_samples == 480  # 20 ms chunk + 10 ms McAdams overlap-add


def test_a_pinned_identity_fixes_the_voice_and_a_fresh_session_differs(anonymizer):
    from rtanon.identity.speaker import new_identity

    ident = new_identity("gmm", rng=np.random.default_rng(0))
    a = anonymizer.open_session(identity=ident).voice
    b = anonymizer.open_session(identity=ident).voice
    assert a == b and a["identity"]["strategy"] == "gmm"
    other = new_identity("gmm", rng=np.random.default_rng(1))
    assert anonymizer.open_session(identity=other).voice["alpha"] != a["alpha"]


def test_allpass_scrambles_the_waveform_and_keeps_the_spectrum(speech):
    from scipy.signal import welch

    from rtanon.stages.allpass import AllPassStage

    stage = AllPassStage(320, 8, np.random.default_rng(0))
    x = speech[: speech.shape[0] // 320 * 320]
    y = np.concatenate([stage.process(c) for c in x.reshape(-1, 320)])
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.6  # a copy would give 1.0
    _, px = welch(x, 16000, nperseg=1024)
    _, py = welch(y, 16000, nperseg=1024)
    band = slice(4, 400)  # 60 Hz - 6 kHz
    np.testing.assert_allclose(10 * np.log10(py[band]), 10 * np.log10(px[band]), atol=1.5)


def test_allpass_can_be_turned_off():
    s = Anonymizer(AnonymizerConfig(method="mcadams", allpass_sections=0)).open_session()
    assert [type(st).__name__ for st in s.stages] == ["McAdamsStage"]


def test_drop_if_pause_consumes_only_chunks_the_gate_closes_on(speech):
    """What `rtanon live` drops to catch up when compute falls behind: pauses, never a word; a chunk it
    keeps renders next without a second pass of the gate (the gate's state stays the one of a plain run)."""
    anonymizer = Anonymizer(AnonymizerConfig(method="mcadams"))
    plain, dropping = anonymizer.open_session(seed=0), anonymizer.open_session(seed=0)
    n = plain.chunk_samples
    x = np.concatenate([speech, np.zeros(16000, np.float32), speech])
    dropped = 0
    for c in x[: x.shape[0] // n * n].reshape(-1, n):
        plain.process(c)
        if dropping.drop_if_pause(c):
            dropped += 1
            assert not plain.last_speech  # the plain run's gate is closed there too
        else:
            dropping.process(c)
            assert dropping.last_speech == plain.last_speech
    assert dropped >= 40  # the second of silence, less the hangover
    assert dropping.counters.speech_chunks == plain.counters.speech_chunks
