"""Anonymizing Kaldi-style corpora for release: checked, resumable, one pseudo-voice per speaker or utterance.

``run_corpus(plan, executor)`` writes ``OUT/<utt-id>.wav`` for every utterance
of the input plus ``wav.scp``, ``utt2spk``, ``spk2gender`` (and ``spk2age``,
``text`` when present), so the output is itself a Kaldi-style directory. It

1. checks everything before the first output is written (:func:`check_corpus`):
   utterance ids are safe file names (no separators, no ``..``, no leading dot,
   short enough for the writer's temporary name; duplicates are refused when
   the files are read), ``OUT`` is neither the
   input nor holds any of it, and every input exists and has a decodable
   header; each input is hashed (sha256);
2. fixes the pseudo-voices: one per speaker or per utterance
   (``assignment``, paper 000 Sec. IV), each a voice seed drawn from the OS
   random source (or derived from ``--seed``), kept in ``OUT/run.json`` so a
   restarted run gives the remaining utterances the same voices;
3. skips what ``OUT/manifest.json`` says is done when its input hash, the
   settings and the output file's hash still match (an input that changed is
   redone), and hands the rest to an executor in batches: in this process
   (:class:`InProcessExecutor`) or on Ray actors (:mod:`rtanon.corpus.on_ray`);
4. writes every output atomically and records it in the manifest (utterance
   id, input sha256, output path and sha256, pseudo-speaker id, method, model
   hashes) as results arrive; a failing utterance is recorded with its error
   and the others go on.

``OUT/spk2pseudo`` (and ``utt2pseudo``) map the original speakers to their
pseudo-speaker ids; with ``run.json`` and ``manifest.json`` they are the key that
links the release back to the speakers: the data owner keeps them and
publishes the rest. The input corpus is only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from rtanon import atomic
from rtanon.errors import UserError
from rtanon.io.kaldi import KaldiDir, write_map
from rtanon.paths import printable

ASSIGNMENTS = ("speaker", "utterance")
RUN_FILE = "run.json"
MANIFEST_FILE = "manifest.json"
FAILED_FILE = "failed"
#: files of the output directory that link the release back to the original speakers (the owner's key)
KEY_FILES = (RUN_FILE, MANIFEST_FILE, "spk2pseudo", "utt2pseudo")


class CorpusError(UserError):
    """A corpus or output directory that cannot be anonymized as asked; the message says why."""


def voice_seed(seed: int | None, key: str) -> int | None:
    """Per-speaker (or per-utterance) seed derived from a run seed; ``None``
    keeps the OS random source (fresh voices every run)."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, zlib.crc32(key.encode())]).generate_state(1)[0])


def pseudo_speaker_id(voice: int) -> str:
    """The name of the pseudo-speaker a voice seed makes (what spk2pseudo maps to)."""
    return "pseudo-" + hashlib.sha256(f"rtanon-voice:{voice}".encode()).hexdigest()[:12]


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- checks -------------------------------------------------------------------------------------

def check_utterance_id(utt: str) -> None:
    """An utterance id names a file in the output folder: refuse anything that could leave it."""
    bad = ("/" in utt or "\\" in utt or ".." in utt or utt.startswith(".") or not utt.isprintable()
           or ":" in utt)
    if bad:
        raise CorpusError(f"utterance id {utt!r} cannot name an output file (no '/', '\\', ':', '..', leading "
                          "dot or control characters); fix wav.scp")


def check_out_dir(src: KaldiDir, out: Path) -> None:
    """``out`` may not be the input directory, lie inside it (the input corpus is never modified, not even
    by a new folder), nor contain it or any input file."""
    out_r = out.resolve()
    data_r = src.root.resolve()
    if out_r == data_r:
        raise CorpusError(f"--out {out} is the input directory; choose a new folder")
    if out_r.is_relative_to(data_r):
        raise CorpusError(f"--out {out} lies inside the input directory {src.root}, which is never modified; "
                          "choose a folder outside it")
    if data_r.is_relative_to(out_r):
        raise CorpusError(f"--out {out} contains the input directory {src.root}; choose a folder outside it")
    for utt, path in src.wav.items():
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError) as exc:  # Python raises RuntimeError on a symlink loop
            raise CorpusError(f"utterance {utt}: {path}: cannot be resolved ({exc}); fix wav.scp") from None
        if resolved.is_relative_to(out_r):
            raise CorpusError(f"--out {out} contains input audio {path} (utterance {utt}); choose another folder")
    if out.exists() and not out.is_dir():
        raise CorpusError(f"--out {out} exists and is not a folder")


