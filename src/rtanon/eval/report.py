"""Writing an evaluation: ``report.json``, ``report.md`` and PNG plots.

- ``similarity_<system>.png``: the voice similarity matrices as in paper 001
  Fig. 1 (M_OO upper left, M_OP upper right, M_PO lower left, M_PP lower
  right; speakers ordered by gender).
- ``scores_<system>.png``: target and non-target score histograms per attack
  scenario (the slicing attacker's over slice trials).
- ``summary.png``: EER and linkability per scenario, WER and rho_F0 per system.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rtanon import atomic

SCENARIO_TITLES = {"ignorant": "Ignorant", "lazy_informed": "Lazy-informed", "semi_informed": "Semi-informed",
                   "slicing": "Slicing"}


def scenarios_of(system: dict) -> list[str]:
    """The attack scenarios a system's entry has, in the table's order."""
    return [sc for sc in SCENARIO_TITLES if sc in system]


def _json_safe(x):
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else (None if math.isnan(x) else ("-inf" if x < 0 else "inf"))
    if isinstance(x, np.integer):
        return int(x)
    return x


def _save_png(fig, path: Path, dpi: int) -> None:
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)


def write_report(out: Path, result: dict, plots: dict) -> None:
    out = Path(out)
    atomic.write_text(out / "report.json", json.dumps(_json_safe(result), indent=2) + "\n")
    figures = _plots(out, result, plots)
    atomic.write_text(out / "report.md", markdown(result, figures))


def _fmt(x, pct: bool = False, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return "-inf" if x < 0 else "inf"
    return f"{100 * x:.1f} %" if pct else f"{x:.{digits}f}"


def privacy_table(result: dict) -> str:
    rows = ["| system | attacker | EER | Cllr | min Cllr | linkability | mean rank (chance) | top-1 | top-5 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["systems"].items():
        for sc in scenarios_of(s):
            m, title = s[sc], SCENARIO_TITLES[sc]
            rows.append(f"| {name} | {title} ({m['scorer']}) | {_fmt(m['eer'], pct=True)} | {_fmt(m['cllr'])} | "
                        f"{_fmt(m['cllr_min'])} | {_fmt(m['linkability'])} | {m['rank_mean']:.1f} "
                        f"({m['rank_chance']:.1f}) | {_fmt(m['top1'], pct=True)} | {_fmt(m['top5'], pct=True)} |")
    return "\n".join(rows)


def utility_table(result: dict) -> str:
    models = list(next(iter(result["systems"].values())).get("asr") or {}) or ["tiny.en"]
    rows = ["| system | " + " | ".join(f"WER ({m})" for m in models) + " | substitutions / deletions / "
            f"insertions ({models[0]}) | ASR loops: utterances (WER without) | PER | rho_F0 | DeID | GVD |",
            "|---|" + "---|" * (len(models) + 6)]
    for name, s in result["systems"].items():
        wers = [(s.get("asr") or {}).get(m, {}).get("wer", s["wer"] if i == 0 else None)
                for i, m in enumerate(models)]
        split = s.get("wer_split")
        split = " / ".join(_fmt(split[k], pct=True) for k in ("substitutions", "deletions", "insertions")) \
            if split else "-"
        loops = s.get("asr_runaways")
        loops = f"{len(loops)} ({_fmt(s['wer_without_runaways'], pct=True)})" if loops is not None else "-"
        rows.append(f"| {name} | " + " | ".join(_fmt(w, pct=True) for w in wers) + f" | {split} | {loops} | "
                    f"{_fmt(s.get('per'), pct=True)} | {_fmt(s['rho_f0'])} | {_fmt(s['deid'], pct=True)} | "
                    f"{_fmt(s['gvd_db'], digits=2)} dB |")
    return "\n".join(rows)


def markdown(result: dict, figures: list[str]) -> str:
    cfg, prot, tim = result["config"], result["protocol"], result["timings_s"]
    any_sys = next(iter(result["systems"].values()))
    ign = any_sys["ignorant"]
    lines = [
        f"# rtanon evaluation: {cfg['method']} on {Path(prot['data']).name}",
        "",
        f"Systems: {', '.join(result['systems'])}. Data: {prot['speakers']} speakers, {prot['utterances']} "
        f"utterances ({prot['audio_seconds']['dev']:.0f} s); per speaker {cfg['enroll_utts']} enrolment "
        f"utterances, the rest ({prot['trial_utterances']}) are trials. Verification: {ign['n_target']} target "
        f"and {ign['n_nontarget']} same-gender non-target trials; closed-set identification among all "
        f"{ign['n_speakers']} speakers.",
        "",
        "## Privacy (more private: EER towards 50 %, min Cllr towards 1, linkability and top-k towards 0, "
        "mean rank towards chance)",
        "",
        privacy_table(result),
        "",
        "## Utility and voice distinctiveness",
        "",
        utility_table(result),
        "",
        "## How these were measured",
        "",
        f"- Attacker embedding: {result['analyzers']['embedding']}; independent of every rtanon method.",
        "- Ignorant: original enrolment, anonymized trials (speaker-level pseudo-voices), cosine scoring.",
        "- Lazy-informed: enrolment anonymized by the same system with other pseudo-voices (another seed), "
        "cosine scoring.",
        f"- Semi-informed: as lazy-informed, scored by PCA + LDA ({any_sys['lda_dim']} dims) + PLDA trained on "
        f"{prot['train_backend_speakers']} speakers of {Path(prot['train_data']).name} "
        f"({cfg['train_utts_per_speaker']} utterances each) anonymized with utterance-level pseudo-voices "
        "(paper 004).",
        f"- Cllr: llrs from the attacker's own affine calibration, fitted on same-gender utterance pairs of "
        f"{prot['train_calibration_speakers']} held-out training speakers (original audio for ignorant and "
        "lazy-informed, anonymized for semi-informed); min Cllr after PAV on the evaluation trials.",
        *_slicing_lines(result),
        "- Linkability: D<->sys with prior ratio 1, histogram estimate (paper 000 Eq. 3). Closed-set rank and "
        "top-k: trial vs. every enrolled speaker (paper 000 Sec. VI).",
        "- DeID / GVD: voice similarity matrices (paper 001 Eq. 2-5) over all utterances, cosine scores with an "
        "oracle affine calibration per matrix, pairs of a segment with itself (or its own anonymized version) "
        "left out.",
        f"- PER (phone error rate): {result['analyzers'].get('phones', '-')}; the learners' own "
        "mispronunciations count, so compare against `original`.",
        f"- WER: {result['analyzers']['asr']}; text normalised (case, punctuation, numbers written as one token per "
        "digit whether spelled or not). The corpus is non-native and partly children's speech, so compare against "
        "`original`, not in absolute terms. ASR loops: utterances whose transcript has more than 3 x the "
        "reference's words + 5 (the decoder repeating itself); the WER column counts them, the one beside "
        "leaves them out.",
        f"- rho_F0: Pearson correlation of original and anonymized F0 on frames voiced in both, mean over "
        f"utterances; tracker: {result['analyzers']['f0']}.",
        "- For `original`, lazy-informed equals ignorant (nothing to anonymize) and the semi-informed backend "
        "is trained on original training audio.",
        "",
        "## Run",
        "",
        f"Seed {cfg['seed']}, {cfg['jobs']} worker process(es). Wall time: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in tim.items())
        + f". Analysis: {result['analysis']['files_analyzed']} files analyzed, "
          f"{result['analysis']['cache_hits']} results from the cache.",
        "",
        "CPU seconds of this run (all processes): " + ", ".join(f"{k} {v:.0f}" for k, v in result["cpu_s"].items())
        + f"; total {sum(result['cpu_s'].values()):.0f} s, i.e. about "
          f"{sum(result['cpu_s'].values()) / max(1, cfg['jobs']) / 60:.1f} min of wall time on {cfg['jobs']} "
          f"otherwise idle cores. Machine: {result['machine']['cpus']} CPUs, load average at the end "
          f"{result['machine']['load_average_at_end']}.",
        "",
        "## Figures",
        "",
    ]
    lines += [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def _slicing_lines(result: dict) -> list[str]:
    sl = result["protocol"].get("slicing")
    if not sl:
        return []
    d = sl["slice_duration_s"]
    dur = f"{d['mean']:.2f} s on average (sd {d['std']:.2f}, {d['min']:.2f} to {d['max']:.2f} s)" if d["mean"] else "-"
    return [f"- Slicing (paper 004): the corpus released as slices of about delta = {sl['slice_seconds']:g} s cut "
            "between words (Algorithm 1: a slice grows word by word until the next word starts at least delta "
            "after the slice's start, silences kept, a shorter rest discarded), attacked by the semi-informed "
            "attacker with its enrolment and trial utterances sliced alike, as in the paper: every trial slice "
            "is one trial against each enrolled speaker, whose model is the mean over the slices of the "
            "speaker's enrolment utterances; the same PLDA backend (the paper's attacker is trained on whole "
            "utterances anonymized with a pseudo-voice each, which the semi-informed backend already is); Cllr "
            "calibrated on slice pairs of the held-out training speakers (pairs within one utterance left out). "
            f"Word timings: {result['analyzers'].get('words', 'Whisper')}; the anonymized audio is "
            "delay-compensated and as long as the original, so the same cut times apply. "
            f"{sl['dev_slices']} slices from the evaluation utterances ({sl['slices_per_utterance']:.2f} per "
            f"utterance, {sl['dev_utterances_without_slice']} utterances too short for one), {dur}. Compare "
            "with the semi-informed row: the difference is what slicing the release adds to privacy."]


def _plots(out: Path, result: dict, plots: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    files = []
    for name, p in plots.items():
        sim = p["similarity"]
        n = len(sim.speakers)
        full = np.block([[sim.m_oo, sim.m_op], [sim.m_op.T, sim.m_pp]])
        fig, ax = plt.subplots(figsize=(6.4, 5.6))
        im = ax.imshow(full, vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        ax.axhline(n - 0.5, color="w", lw=1.5)
        ax.axvline(n - 0.5, color="w", lw=1.5)
        ax.set_xticks([n / 2 - 0.5, 1.5 * n - 0.5], ["original", "pseudonymised"])
        ax.set_yticks([n / 2 - 0.5, 1.5 * n - 0.5], ["original", "pseudonymised"], rotation=90, va="center")
        ax.set_title(f"{name}: M_OO | M_OP / M_PO | M_PP\nDeID {100 * sim.deid:.1f} %, GVD {sim.gvd_db:.2f} dB")
        fig.colorbar(im, ax=ax, label="voice similarity S(i, j)")
        fig.tight_layout()
        f = f"similarity_{name}.png"
        _save_png(fig, out / f, dpi=110)
        plt.close(fig)
        files.append(f)

        present = [sc for sc in SCENARIO_TITLES if sc in p["attacks"]]
        fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.4))
        for ax, sc in zip(axes, present):
            a, title = p["attacks"][sc], SCENARIO_TITLES[sc]
            lo, hi = min(a.tar.min(), a.non.min()), max(a.tar.max(), a.non.max())
            bins = np.linspace(lo, hi, 40)
            ax.hist(a.non, bins=bins, density=True, alpha=0.6, label="different speaker")
            ax.hist(a.tar, bins=bins, density=True, alpha=0.6, label="same speaker")
            ax.set_title(f"{title}: EER {100 * a.metrics['eer']:.1f} %, D {a.metrics['linkability']:.2f}",
                         fontsize=9)
            ax.set_xlabel(f"{a.metrics['scorer']} score")
        axes[0].legend(fontsize=8)
        fig.suptitle(name)
        fig.tight_layout()
        f = f"scores_{name}.png"
        _save_png(fig, out / f, dpi=100)
        plt.close(fig)
        files.append(f)

    systems = list(result["systems"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    width = 0.8 / len(systems)
    present = scenarios_of(result["systems"][systems[0]])
    x = np.arange(len(present))
    for k, name in enumerate(systems):
        s = result["systems"][name]
        axes[0].bar(x + k * width, [100 * s[sc]["eer"] for sc in present], width, label=name)
        axes[1].bar(x + k * width, [s[sc]["linkability"] for sc in present], width, label=name)
    for ax, label in ((axes[0], "EER (%)"), (axes[1], "linkability")):
        ax.set_xticks(x + width * (len(systems) - 1) / 2, [SCENARIO_TITLES[sc] for sc in present], fontsize=8,
                      rotation=20, ha="right")
        ax.set_ylabel(label)
    axes[0].set_ylim(0, 50)
    axes[1].set_ylim(0, 1)
    axes[0].legend(fontsize=8)
    wer = [100 * (result["systems"][n]["wer"] or 0) for n in systems]
    rho = [result["systems"][n]["rho_f0"] or 0 for n in systems]
    axes[2].bar(np.arange(len(systems)) - 0.2, wer, 0.4, color="tab:gray", label="WER (%)")
    ax2 = axes[2].twinx()
    ax2.bar(np.arange(len(systems)) + 0.2, rho, 0.4, color="tab:green", label="rho_F0")
    axes[2].legend(handles=axes[2].patches[:1] + ax2.patches[:1], labels=["WER (%)", "rho_F0"], fontsize=8,
                   loc="upper left")
    axes[2].set_title("utility", fontsize=9)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("rho_F0")
    axes[2].set_ylabel("WER (%)")
    axes[2].set_xticks(np.arange(len(systems)), systems, fontsize=8)
    fig.tight_layout()
    _save_png(fig, out / "summary.png", dpi=100)
    plt.close(fig)
    files.append("summary.png")
    return files
