"""``rtanon train vocoder --data DIR [DIR ...] --out DIR``: the neural method's vocoder."""

from __future__ import annotations

import json
from pathlib import Path

from rtanon.atomic import atomic_open


def register(sub) -> None:
    from rtanon.train.vocoder_config import TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "vocoder", help="the harmonic-plus-noise vocoder on content, F0 and speaker embeddings",
        description="Extracts features once into OUT/shards (the content encoder's projections z, the rtanon "
                    "F0 track, one speaker embedding per training speaker from the speaker pool or "
                    "resemblyzer), then trains the vocoder from OUT/generator.pt when it exists (resumable; "
                    "checkpoints every --checkpoint-every steps) and exports OUT/vocoder.onnx. The rest of the "
                    "recipe (batch 16 of 0.64 s segments, AdamW at 1e-3, embedding blending on 20 % of "
                    "items, MPD/MSD losses on CUDA only) is fixed: rtanon.train.vocoder_config.TrainConfig. To ship "
                    "the result, copy OUT/generator.pt and OUT/vocoder.onnx to src/rtanon/models/neural/ (the strong "
                    "point), or write them with `rtanon lab package-vocoder OUT/generator.pt "
                    "src/rtanon/models/neural/balanced --content GRAPH` (the balanced point). "
                    "Never train on the evaluation split (so762_dev): such directories are refused.",
        epilog="the shipped model's recipe: models/neural/MODEL_CARD.md. Example (a fine-tune of the shipped "
               "weights): rtanon train vocoder --data ../shared/data/so762_train ../shared/data/libri_clips "
               "--out runs/vocoder --init src/rtanon/models/neural/generator.pt --residual-start-step 0 "
               "--content-loss 30 --content-weights src/rtanon/models/content/content_encoder.pt --max-minutes 60")
    p.add_argument("--data", nargs="+", type=Path, metavar="DIR",
                   help="Kaldi-style training directories (e.g. so762_train libri_clips); not needed when --shards "
                        "holds shards already")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="run directory: shards/, generator.pt, trainer.pt, train.log, vocoder.onnx")
    p.add_argument("--shards", type=Path, metavar="DIR", help="use these feature shards (default: OUT/shards, "
                                                              "built when missing)")
    p.add_argument("--content-onnx", type=Path, metavar="FILE",
                   help="content encoder whose output the shards hold (default: the packaged one); the neural "
                        "method then needs the same graph: rtanon ... --method neural --content FILE")
    p.add_argument("--utterance-content", choices=("tiny.en",), metavar="WHISPER",
                   help="content from Whisper WHISPER's encoder over each whole utterance instead of a streaming "
                        "graph (tiny.en: the file and corpus path's candidate, which need no causality; issue 62)")
    p.add_argument("--init", type=Path, metavar="CKPT",
                   help="start from these generator weights (e.g. the shipped generator.pt) when OUT has none; "
                   "with shards of another content width (a new --content-onnx) its input convolution starts fresh")
    p.add_argument("--steps", type=int, default=d.steps, help=f"total steps of the run (default {d.steps})")
    p.add_argument("--max-minutes", type=float, help="stop this call after this many minutes, with a checkpoint")
    p.add_argument("--residual-start-step", type=int, default=d.residual_start_step,
                   help="train the synthesised speech alone (the upsampling stack not run, about half the cost of "
                        f"a step) until this step, then with the stack's residual (default {d.residual_start_step}; "
                        "0 when fine-tuning a trained model)")
    p.add_argument("--content-loss", type=float, default=d.content_loss_weight, metavar="W",
                   help="weight of a content-consistency loss: 1 - cosine between the content encoder's z of the "
                        f"output and of the target, per 20 ms frame (default {d.content_loss_weight:g} = off; the "
                        "shipped model's last stage used 30); needs --content-weights")
    p.add_argument("--content-weights", type=Path, metavar="PT",
                   help="torch weights of the content encoder that made the shards (src/rtanon/"
                        "models/content/content_encoder.pt for the packaged one; `rtanon lab export-content --weights`), for "
                        "--content-loss")
    p.add_argument("--no-gan", action="store_true",
                   help="train without the MPD/MSD adversarial losses on CUDA too (the CPU recipe's losses at a "
                        "GPU's speed; on a CPU they are off anyway)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help=f"steps between checkpoints (default {d.checkpoint_every})")
    p.add_argument("--accelerator", choices=("cpu", "cuda"), help="where torch trains (default: cuda when "
                                                                   "available)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice; 1 when anything "
                                               "else runs on the machine)")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import replace

    from rtanon.train.commands.train import check_installed

    check_installed("vocoder")
    import torch

    from rtanon.errors import CliError
    from rtanon.neural.backends import file_sha256
    from rtanon.neural.vocoder import VocoderConfig, load_generator
    from rtanon.train.export import export_vocoder_onnx
    from rtanon.train.shards import ShardDataset, build_shards, default_extractors
    from rtanon.train.vocoder import train_vocoder, warm_start
    from rtanon.train.vocoder_config import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.accelerator or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.content_onnx is not None and args.utterance_content is not None:
        raise CliError("--content-onnx and --utterance-content name two content encoders: pass one")
    shards = args.shards or args.out / "shards"
    if not (shards / "manifest.json").exists():
        if not args.data:
            raise CliError(f"{shards} holds no shards: pass --data DIR [DIR ...] to build them")
        try:
            content = None
            if args.utterance_content is not None:
                from rtanon.train.whisper import UtteranceContent

                content = UtteranceContent(args.utterance_content)
            extractors = default_extractors(content_onnx=args.content_onnx, content=content)
            build_shards(list(args.data), shards, extractors, units_dim=extractors.units_dim)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    try:
        data = ShardDataset(shards)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.content_onnx is not None and data.content_sha256 != file_sha256(args.content_onnx):
        raise CliError(f"{shards} was not made with --content-onnx {args.content_onnx}: pass another --shards/--out "
                       "for new shards from that encoder")
    tag = f"whisper-{args.utterance_content}-utterance:"
    if args.utterance_content is not None and not data.content_sha256.startswith(tag):
        raise CliError(f"{shards} was not made with --utterance-content {args.utterance_content}: pass another "
                       "--shards/--out for new shards from that encoder")
    args.out.mkdir(parents=True, exist_ok=True)
    vocoder = VocoderConfig(units_dim=data.units_dim, speaker_dim=int(data.embeddings.shape[1]),
                            content_sha256=data.content_sha256)
    if (args.out / "generator.pt").exists():  # resuming: the run's own config wins
        vocoder = load_generator(args.out / "generator.pt").config
        if vocoder.content_sha256 != data.content_sha256:
            raise CliError(f"{args.out / 'generator.pt'} was trained on another content encoder's output than "
                           f"{shards} holds: use a new --out")
    elif args.init:
        # the content it will be trained on from now is the shards', whatever --init was trained on (of
        # another width: a new content encoder, whose input convolution starts fresh)
        vocoder = replace(load_generator(args.init).config, units_dim=data.units_dim,
                          content_sha256=data.content_sha256)
        with atomic_open(args.out / "generator.pt") as f:
            torch.save(warm_start(args.init, vocoder), f)
    content_model = None
    if args.content_loss > 0:
        if args.content_weights is None or not args.content_weights.exists():
            raise CliError("--content-loss needs --content-weights: the torch weights of the content encoder "
                           "that made the shards (e.g. src/rtanon/models/content/content_encoder.pt)")
        from rtanon.train.content import load_checkpoint

        content_model = load_checkpoint(args.content_weights)
    config = replace(TrainConfig(), vocoder=vocoder, steps=args.steps, checkpoint_every=args.checkpoint_every,
                     seed=args.seed, residual_start_step=args.residual_start_step,
                     content_loss_weight=args.content_loss,
                     adversarial_start_step=args.steps if args.no_gan else None)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"{len(data)} utterances, {data.total_seconds / 3600:.2f} h, {data.embeddings.shape[0]} speakers; "
          f"training on {device}; log: {args.out / 'train.log'}", flush=True)
    last = train_vocoder(config, data, args.out, device=device, max_minutes=args.max_minutes,
                         on_log=lambda r: print(json.dumps(r), flush=True), content_model=content_model)
    onnx_path = export_vocoder_onnx(load_generator(args.out / "generator.pt"), args.out / "vocoder.onnx")
    print(f"stopped at step {last.get('step')}; weights {args.out / 'generator.pt'}, graph {onnx_path}")
    return 0
