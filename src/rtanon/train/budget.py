"""The intelligibility budget: where between the microphone and the pseudo-voice the words are lost.

    rtanon lab budget --data ../shared/data/so762_dev ../shared/data/libri_devclean \\
        --utts-per-speaker 2 --asr tiny.en,base --out runs/budget.json --jobs 2

Every chosen utterance (a seeded few per speaker, the same for every row) is rendered once per row of
:data:`ROWS`, each with the same fresh pseudo-voice (seeded by ``--seed`` and the utterance id), and read back by every
Whisper model of ``--asr`` (WER) and by hama's phone recognizer against the transcript's canonical phones
(PER). Rows:

- ``original``: the input itself.
- ``synth_own``: the vocoder's own envelope synthesiser (:class:`rtanon.neural.vocoder.EnvelopeSynth`, 48
  mel-spaced points per envelope, 10 ms frames) driven by envelopes *measured from the input* (WORLD's
  CheapTrick envelope and D4C aperiodicity at rtanon's own F0 track: harmonic = periodic part, noise =
  aperiodic part) at the input's F0: the synthesiser's ceiling in the speaker's own voice.
- ``synth_pseudo_f0``: the same envelopes at the pseudo-voice's F0 (percentile mapping, as the neural
  method does).
- ``synth_tract``: and the envelopes warped in frequency by 1.15 towards the pseudo-voice (up for a
  higher voice, down for a lower one): what another vocal tract alone costs, with measured envelopes.
- ``student_own`` / ``student_pseudo``: the shipped strong vocoder run offline on the causal content
  encoder's ``z`` with the speaker's own resemblyzer embedding and F0 / with the pseudo-voice's embedding
  and mapped F0 (what predicting the envelopes from causal content costs, without and with the change of
  voice).
- ``strong`` / ``balanced`` / ``mcadams``: the shipped methods, streamed (``Session.process_signal``) with
  that pseudo-voice (McAdams draws its own alpha from the same seed).
- ``probe_KIND_own`` / ``probe_KIND_pseudo`` (with ``--probes DIR`` holding ``envprobe_KIND.pt`` from
  ``rtanon lab envelope-probe train``): the synthesiser on envelopes a small causal regressor predicts from
  the Whisper teacher (``whisper``), hama's phone posteriors (``phones``) or the student's ``z``, with the
  own embedding and F0 or the pseudo-voice's: the vocoder fed teacher content, through one renderer for
  every input. The whole-utterance candidates of files and corpora (``utterance``: Whisper tiny.en over
  each utterance alone, ``utterancebase``: Whisper base, ``moonshine``: Moonshine base's encoder) and any
  content encoder graph's ``z`` (``graph``: the probe names the graph) the same way, with the own voice.
  A probe row is stored under the probe file's digest, so one ``--out`` holds the rows of several
  ``--probes`` folders.

Each row has a parent; its stage cost is its error rate minus the parent's, and the table names the
stage that costs the most. The per-utterance transcripts go to ``--out`` (JSON); a rerun with the same
``--out`` keeps what it holds and renders only what is missing, so rows and sets can be added later.

A candidate's budget: ``--content`` (a content encoder's graph), ``--strong`` and ``--balanced`` (folders
as ``rtanon lab package-vocoder`` writes them: ``vocoder.onnx`` and ``generator.pt``) replace the packaged
models in the rows that use them (``student_*``, ``strong``, ``balanced``). Those rows are stored under
their models' digests, so one ``--out`` holds the shipped pair and every candidate, and the rows that do not
depend on them (the original, the synthesiser, McAdams) are rendered once:

    rtanon lab budget --data ../shared/data/so762_dev ../shared/data/libri_devclean --out runs/budget.json \
        --content runs/pkgPF/content_encoder.onnx --strong runs/pkgS --balanced runs/pkgB8 \
        --rows original,synth_own,student_own,student_pseudo,strong,balanced
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtanon import atomic


@dataclass(frozen=True)
class Row:
    name: str
    parent: str | None
    stage: str  # what the difference to the parent measures


ROWS = (
    Row("original", None, "-"),
    Row("synth_own", "original", "the synthesiser and its 48-point envelopes (measured)"),
    Row("synth_pseudo_f0", "synth_own", "the pseudo-voice's pitch"),
    Row("synth_tract", "synth_pseudo_f0", "another vocal tract (envelopes warped 1.15)"),
    Row("student_own", "synth_own", "predicting the envelopes from causal content (own voice)"),
    Row("student_pseudo", "student_own", "the pseudo-voice on predicted envelopes"),
    Row("strong", "student_pseudo", "the live path: VAD gate (comfort noise outside speech), online pitch "
                                    "mapping, ONNX in 20 ms chunks"),
    Row("balanced", "strong", "the balanced point: its own content encoder and vocoder (against strong)"),
    Row("mcadams", "original", "McAdams (reference)"),
    Row("probe_mel_own", "synth_own", "the probe's regressor, fed the input's own log-mel (its floor)"),
    Row("probe_whisper_own", "probe_mel_own", "the Whisper teacher's content (own voice)"),
    Row("probe_whisper_pseudo", "probe_whisper_own", "the pseudo-voice on envelopes from the Whisper teacher"),
    Row("probe_phones_own", "probe_mel_own", "hama's phone posteriors as content (own voice)"),
    Row("probe_phones_pseudo", "probe_phones_own", "the pseudo-voice on envelopes from phone posteriors"),
    Row("probe_z_own", "probe_mel_own", "the causal student's z as content (own voice)"),
    Row("probe_phoneframes_own", "probe_mel_own", "hama's phones spread over their frames (one-hot; own voice)"),
    Row("probe_student_own", "probe_z_own", "a content checkpoint's z (own voice)"),
    Row("probe_studentphones_own", "probe_mel_own", "a content checkpoint's causal phone reader (own voice)"),
    Row("probe_graph_own", "probe_mel_own", "a content encoder graph's z (envelope-probe --input graph; own voice)"),
    Row("probe_utterance_own", "probe_mel_own", "Whisper tiny.en over each utterance alone (the shipped "
                                                "whole-utterance content; own voice)"),
    Row("probe_utterancebase_own", "probe_utterance_own", "Whisper base instead of tiny.en (own voice)"),
    Row("probe_moonshine_own", "probe_utterance_own", "Moonshine base's encoder instead of Whisper tiny.en "
                                                      "(own voice)"),
)
#: Rows rendered unless ``--rows`` says otherwise; the ``probe_*`` rows need ``--probes DIR``.
DEFAULT_ROWS = tuple(r.name for r in ROWS if not r.name.startswith("probe_"))
ROW_NAMES = tuple(r.name for r in ROWS)
TRACT_WARP = 1.15
#: Rows rendered with the content encoder and a vocoder: stored under those models' digests.
MODEL_ROWS = {"student_own": "strong", "student_pseudo": "strong", "strong": "strong", "balanced": "balanced"}


@dataclass(frozen=True)
class Models:
    """The content encoder graph and the two vocoder folders (``vocoder.onnx`` + ``generator.pt``) the
    model rows use; ``None``: the packaged one."""

    content: str | None = None
    strong: str | None = None
    balanced: str | None = None

    def vocoder_files(self, point: str) -> tuple[str | None, str | None]:
        """(vocoder graph, generator checkpoint) of ``point`` ("strong" / "balanced"); ``None``: packaged."""
        folder = getattr(self, point)
        if folder is None:
            return None, None
        return str(Path(folder) / "vocoder.onnx"), str(Path(folder) / "generator.pt")

    def check(self, rows: tuple[str, ...]) -> None:
        """Stops with a clear message when a file is missing or a vocoder used by ``rows`` was trained on
        another content encoder than the one given."""
        if self.content is not None and not Path(self.content).is_file():
            raise SystemExit(f"--content: {self.content}: no such content encoder graph")
        for point in sorted({MODEL_ROWS[r] for r in rows if r in MODEL_ROWS}):
            for f in self.vocoder_files(point):
                if f is not None and not Path(f).is_file():
                    raise SystemExit(f"--{point}: {f} is missing (a folder as `rtanon lab package-vocoder` writes)")
            trained_on, given = self.trained_on(point), self.content_digest(point)
            if trained_on != given:
                raise SystemExit(f"the {point} vocoder ({getattr(self, point) or 'packaged'}) was trained on content "
                                 f"encoder {trained_on[:12]}, not on {self.content or 'the packaged one'} "
                                 f"({given[:12]}): pass the pair that belongs together")

    def trained_on(self, point: str) -> str:
        """sha256 of the content encoder ``point``'s generator was trained on (the packaged encoder for
        generators from before the record)."""
        import torch

        from rtanon.stages.neural import PACKAGED_CHECKPOINT, packaged_path

        with packaged_path(PACKAGED_CHECKPOINT, point) as p:
            config = torch.load(self.vocoder_files(point)[1] or p, map_location="cpu", weights_only=True)["config"]
        return config.get("content_sha256") or Models().content_digest("strong")

    def content_digest(self, point: str = "strong") -> str:
        """sha256 of the content encoder graph (of a whole-utterance graph: the weights' digest it records,
        the name its vocoders record); without ``content``, of the one ``point`` ships with."""
        from rtanon.content.stream import packaged_model_path
        from rtanon.content.utterance import UtteranceContentModel
        from rtanon.neural.backends import file_sha256
        from rtanon.stages.neural import PACKAGED_CONTENT

        if self.content is not None and (utterance := UtteranceContentModel.load_if_utterance(self.content)):
            return utterance.sha256
        with packaged_model_path(PACKAGED_CONTENT[point]) as p:
            return file_sha256(self.content or p)

    def vocoder_digest(self, point: str, row: str) -> str:
        """sha256 of ``point``'s vocoder as ``row`` uses it: the student rows run the generator checkpoint
        offline, strong and balanced the graph."""
        from rtanon.neural.backends import file_sha256
        from rtanon.stages.neural import PACKAGED_CHECKPOINT, PACKAGED_ONNX, packaged_path

        onnx, ckpt = self.vocoder_files(point)
        name, path = (PACKAGED_CHECKPOINT, ckpt) if row.startswith("student_") else (PACKAGED_ONNX, onnx)
        with packaged_path(name, point) as p:
            return file_sha256(path or p)

    def key(self, row: str) -> str:
        """Where ``row`` is stored: its name, and for a model row the digests of the models that render it."""
        point = MODEL_ROWS.get(row)
        if point is None:
            return row
        return f"{row}@{self.content_digest(point)[:10]}+{self.vocoder_digest(point, row)[:10]}"


def probe_key(row: str, probes: str) -> str:
    """Where a probe row is stored: its name and the digest of the regressor (``envprobe_KIND.pt``) that
    renders it."""
    from rtanon.neural.backends import file_sha256

    path = Path(probes) / f"envprobe_{row.split('_')[1]}.pt"
    if not path.is_file():
        raise SystemExit(f"--probes: {path} is missing (rtanon lab envelope-probe train --out {path})")
    return f"{row}@{file_sha256(path)[:10]}"


_MODELS: dict = {}


def _model(kind: str, **kw):
    """Per-process models, built on first use."""
    key = (kind, tuple(sorted(kw.items())))
    if key not in _MODELS:
        if kind == "asr":
            from rtanon.eval.asr import WhisperTranscriber
            _MODELS[key] = WhisperTranscriber(**kw)
        elif kind == "phones":
            from rtanon.eval.asr import PhoneRecognizer
            _MODELS[key] = PhoneRecognizer()
        elif kind == "identities":
            from rtanon.identity.speaker import IdentityModel
            _MODELS[key] = IdentityModel()
        elif kind == "extract":
            from rtanon.content.utterance import UtteranceContentModel
            from rtanon.train.shards import default_extractors
            whole = UtteranceContentModel.load_if_utterance(kw["content"]) if kw.get("content") else None
            _MODELS[key] = default_extractors(content=whole) if whole else \
                default_extractors(content_onnx=kw.get("content"))
        elif kind == "strong_generator":
            from rtanon.neural.vocoder import load_generator
            from rtanon.stages.neural import PACKAGED_CHECKPOINT, packaged_path
            if kw.get("path"):
                _MODELS[key] = load_generator(kw["path"]).eval().float()
            else:
                with packaged_path(PACKAGED_CHECKPOINT, "strong") as path:
                    _MODELS[key] = load_generator(path).eval().float()
        elif kind == "probe":
            from rtanon.train.envelope_probe import load
            _MODELS[key] = load(kw["path"])
        elif kind == "content":
            from rtanon.train.envelope_probe import _content
            _MODELS[key] = _content(kw["representation"], kw.get("student"))
        elif kind == "anonymizer":
            from rtanon.config import AnonymizerConfig, NeuralConfig
            from rtanon.engine import Anonymizer
            method = kw["method"]
            cfg = AnonymizerConfig(method="mcadams") if method == "mcadams" else \
                AnonymizerConfig(method="neural", neural=NeuralConfig(
                    privacy=method, content_onnx=kw.get("content"), vocoder_onnx=kw.get("vocoder")))
            _MODELS[key] = Anonymizer(cfg)
        else:
            raise KeyError(kind)
    return _MODELS[key]


# --------------------------------------------------------------------------- one utterance


def _match_rms(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    n = min(len(x), len(y))
    y = np.asarray(y[:n], np.float32)
    return y * (np.sqrt(np.mean(x[:n] ** 2)) / max(1e-6, float(np.sqrt(np.mean(y ** 2)))))


def render(x: np.ndarray, rows: tuple[str, ...], seed: int, probes: str | None = None,
           models: Models = Models()) -> dict[str, np.ndarray]:
    """Every row's audio for one utterance (16 kHz float32), with the pseudo-voice of ``seed``; the model
    rows with ``models``."""
    import torch

    from rtanon.f0.convert import TargetPitch, convert_utterance
    from rtanon.train.envelope_probe import measured_envelopes, synthesise, synthesise_points

    out: dict[str, np.ndarray] = {}
    voice = _model("identities").new_identity("gmm", rng=np.random.default_rng(seed))
    extract = _model("extract", content=models.content)
    f0 = extract.f0_hz(x)
    f0_pseudo = convert_utterance(f0, TargetPitch.from_quantiles(voice.f0_quantiles_hz)).astype(np.float32)
    if "original" in rows:
        out["original"] = x
    synth_rows = [r for r in rows if r.startswith("synth_")]
    if synth_rows:
        harm, noise = measured_envelopes(x, f0)
        voiced = f0 > 0
        up = voiced.any() and voice.median_f0_hz >= np.median(f0[voiced])
        for r in synth_rows:
            f = f0 if r == "synth_own" else f0_pseudo
            warp = (TRACT_WARP if up else 1.0 / TRACT_WARP) if r == "synth_tract" else 1.0
            out[r] = _match_rms(synthesise(f, harm, noise, seed, warp), x)
    student_rows = [r for r in rows if r.startswith("student_")]
    probe_rows = [r for r in rows if r.startswith("probe_")]
    own = extract.speaker_embedding([x]) if "student_own" in rows or probe_rows else None
    if student_rows:
        z = extract.units(x)
        t = min(len(z), len(f0) // 2)
        gen = _model("strong_generator", path=models.vocoder_files("strong")[1])
        for r in student_rows:
            emb = own if r == "student_own" else voice.embedding
            f = (f0 if r == "student_own" else f0_pseudo)[: 2 * t].astype(np.float32)
            noise = torch.randn(1, 320 * t, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                y = gen(torch.from_numpy(z[None, :t]), torch.from_numpy(f[None]),
                        torch.from_numpy(np.asarray(emb, np.float32)[None]), noise)[0].numpy()
            out[r] = _match_rms(y, x)
    if probe_rows:
        from rtanon.train import envelope_probe

        for r in probe_rows:
            kind, voice_kind = r.split("_")[1:]
            _, net, student = _model("probe", path=str(Path(probes) / f"envprobe_{kind}.pt"))
            content = _model("content", representation=kind, student=student)(x)
            env_h, env_n = envelope_probe.predict(net, content, own if voice_kind == "own" else voice.embedding)
            f = f0 if voice_kind == "own" else f0_pseudo
            out[r] = _match_rms(synthesise_points(f, env_h, env_n, seed), x)
    for r in ("strong", "balanced", "mcadams"):
        if r in rows:
            neural = {} if r == "mcadams" else {"content": models.content, "vocoder": models.vocoder_files(r)[0]}
            session = _model("anonymizer", method=r, **neural).open_session(
                seed=seed, identity=None if r == "mcadams" else voice)
            out[r] = session.process_signal(x)
    return out


def analyse_utterance(path: str, rows: tuple[str, ...], seed: int, asr: tuple[str, ...],
                      probes: str | None = None, models: Models = Models()) -> dict:
    """Renders one utterance's rows and reads each back: {row: {"text:MODEL": str, "phones": str}}."""
    import torch

    from rtanon.io.audio import read_audio

    torch.set_num_threads(1)
    x = read_audio(path)
    audio = render(x, rows, seed, probes, models)
    res = {}
    for r, y in audio.items():
        y = np.asarray(y, np.float32)
        res[r] = {f"text:{m}": _model("asr", model=m, beam_size=2).transcribe(y) for m in asr}
        res[r]["phones"] = " ".join(_model("phones").phones(y))
    return res


