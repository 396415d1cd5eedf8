"""``rtanon bench``: latency and compute figures of a method or one stage."""

from __future__ import annotations

from rtanon.commands._common import add_engine_args
from rtanon.errors import install_hint


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure algorithmic latency, per-chunk compute (p50/p99) and real-time factor",
        description="Runs a session over speech (the embedded sample, looped, or --input) and prints, per "
                    "stage and in total: latency, compute per chunk (p50, p99) and real-time factor "
                    "(compute time / audio time; < 1 is faster than real time). --stage times one stage "
                    "alone; --e2e measures microphone-to-virtual-microphone latency through a private "
                    "PulseAudio daemon (or PipeWire: --server pipewire). With --json stdout is one line of JSON "
                    "(the table goes to stderr): rtanon bench --json > figures.json")
    add_engine_args(p)
    from rtanon.bench import BENCH_STAGES
    from rtanon.live.bench import E2E_WINDOW_S

    p.add_argument("--stage", default=None, metavar="NAME",
                   help=f"time one stage alone: {', '.join(BENCH_STAGES)}")
    p.add_argument("--seconds", type=float, default=30.0, help="audio to process (default: 30)")
    p.add_argument("--input", default=None, metavar="WAV", help="speech to use instead of the embedded sample")
    p.add_argument("--e2e", action="store_true", help="also measure end-to-end latency through PulseAudio")
    p.add_argument("--e2e-seconds", type=float, default=20.0, metavar="S",
                   help="--e2e: seconds of looped speech to measure over (default: 20; the delay is measured per "
                        f"{E2E_WINDOW_S:.0f} s window, so longer runs give a truer p99)")
    p.add_argument("--server", choices=("pulseaudio", "pipewire"), default="pulseaudio",
                   help="--e2e: the private sound server to measure through (pipewire: pipewire, wireplumber "
                        "and pipewire-pulse; default: pulseaudio)")
    p.add_argument("--streams", type=int, default=0, metavar="N",
                   help="neural method: also time the vocoder on batches of 1, 2, 4, ... up to N concurrent "
                        "sessions, bisect between the last real-time doubling and the first that is not, and "
                        "report the largest batch whose p99 step stays under 20 ms (on a GPU: streams one GPU "
                        "sustains)")
    p.add_argument("--live-seconds", type=float, default=10.0, metavar="S",
                   help="also run a simulated live loop (rtanon live's ring buffers and worker, 10 ms callbacks "
                        "at real-time pace) for S seconds and count missed deadlines at this chunk size "
                        "(default: 10; 0 skips it)")
    p.add_argument("--serve", action="store_true",
                   help="measure `rtanon serve` instead: a fresh server on loopback per trial, --sessions "
                        "clients streaming speech in real time for --serve-seconds; prints per-tick compute "
                        "p50/p99, missed deadlines per session, round trips (needs the [serve] extra)")
    p.add_argument("--sessions", type=int, default=8, metavar="N",
                   help="with --serve: concurrent sessions (default: 8); with --ramp the largest tried")
    p.add_argument("--ramp", action="store_true",
                   help="with --serve: find the largest N held with no missed deadline (doubling from 1, then "
                        "bisecting; each trial --serve-seconds long)")
    p.add_argument("--churn", action="store_true",
                   help="with --serve: a reliability run instead: sessions (at most --sessions at once) open, "
                        "stream 2-20 s of speech and close (a third without a bye) at random for --serve-seconds; "
                        "checks the server's memory and descriptors and that no output repeats its own or "
                        "another session's input")
    p.add_argument("--hostile", action="store_true",
                   help="with --churn: bad clients beside the sessions (idle and header-trickling sockets, a stats "
                        "flood, an unloaded method, another site's Host); it passes only if each was refused")
    p.add_argument("--no-network", action="store_true",
                   help="with --serve: measure the server's tick alone, in this process: --sessions sessions of "
                        "speech stepped together as the scheduler steps them (content, F0 and vocoder batched), "
                        "no sockets, no load generator; a trial holds while its tick p99 stays within "
                        "--tick-budget-ms (with --backend torch --accelerator cuda: the GPU's figure)")
    p.add_argument("--tick-budget-ms", type=float, default=15.0, metavar="MS",
                   help="with --serve --no-network: the tick p99 a trial must keep (default: 15)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="with --serve: the server's worker threads for its batched calls (default: rtanon "
                        "serve's, the cores this process may use, at most 8)")
    p.add_argument("--serve-seconds", type=float, default=60.0, metavar="S",
                   help="with --serve: length of each trial (default: 60)")
    p.add_argument("--json", action="store_true",
                   help="print the figures as one line of JSON on stdout (the table goes to stderr)")
    p.set_defaults(func=run)


