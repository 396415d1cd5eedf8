"""Arguments shared by the commands that run the engine."""

from __future__ import annotations

import argparse
from dataclasses import replace

from rtanon.config import (ALLOWED_CHUNK_MS, CONTEXTS, METHOD_NAMES, PRIVACY_POINTS, AnonymizerConfig, NeuralConfig,
                           StreamConfig)


class _StoreGiven(argparse.Action):
    """Stores the value and notes that it was given (``<dest>_given``), so a default can be told apart from
    the same value typed."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_engine_args(p: argparse.ArgumentParser, chunk: bool = True) -> None:
    """The engine's options; ``chunk=False`` for a command whose chunk is fixed (the default one)."""
    default = AnonymizerConfig()
    p.add_argument("--method", default=default.method, choices=METHOD_NAMES,
                   help=f"anonymization method (default: {default.method})")
    if chunk:
        p.add_argument("--chunk-ms", type=int, default=default.stream.chunk_ms, choices=ALLOWED_CHUNK_MS,
                       help=f"processing chunk in ms; also the buffering delay (default: {default.stream.chunk_ms})")
    else:
        p.set_defaults(chunk_ms=default.stream.chunk_ms)
    n = default.neural
    p.add_argument("--privacy", default=n.privacy, choices=PRIVACY_POINTS, action=_StoreGiven,
                   help=f"neural method: which shipped content encoder and vocoder (default: {n.privacy}). "
                        "balanced: a streaming Whisper tiny.en encoder, fewer lost words; strong: the small "
                        "content encoder version 4: a third of the content compute, more lost words. Figures "
                        "of both: models/neural/MODEL_CARD.md (ignored with --vocoder, which runs with the "
                        "shipped content encoder it records, or with --content)")
    p.add_argument("--backend", default=n.backend, choices=("onnxruntime", "torch", "tensorrt"),
                   help=f"neural method: what runs the vocoder (default: {n.backend}; torch needs the [train] "
                        "extra, tensorrt an NVIDIA GPU with TensorRT)")
    p.add_argument("--accelerator", default=n.device, choices=("cpu", "cuda", "auto"),
                   help=f"neural method, --backend torch: where the vocoder runs (default: {n.device}; audio "
                        "devices are --input/--output); on cuda the content encoder runs there too, from the torch "
                        "weights beside its graph")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="neural method, --backend torch on CUDA: run the vocoder and content steps eagerly instead "
                        "of replaying them as captured CUDA graphs (slower; for measuring what the graphs save)")
    p.add_argument("--vocoder", metavar="FILE", default=None,
                   help="neural method: other vocoder weights than the shipped ones, as `rtanon train vocoder` "
                        "writes them: OUT/vocoder.onnx (onnxruntime, tensorrt) or OUT/generator.pt (torch)")
    p.add_argument("--content", metavar="FILE", default=None,
                   help="neural method: another content encoder than the shipped one (the .onnx that `rtanon lab "
                        "export-content` writes, or a whole-utterance one, `rtanon lab export-whisper --utterance`: "
                        "files and corpora only); the vocoder must have been trained on its output "
                        "(`rtanon train vocoder --content-onnx FILE`, or `--utterance-content`)")


def add_context_arg(p: argparse.ArgumentParser, default: str = NeuralConfig.context) -> None:
    """``--context``, for the commands that read whole files (file, anonymize-dir, eval)."""
    p.add_argument("--context", default=default, choices=CONTEXTS,
                   help=f"neural method: what the content encoder reads (default: {default}). causal: the live "
                        "path's, 20 ms ahead of each frame, so a file sounds as `rtanon live` would play it; "
                        "utterance: Whisper tiny.en's encoder over each whole utterance with the vocoder trained on "
                        "it (files and corpora only): fewer lost words, at least the strong point's privacy; "
                        "--privacy does not apply. Figures: models/neural/MODEL_CARD_UTTERANCE.md")


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=None,
                   help="pin the pseudo-voice (reproducible runs); by default every run draws a fresh, "
                        "unlinkable voice from the OS random source")
    p.add_argument("--identity", metavar="FILE", default=None,
                   help="pin a pseudo-speaker made by `rtanon identity new` (on purpose: the same file gives "
                        "the same voice every time, so sessions using it can be linked)")