# --------------------------------------------------------------------------- the table


def error_rates(results: dict, refs: dict, ref_phones: dict, row: str, asr: tuple[str, ...]) -> dict:
    """Corpus error rates of one row over the utterances in ``results`` that have it: per Whisper model
    the WER, and the WER without the utterances where that model looped on this row's audio
    (``rtanon.eval.metrics.asr_runaway``: one loop adds a hundred insertions to a few hundred words),
    ``loops`` of them; the PER."""
    from rtanon.eval.utility import corpus_error_rate
    from rtanon.eval.textnorm import normalize

    utts = [u for u in sorted(results) if row in results[u]]
    out = {"utterances": len(utts)}
    if not utts:
        return {**out, "per": None, **{k: None for m in asr for k in (f"wer_{m}", f"wer_{m}_noloop")},
                **{f"loops_{m}": 0 for m in asr}}
    for m in asr:
        e = corpus_error_rate({u: refs[u] for u in utts},
                              {u: normalize(results[u][row][f"text:{m}"]) for u in utts})
        out[f"wer_{m}"], out[f"loops_{m}"] = e["rate"], len(e["runaways"])
        out[f"wer_{m}_noloop"] = e["rate_without_runaways"] if len(e["runaways"]) < len(utts) else None
    out["per"] = corpus_error_rate({u: ref_phones[u] for u in utts},
                                   {u: results[u][row]["phones"].split() for u in utts})["rate"]
    return out


