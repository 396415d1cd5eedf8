"""Utility scoring: WER per Whisper model, PER against the references' canonical phones, and rho_F0 of the
anonymized speech against the original (``utility_scores``); ``corpus_error_rate`` for any token lists."""

from __future__ import annotations

import numpy as np


def canonical_phones(refs: dict) -> dict:
    """Utterance -> the canonical phones of its normalised reference words (hama's G2P)."""
    from rtanon.eval.asr import PhoneRecognizer

    if not refs:
        return {}
    g2p = PhoneRecognizer()
    return {u: g2p.canonical(words) for u, words in refs.items()}


def corpus_error_rate(refs: dict, hyps: dict) -> dict:
    """Word (or phone) error rate of ``hyps`` against ``refs`` (utterance -> token list), split, with the
    utterances where the recognizer looped and the rate without them."""
    from rtanon.eval import metrics

    counts = {u: metrics.error_counts(refs[u], hyps[u]) for u in refs}
    n = sum(len(refs[u]) for u in refs)
    subs, dels, ins = (sum(c[k] for c in counts.values()) for k in range(3))
    runaways = sorted(u for u in refs if metrics.asr_runaway(refs[u], hyps[u]))
    kept = [u for u in refs if u not in runaways]
    return {"rate": (subs + dels + ins) / max(1, n), "tokens": n,
            "split": {"substitutions": subs / max(1, n), "deletions": dels / max(1, n),
                      "insertions": ins / max(1, n)},
            "runaways": runaways,
            "rate_without_runaways": sum(sum(counts[u]) for u in kept) / max(1, sum(len(refs[u]) for u in kept))}


def utility_scores(orig: dict, anon: dict, refs: dict, asr_models: tuple[str, ...], ref_phones: dict) -> dict:
    """WER per Whisper model (the first one's also as ``wer``, ``wer_split``...), PER and rho_F0."""
    from rtanon.eval import metrics
    from rtanon.eval.textnorm import normalize

    out: dict = {"wer": None, "asr": {}}
    for i, model in enumerate(asr_models):
        texts = anon.get(f"text:{model}")
        if not refs or not texts:
            continue
        e = corpus_error_rate(refs, {u: normalize(texts[u]) for u in refs})
        out["asr"][model] = {"wer": e["rate"], "wer_split": e["split"], "asr_runaways": e["runaways"],
                             "wer_without_runaways": e["rate_without_runaways"]}
        if i == 0:
            out.update(out["asr"][model], wer_words=e["tokens"])
    if ref_phones and anon.get("phones"):
        e = corpus_error_rate(ref_phones, anon["phones"])
        out["per"], out["per_phones"], out["per_split"] = e["rate"], e["tokens"], e["split"]
    else:
        out["per"] = None
    rhos = [metrics.pearson_voiced(orig["f0"][u], anon["f0"][u]) for u in sorted(orig["f0"])]
    valid = [r for r in rhos if r is not None]
    out["rho_f0"] = float(np.mean(valid)) if valid else None
    out["rho_f0_utterances"] = len(valid)
    return out