def run_serve(args) -> int:
    from rtanon import bench
    from rtanon.errors import CliError

    try:
        from rtanon.serve.bench import engine_args_of, run_trial
        from rtanon.serve.scheduler import default_workers
    except ImportError:
        raise CliError(f"rtanon bench --serve needs the [serve] extra: {install_hint('serve')}") from None
    if args.sessions < 1:
        raise CliError(f"--sessions {args.sessions}: use 1 or more")
    if args.serve_seconds < 2:
        raise CliError(f"--serve-seconds {args.serve_seconds}: use 2 or more")
    if args.workers is not None and not 1 <= args.workers <= 256:
        raise CliError(f"--workers {args.workers}: use 1 to 256")
    speech = [bench.speech_signal(max(args.seconds, 10.0), args.input)]
    if args.no_network:
        if args.churn:
            raise CliError("--churn measures the server with its connections: leave out --no-network")
        return run_ticks(args, speech[0])
    engine = engine_args_of(args) + ([] if args.workers is None else ["--workers", str(args.workers)])
    start = {"method": args.method, "privacy": args.privacy}
    if args.hostile and not args.churn:
        raise CliError("--hostile goes with --churn: the bad clients run beside its sessions")
    if args.churn:
        from rtanon.serve.bench import run_churn

        print(f"rtanon serve, method {args.method}: sessions opening and closing at random for "
              f"{args.serve_seconds:.0f} s, at most {args.sessions} at once")
        sources = [speech[0], speech[0][::-1].copy()]  # the speech and its time reversal: two different signals
        r = run_churn(engine, start, args.sessions, args.serve_seconds, sources, lambda t: print(t, flush=True),
                      hostile=args.hostile)
        print(f"churn: {r['sessions']} sessions in {r['seconds']:.0f} s (at most {r['concurrent']} at once, "
              f"{r['dropped_without_bye']} dropped without a bye), {r['sessions_failed']} failed, "
              f"{r['frames_unanswered']} of {r['frames_sent']} frames unanswered, {r['missed_deadlines']} missed "
              f"deadlines; server memory {r['rss_mb_after_1min']:.0f} MB after a minute, {r['rss_mb_end']:.0f} MB at "
              f"the end; descriptors {r['fds_start']} before, {r['fds_end']} after; output vs own input "
              f"{r['max_own_xcorr']:.3f}, vs another session's input {r['max_cross_xcorr']:.3f} (a copy: 1); "
              f"{r['server_tracebacks']} tracebacks: {'PASS' if r['held'] else 'FAIL'}")
        if "attacks" in r:
            print("beside them: " + ", ".join(f"{k} {a['refused']} of {a['tried']} refused"
                                              for k, a in r["attacks"].items())
                  + f"; the server logged {r['server_log_lines']} lines")
        if args.json:
            _print_json(args, r)
        return 0 if r["held"] else 1
    print(f"rtanon serve, method {args.method}" + (f" ({args.privacy})" if args.method == "neural" else "")
          + f", {args.serve_seconds:.0f} s per trial; the load generator shares this machine")
    print(f"{'sessions':>8}{'tick p50 ms':>12}{'tick p99 ms':>12}{'>20 ms':>8}{'per session':>12}"
          f"{'missed':>8}{'max/sess':>9}{'lost':>6}{'rt p50':>8}{'rt p99':>8}  held")

    def say(r: dict) -> None:
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{r['sessions']:>8}{fmt(r['tick_compute_p50_ms'], '.2f'):>12}{fmt(r['tick_compute_p99_ms'], '.2f'):>12}"
              f"{fmt(r['ticks_over_20ms'], 'd'):>8}{fmt(r['per_session_ms'], '.3f'):>12}{r['missed_total']:>8}"
              f"{r['missed_max_per_session']:>9}{r['frames_lost']:>6}{fmt(r['round_trip_p50_ms'], '.1f'):>8}"
              f"{fmt(r['round_trip_p99_ms'], '.1f'):>8}  {'yes' if r['held'] else 'NO'}"
              + (f"  ({r['sessions_failed']} sessions failed: {r['errors'][0]})" if r["errors"] else ""), flush=True)

    def trial(n: int, seconds: float = args.serve_seconds) -> dict:
        return run_trial(engine, start, n, seconds, speech)

    alone = trial(1, min(args.serve_seconds, 10.0))
    say(alone)
    # the server is this process's child: its default worker count is this machine's
    result: dict = {"method": args.method, "privacy": args.privacy,
                    "workers": args.workers or default_workers(), "alone": alone}
    _trials(args, trial, say, result, f"held for {args.serve_seconds:.0f} s with no missed deadline")
    _cost_ratio(result, [t for t in result["trials"] if t["held"]] or result["trials"])
    if args.json:
        _print_json(args, result)
    return 0