@dataclass(frozen=True)
class Utterance:
    utt: str
    spk: str
    src: str  # absolute input path
    seconds: float
    sha256: str


def check_corpus(src: KaldiDir, out: Path, progress: bool = False) -> list[Utterance]:
    """Every check before the first output (module docstring, step 1); returns the utterances, sorted."""
    from tqdm import tqdm

    from rtanon.io.audio import probe

    for utt in src.wav:
        check_utterance_id(utt)
    check_out_dir(src, out)
    utts = []
    for utt in tqdm(sorted(src.wav), desc="checking inputs", unit="utt", disable=not progress, leave=False):
        path = src.wav[utt]
        try:
            atomic.check_target(out / f"{utt}.wav")  # a name too long for its temporary file, a FIFO
            info = probe(path)
            digest = file_sha256(path)
        except UserError as exc:  # undecodable, truncated, not a regular file
            raise CorpusError(f"utterance {utt}: {exc}") from None
        except OSError as exc:
            raise CorpusError(f"utterance {utt}: {path}: cannot read: {exc.strerror or exc}") from None
        utts.append(Utterance(utt, src.utt2spk[utt], str(path.resolve()), info.seconds, digest))
    return utts


# ---- what a run is ------------------------------------------------------------------------------

def model_hashes(config) -> dict[str, str]:
    """sha256 of the model files the method runs (none for McAdams)."""
    if config.method != "neural":
        return {}
    from importlib import resources

    from rtanon.stages.neural import content_ref, packaged_vocoder_ref

    n = config.neural
    vocoder = n.vocoder_checkpoint if n.backend == "torch" else n.vocoder_onnx
    out = {}
    for name, ref in (("vocoder", Path(vocoder) if vocoder else packaged_vocoder_ref(n)), ("content", content_ref(n))):
        with resources.as_file(ref) as p:
            if Path(p).is_file():
                out[name] = file_sha256(p)
    return out


@dataclass
class CorpusPlan:
    """One run: what to anonymize, where, how. ``workers`` only describes the executor."""

    data: KaldiDir
    out: Path
    config: object  # AnonymizerConfig
    assignment: str = "speaker"
    seed: int | None = None
    identity: object = None  # a PseudoSpeaker pinning every voice
    batch: int = 4
    progress: bool = True
    utterances: list[Utterance] = field(default_factory=list)

    def settings(self) -> dict:
        """What must be equal for a restart to continue a run (not the executor, which changes no output)."""
        from rtanon import __version__

        ident = None
        if self.identity is not None:
            ident = hashlib.sha256(np.asarray(self.identity.embedding, np.float32).tobytes()
                                   + json.dumps(self.identity.f0_quantiles_hz.tolist()
                                                if hasattr(self.identity.f0_quantiles_hz, "tolist")
                                                else list(self.identity.f0_quantiles_hz)).encode()).hexdigest()
        return {"rtanon": __version__, "method": self.config.method,
                "config": json.loads(json.dumps(asdict(self.config), default=str)),
                "models": model_hashes(self.config), "assignment": self.assignment, "seed": self.seed,
                "identity_sha256": ident}


def _settings_digest(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _load_json(path: Path, what: str) -> dict | None:
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # nested deeper than the parser goes: no file rtanon wrote
        raise CorpusError(f"{printable(path)}: not a {what} (nested too deep); remove it or choose a new "
                          "--out") from None
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path}: unreadable {what} ({exc}); remove it or choose a new --out") from None
    if not isinstance(d, dict):
        raise CorpusError(f"{path}: not a {what}; remove it or choose a new --out")
    return d