def table(figures: dict, asr: tuple[str, ...], rows: tuple[str, ...]) -> str:
    """Markdown: one line per row, per set its WERs (without the ASR's loops) and PER, then the stage it
    adds over its parent."""
    sets = list(figures)
    cols = [f"WER {m}" for m in asr] + ["PER"]
    head = "| row | " + " | ".join(f"{Path(s).name}: {c}" for s in sets for c in cols) + " | stage (against parent) |"
    lines = [head, "|---|" + "---|" * (len(sets) * len(cols) + 1)]
    by_name = {r.name: r for r in ROWS}
    for name in rows:
        cells = []
        for s in sets:
            f = figures[s].get(name)
            for m in asr:
                if f is None or f[f"wer_{m}"] is None:
                    cells.append("-")
                elif f[f"loops_{m}"]:
                    cells.append(f"{100 * f[f'wer_{m}']:.1f} ({100 * f[f'wer_{m}_noloop']:.1f}, "
                                 f"{f[f'loops_{m}']} loops)")
                else:
                    cells.append(f"{100 * f[f'wer_{m}']:.1f}")
            cells.append("-" if f is None or f["per"] is None else f"{100 * f['per']:.1f}")
        r = by_name[name]
        stage = "-" if r.parent is None else f"{r.stage} (vs {r.parent})"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {stage} |")
    return "\n".join(lines)


