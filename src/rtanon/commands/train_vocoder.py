"""``rtanon train vocoder --data DIR [DIR ...] --out DIR``: the causal HiFi-GAN vocoder of the neural method
(envelope harmonic-plus-noise source by default, NSF sine source on request)."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    from rtanon.neural.train import CONVERTED_PASSES, TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "vocoder", help="causal HiFi-GAN vocoder (harmonic-plus-noise source) on content units, F0 and "
                        "speaker embeddings",
        description="Extracts features once into OUT/shards (the shipped content encoder's soft units, the "
                    "rtanon F0 track, one speaker embedding per training speaker from the speaker pool or "
                    "resemblyzer), then trains the vocoder from OUT/generator.pt when it exists (resumable; "
                    "checkpoints every --checkpoint-every steps) and exports OUT/vocoder.onnx. To ship the "
                    "result, copy OUT/generator.pt and OUT/vocoder.onnx to src/rtanon/models/neural/. "
                    "Never train on the evaluation split (so762_dev): such directories are refused.",
        epilog="example: rtanon train vocoder --data ../shared/data/so762_train ../shared/data/libri_clips "
               "--out runs/vocoder --init src/rtanon/models/neural/generator.pt --max-minutes 60")
    p.add_argument("--data", nargs="+", required=True, type=Path, metavar="DIR",
                   help="Kaldi-style training directories (e.g. so762_train libri_clips)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="run directory: shards/, generator.pt, trainer.pt, train.log, vocoder.onnx")
    p.add_argument("--shards", type=Path, metavar="DIR", help="use these feature shards (default: OUT/shards, "
                                                              "built when missing)")
    p.add_argument("--content-onnx", type=Path, metavar="FILE",
                   help="content encoder whose output the shards hold (default: the packaged one); the neural "
                        "method then needs the same graph: rtanon ... --method neural --content FILE")
    p.add_argument("--init", type=Path, metavar="CKPT",
                   help="start from these generator weights (e.g. the shipped generator.pt) when OUT has none")
    p.add_argument("--steps", type=int, default=d.steps, help=f"total steps of the run (default {d.steps})")
    p.add_argument("--max-minutes", type=float, help="stop this call after this many minutes, with a checkpoint")
    p.add_argument("--batch-size", type=int, default=16, help="segments per step (default 16)")
    p.add_argument("--segment-frames", type=int, default=32, help="frames of 20 ms per segment (default 32)")
    p.add_argument("--adversarial-start-step", type=int, default=None,
                   help="step at which the MPD/MSD adversarial and feature-matching losses join (default: "
                        "never on CPU, where they cost ~10x per step; 0 on CUDA)")
    p.add_argument("--discriminator-width", type=float, default=1.0, metavar="F",
                   help="MPD/MSD channel widths as a fraction of HiFi-GAN's (default 1.0; 0.125 makes the "
                        "adversarial losses affordable on a CPU: one forward and backward pass of both at batch 16 "
                        "then takes about 0.55 s on one thread, and a step runs them about three times)")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--units-temperature", type=float, default=0.05,
                   help="Eq. 1 temperature of the soft units (default 0.05; the neural method feeds the same)")
    p.add_argument("--blend-prob", type=float, default=0.2,
                   help="probability of blending a segment's speaker embedding with another's (default 0.2)")
    p.add_argument("--source", choices=("envelope", "nsf"), default="envelope",
                   help="excitation: 'envelope' (default) = harmonic-plus-noise synthesis from spectral envelopes "
                        "the 50 Hz pre-net predicts, plus the upsampling stack's learnt residual; 'nsf' = the "
                        "fixed NSF sine source of the first CPU run, with a training-only mel head")
    p.add_argument("--units", choices=("z", "probs"), default="z",
                   help="content the vocoder is conditioned on: the encoder's 256-dim unit-space projections "
                        "('z', default: what the shipped vocoder uses) or its soft units ('probs', sharpened to "
                        "--units-temperature: less of the speaker, and less of the speech)")
    p.add_argument("--prenet-dilations", default=None, metavar="D,D,...",
                   help="dilations of the residual causal convolutions of the 50 Hz pre-net (default 1,2,4,8,1,1 "
                        "for the envelope source, 1,2,4,1 for nsf; 'none' for the nsf model without one)")
    p.add_argument("--input-mel", type=int, default=0, metavar="BANDS",
                   help="also condition on the input's own spectral shape: its log-mel in BANDS bands per 20 ms "
                        "frame (e.g. 40), of which the vocoder keeps --input-cepstra DCT coefficients; training "
                        "reads it through a random vocal-tract-length warp and tilt so the voice still comes from "
                        "the speaker embedding (rtanon.neural.input_mel; default 0 = content from the encoder alone)")
    p.add_argument("--input-cepstra", type=int, default=16, metavar="C",
                   help="cepstral coefficients 1..C of the input log-mel the vocoder keeps (default 16)")
    p.add_argument("--residual-start-step", type=int, default=d.residual_start_step,
                   help="envelope source: train the synthesised speech alone (the upsampling stack not run, about "
                        "half the cost of a step) until this step, then with the stack's residual "
                        f"(default {d.residual_start_step})")
    p.add_argument("--units-noise", type=float, default=d.units_noise, metavar="F",
                   help="content-noise augmentation: Gaussian noise on each segment's content frames with a norm "
                        "of up to F times theirs (drawn per segment; default 0 = off), meant to teach the vocoder "
                        "the less exact content the encoder gives for voices it was not trained on (0.5 and 1.0 "
                        "did not change so762_dev WER measurably: models/neural/README.md)")
    p.add_argument("--content-loss", type=float, default=d.content_loss_weight, metavar="W",
                   help="weight of a content-consistency loss: 1 - cosine between the content encoder's z of the "
                        "output and of the target, per 20 ms frame (default 0 = off); needs --content-weights")
    p.add_argument("--content-loss-layers", action="store_true",
                   help="the content losses also compare the content encoder's hidden (residual) layers, not only "
                        "its z: a deep-feature loss that keeps more of the acoustic detail")
    p.add_argument("--converted-content-loss", type=float, default=d.converted_content_weight, metavar="W",
                   help="weight of the same content loss on half of each batch rendered again in a fresh "
                        "pseudo-speaker's voice (drawn as the neural method draws one, F0 moved to its median): "
                        "training otherwise hears only each speaker's own voice (default 0 = off; costs about "
                        "half a step more); needs --content-weights")
    p.add_argument("--speaker-loss", type=float, default=d.speaker_loss_weight, metavar="W",
                   help="weight of a speaker loss on the same converted half-batch: cosine to the source's voice "
                        "minus cosine to the pseudo-speaker's, in resemblyzer's (frozen) speaker space, so the "
                        "voice comes from the pseudo-speaker and not through a content input such as --input-mel "
                        "(default 0 = off; rtanon.neural.speaker_loss)")
    p.add_argument("--converted-pass", choices=CONVERTED_PASSES, default=d.converted_pass,
                   help="what the converted half-batch's losses hear: the vocoder's output, or the envelope "
                        "synthesiser's speech alone, so that they train the envelopes and not a waveform "
                        f"residual against the speaker model (default {d.converted_pass})")
    p.add_argument("--content-weights", type=Path, metavar="PT",
                   help="torch weights of the content encoder that made the shards (e.g. "
                        "models/content/content_encoder.pt for the packaged one), for --content-loss")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints (default 200)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    p.set_defaults(func=run)


def scaled_discriminators(width: float):
    """HiFi-GAN's MPD/MSD with every channel count scaled by ``width``, rounded to a multiple of 16 (the
    MSD's grouped convolutions have up to 16 groups)."""
    from rtanon.neural.config import DiscriminatorConfig

    d = DiscriminatorConfig()

    def scale(channels):
        return tuple(max(16, 16 * round(c * width / 16)) for c in channels)

    return DiscriminatorConfig(periods=d.periods, mpd_channels=scale(d.mpd_channels),
                               msd_channels=scale(d.msd_channels), msd_scales=d.msd_scales)


