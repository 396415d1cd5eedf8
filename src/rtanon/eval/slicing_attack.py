"""The slicing attack (paper 004): every file of a timed utterance cut at the original's word timings and
its slices embedded (``slice_and_embed``), then the semi-informed attacker on those slices
(``slicing_attack``). The slicing itself (Algorithm 1) and its protocol are in :mod:`rtanon.eval.slicing`."""

from __future__ import annotations

import numpy as np

from rtanon.eval.pool import Pool, add_cpu
from rtanon.eval.scenarios import ORIGINAL
from rtanon.io.kaldi import KaldiDir


def slice_and_embed(pool: Pool, slice_seconds: float, sets: dict, results: dict, cache, names: dict,
                    progress: bool, cpu_s: dict) -> tuple[list[str], int, dict]:
    """Cuts every file of a timed utterance (original and anonymized alike)
    at the original's word timings (Algorithm 1) and embeds the slices into
    ``results[key]["slices"][utt]``. Returns the files analyzed, the number
    of cache misses and the slicing figures for the report."""
    import hashlib

    import soundfile as sf

    from rtanon.eval import _worker
    from rtanon.eval.cache import file_key
    from rtanon.eval.slicing import slice_bounds

    words = {**results[(ORIGINAL, "train")]["words"], **results[(ORIGINAL, "dev")]["words"]}
    originals = {**sets[(ORIGINAL, "train")].wav, **sets[(ORIGINAL, "dev")].wav}
    bounds = {u: slice_bounds(w, sf.info(str(originals[u])).duration, slice_seconds) for u, w in words.items()}
    requests: dict[str, list] = {}
    for key, kd in sets.items():
        for utt, path in kd.wav.items():
            if not bounds.get(utt):
                continue
            cuts = tuple((round(b[0], 3), round(b[1], 3)) for b in bounds[utt])
            tag = hashlib.sha256(repr(cuts).encode()).hexdigest()[:16]
            ck = file_key(f"{names['embedding']}|slices:{tag}", path)
            hit = cache.get("slices", ck)
            if hit is not None:
                results[key]["slices"][utt] = hit
            else:
                requests.setdefault(str(path), []).append((key, utt, ck, cuts))
    paths = sorted(requests)
    arglist = [(p, requests[p][0][3], 1) for p in paths]
    done = pool.run(_worker.embed_slices, arglist, desc="slicing", progress=progress)
    for p, (res, cpu) in zip(paths, done):
        add_cpu(cpu_s, cpu)
        for key, utt, ck, _ in requests[p]:
            results[key]["slices"][utt] = res
            cache.put("slices", ck, res)
    dev_utts = sorted(sets[(ORIGINAL, "dev")].wav)
    lengths = [b[1] - b[0] for u in dev_utts for b in bounds.get(u, [])]
    counts = [len(bounds.get(u, [])) for u in dev_utts]
    protocol = {"slice_seconds": slice_seconds, "dev_slices": len(lengths),
                "dev_utterances_without_slice": sum(c == 0 for c in counts),
                "slices_per_utterance": float(np.mean(counts)) if counts else 0.0,
                "slice_duration_s": {"mean": float(np.mean(lengths)) if lengths else None,
                                     "std": float(np.std(lengths)) if lengths else None,
                                     "min": float(np.min(lengths)) if lengths else None,
                                     "max": float(np.max(lengths)) if lengths else None},
                "timed_train_utterances": len(words) - len([u for u in words if u in sets[(ORIGINAL, "dev")].wav])}
    return paths, sum(len(r) for r in requests.values()), protocol


def slicing_attack(split, results: dict, name: str, plda, calib_spk: list[str], train_sub: KaldiDir):
    """The semi-informed attacker on slices: enrolment and trial utterances
    cut into slices (trial slices against speakers enrolled with their
    enrolment slices), the same PLDA backend, and a calibration fitted on
    slice pairs of the held-out training speakers (pairs within one
    utterance left out)."""
    from rtanon.eval import metrics, scenarios
    from rtanon.eval.slicing import slice_embeddings, slice_utt, sliced_split

    dev_key = (name, "dev")
    enroll_key = (ORIGINAL, "dev") if name == ORIGINAL else (name, "enroll")
    train_key = (ORIGINAL, "train") if name == ORIGINAL else (name, "train")
    trial_sl = results[dev_key]["slices"]
    enroll_sl = results[enroll_key]["slices"]
    n_slices = {u: len(v) for u, v in trial_sl.items() if u in set(split.trials)}
    n_slices.update({u: len(enroll_sl[u]) for u in split.enroll_utts if u in enroll_sl})
    sl_split = sliced_split(split, n_slices)
    calib = set(calib_spk)
    cal_emb = slice_embeddings({u: v for u, v in results[train_key]["slices"].items()
                                if train_sub.utt2spk[u] in calib})
    ids = sorted(cal_emb)
    spk = np.array([train_sub.utt2spk[slice_utt(i)] for i in ids])
    gen = np.array([train_sub.spk2gender[s] for s in spk])
    utt = np.array([slice_utt(i) for i in ids])
    cal = metrics.fit_affine_calibration(*scenarios.pairwise_trials(
        np.stack([cal_emb[i] for i in ids]), spk, gen, plda, groups=utt))
    result = scenarios.evaluate_attack(sl_split, slice_embeddings(enroll_sl), slice_embeddings(trial_sl), plda, cal)
    result.metrics["trial_slices"] = len(sl_split.trials)
    result.metrics["enroll_slices"] = len(sl_split.enroll_utts)
    return result
