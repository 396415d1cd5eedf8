"""Text normalisation for WER: case, punctuation and numbers.

``normalize(text) -> list[str]`` lower-cases, drops punctuation (keeping
in-word apostrophes), splits hyphenated words, turns spelled numbers into
digits ("twenty one" -> "21", "one hundred and five" -> "105") and then
writes every number as one token per digit, so that a reference "TWO TWO ZERO
FOUR" and the hypotheses "2204", "2, 2, 0, 4" and "two-two-zero-four" all
become ``["2", "2", "0", "4"]`` (four words, as in the reference: one misheard
digit is one error), and "TWENTY ONE" and "21" both become ``["2", "1"]``.
The same function is applied to reference and hypothesis.
"""

from __future__ import annotations

import re

_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
_TEENS = {w: i + 10 for i, w in enumerate(
    "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: (i + 2) * 10 for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_NUMBER_WORDS = set(_UNITS) | set(_TEENS) | set(_TENS) | set(_SCALES)
#: Spelling variants that ASR systems write differently from the references.
_SPELLING = {"ok": "okay", "mr": "mister", "mrs": "missus", "dr": "doctor"}


def _numbers_from_words(words: list[str]) -> list[int]:
    """A run of number words -> the numbers it spells, left to right.
    A word that cannot extend the current number starts a new one."""
    out: list[int] = []
    high = 0  # completed thousands/millions part
    low: int | None = None  # part below the last scale word
    last = ""  # kind of the previous word: unit, teen, tens, hundred, scale

    def flush():
        nonlocal high, low, last
        if low is not None or high:
            out.append(high + (low or 0))
        high, low, last = 0, None, ""

    for w in words:
        if w in _UNITS:
            v = _UNITS[w]
            if low is not None and (last == "tens" or last == "hundred") or (low is None and last == "scale"):
                low = (low or 0) + v
            else:
                flush()
                low = v
            last = "unit"
        elif w in _TEENS or w in _TENS:
            v = _TEENS.get(w, _TENS.get(w))
            if (low is not None and last == "hundred") or (low is None and last == "scale"):
                low = (low or 0) + v
            else:
                flush()
                low = v
            last = "teen" if w in _TEENS else "tens"
        elif w == "hundred":
            if low is not None and 0 < low < 100 and last in ("unit", "teen", "tens"):
                low *= 100
            else:
                flush()
                low = 100
            last = "hundred"
        else:  # thousand, million
            scale = _SCALES[w]
            if low is not None and 0 < low < 1000:
                high += low * scale
                low = None
            else:
                flush()
                high = scale
                low = None
            last = "scale"
    flush()
    return out


def _tokens(text: str) -> list[str]:
    s = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # 1,000 -> 1000
    s = re.sub(r"(?<=\d)\.(?=\d)", " point ", s)  # 3.5 -> 3 point 5
    s = s.replace("%", " percent ").replace("&", " and ")
    s = re.sub(r"[-\u2013\u2014/]", " ", s)  # hyphens, dashes and slashes split words
    s = re.sub(r"[^a-z0-9' ]+", " ", s)
    s = re.sub(r"(?<=[a-z])(?=\d)|(?<=\d)(?=[a-z])", " ", s)  # digits never glue to letters
    words = [w.strip("'") for w in s.split()]
    return [_SPELLING.get(w, w) for w in words if w]


def normalize(text: str) -> list[str]:
    """Normalised word list of ``text`` (see the module docstring)."""
    words = _tokens(text)
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in _NUMBER_WORDS:
            j = i
            run = []
            while j < len(words) and (words[j] in _NUMBER_WORDS or (
                    words[j] == "and" and run and run[-1] in _SCALES
                    and j + 1 < len(words) and words[j + 1] in _NUMBER_WORDS)):
                if words[j] != "and":
                    run.append(words[j])
                j += 1
            out.extend(str(n) for n in _numbers_from_words(run))
            i = j
        else:
            out.append(w)
            i += 1
    # one token per digit: "2204", "2, 2, 0, 4" and "two two zero four" all become 2 2 0 4,
    # so a digit string keeps its word count and one misheard digit is one error
    return [t for w in out for t in (list(w) if w.isdigit() else [w])]
