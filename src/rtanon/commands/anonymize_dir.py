"""``rtanon anonymize-dir``: anonymize a Kaldi-style corpus directory for release, on Ray or in this process."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from rtanon.commands._common import add_context_arg, add_engine_args, add_seed_arg, config_from_args, identity_from_args
from rtanon.errors import Interrupted, install_hint

DESCRIPTION = """\
Writes OUT/<utt-id>.wav for every utterance of KALDI_DIR, plus wav.scp, utt2spk, spk2gender (and spk2age,
text when present), so OUT is a Kaldi-style directory too.

The neural method reads each utterance whole (--context utterance, the default here: Whisper tiny.en's
encoder and the vocoder trained on it), which loses fewer words and links less than the live path's causal
content (--context causal); figures: models/neural/MODEL_CARD_UTTERANCE.md.

Before the first output is written, every input is checked (utterance ids are plain file names, unique;
every file exists and has a decodable header) and OUT may be neither the input nor hold any of it. The
input corpus is only read.

Runs on Ray: by default a local Ray started in this process with one worker per core (--workers N), or an
existing cluster with --ray-address (inputs and outputs must then be on a path every node sees). Each
worker loads the models once and anonymizes batches of utterances; with the neural method on
--accelerator cuda|auto and GPUs in the cluster, each worker takes a GPU share for the vocoder.
Without Ray installed (it is the [corpus] extra: RTANON_EXTRAS=corpus ./setup.sh), the run goes on in this
process and says so in one line; --workers 0 runs in this process on purpose.

Resumable: every output is written atomically and recorded in OUT/manifest.json (utterance id, input
sha256, output and its sha256, pseudo-speaker id, method, model hashes). Run the same command again after
a crash or kill: it verifies and skips what is done, redoes what changed, and gives the remaining
utterances the same voices (kept in OUT/run.json). A failing utterance is reported by id and listed in
OUT/failed; the others go on.

Pseudo-speakers (Srivastava et al., "Privacy and utility of x-vector based speaker anonymization", 2022,
Sec. IV): --assignment speaker gives each original speaker one pseudo-voice
for all their utterances, utterance a new one per utterance. Voices come from the OS random source, so
two runs are unlinkable, unless --seed pins them. OUT/spk2pseudo (and utt2pseudo) map the original
speakers to pseudo-speaker ids: with run.json and manifest.json they are the key that links the release
back to the speakers. Keep them, and publish the rest; utt2spk keeps the original speaker labels (which
evaluation needs): relabel it before publishing.

Exit status: 0 when every utterance succeeded, 1 when some failed (listed), 2 on a usage error."""

EPILOG = """\
examples:
  rtanon anonymize-dir --data ../shared/data/so762_dev --out anon_dev
  rtanon anonymize-dir --data DIR --out OUT --method neural --workers 2 --assignment utterance
  ray start --head --port 6380 && rtanon anonymize-dir --data /shared/DIR --out /shared/OUT --ray-address 127.0.0.1:6380
  rtanon anonymize-dir --data ../shared/data/so762_dev --bench --workers 2      # throughput figures"""