def costs(figures: dict, asr: tuple[str, ...], rows: tuple[str, ...],
          probes: bool = False) -> list[tuple[float, str, str]]:
    """(mean cost in WER points without the ASR's loops, over sets and ASRs; row; stage), largest first:
    the stages of the shipped path, or with ``probes`` the probe rows (each content against the input's own
    log-mel through the same regressor). McAdams and balanced (a reference and a second shipped point, not
    a stage of the path) are left out."""
    by_name = {r.name: r for r in ROWS}
    out = []
    for name in rows:
        r = by_name[name]
        if r.parent is None or r.parent not in rows or name in ("mcadams", "balanced") \
                or name.startswith("probe_") != probes:
            continue
        key = [f"wer_{m}_noloop" for m in asr]
        diffs = [100 * (figures[s][name][k] - figures[s][r.parent][k]) for s in figures for k in key
                 if figures[s].get(name) and figures[s].get(r.parent)
                 and None not in (figures[s][name][k], figures[s][r.parent][k])]
        if diffs:
            out.append((float(np.mean(diffs)), name, r.stage))
    return sorted(out, reverse=True)


def voice_seed(seed: int, utt: str) -> int:
    """The pseudo-voice seed of one utterance: the same whichever utterances a run picks."""
    import hashlib

    return seed * 1_000_003 + int(hashlib.sha256(utt.encode()).hexdigest()[:8], 16)


