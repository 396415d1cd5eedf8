"""Phone transcriptions for the content encoder's CTC target (training only).

The teacher units say what a frame sounds like to Whisper's encoder; the transcripts say which phones an
utterance holds. ``rtanon train content --phone-ctc W`` adds a CTC loss (Graves et al. 2006) from the
projection ``z`` to the utterance's phone sequence, so ``z`` must tell the phones apart. The phones come
from the transcripts through espeak-ng's grapheme-to-phoneme rules (``espeak-ng -x``, its ASCII phoneme
names, American English), with stress marks and pauses dropped.

Cache: ``<cache>/<name>/phones.json`` maps every transcribed utterance id to its phone list, so a run is
reproducible without espeak-ng once the cache exists. espeak-ng is a system program (``apt install
espeak-ng``), called as a subprocess at training time only; nothing at run time needs it.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

BLANK = "<blank>"
# espeak-ng -x marks: primary/secondary stress, unstressed; word-level pauses and links
_STRESS = str.maketrans("", "", "',%=")
_DROP = {"_", "_:", "_!", ";", "||", "|"}


def parse_espeak(line: str) -> list[str]:
    """One line of ``espeak-ng -x --sep=' '`` output -> phones (stress marks and pauses dropped)."""
    phones = []
    for tok in line.split():
        tok = tok.translate(_STRESS)
        if tok and tok not in _DROP:
            phones.append(tok)
    return phones


def espeak_phones(sentence: str, voice: str = "en-us") -> list[str]:
    """The phones espeak-ng gives for ``sentence`` (lower-cased first: upper-case words read as letters)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is needed for --phone-ctc (phone targets from the transcripts); "
                           "install it with: apt install espeak-ng")
    out = subprocess.run([exe, "-q", "-v", voice, "-x", "--sep= ", sentence.lower()], capture_output=True,
                         text=True, check=True).stdout
    return [p for line in out.splitlines() for p in parse_espeak(line)]


def build_phones(data_dir: Path, cache_dir: Path) -> dict[str, list[str]]:
    """``{utt: phones}`` for every utterance of ``data_dir`` with a transcript, cached as
    ``cache_dir/phones.json``; {} when the directory has no ``text`` file (e.g. libri_clips)."""
    from rtanon.kaldi import KaldiDir

    path = Path(cache_dir) / "phones.json"
    if path.exists():
        return json.loads(path.read_text())
    kd = KaldiDir.load(data_dir)
    phones = {}
    if kd.text:
        from tqdm import tqdm

        for utt in tqdm(sorted(kd.text), desc=f"phones {Path(data_dir).name}", unit="utt"):
            phones[utt] = espeak_phones(kd.text[utt])
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(phones))
    log.info("%s: phone transcriptions of %d utterances", Path(data_dir).name, len(phones))
    return phones


def phone_inventory(tables: list[dict[str, list[str]]]) -> list[str]:
    """The CTC labels: the blank first, then every phone seen, sorted."""
    return [BLANK] + sorted({p for t in tables for ph in t.values() for p in ph})


def ctc_greedy(label_ids) -> list[int]:
    """Best-path CTC decoding: repeats merged, blanks (0) removed."""
    out, last = [], 0
    for k in label_ids:
        k = int(k)
        if k != last and k != 0:
            out.append(k)
        last = k
    return out