def _cost_ratio(result: dict, trials: list[dict]) -> None:
    """The largest of ``trials``' per-session compute against the session alone, into ``result`` and printed."""
    top, alone = max(trials, key=lambda t: t["sessions"]), result["alone"]
    if alone["per_session_ms"] and top["per_session_ms"]:
        result["cost_ratio"] = round(top["per_session_ms"] / alone["per_session_ms"], 3)
        print(f"per-session compute at {top['sessions']} sessions: {top['per_session_ms']:.3f} ms per 20 ms frame, "
              f"{result['cost_ratio']:.2f} x its cost alone ({alone['per_session_ms']:.3f} ms)")


def _trials(args, trial, say, result: dict, held: str) -> None:
    """``--ramp``: the largest N that held, and every trial, into ``result``; else the one trial of
    ``--sessions``."""
    from rtanon.serve.bench import ramp

    if args.ramp:
        result["max_sessions_held"], result["trials"] = ramp(trial, 1, args.sessions, say)
        print(f"largest N {held}: {result['max_sessions_held']}")
    else:
        result["trials"] = [trial(args.sessions)]
        say(result["trials"][0])


def run_ticks(args, speech) -> int:
    """``rtanon bench --serve --no-network``: the server's tick alone (:func:`rtanon.serve.bench.run_tick_trial`)."""
    from rtanon.commands._common import config_from_args
    from rtanon.engine import Anonymizer
    from rtanon.batch import Workers
    from rtanon.serve.bench import run_tick_trial
    from rtanon.serve.host import warm_up
    from rtanon.serve.scheduler import default_workers

    anonymizer = Anonymizer(config_from_args(args))
    warm_up(anonymizer)
    workers = Workers(args.workers or default_workers())
    neural = f" ({args.privacy}, {args.backend} on {args.accelerator})" if args.method == "neural" else ""
    print(f"rtanon serve's tick, method {args.method}{neural}, {workers.threads} worker threads, in this "
          "process (no network), up to "
          f"{args.serve_seconds:.0f} s per trial; held: tick p99 <= {args.tick_budget_ms:g} ms and no stage error")
    print(f"{'sessions':>8}{'ticks':>7}{'tick p50 ms':>12}{'tick p99 ms':>12}{'max ms':>9}{'>20 ms':>8}"
          f"{'per session':>12}{'errors':>7}  held")

    def say(r: dict) -> None:
        print(f"{r['sessions']:>8}{r['ticks']:>7}{r['tick_compute_p50_ms']:>12.2f}{r['tick_compute_p99_ms']:>12.2f}"
              f"{r['tick_compute_max_ms']:>9.1f}{r['ticks_over_20ms']:>8}{r['per_session_ms']:>12.3f}"
              f"{r['stage_errors']:>7}  {'yes' if r['held'] else 'NO'}", flush=True)

    def trial(n: int, seconds: float = args.serve_seconds) -> dict:
        return run_tick_trial(anonymizer, n, seconds, speech, args.tick_budget_ms, workers)

    alone = trial(1, min(args.serve_seconds, 10.0))
    say(alone)
    result: dict = {"method": args.method, "privacy": args.privacy, "backend": args.backend,
                    "accelerator": args.accelerator, "workers": workers.threads, "no_network": True, "alone": alone}
    _trials(args, trial, say, result, f"whose tick p99 stayed within {args.tick_budget_ms:g} ms")
    _cost_ratio(result, result["trials"])
    if args.json:
        _print_json(args, result)
    return 0


