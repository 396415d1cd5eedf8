"""``rtanon lab TOOL ...``: the research tools behind the model cards, one module each in ``rtanon.train``.

Every tool keeps its own argument parser (``main(argv)``); this command only dispatches to it, so
``rtanon lab TOOL --help`` is the tool's own help. They need the ``[train]`` extra (``probe``,
``wer-paired`` and ``budget`` also ``[eval]``).
"""

from __future__ import annotations

import argparse
import importlib

#: Tool name -> (module in rtanon.train[:function, default main], one line of help), in the order
#: ``rtanon lab --help`` lists them.
TOOLS = {
    "export-content": ("export", "a content encoder checkpoint to the ONNX graph the run time loads"),
    "export-whisper": ("whisper:main_export", "Whisper's encoder in its streaming form, as loaded, to a content "
                                              "encoder graph"),
    "package-vocoder": ("export:main_package_vocoder", "a trained vocoder as the package ships it (float16 "
                                                      "generator.pt and its ONNX graph)"),
    "shards": ("travel", "vocoder shards packed to travel to a GPU machine (Opus audio, F0, speakers) and "
                         "unpacked there, z computed from the decoded audio"),
    "content-eval": ("content_eval", "the content encoder's held-out figures: teacher top-1, probe R2, "
                                     "speaker-ID"),
    "phone-eval": ("content_eval:main_phone_eval", "the causal phone reader's PER on evaluation sets, against "
                                                   "the transcripts' phones and hama's"),
    "wer-paired": ("wer_paired", "per-utterance WER of a system with a fresh voice per utterance, and paired "
                                 "bootstrap comparisons between systems"),
    "budget": ("budget", "the intelligibility budget: WER and PER stage by stage, from the synthesiser's ceiling "
                         "on measured envelopes to the shipped points, on several sets and ASRs"),
    "envelope-probe": ("envelope_probe", "the envelopes a causal regressor predicts from teacher, phone or "
                                         "student content, for the budget's probe rows"),
    "probe": ("probes", "where the neural voice loses intelligibility: the synthesiser's floor, what the "
                        "content carries, copy-synthesis WER"),
    "spectrogram-pair": ("spectrogram", "the model card's original/anonymized spectrogram pair (PNG)"),
    "bench-vocoder": ("bench_vocoder", "ONNX Runtime timing of vocoder configurations with random weights, "
                                       "for architecture choices"),
}


def register(sub) -> None:
    p = sub.add_parser("lab", help="research tools: export, probes, paired WER, architecture benchmarks",
                       description="Research tools behind the model cards (models/*/MODEL_CARD.md) and the "
                                   "lab notes (docs/lab-notes/). `rtanon lab TOOL --help` explains each.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="tools:\n" + "\n".join(f"  {name:18s}{line}" for name, (_, line) in TOOLS.items()))
    p.add_argument("tool", choices=list(TOOLS), metavar="TOOL", help="one of: " + ", ".join(TOOLS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the tool's own arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    module, _, entry = TOOLS[args.tool][0].partition(":")
    main = getattr(importlib.import_module(f"rtanon.train.{module}"), entry or "main")
    return int(main(args.args, prog=f"rtanon lab {args.tool}") or 0)