def _voices(plan: CorpusPlan, settings: dict) -> dict[str, int]:
    """Voice seed per speaker or utterance: those ``run.json`` holds (a restart), plus new ones."""
    run_path = plan.out / RUN_FILE
    run = _load_json(run_path, "run file")
    voices: dict[str, int] = {}
    if run is not None:
        if run.get("settings") != settings:
            old = run.get("settings") or {}
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise CorpusError(f"{plan.out} holds a run made with other settings ({', '.join(diff)}); rerun the "
                              "same command to continue it, or choose a new --out")
        voices = {str(k): int(v) for k, v in run.get("voices", {}).items()}
    keys = sorted({u.spk if plan.assignment == "speaker" else u.utt for u in plan.utterances})
    changed = False
    for key in keys:
        if key not in voices:
            derived = voice_seed(plan.seed, key)
            voices[key] = derived if derived is not None else secrets.randbits(63)
            changed = True
    if changed or run is None:
        atomic.write_text(run_path, json.dumps({"settings": settings, "voices": dict(sorted(voices.items()))},
                                               indent=1, sort_keys=True) + "\n")
    return voices


# ---- executors ----------------------------------------------------------------------------------

def _anonymize_one(anonymizer, identity, job: dict, session=None) -> dict:
    """One utterance; a failure comes back as ``{"error"}`` instead of raising."""
    from rtanon.io.audio import anonymize_file

    res = {"utt": job["utt"], "seconds": job["seconds"], "pid": os.getpid()}
    try:
        session = session or anonymizer.open_session(seed=job["voice"], identity=identity)
        anonymize_file(session, job["src"], job["dst"])  # RunFailed when the output would be comfort noise only
        res["output_sha256"] = file_sha256(job["dst"])
    except Exception as exc:  # reported by utterance id; the other utterances go on
        res["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return res


def _vocoders(session) -> list:
    return [stage.vocoder for stage in session.stages if hasattr(stage, "vocoder")]


def process_batch(anonymizer, identity, jobs: list[dict]) -> list[dict]:
    """Anonymizes ``jobs`` with ``anonymizer`` (models loaded once); never raises for one utterance: a
    failure comes back as ``{"utt", "error"}``. The neural method runs the batch's utterances side by side,
    one thread each, their vocoder steps batched into one backend call (:mod:`rtanon.neural.batching`;
    same audio as one at a time); McAdams runs them one after the other. Each result carries the wall
    seconds it took (a batched call's wall time shared out by audio length), the CPU seconds and the audio
    seconds it processed."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        sessions = [anonymizer.open_session(seed=j["voice"], identity=identity) for j in jobs]
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        return [{"utt": j["utt"], "seconds": j["seconds"], "pid": os.getpid(), "error": err, "wall_s": 0.0,
                 "cpu_s": 0.0} for j in jobs]
    if len(jobs) > 1 and _vocoders(sessions[0]):
        from concurrent.futures import ThreadPoolExecutor

        from rtanon.neural.batching import BatchedVocoder

        batched = BatchedVocoder(_vocoders(sessions[0])[0].backend, len(jobs))
        for s in sessions:
            for v in _vocoders(s):
                v.use_backend(batched)

        def one(k: int) -> dict:
            try:
                return _anonymize_one(anonymizer, identity, jobs[k], sessions[k])
            finally:
                batched.leave()

        with ThreadPoolExecutor(len(jobs), thread_name_prefix="rtanon-utt") as pool:
            results = list(pool.map(one, range(len(jobs))))
        wall = time.perf_counter() - t0
        total = sum(j["seconds"] for j in jobs) or 1.0
        for r in results:
            r["wall_s"] = wall * r["seconds"] / total
            r["cpu_s"] = (time.process_time() - c0) * r["seconds"] / total
            r["vocoder_batch"] = round(batched.rows / max(batched.calls, 1), 2)
        return results
    results = []
    for job, session in zip(jobs, sessions):
        t1, c1 = time.perf_counter(), time.process_time()
        r = _anonymize_one(anonymizer, identity, job, session)
        r["wall_s"] = time.perf_counter() - t1
        r["cpu_s"] = time.process_time() - c1
        results.append(r)
    return results


def warm_up(anonymizer) -> None:
    """One second of quiet noise through a throw-away session: compiles and caches what the first utterance
    would otherwise pay for (Numba kernels, ONNX Runtime's first runs), so timings start warm."""
    noise = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.01
    anonymizer.open_session(seed=0).process_signal(noise)


class InProcessExecutor:
    """Runs every batch in this process, one after the other (the fallback without Ray: ``--workers 0``)."""

    name = "in-process"

    def __init__(self, config, identity=None, anonymizer=None) -> None:
        from rtanon.engine import Anonymizer

        t0 = time.perf_counter()
        self.anonymizer = anonymizer if anonymizer is not None else Anonymizer(config)
        warm_up(self.anonymizer)
        self.identity = identity
        self.workers = 1
        self.startup_s = time.perf_counter() - t0

    def run(self, batches):
        for batch in batches:
            yield process_batch(self.anonymizer, self.identity, batch)

    def close(self) -> None:
        pass


# ---- the run ------------------------------------------------------------------------------------

@dataclass
class RunResult:
    out: Path
    total: int  # utterances in the corpus
    skipped: int  # verified as done by an earlier run
    done: int  # anonymized now
    failed: dict[str, str]  # utt -> error
    audio_s: float  # audio anonymized now
    process_s: float  # wall seconds from the first batch handed out to the last result
    check_s: float
    workers: dict  # worker id -> {"utts", "audio_s", "wall_s", "cpu_s"}

    @property
    def ok(self) -> bool:
        return not self.failed


def _record(u: Utterance, out_name: str, out_sha: str, pseudo: str, settings: dict, digest: str) -> dict:
    return {"utt": u.utt, "spk": u.spk, "input": u.src, "input_sha256": u.sha256, "output": out_name,
            "output_sha256": out_sha, "pseudo_speaker": pseudo, "method": settings["method"],
            "models": settings["models"], "settings_sha256": digest}


def _write_manifest(out: Path, records: dict[str, dict]) -> None:
    atomic.write_text(out / MANIFEST_FILE, json.dumps({"utterances": dict(sorted(records.items()))},
                                                      indent=1, sort_keys=True) + "\n")


def run_corpus(plan: CorpusPlan, executor_factory) -> RunResult:
    """Anonymizes ``plan`` (see the module docstring). ``executor_factory()`` builds the executor only when
    there is work left. Raises CorpusError before writing anything when a check fails."""
    from tqdm import tqdm

    if plan.assignment not in ASSIGNMENTS:
        raise CorpusError(f"assignment={plan.assignment!r}; use one of {ASSIGNMENTS}")
    src, out = plan.data, plan.out
    t_check = time.perf_counter()
    plan.utterances = check_corpus(src, out, progress=plan.progress)
    check_s = time.perf_counter() - t_check
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CorpusError(f"--out {out}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CorpusError(f"--out {out}: not writable; choose a folder you can write to")
    atomic.remove_leftovers(out)  # what a run killed with SIGKILL left behind
    settings = plan.settings()
    digest = _settings_digest(settings)
    voices = _voices(plan, settings)
    old = (_load_json(out / MANIFEST_FILE, "manifest") or {}).get("utterances", {})

    def key(u: Utterance) -> str:
        return u.spk if plan.assignment == "speaker" else u.utt

    def pseudo(u: Utterance) -> str:
        return pseudo_speaker_id(voices[key(u)])

    records, todo = {}, []
    for u in plan.utterances:
        rec, name = old.get(u.utt), f"{u.utt}.wav"
        dst = out / name
        if (rec and rec.get("input_sha256") == u.sha256 and rec.get("settings_sha256") == digest
                and rec.get("output") == name and dst.is_file() and file_sha256(dst) == rec.get("output_sha256")):
            records[u.utt] = rec
        else:
            todo.append(u)
    skipped = len(records)
    if skipped and plan.progress:
        print(f"{skipped} utterances already done (outputs verified against {MANIFEST_FILE}); "
              f"{len(todo)} to do", flush=True)
    by_utt = {u.utt: u for u in todo}
    jobs = [{"utt": u.utt, "src": u.src, "dst": str((out / f"{u.utt}.wav").absolute()), "voice": voices[key(u)],
             "seconds": u.seconds} for u in todo]
    # longest first: the last batches are short, so workers finish together
    jobs.sort(key=lambda j: -j["seconds"])
    batches = [jobs[i:i + plan.batch] for i in range(0, len(jobs), max(1, plan.batch))]
    failed: dict[str, str] = {}
    workers: dict = {}
    audio_s = process_s = 0.0
    if jobs:
        executor = executor_factory()
        total_h = sum(u.seconds for u in todo) / 3600
        bar = tqdm(total=len(jobs), desc=f"anonymizing {src.root.name}", unit="utt", disable=not plan.progress)
        last_save = t0 = time.perf_counter()
        try:
            for results in executor.run(batches):
                for r in results:
                    u = by_utt[r["utt"]]
                    w = workers.setdefault(r.get("worker", r["pid"]), {"utts": 0, "audio_s": 0.0, "wall_s": 0.0,
                                                                        "cpu_s": 0.0})
                    w["utts"] += 1
                    w["audio_s"] += u.seconds
                    w["wall_s"] += r["wall_s"]
                    w["cpu_s"] += r["cpu_s"]
                    if "error" in r:
                        failed[u.utt] = r["error"]
                        bar.write(f"utterance {u.utt} failed: {printable(r['error'], 500)}", file=sys.stderr)
                    else:
                        records[u.utt] = _record(u, f"{u.utt}.wav", r["output_sha256"], pseudo(u), settings, digest)
                        audio_s += u.seconds
                    bar.update(1)
                elapsed = time.perf_counter() - t0
                bar.set_postfix_str(f"audio {audio_s / 3600:.3f}/{total_h:.3f} h, "
                                    f"{audio_s / max(elapsed, 1e-9):.1f}x real time", refresh=False)
                if time.perf_counter() - last_save > 2.0:
                    _write_manifest(out, records)
                    last_save = time.perf_counter()
            process_s = time.perf_counter() - t0
        finally:
            bar.close()
            _write_manifest(out, records)
            executor.close()
            atomic.remove_leftovers(out)  # what the executor's killed workers were writing
    else:
        _write_manifest(out, records)
    _write_kaldi(src, out, plan, records, failed, voices, key)
    return RunResult(out, len(plan.utterances), skipped, len(jobs) - len(failed), failed, audio_s, process_s,
                     check_s, workers)


def _write_kaldi(src: KaldiDir, out: Path, plan: CorpusPlan, records: dict, failed: dict, voices: dict, key) -> None:
    utts = sorted(records)
    spks = {src.utt2spk[u] for u in utts}
    write_map(out / "wav.scp", {u: records[u]["output"] for u in utts})
    write_map(out / "utt2spk", {u: src.utt2spk[u] for u in utts})
    write_map(out / "spk2gender", {s: g for s, g in src.spk2gender.items() if s in spks})
    if src.spk2age:
        write_map(out / "spk2age", {s: a for s, a in src.spk2age.items() if s in spks})
    if src.text:
        write_map(out / "text", {u: src.text[u] for u in utts if u in src.text})
    write_map(out / "utt2pseudo", {u: records[u]["pseudo_speaker"] for u in utts})
    spk2pseudo: dict[str, list[str]] = {}
    for u in utts:
        ids = spk2pseudo.setdefault(src.utt2spk[u], [])
        if records[u]["pseudo_speaker"] not in ids:
            ids.append(records[u]["pseudo_speaker"])
    write_map(out / "spk2pseudo", {s: " ".join(ids) for s, ids in spk2pseudo.items()})
    if failed:
        write_map(out / FAILED_FILE, failed)
    else:
        (out / FAILED_FILE).unlink(missing_ok=True)


def anonymize_dir(anonymizer, data: str | Path | KaldiDir, out: str | Path, *, assignment: str = "speaker",
                  seed: int | None = None, identity=None, progress: bool = True) -> KaldiDir:
    """Anonymizes every utterance of ``data`` into ``out`` in this process with ``anonymizer``; returns the
    new KaldiDir, or raises CorpusError naming the utterances that failed. ``assignment="speaker"``: one
    pseudo-voice per original speaker; ``"utterance"``: one per utterance. ``identity`` (a PseudoSpeaker)
    pins one voice for every speaker, on purpose."""
    src = data if isinstance(data, KaldiDir) else KaldiDir.load(data)
    plan = CorpusPlan(src, Path(out), anonymizer.config, assignment=assignment, seed=seed, identity=identity,
                      progress=progress)
    result = run_corpus(plan, lambda: InProcessExecutor(anonymizer.config, identity, anonymizer))
    if result.failed:
        first = sorted(result.failed)[0]
        raise CorpusError(f"{len(result.failed)} utterances failed, e.g. {first}: {result.failed[first]}")
    return KaldiDir.load(out)
