"""Kaldi-style data directories: wav.scp, utt2spk, spk2gender (spk2age, text).

``KaldiDir.load(path)`` reads one (a key given twice is an error); paths in wav.scp are relative to the
directory (absolute paths work too). ``write_map`` writes one of its files. Piped wav.scp entries (``cmd |``) are
refused with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rtanon import atomic
from rtanon.errors import UserError
from rtanon.paths import check_regular


class KaldiDirError(UserError):
    """A Kaldi-style directory is missing a file or has a malformed line."""


def _read_map(path: Path, required: bool = True) -> dict[str, str]:
    if not path.exists():
        if required:
            raise KaldiDirError(f"{path}: missing (a Kaldi-style directory needs wav.scp, utt2spk, spk2gender)")
        return {}
    check_regular(path, "Kaldi table")  # a FIFO would block the run
    table: dict[str, str] = {}
    first: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not part of a key
    except (OSError, UnicodeDecodeError) as exc:
        raise KaldiDirError(f"{path}: unreadable: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise KaldiDirError(f"{path}:{lineno}: expected '<key> <value>', got {line!r}")
        if parts[0] in first:  # the last line would silently win: one utterance's audio under two labels
            raise KaldiDirError(f"{path}:{lineno}: duplicate key {parts[0]!r} (first on line {first[parts[0]]}); "
                                "each key may appear once")
        first[parts[0]] = lineno
        table[parts[0]] = parts[1].strip()
    return table


def write_map(path: Path, table: dict[str, str]) -> None:
    """Writes a Kaldi-style ``<key> <value>`` file, sorted by key."""
    atomic.write_text(path, "".join(f"{k} {v}\n" for k, v in sorted(table.items())))


@dataclass(frozen=True)
class KaldiDir:
    root: Path
    wav: dict[str, Path]  # utt -> audio path
    utt2spk: dict[str, str]
    spk2gender: dict[str, str]
    spk2age: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, root: str | Path) -> "KaldiDir":
        root = Path(root)
        if not root.is_dir():
            raise KaldiDirError(f"{root}: not a directory")
        wav = {}
        for utt, value in _read_map(root / "wav.scp").items():
            if value.endswith("|"):
                raise KaldiDirError(f"{root / 'wav.scp'}: utterance {utt} is a pipe ({value!r}); "
                                    "convert the audio to files first")
            p = Path(value)
            wav[utt] = p if p.is_absolute() else root / p
        utt2spk = _read_map(root / "utt2spk")
        missing = sorted(set(wav) - set(utt2spk))
        if missing:
            raise KaldiDirError(f"{root / 'utt2spk'}: no speaker for {len(missing)} utterances, e.g. {missing[0]}")
        spk2gender = _read_map(root / "spk2gender")
        for spk, g in spk2gender.items():
            if g not in ("m", "f"):
                raise KaldiDirError(f"{root / 'spk2gender'}: speaker {spk} has gender {g!r}; use m or f")
        return cls(root, wav, utt2spk, spk2gender,
                   _read_map(root / "spk2age", required=False), _read_map(root / "text", required=False))

    @property
    def speakers(self) -> list[str]:
        return sorted(set(self.utt2spk.values()))

    def utterances_of(self, spk: str) -> list[str]:
        return sorted(u for u, s in self.utt2spk.items() if s == spk and u in self.wav)