def run(args) -> int:
    from dataclasses import replace

    import torch

    from rtanon.errors import CliError
    from rtanon.neural.backends import file_sha256
    from rtanon.neural.features import build_shards, default_extractors
    from rtanon.neural.train import (BlendWithOtherSpeaker, PseudoSpeakerTargets, ShardDataset, TrainConfig,
                                     load_generator, train_vocoder, warm_start)
    from rtanon.neural.vocoder import VocoderConfig, export_onnx

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shards = args.shards or args.out / "shards"
    if not (shards / "manifest.json").exists():
        try:
            extractors = default_extractors(units_kind=args.units, content_onnx=args.content_onnx)
            build_shards(list(args.data), shards, extractors, units_dim=extractors.units_dim, units_kind=args.units)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    data = ShardDataset(shards, units_temperature=args.units_temperature)
    if args.content_onnx is not None and data.content_sha256 != file_sha256(args.content_onnx):
        raise CliError(f"{shards} was not made with --content-onnx {args.content_onnx}: pass another --shards/--out "
                       "for new shards from that encoder")
    if data.units_kind != args.units:
        raise CliError(f"{shards} holds content {data.units_kind!r}, not {args.units!r}: pass --units "
                       f"{data.units_kind}, or another --shards/--out for new shards")
    args.out.mkdir(parents=True, exist_ok=True)
    envelope = args.source == "envelope"
    spec = args.prenet_dilations or ("1,2,4,8,1,1" if envelope else "1,2,4,1")
    try:
        dilations = () if spec.strip().lower() in ("", "none", "0") else tuple(int(d) for d in spec.split(","))
    except ValueError:
        raise CliError(f"--prenet-dilations {spec!r}: give integers like 1,2,4,1, or none") from None
    if envelope and not dilations:
        raise CliError("--source envelope predicts its envelopes with the pre-net: give --prenet-dilations")
    arch = {"prenet_dilations": dilations, "source_type": args.source,
            "aux_mel_bins": 80 if dilations and not envelope else 0,
            "input_mel_bins": args.input_mel, "input_cepstra": args.input_cepstra}
    vocoder = VocoderConfig(units_dim=data.units_dim, speaker_dim=int(data.embeddings.shape[1]),
                            units_temperature=data.units_temperature, units_kind=data.units_kind,
                            content_sha256=data.content_sha256, **arch)
    if (args.out / "generator.pt").exists():  # resuming: the run's own config wins
        vocoder = load_generator(args.out / "generator.pt").config
        if vocoder.content_sha256 != data.content_sha256:
            raise CliError(f"{args.out / 'generator.pt'} was trained on another content encoder's output than "
                           f"{shards} holds: use a new --out")
    elif args.init:
        init_config = load_generator(args.init).config
        if init_config.source_type != args.source:
            raise CliError(f"--init {args.init} has the {init_config.source_type!r} source; pass --source "
                           f"{init_config.source_type} to continue it, or leave --init out to train a new model")
        # the content it will be trained on from now is the shards', whatever --init was trained on
        vocoder = replace(init_config, content_sha256=data.content_sha256, **arch)
        if vocoder.units_temperature != data.units_temperature:
            raise CliError(f"--init {args.init} was trained on units at temperature {vocoder.units_temperature}; "
                           f"pass --units-temperature {vocoder.units_temperature}")
        try:
            torch.save(warm_start(args.init, vocoder), args.out / "generator.pt")
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if not 0.0 < args.discriminator_width <= 1.0:
        raise CliError(f"--discriminator-width {args.discriminator_width}; use a fraction in (0, 1]")
    content_model = None
    if args.content_loss > 0 or args.converted_content_loss > 0:
        if args.content_weights is None or not args.content_weights.exists():
            raise CliError("--content-loss and --converted-content-loss need --content-weights: the torch weights "
                           "of the content encoder that made the shards (e.g. models/content/content_encoder.pt)")
        from rtanon.content.train import load_checkpoint

        content_model = load_checkpoint(args.content_weights)
    targets = speaker_model = None
    if args.speaker_loss > 0:
        from rtanon.neural.speaker_loss import load_speaker_embedder

        try:
            speaker_model = load_speaker_embedder()
        except ImportError as exc:
            raise CliError(str(exc)) from None
    if args.converted_content_loss > 0 or args.speaker_loss > 0:
        from rtanon.identity.speaker import IdentityModel

        targets = PseudoSpeakerTargets(IdentityModel())
    adv = args.adversarial_start_step
    if adv is None:
        adv = 0 if device.startswith("cuda") else 10**9
    config = replace(TrainConfig(), vocoder=vocoder, discriminators=scaled_discriminators(args.discriminator_width),
                     steps=args.steps, batch_size=args.batch_size,
                     segment_frames=args.segment_frames, adversarial_start_step=adv,
                     learning_rate=args.learning_rate, checkpoint_every=args.checkpoint_every, seed=args.seed,
                     residual_start_step=args.residual_start_step, units_noise=args.units_noise,
                     content_loss_weight=args.content_loss, converted_content_weight=args.converted_content_loss,
                     content_loss_layers=args.content_loss_layers, speaker_loss_weight=args.speaker_loss,
                     converted_pass=args.converted_pass)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"{len(data)} utterances, {data.total_seconds / 3600:.2f} h, {data.embeddings.shape[0]} speakers; "
          f"training on {device}; log: {args.out / 'train.log'}", flush=True)
    augment = BlendWithOtherSpeaker(prob=args.blend_prob) if args.blend_prob > 0 else None
    last = train_vocoder(config, data, args.out, device=device, speaker_augment=augment,
                         max_minutes=args.max_minutes, on_log=lambda r: print(json.dumps(r), flush=True),
                         content_model=content_model, conversion_targets=targets, speaker_model=speaker_model)
    onnx_path = export_onnx(load_generator(args.out / "generator.pt"), args.out / "vocoder.onnx")
    print(f"stopped at step {last.get('step')}; weights {args.out / 'generator.pt'}, graph {onnx_path}")
    return 0