def _pick(data: Path, per_speaker: int, seed: int):
    from rtanon.eval.scenarios import seeded_shuffle
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(data)
    utts = [u for s in kd.speakers for u in
            seeded_shuffle([u for u in kd.utterances_of(s) if u in kd.text], seed, "budget:" + s)[:per_speaker]]
    return kd, sorted(utts)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, metavar="KALDI_DIR",
                    help="evaluation sets with transcripts (e.g. so762_dev libri_devclean)")
    ap.add_argument("--out", required=True, help="per-utterance results (JSON; a rerun adds what is missing)")
    ap.add_argument("--utts-per-speaker", type=int, default=2, help="utterances per speaker, seeded (default 2)")
    ap.add_argument("--asr", default="tiny.en,base", help="Whisper models, comma-separated (default tiny.en,base)")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                    help=f"comma-separated, from {', '.join(ROW_NAMES)} (default: all but the probe rows)")
    ap.add_argument("--probes", default=None, metavar="DIR",
                    help="directory with envprobe_KIND.pt (rtanon lab envelope-probe train --input KIND), for "
                         "the probe_* rows")
    ap.add_argument("--content", default=None, metavar="ONNX",
                    help="a candidate content encoder graph for the student, strong and balanced rows, causal "
                         "or whole-utterance (`rtanon lab export-whisper --utterance`; the packaged one: "
                         "src/rtanon/models/content/whisper_tiny_en_utterance.onnx) (default: the packaged "
                         "causal one)")
    ap.add_argument("--strong", default=None, metavar="DIR",
                    help="a candidate strong vocoder (vocoder.onnx + generator.pt, as `rtanon lab "
                         "package-vocoder` writes them) for the student and strong rows")
    ap.add_argument("--balanced", default=None, metavar="DIR", help="a candidate balanced vocoder (the same "
                                                                   "layout) for the balanced row")
    ap.add_argument("--seed", type=int, default=1000, help="seeds the utterances picked and their pseudo-voices "
                                                            "(default 1000)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = ap.parse_args(argv)
    asr = tuple(m.strip() for m in args.asr.split(",") if m.strip())
    rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
    unknown = set(rows) - set(ROW_NAMES)
    if unknown:
        raise SystemExit(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROW_NAMES)}")
    if any(r.startswith("probe_") for r in rows) and not args.probes:
        raise SystemExit("the probe_* rows need --probes DIR (rtanon lab envelope-probe train writes them)")
    models = Models(args.content, args.strong, args.balanced)
    models.check(rows)
    keys = {r: probe_key(r, args.probes) if r.startswith("probe_") else models.key(r) for r in rows}
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing as mp

    from tqdm import tqdm

    from rtanon.eval.asr import PhoneRecognizer
    from rtanon.eval.textnorm import normalize

    out = Path(args.out)
    done = json.loads(out.read_text()) if out.exists() else {}
    g2p = PhoneRecognizer()
    figures, t0 = {}, time.perf_counter()
    for data in args.data:
        kd, utts = _pick(Path(data), args.utts_per_speaker, args.seed)
        key = Path(data).resolve().name
        store = done.setdefault(f"{key}|seed{args.seed}", {})
        tasks = []
        for u in utts:
            missing = tuple(r for r in rows if keys[r] not in store.get(u, {})
                            or any(f"text:{m}" not in store[u][keys[r]] for m in asr))
            if missing:
                tasks.append((u, str(kd.wav[u]), missing, voice_seed(args.seed, u)))
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            futures = {ex.submit(analyse_utterance, p, r, s, asr, args.probes, models): u for u, p, r, s in tasks}
            for fut in tqdm(as_completed(futures), total=len(futures), desc=key, unit="utt", file=sys.stderr):
                u = futures[fut]
                for r, res in fut.result().items():
                    store.setdefault(u, {}).setdefault(keys[r], {}).update(res)
                atomic.write_text(out, json.dumps(done, indent=0, ensure_ascii=False))
        refs = {u: normalize(kd.text[u]) for u in utts}
        ref_phones = {u: g2p.canonical(refs[u]) for u in utts}
        results = {u: {r: store[u][keys[r]] for r in rows if keys[r] in store[u]} for u in utts if u in store}
        figures[key] = {r: error_rates(results, refs, ref_phones, r, asr) for r in rows}
        n_words = sum(len(v) for v in refs.values())
        print(f"{key}: {len(utts)} utterances of {len(kd.speakers)} speakers, {n_words} words", file=sys.stderr)
    for point in sorted({MODEL_ROWS[r] for r in rows if r in MODEL_ROWS}):
        if models.content or getattr(models, point):
            print(f"{point} rows: content encoder {models.content or 'packaged'}, vocoder "
                  f"{getattr(models, point) or 'packaged'}")
    print(table(figures, asr, rows))
    ranked = costs(figures, asr, rows)
    probed = costs(figures, asr, rows, probes=True)
    if probed:
        print("\ncontent through the probe's regressor and the synthesiser (WER points without the ASR's loops, "
              "mean over sets and ASRs):")
        for c, name, stage in probed:
            print(f"  {c:+6.1f}  {name}: {stage}")
    if ranked:
        print("\nstage costs (WER points without the ASR's loops, mean over sets and ASRs), largest first:")
        for c, name, stage in ranked:
            print(f"  {c:+6.1f}  {name}: {stage}")
        print(f"\nthe stage that costs the most: {ranked[0][1]} ({ranked[0][2]})")
    print(f"\n{time.perf_counter() - t0:.0f} s; per-utterance transcripts in {out}")
    return 0
