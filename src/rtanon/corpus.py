"""Anonymizing Kaldi-style corpora: one pseudo-voice per speaker or per utterance.

``anonymize_dir(anonymizer, data, out)`` writes ``out/<utt-id>.wav`` for every
utterance of ``data`` plus ``wav.scp``, ``utt2spk``, ``spk2gender`` (and
``spk2age``, ``text`` when present), so the output is itself a Kaldi-style
directory that evaluation and training tools read directly.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from rtanon.audio_io import anonymize_file
from rtanon.kaldi import KaldiDir, write_map

ASSIGNMENTS = ("speaker", "utterance")


def voice_seed(seed: int | None, key: str) -> int | None:
    """Per-speaker (or per-utterance) seed derived from a run seed; ``None``
    keeps the OS random source (fresh voices every run)."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, zlib.crc32(key.encode())]).generate_state(1)[0])


def anonymize_dir(anonymizer, data: str | Path | KaldiDir, out: str | Path, *, assignment: str = "speaker",
                  seed: int | None = None, identity=None, progress: bool = True) -> KaldiDir:
    """Anonymizes every utterance of ``data`` into ``out``; returns the new KaldiDir.

    ``assignment="speaker"``: one session (one pseudo-voice) per original
    speaker, reset between that speaker's utterances; ``"utterance"``: a new
    pseudo-voice for every utterance. ``identity`` (a PseudoSpeaker) pins one
    voice for every speaker, on purpose.
    """
    from tqdm import tqdm

    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment={assignment!r}; use one of {ASSIGNMENTS}")
    src = data if isinstance(data, KaldiDir) else KaldiDir.load(data)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    utts = sorted(src.wav)
    sessions = {}
    for utt in tqdm(utts, desc=f"anonymizing {src.root.name}", unit="utt", disable=not progress):
        spk = src.utt2spk[utt]
        if assignment == "speaker":
            if spk not in sessions:
                sessions[spk] = anonymizer.open_session(seed=voice_seed(seed, spk), identity=identity)
            session = sessions[spk]
            session.reset()
        else:
            session = anonymizer.open_session(seed=voice_seed(seed, utt), identity=identity)
        anonymize_file(session, src.wav[utt], out / f"{utt}.wav")
    write_map(out / "wav.scp", {u: f"{u}.wav" for u in utts})
    write_map(out / "utt2spk", {u: src.utt2spk[u] for u in utts})
    spks = {src.utt2spk[u] for u in utts}
    write_map(out / "spk2gender", {s: g for s, g in src.spk2gender.items() if s in spks})
    if src.spk2age:
        write_map(out / "spk2age", {s: a for s, a in src.spk2age.items() if s in spks})
    if src.text:
        write_map(out / "text", {u: src.text[u] for u in utts if u in src.text})
    return KaldiDir.load(out)

