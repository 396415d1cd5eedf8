"""Vocoder shards packed to travel to a GPU machine, and unpacked there (issue 24 item 6).

A GPU machine lent here takes 64 MiB of working tree per call, and the shards of 2.9 h of speech are
578 MB (``rtanon.train.shards``: audio as int16 and the content encoder's ``z`` as float16). A *pack*
keeps what cannot be recomputed cheaply there and drops what can:

    pack/
      manifest.json      format, the content encoder (sha256 of its ONNX graph), rates, one entry per shard
      speakers.npz       the shards' speaker embeddings, as they are
      reference.npz      a few seconds of decoded audio and the ONNX graph's ``z`` of it (float32)
      shard_00000.opus   the shard's audio, concatenated, as Ogg Opus (about 31 kbit/s at level 0.9)
      shard_00000.npz    f0_hz, frames, speaker, utt_ids (compressed)

``unpack_shards`` decodes the audio and computes ``z`` from the *decoded* audio with the content
encoder's torch weights (on CUDA when there is one), so the target audio and its content match; it
first checks the torch encoder against ``reference.npz`` (the ONNX graph's own output), so shards that
say they come from the shipped content graph really do. F0 and the speaker embeddings travel as they
are (the F0 tracker's compiled kernel is not needed there). About 40 MB for the 2.9 h.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rtanon.atomic import atomic_open, write_text
from rtanon.constants import FRAME_SAMPLES, SAMPLE_RATE_HZ

PACK_FORMAT = "rtanon-vocoder-pack-v1"
#: libsndfile's Opus compression level: 0.9 is about 31 kbit/s for 16 kHz speech
DEFAULT_OPUS_LEVEL = 0.9
#: the torch encoder must give the ONNX graph's z to this cosine on every reference frame
MIN_REFERENCE_COSINE = 0.999


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_opus(path: Path, audio_int16: np.ndarray, level: float) -> None:
    import soundfile as sf

    with atomic_open(path) as f:
        sf.write(f, audio_int16.astype(np.float32) / 32768.0, SAMPLE_RATE_HZ, format="OGG", subtype="OPUS",
                 compression_level=level)


def _read_opus(path: Path, samples: int) -> np.ndarray:
    """float32 audio, exactly ``samples`` long (the codec's length is trimmed or zero-padded)."""
    import soundfile as sf

    audio, sr = sf.read(path, frames=samples, dtype="float32")  # decodes no further than needed
    if sr != SAMPLE_RATE_HZ:
        raise ValueError(f"{path}: {sr} Hz, expected {SAMPLE_RATE_HZ}")
    out = np.zeros(samples, np.float32)
    out[:min(samples, len(audio))] = audio[:samples]
    return out


def pack_shards(shard_dir: str | Path, pack_dir: str | Path, content_encoder, *, opus_level: float =
                DEFAULT_OPUS_LEVEL, reference_seconds: float = 10.0, progress: bool = True) -> Path:
    """Writes the pack of ``shard_dir`` to ``pack_dir``; ``content_encoder`` (a ``ContentEncoderModel``)
    is the graph whose ``z`` the unpacked shards will hold (it need not be the one of ``shard_dir``:
    ``z`` is not packed). Returns the manifest's path."""
    from tqdm import tqdm

    shard_dir, pack_dir = Path(shard_dir), Path(pack_dir)
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    pack_dir.mkdir(parents=True, exist_ok=True)
    (pack_dir / "speakers.npz").write_bytes((shard_dir / "speakers.npz").read_bytes())
    entries = []
    for e in tqdm(manifest["shards"], desc="pack", unit="shard", disable=not progress):
        stem = Path(e["file"]).stem
        with np.load(shard_dir / e["file"]) as z:
            _write_opus(pack_dir / f"{stem}.opus", z["audio"], opus_level)
            with atomic_open(pack_dir / f"{stem}.npz") as f:
                np.savez_compressed(f, f0_hz=z["f0_hz"], frames=z["frames"], speaker=z["speaker"],
                                    utt_ids=z["utt_ids"])
            samples = int(z["audio"].shape[0])
        entries.append({"stem": stem, "samples": samples, "utterances": e["utterances"], "frames": e["frames"],
                        "opus_sha256": _sha256(pack_dir / f"{stem}.opus"),
                        "npz_sha256": _sha256(pack_dir / f"{stem}.npz")})
    first = entries[0]
    n = min(first["samples"], int(reference_seconds * SAMPLE_RATE_HZ)) // FRAME_SAMPLES * FRAME_SAMPLES
    ref_audio = _read_opus(pack_dir / f"{first['stem']}.opus", n)
    with atomic_open(pack_dir / "reference.npz") as f:
        np.savez(f, audio=ref_audio, z=content_encoder.encode(ref_audio).astype(np.float32))
    out = {"format": PACK_FORMAT, "content_sha256": content_encoder.sha256,
           "lookahead_frames": content_encoder.lookahead_frames, "units_dim": content_encoder.output_dim,
           "opus_level": opus_level, "speakers": manifest["speakers"], "shards": entries}
    write_text(pack_dir / "manifest.json", json.dumps(out, indent=1))
    return pack_dir / "manifest.json"


class TorchContentEncoder:
    """The content encoder's torch weights run as ``ContentEncoderModel.encode`` runs its ONNX graph:
    a whole utterance from the zero state, the last ``lookahead_frames`` hearing silence after it."""

    def __init__(self, weights: str | Path, lookahead_frames: int, device: str = "cpu") -> None:
        import torch

        from rtanon.train.content import load_checkpoint

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.model = load_checkpoint(Path(weights)).to(device)
        self.lookahead_frames, self.device = lookahead_frames, device

    def encode(self, audio: np.ndarray) -> np.ndarray:
        import torch

        n = len(audio) // FRAME_SAMPLES * FRAME_SAMPLES
        x = np.zeros(n + FRAME_SAMPLES * self.lookahead_frames, np.float32)
        x[:n] = audio[:n]
        state = tuple(s.to(self.device) for s in self.model.init_state(1))
        with torch.no_grad():
            z = self.model(torch.from_numpy(x)[None].to(self.device), *state)[1][0]
        return z[self.lookahead_frames:].float().cpu().numpy()


def reference_cosine(pack_dir: str | Path, encoder: TorchContentEncoder) -> float:
    """The lowest per-frame cosine between ``encoder``'s z and the packed graph's z of the reference."""
    ref = np.load(Path(pack_dir) / "reference.npz")
    a, b = encoder.encode(ref["audio"]), ref["z"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    return float(cos.min())


def unpack_shards(pack_dir: str | Path, out_dir: str | Path, encoder: TorchContentEncoder, *, jobs: int = 8,
                  progress: bool = True) -> Path:
    """Shards in ``out_dir`` (``rtanon.train.shards`` format) from the pack: decoded audio, ``encoder``'s
    ``z`` of it, the packed F0 and speakers. Refuses an encoder that is not the packed graph's twin, and a
    pack file whose sha256 does not match (a partial copy). Returns the shards' manifest path."""
    from tqdm import tqdm

    from rtanon.train.shards import ShardWriter

    pack_dir = Path(pack_dir)
    manifest = json.loads((pack_dir / "manifest.json").read_text())
    if manifest.get("format") != PACK_FORMAT:
        raise ValueError(f"{pack_dir} is not a {PACK_FORMAT} directory (format {manifest.get('format')!r})")
    if encoder.lookahead_frames != manifest["lookahead_frames"]:
        raise ValueError(f"the pack's content graph looks {manifest['lookahead_frames']} frames ahead, the encoder "
                         f"{encoder.lookahead_frames}")
    cos = reference_cosine(pack_dir, encoder)
    if cos < MIN_REFERENCE_COSINE:
        raise ValueError(f"these content weights are not the packed graph's ({manifest['content_sha256'][:12]}): "
                         f"lowest cosine to its z {cos:.4f} < {MIN_REFERENCE_COSINE}")
    for e in manifest["shards"]:
        for kind in ("opus", "npz"):
            if _sha256(pack_dir / f"{e['stem']}.{kind}") != e[f"{kind}_sha256"]:
                raise ValueError(f"{pack_dir / e['stem']}.{kind} does not match its sha256 (partial copy?)")

    def decode(e: dict) -> tuple[dict, np.ndarray]:
        return e, _read_opus(pack_dir / f"{e['stem']}.opus", e["samples"])

    writer = ShardWriter(out_dir, int(manifest["units_dim"]), content_sha256=manifest["content_sha256"])
    with ThreadPoolExecutor(max(1, jobs)) as pool:  # libsndfile decodes without the GIL
        for e, audio in tqdm(pool.map(decode, manifest["shards"]), total=len(manifest["shards"]), desc="unpack",
                             unit="shard", disable=not progress):
            side = np.load(pack_dir / f"{e['stem']}.npz")
            offset = 0
            for utt, t, spk in zip(side["utt_ids"], side["frames"], side["speaker"]):
                a = audio[FRAME_SAMPLES * offset:FRAME_SAMPLES * (offset + int(t))]
                f0 = side["f0_hz"][2 * offset:2 * (offset + int(t))]
                writer.add(str(utt), int(spk), encoder.encode(a), f0, a)
                offset += int(t)
    spk = np.load(pack_dir / "speakers.npz")
    return writer.close([str(s) for s in spk["ids"]], spk["embeddings"])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``rtanon lab pack-shards SHARDS PACK`` and ``rtanon lab unpack-shards PACK OUT --content-weights PT``."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0] + " See the module "
                                 "rtanon.train.travel for the layout.",
                                 epilog="on the GPU machine: rtanon lab shards unpack PACK runs/shards "
                                        "--content-weights src/rtanon/models/content/content_encoder.pt, then rtanon train "
                                        "vocoder --shards runs/shards ...")
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="shards -> a compact pack (Opus audio, F0, speakers; no z)")
    p.add_argument("shards", type=Path, help="a shard directory of `rtanon train vocoder`")
    p.add_argument("pack", type=Path, help="folder to write the pack to")
    p.add_argument("--content-onnx", type=Path, help="the content graph whose z the unpacked shards will hold "
                                                     "(default: the packaged one)")
    p.add_argument("--opus-level", type=float, default=DEFAULT_OPUS_LEVEL,
                   help=f"Opus compression level 0..1 (default {DEFAULT_OPUS_LEVEL}: about 31 kbit/s)")
    u = sub.add_parser("unpack", help="a pack -> shards, z computed from the decoded audio")
    u.add_argument("pack", type=Path)
    u.add_argument("out", type=Path, help="shard directory to write")
    u.add_argument("--content-weights", type=Path, required=True,
                   help="torch weights of the packed content graph (src/rtanon/models/content/content_encoder.pt for the "
                        "packaged one)")
    u.add_argument("--accelerator", choices=("cpu", "cuda"), help="default: cuda when available")
    u.add_argument("--jobs", type=int, default=8, help="decoding threads (default 8)")
    args = ap.parse_args(argv)
    if args.verb == "pack":
        from rtanon.content.stream import ContentEncoderModel

        path = pack_shards(args.shards, args.pack, ContentEncoderModel(args.content_onnx),
                           opus_level=args.opus_level)
        size = sum(p.stat().st_size for p in args.pack.iterdir())
        print(f"wrote {path.parent} ({size / 1e6:.1f} MB)")
        return 0
    import torch

    device = args.accelerator or ("cuda" if torch.cuda.is_available() else "cpu")
    lookahead = int(json.loads((args.pack / "manifest.json").read_text())["lookahead_frames"])
    path = unpack_shards(args.pack, args.out, TorchContentEncoder(args.content_weights, lookahead, device),
                         jobs=args.jobs)
    print(f"wrote {path.parent} on {device}")
    return 0
