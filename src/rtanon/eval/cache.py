"""Analysis cache inside the evaluation's output directory (never in the package).

Entries are keyed by what was computed (the analyzer's tag) and by the audio
file's identity (absolute path, size, modification time), so a file that is
rewritten (a fresh anonymization) misses the cache. ``save`` keeps only the
entries this run used. Stored without pickle: ``.npz`` arrays and JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rtanon import atomic


def file_key(tag: str, path: str | os.PathLike) -> str:
    p = Path(path).resolve()
    st = p.stat()
    return f"{tag}|{p}|{st.st_size}|{st.st_mtime_ns}"


class AnalysisCache:
    """``get(kind, key)`` / ``put(kind, key, value)`` for the kinds
    ``embedding`` ((d,) float32), ``f0`` ((frames,) float64), ``text`` (str; also the kinds
    ``text:MODEL`` and ``phones``, stored with it: their keys carry their own analyzer tags),
    ``words`` (list of [start_s, end_s, word]) and ``slices`` ((n, d) float32,
    the embeddings of one file's slices; the key names the cut times)."""

    KINDS = ("embedding", "f0", "text", "words", "slices")

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self._data: dict[str, dict] = {k: {} for k in self.KINDS}
        self._used: dict[str, set] = {k: set() for k in self.KINDS}
        self._load()

    def _load(self) -> None:
        emb = self.dir / "embeddings.npz"
        if emb.exists():
            with np.load(emb, allow_pickle=False) as z:
                self._data["embedding"] = dict(zip(z["keys"].tolist(), z["values"]))
        f0 = self.dir / "f0.npz"
        if f0.exists():
            with np.load(f0, allow_pickle=False) as z:
                offsets = z["offsets"]
                self._data["f0"] = {k: z["values"][offsets[i]:offsets[i + 1]]
                                    for i, k in enumerate(z["keys"].tolist())}
        text = self.dir / "transcripts.json"
        if text.exists():
            self._data["text"] = json.loads(text.read_text(encoding="utf-8"))
        words = self.dir / "words.json"
        if words.exists():
            self._data["words"] = {k: [tuple(w) for w in v]
                                   for k, v in json.loads(words.read_text(encoding="utf-8")).items()}
        sl = self.dir / "slices.npz"
        if sl.exists():
            with np.load(sl, allow_pickle=False) as z:
                offsets = z["offsets"]
                self._data["slices"] = {k: z["values"][offsets[i]:offsets[i + 1]]
                                        for i, k in enumerate(z["keys"].tolist())}

    @staticmethod
    def _kind(kind: str) -> str:
        return "text" if kind.startswith("text:") or kind == "phones" else kind

    def get(self, kind: str, key: str):
        kind = self._kind(kind)
        value = self._data[kind].get(key)
        if value is not None:
            self._used[kind].add(key)
        return value

    def put(self, kind: str, key: str, value) -> None:
        kind = self._kind(kind)
        self._data[kind][key] = value
        self._used[kind].add(key)

    def __len__(self) -> int:
        return sum(len(v) for v in self._data.values())

    def save(self) -> None:
        """Writes the entries used by this run (atomically, file by file)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        keys = sorted(self._used["embedding"])
        if keys:
            _atomic_npz(self.dir / "embeddings.npz", keys=np.array(keys),
                        values=np.stack([self._data["embedding"][k] for k in keys]).astype(np.float32))
        keys = sorted(self._used["f0"])
        if keys:
            arrays = [np.asarray(self._data["f0"][k], dtype=np.float64) for k in keys]
            offsets = np.concatenate([[0], np.cumsum([a.size for a in arrays])]).astype(np.int64)
            _atomic_npz(self.dir / "f0.npz", keys=np.array(keys), values=np.concatenate(arrays), offsets=offsets)
        keys = sorted(self._used["text"])
        if keys:
            atomic.write_text(self.dir / "transcripts.json",
                              json.dumps({k: self._data["text"][k] for k in keys}, indent=0, ensure_ascii=False))
        keys = sorted(self._used["words"])
        if keys:
            atomic.write_text(self.dir / "words.json",
                              json.dumps({k: [list(w) for w in self._data["words"][k]] for k in keys}, indent=0,
                                         ensure_ascii=False))
        keys = sorted(self._used["slices"])
        if keys:
            arrays = [np.asarray(self._data["slices"][k], dtype=np.float32) for k in keys]
            offsets = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int64)
            _atomic_npz(self.dir / "slices.npz", keys=np.array(keys), values=np.concatenate(arrays),
                        offsets=offsets)


def _atomic_npz(path: Path, **arrays) -> None:
    with atomic.atomic_open(path) as f:
        np.savez(f, **arrays)