def identity_from_args(args: argparse.Namespace):
    """The PseudoSpeaker named by --identity, or None."""
    if getattr(args, "identity", None) is None:
        return None
    from rtanon.errors import CliError
    from rtanon.identity.speaker import IdentityError, PseudoSpeaker

    try:
        return PseudoSpeaker.load(args.identity)
    except (IdentityError, OSError) as exc:
        raise CliError(f"--identity {args.identity}: {exc}") from None


def config_from_args(args: argparse.Namespace) -> AnonymizerConfig:
    """The AnonymizerConfig of the engine options; a ``--privacy`` the chosen ``--context`` has no use for is
    refused (CliError) rather than silently ignored."""
    context = getattr(args, "context", NeuralConfig.context)
    privacy = getattr(args, "privacy", NeuralConfig.privacy)
    if getattr(args, "privacy_given", False) and context == "utterance" and args.method == "neural":
        from rtanon.errors import CliError
        raise CliError(f"--privacy {privacy} chooses among the live path's vocoders; --context utterance has one "
                       "vocoder of its own (at least the strong point's privacy): drop --privacy, or add "
                       "--context causal for the live path's points")
    backend = getattr(args, "backend", NeuralConfig.backend)
    vocoder = getattr(args, "vocoder", None)
    weights = {}
    if vocoder:
        weights = {"vocoder_checkpoint": vocoder} if backend == "torch" else {"vocoder_onnx": vocoder}
    neural = replace(NeuralConfig(), backend=backend, device=getattr(args, "accelerator", NeuralConfig.device),
                     cuda_graphs=getattr(args, "cuda_graphs", NeuralConfig.cuda_graphs),
                     content_onnx=getattr(args, "content", None),
                     privacy=privacy, context=context, **weights)
    return replace(AnonymizerConfig(), method=args.method, stream=StreamConfig(chunk_ms=args.chunk_ms),
                   neural=neural)


#: Loading that takes longer than this is announced on stderr.
LOADING_NOTICE_S = 1.0


def anonymizer_from_args(args: argparse.Namespace):
    """The Anonymizer the options ask for; while the neural voice loads for more than LOADING_NOTICE_S (it
    takes seconds), one line on stderr says so. Check the outputs before calling this."""
    import sys
    import threading

    from rtanon.engine import Anonymizer

    if args.method != "neural":  # McAdams loads in a moment
        return Anonymizer(config_from_args(args))
    notice = threading.Timer(LOADING_NOTICE_S, lambda: print("loading the neural voice...", file=sys.stderr,
                                                             flush=True))
    notice.daemon = True
    notice.start()
    try:
        return Anonymizer(config_from_args(args))
    finally:
        notice.cancel()


def import_sounddevice():
    """python-sounddevice, or a CliError saying how to install PortAudio."""
    from rtanon.errors import CliError

    try:
        import sounddevice
    except OSError as exc:
        raise CliError(f"PortAudio is missing ({exc}); install it (Debian/Ubuntu: sudo apt-get install libportaudio2; "
                       "Fedora: sudo dnf install portaudio; Arch: sudo pacman -S portaudio); `rtanon file` and "
                       "`rtanon demo` run without it") from None
    return sounddevice


def invoked_as() -> str:
    """How the user ran rtanon, for the commands a hint tells them to run next: ``sys.argv[0]`` when it
    is a path to the ``rtanon`` script (``.venv/bin/rtanon``: not on PATH), else ``rtanon``."""
    import os
    import shlex
    import sys

    argv0 = sys.argv[0] if sys.argv else ""
    if os.sep in argv0 and os.path.basename(argv0) == "rtanon":
        return shlex.quote(argv0)
    return "rtanon"