def run(args) -> int:
    """With ``--json`` stdout carries the JSON alone (for ``> figures.json``); the table goes to stderr."""
    import contextlib
    import sys

    if not args.json:
        return _run(args)
    args.json_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return _run(args)


def _print_json(args, result: dict) -> None:
    import json

    print(json.dumps(result), file=getattr(args, "json_stdout", None), flush=True)


def _run(args) -> int:
    from rtanon import bench
    from rtanon.commands._common import config_from_args
    from rtanon.live import bench as live_bench
    from rtanon.engine import Anonymizer
    from rtanon.errors import CliError

    if args.serve:
        return run_serve(args)
    config = config_from_args(args)
    signal = bench.speech_signal(args.seconds, args.input)
    if args.stage is not None:
        if args.stage not in bench.BENCH_STAGES:
            raise CliError(f"unknown stage {args.stage!r}; choose one of {sorted(bench.BENCH_STAGES)}")
        config.validate()
        result = bench.bench_stage(args.stage, config, signal)
        title = f"stage {args.stage}"
    else:
        anonymizer = Anonymizer(config)
        result = bench.bench_compute(anonymizer, signal)
        title = f"method {result['method']}"
        if args.live_seconds > 0:
            result["live_loop"] = live_bench.bench_live_loop(anonymizer, signal, args.live_seconds)
        if args.streams:
            try:
                result["streams"] = bench.bench_streams(anonymizer, args.streams)
            except ValueError as exc:
                raise CliError(str(exc)) from None
        if "backend" in result:
            graphs = ", CUDA graphs" if result.get("cuda_graphs") else ""
            title += f" (vocoder backend {result['backend']} on {result['device']}{graphs})"
    if args.e2e:
        if args.stage is not None:
            raise CliError("--e2e measures a whole method; drop --stage")
        if not 5 <= args.e2e_seconds <= 7200:
            raise CliError(f"--e2e-seconds {args.e2e_seconds}: use 5 to 7200")
        try:
            result.update(live_bench.measure_e2e(args.method, args.chunk_ms, seconds=args.e2e_seconds,
                                                 server=args.server, progress=_progress_line("end to end")))
        except Exception as exc:
            from rtanon.live.pulse import PulseError

            if isinstance(exc, (PulseError, OSError)):
                raise CliError(f"end-to-end measurement needs PulseAudio and PortAudio: {exc}") from None
            raise
    print(f"{title}, chunk {result['chunk_ms']:.0f} ms, {result['audio_s']:.1f} s of speech")
    print(f"{'stage':<16}{'latency ms':>12}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'RTF':>9}")
    for name, s in result["stages"].items():
        print(f"{name:<16}{s['latency_ms']:>12.1f}{s['compute_p50_ms']:>10.3f}{s['compute_p99_ms']:>10.3f}"
              f"{s['compute_max_ms']:>10.3f}{s['rtf']:>9.4f}")
        for part, p in s.get("parts", {}).items():  # a composite stage's parts, indented under it
            print(f"{'  ' + part:<16}{'':>12}{p['compute_p50_ms']:>10.3f}{p['compute_p99_ms']:>10.3f}"
                  f"{p['compute_max_ms']:>10.3f}{p['rtf']:>9.4f}")
    if args.stage is None:
        print(f"{'total':<16}{result['algorithmic_latency_ms']:>12.1f}{result['compute_p50_ms']:>10.3f}"
              f"{result['compute_p99_ms']:>10.3f}{result['compute_max_ms']:>10.3f}{result['rtf']:>9.4f}")
        print(f"algorithmic latency {result['algorithmic_latency_ms']:.1f} ms = buffering "
              f"{result['buffering_ms']:.0f} ms + stage delays")
    if "guard" in result:
        g = result["guard"]
        print(f"fail-closed guard (pass-through check): p50 {1000 * g['compute_p50_ms']:.1f} us, p99 "
              f"{1000 * g['compute_p99_ms']:.1f} us per chunk = {g['p99_pct_of_chunk']:.2f} % of the "
              f"{result['chunk_ms']:.0f} ms chunk budget at p99 (target < 2 %)")
    if "live_loop" in result:
        lv = result["live_loop"]
        print(f"simulated live loop, {result['chunk_ms']:.0f} ms chunks, {lv['live_seconds']:.0f} s: missed "
              f"deadlines {lv['missed_deadlines']} of {lv['callbacks']} output callbacks ({lv['missed_pct']:.1f} %), "
              f"input skips {lv['input_skips']}, stage errors {lv['stage_errors']}"
              + (f" (the benchmark's own clock ran up to {lv['callback_late_max_ms']:.0f} ms late)"
                 if lv["callback_late_max_ms"] > 5 else ""))
    if "streams" in result:
        st = result["streams"]
        print(f"batched vocoder sessions ({st['backend']} on {st['device']}), one 20 ms step per call:")
        print(f"{'streams':>8}{'p50 ms':>10}{'p99 ms':>10}{'per stream ms':>15}  real-time")
        for r in st["batches"]:
            print(f"{r['streams']:>8}{r['step_p50_ms']:>10.2f}{r['step_p99_ms']:>10.2f}"
                  f"{r['per_stream_p50_ms']:>15.3f}  {'yes' if r['realtime'] else 'no'}")
        print(f"largest real-time batch: {st['max_realtime_streams']} sessions")
    if args.e2e:
        print_delay_budget(result)
    if args.json:
        _print_json(args, result)
    return 0