def register(sub) -> None:
    p = sub.add_parser(
        "anonymize-dir", help="anonymize a Kaldi-style directory (wav.scp, utt2spk, spk2gender), on Ray if installed",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, metavar="KALDI_DIR", help="input directory")
    p.add_argument("--out", metavar="DIR", help="output directory (created; required unless --bench)")
    p.add_argument("--assignment", choices=("speaker", "utterance"), default="speaker",
                   help="one pseudo-voice per original speaker (default) or per utterance")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="Ray workers (default: one per core here, or every CPU of the --ray-address cluster); "
                        "0: no Ray, everything in this process (what happens anyway when Ray is not installed)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="use a running Ray cluster (HOST:PORT of `ray start --head`) instead of a local one")
    p.add_argument("--batch", type=int, default=4, metavar="N",
                   help="utterances per task (default: 4), run with the models the worker loaded once: the "
                        "neural method runs them side by side with their vocoder steps batched into one call "
                        "(a third less CPU than 1 on so762_dev), McAdams one after the other")
    p.add_argument("--bench", action="store_true",
                   help="print throughput figures instead of writing OUT: the same utterances in this process, "
                        "then on Ray with 1..N workers (N = --workers), real-time factor per worker and in total, "
                        "Ray's overhead against this process, and the machine's load")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="--bench: use the first N utterances only")
    p.add_argument("--repeat", type=int, default=2, metavar="N",
                   help="--bench: alternate N in-process and N 1-worker Ray runs, and N of each larger count "
                        "(default: 2); medians give the overhead")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_engine_args(p)
    add_context_arg(p, default="utterance")  # corpora need no causality: models/neural/MODEL_CARD_UTTERANCE.md
    add_seed_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from rtanon.errors import CliError
    from rtanon.io.kaldi import KaldiDir

    if args.workers is not None and args.workers < 0:
        raise CliError(f"--workers {args.workers}: use 0 (this process) or more")
    if args.batch < 1:
        raise CliError(f"--batch {args.batch}: use 1 or more")
    if args.workers == 0 and args.ray_address:
        raise CliError("--workers 0 runs in this process; it cannot use --ray-address")
    config = config_from_args(args)
    identity = identity_from_args(args)
    data = KaldiDir.load(args.data)
    if args.bench:
        from rtanon.corpus.bench import bench

        bench(data, config, workers=args.workers or os.cpu_count() or 1, address=args.ray_address,
              limit=args.limit, batch=args.batch, seed=args.seed, repeat=args.repeat)
        return 0
    if not args.out:
        raise CliError("--out DIR is required (unless --bench)")
    return anonymize(data, args.out, config, identity, args)


def anonymize(data, out, config, identity, args) -> int:
    from pathlib import Path

    from rtanon.corpus.run import CorpusPlan, InProcessExecutor, run_corpus
    from rtanon.corpus.on_ray import RAY_PIN, ray_abandoned, ray_installed, stopped_line
    from rtanon.paths import printable

    plan = CorpusPlan(data, Path(out), config, assignment=args.assignment, seed=args.seed, identity=identity,
                      batch=args.batch, progress=args.progress)
    in_process = args.workers == 0
    if not in_process and not args.ray_address and not ray_installed():  # a cluster needs Ray: that errs below
        asked = f"--workers {args.workers}" if args.workers else "one worker per core"
        print(f"rtanon anonymize-dir: Ray is not installed, so this runs in this process ({asked} needs "
              f"{install_hint('corpus')}, {RAY_PIN})", file=sys.stderr)
        in_process = True
    try:
        if in_process:
            result = run_corpus(plan, lambda: InProcessExecutor(config, identity))
            where = "in this process"
        else:
            from rtanon.corpus.on_ray import RayExecutor, start_ray, stop_ray

            start_ray(args.ray_address, args.workers)
            try:
                executors = []

                def factory():
                    executors.append(RayExecutor(config, identity, args.workers))
                    return executors[-1]

                result = run_corpus(plan, factory)
                where = f"on {executors[0].workers} Ray workers" if executors else "on Ray"
            finally:
                stop_ray()
    except (Interrupted, KeyboardInterrupt) as exc:  # every output so far is complete and in the manifest
        signum = getattr(exc, "signum", signal.SIGINT)
        after_ctrl_c = "\n" if signum == signal.SIGINT else ""  # the terminal's ^C ends no line
        print(after_ctrl_c + stopped_line(signum), file=sys.stderr)
        if not in_process and ray_abandoned():  # every file is written and closed: nothing else to run at exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)
        return 128 + signum
    speed = f", {result.audio_s / result.process_s:.1f}x real time" if result.process_s else ""
    print(f"{result.out}: {result.done} utterances anonymized {where} ({result.audio_s / 3600:.3f} h of audio"
          f"{speed}), {result.skipped} already done, {len(result.failed)} failed")
    if result.failed:
        print(f"failed utterances (also in {result.out / 'failed'}; rerun the same command to retry them):",
              file=sys.stderr)
        for utt, err in sorted(result.failed.items()):
            print(f"  {utt}: {printable(err, 500)}", file=sys.stderr)
        return 1
    return 0
