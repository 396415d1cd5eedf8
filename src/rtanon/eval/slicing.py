"""Word-level slicing of utterances (paper 004, Algorithm 1) and the slicing attacker's protocol.

Paper 004 releases a corpus as slices of about ``delta`` seconds cut between
words, and attacks it with its semi-informed attacker, whose enrolment and
trial data are sliced alike. Here:

- ``clean_words``: word timings ``[(start_s, end_s, word), ...]`` made usable:
  clipped to the utterance, in order, not overlapping (Whisper's timings come
  from cross-attention and can overlap or overrun by a few tens of ms).
- ``slice_bounds``: Algorithm 1. A slice grows word by word from the end of the
  previous slice's last word (the first slice from 0) until the start of the
  next word (or, after the last word, the end of the utterance) is at least
  ``delta`` seconds away; the silences around its words are kept. A last
  segment shorter than ``delta`` is discarded.
- ``sliced_split``: the enrolment/trial protocol over slices (trial slices
  against speakers enrolled with the slices of their enrolment utterances),
  the way the VoicePrivacy recipe the paper uses scores: every trial slice is
  one trial, the enrolment side is the speaker's mean embedding.
- ``slice_id`` / ``slice_utt``: slice ``i`` of utterance ``u`` is ``u#i``.

Timings come from the original audio; the anonymized audio of every rtanon
method is delay-compensated and as long as its input, so the same cut times
apply to it (the data publisher slices with the clear audio at hand).
"""

from __future__ import annotations

import numpy as np

from rtanon.config import SAMPLE_RATE_HZ
from rtanon.eval.scenarios import Split

Word = tuple[float, float, str]
Bound = tuple[float, float, int, int]  # start_s, end_s, first word, last word + 1


def clean_words(words, duration_s: float) -> list[Word]:
    """Timings clipped to [0, duration], starts non-decreasing, each word
    starting no earlier than the previous one ends."""
    out: list[Word] = []
    prev_end = 0.0
    for start, end, word in words:
        start = min(max(float(start), prev_end), duration_s)
        end = min(max(float(end), start), duration_s)
        out.append((start, end, str(word)))
        prev_end = end
    return out


def slice_bounds(words, duration_s: float, delta_s: float) -> list[Bound]:
    """Algorithm 1 of paper 004 on cleaned word timings; returns
    ``(start_s, end_s, first_word, last_word + 1)`` per slice."""
    if delta_s <= 0:
        raise ValueError(f"delta_s={delta_s}; the target slice duration must be positive")
    words = clean_words(words, duration_s)
    slices: list[Bound] = []
    t_prv, k_prv = 0.0, 0
    for k in range(len(words)):
        t_next = words[k + 1][0] if k + 1 < len(words) else duration_s
        if t_next - t_prv >= delta_s:
            slices.append((t_prv, t_next, k_prv, k + 1))
            t_prv = words[k][1]
            k_prv = k + 1
    return slices


def cut(signal: np.ndarray, bounds) -> list[np.ndarray]:
    """The slices' samples (16 kHz) for ``(start_s, end_s, ...)`` bounds."""
    out = []
    for b in bounds:
        a, e = int(round(b[0] * SAMPLE_RATE_HZ)), int(round(b[1] * SAMPLE_RATE_HZ))
        out.append(np.asarray(signal[a:e], dtype=np.float32))
    return out


def slice_id(utt: str, i: int) -> str:
    return f"{utt}#{i}"


def slice_utt(sid: str) -> str:
    return sid.rsplit("#", 1)[0]


def sliced_split(split: Split, n_slices: dict[str, int]) -> Split:
    """The protocol of ``split`` over slices: ``n_slices[utt]`` slices per
    utterance. Speakers left without an enrolment slice are dropped (with
    their trials): they cannot be enrolled."""
    enroll = {s: [slice_id(u, i) for u in us for i in range(n_slices.get(u, 0))] for s, us in split.enroll.items()}
    speakers = [s for s in split.speakers if enroll[s]]
    kept = set(speakers)
    trials = sorted(slice_id(u, i) for u in split.trials if split.utt2spk[u] in kept
                    for i in range(n_slices.get(u, 0)))
    utt2spk = {sid: split.utt2spk[slice_utt(sid)] for sid in trials}
    utt2spk.update({sid: s for s in speakers for sid in enroll[s]})
    return Split(speakers=speakers, gender={s: split.gender[s] for s in speakers},
                 enroll={s: enroll[s] for s in speakers}, trials=trials, utt2spk=utt2spk)


def slice_embeddings(per_utt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{utt: (n, d) slice embeddings}`` -> ``{utt#i: (d,)}``."""
    return {slice_id(u, i): e for u, arr in per_utt.items() for i, e in enumerate(arr)}