def _progress_line(what: str):
    import sys

    if not sys.stderr.isatty():
        return None
    return lambda text: print(f"\r{what}: {text}", end="", file=sys.stderr, flush=True)


def print_delay_budget(r: dict) -> None:
    """The end-to-end delay budget: the parts rtanon live reports, their sum, and the delay measured."""
    from rtanon.live.bench import DELAY_PARTS, E2E_WINDOW_S, MIN_REFERENCE_XCORR

    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"end-to-end delay, fake microphone -> rtanon live -> virtual microphone ({r['server']}, "
          f"{r['e2e_seconds']:.0f} s of speech):")
    for key, label in DELAY_PARTS:
        print(f"  {label:<40}{fmt(r['delay_parts_ms'][key]):>8} ms")
    print(f"  {'sum of the parts':<40}{r['delay_parts_sum_ms']:>8.1f} ms")
    print(f"  {'measured, median of ' + str(r['e2e_windows']) + ' windows':<40}{fmt(r['e2e_latency_ms']):>8} ms   "
          f"p99 {fmt(r['e2e_p99_ms'])} ms")
    if r["e2e_silent_windows"]:
        print(f"warning: in {r['e2e_silent_windows']} windows of {E2E_WINDOW_S:.0f} s the microphone had speech "
              "and the virtual microphone none (an outage; no delay measured there)")
    print(f"  missed deadlines {r['missed_deadlines']} ({r['missed_pct']:.2f} % of the "
          f"{r.get('out_block_ms', 10):g} ms output blocks), "
          f"xruns {r['xruns']}, stuck streams reopened {r['stuck_reopens']}; waveform similarity to the input: "
          f"microphone {r['xcorr_mic_vs_played']:.2f}, rtanon {r['xcorr_anon_vs_played']:.2f}")
    if r["overloaded_statuses"] or r["overload_drops"]:
        print(f"  overloaded in {r['overloaded_statuses']} status lines; {r['overload_drops']} chunks of pauses "
              "dropped to keep the delay")
    if r["recorder_overflows"] or r["xcorr_mic_vs_played"] <= MIN_REFERENCE_XCORR:
        print(f"warning: the fake microphone's recording is not a faithful copy of what was played (similarity "
              f"{r['xcorr_mic_vs_played']:.2f}, {r['recorder_overflows']} overflows, {r['attempts']} attempts: the "
              "machine was too busy); measure again on a quieter machine")
