"""The rtanon command line: help, demo, bench JSON, anonymize-dir."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from rtanon.cli import COMMANDS, build_parser


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "rtanon", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def test_every_command_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert len(sub.choices) == len(COMMANDS)
    for name, p in sub.choices.items():
        assert p.description, f"{name} has no description"
    assert _run("--help").returncode == 0


def test_cli_and_the_default_method_need_no_torch(tmp_path):
    """torch is an extra ([identity], [train]): with it unimportable, every command's --help and a McAdams
    run of the demo still work (a CUDA-free, torch-free install is the base install)."""
    block = ("import sys\n"
             "class NoTorch:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'torch':\n"
             "            raise ImportError('torch is blocked in this test')\n"
             "sys.meta_path.insert(0, NoTorch())\n"
             "from rtanon.cli import main\n")
    for args in (["bench", "--help"], ["train", "vocoder", "--help"], ["live", "--help"]):
        proc = subprocess.run([sys.executable, "-c", block + f"main({args!r})"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (args, proc.stderr[-2000:])
    code = f"raise SystemExit(main(['demo', '--method', 'mcadams', '--out', {str(tmp_path / 'd.wav')!r}]))"
    proc = subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch" not in proc.stderr


def test_neural_torch_backend_on_cuda_without_cuda_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the error path is for machines without it")
    proc = _run("bench", "--method", "neural", "--backend", "torch", "--accelerator", "cuda", "--seconds", "1")
    assert proc.returncode != 0
    assert "CUDA is not available" in proc.stderr and "Traceback" not in proc.stderr


def test_cuda_graphs_flag_reaches_the_neural_config():
    from rtanon.commands._common import config_from_args

    parser = build_parser()
    on = config_from_args(parser.parse_args(["bench", "--method", "neural", "--backend", "torch"]))
    off = config_from_args(parser.parse_args(["bench", "--method", "neural", "--backend", "torch", "--no-cuda-graphs"]))
    assert on.neural.cuda_graphs is True and off.neural.cuda_graphs is False


def test_demo_writes_original_and_anonymized(tmp_path):
    proc = _run("demo", "--out", str(tmp_path / "d.wav"), "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    x, _ = sf.read(tmp_path / "d-original.wav")
    y, _ = sf.read(tmp_path / "d.wav")
    # the default: the neural method at its balanced point
    assert x.shape == y.shape and "method neural" in proc.stdout and "algorithmic latency 40.0 ms" in proc.stdout


def test_bench_json_is_all_of_stdout():
    proc = _run("bench", "--seconds", "4", "--json", "--method", "mcadams")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)  # `rtanon bench --json > x.json` writes JSON; the table went to stderr
    assert "algorithmic latency 30.0 ms" in proc.stderr
    for key in ("algorithmic_latency_ms", "compute_p50_ms", "compute_p99_ms", "rtf", "stages"):
        assert key in r
    assert r["algorithmic_latency_ms"] == 30.0
    assert set(r["stages"]) == {"vad", "McAdamsStage", "AllPassStage"}
    assert 0 < r["compute_p50_ms"] <= r["compute_p99_ms"]


def test_bench_one_stage_and_unknown_stage():
    proc = _run("bench", "--stage", "mcadams", "--seconds", "2", "--json")
    r = json.loads(proc.stdout)
    assert r["stage"] == "mcadams" and r["algorithmic_latency_ms"] == 10.0
    bad = _run("bench", "--stage", "nope")
    assert bad.returncode == 2 and "choose one of" in bad.stderr


@pytest.fixture()
def tiny_kaldi(tmp_path, shared_data):
    """2 speakers x 2 utterances of so762_dev as a Kaldi-style dir (paths point into ../shared)."""
    src = shared_data / "so762_dev"
    utt2spk = dict(line.split() for line in (src / "utt2spk").read_text().splitlines())
    wav = dict(line.split() for line in (src / "wav.scp").read_text().splitlines())
    gender = dict(line.split() for line in (src / "spk2gender").read_text().splitlines())
    spks = sorted(set(utt2spk.values()))[:2]
    utts = [u for s in spks for u in sorted(u for u, v in utt2spk.items() if v == s)[:2]]
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "wav.scp").write_text("".join(f"{u} {src / wav[u]}\n" for u in utts))
    (d / "utt2spk").write_text("".join(f"{u} {utt2spk[u]}\n" for u in utts))
    (d / "spk2gender").write_text("".join(f"{s} {gender[s]}\n" for s in spks))
    return d, utts


def test_anonymize_dir_writes_a_kaldi_dir_and_pins_voices_only_with_a_seed(tmp_path, tiny_kaldi):
    d, utts = tiny_kaldi
    runs = {}
    for name, extra in (("a", ["--seed", "4"]), ("b", ["--seed", "4"]), ("c", []),
                        ("u", ["--assignment", "utterance"])):
        out = tmp_path / name
        proc = _run("anonymize-dir", "--data", str(d), "--out", str(out), "--workers", "0", *extra)  # Ray: test_corpus_ray
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.stem for p in out.glob("*.wav")) == sorted(utts)
        for f in ("wav.scp", "utt2spk", "spk2gender"):
            assert (out / f).exists()
        runs[name] = {u: sf.read(out / f"{u}.wav")[0] for u in utts}
    for u in utts:
        src_len = sf.info(dict(line.split() for line in (d / "wav.scp").read_text().splitlines())[u]).frames
        assert runs["a"][u].shape[0] == src_len
        np.testing.assert_array_equal(runs["a"][u], runs["b"][u])  # pinned by --seed
        assert not np.array_equal(runs["a"][u], runs["c"][u])  # fresh voices by default


def test_speaker_assignment_gives_one_voice_per_speaker(tiny_kaldi):
    from rtanon import Anonymizer
    from rtanon.corpus.run import voice_seed

    a = Anonymizer()
    v = [a.open_session(seed=voice_seed(9, spk)).voice for spk in ("s1", "s1", "s2")]
    assert v[0] == v[1] != v[2]


def test_live_with_a_missing_device_fails_with_a_hint():
    proc = _run("live", "--input", "no-such-microphone-xyz", "--duration", "1")
    assert proc.returncode == 2
    assert "rtanon live: error" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_prints_the_voice_and_next_steps_for_the_user(tmp_path, monkeypatch, capsys):
    """The voice as a sentence, not a Python dict, and the next commands as the user invoked rtanon
    (`.venv/bin/rtanon` is on no PATH)."""
    import sys

    from rtanon.cli import main

    monkeypatch.setattr(sys, "argv", ["/opt/x/.venv/bin/rtanon"])
    assert main(["demo", "--method", "mcadams", "--seed", "1", "--out", str(tmp_path / "d.wav")]) == 0
    out = capsys.readouterr().out
    assert "voice: McAdams, coefficient 0." in out and "{" not in out, out
    assert "next: `/opt/x/.venv/bin/rtanon virtual-device create`, then `/opt/x/.venv/bin/rtanon live" in out, out


def test_a_sound_server_error_is_one_line():
    """pactl's two lines of error were printed with a literal \\n between them."""
    import shutil

    from rtanon.live import pulse

    if shutil.which("pactl") is None:
        pytest.skip("needs pactl")
    with pytest.raises(pulse.PulseError) as err:
        pulse.status({"PATH": os.environ["PATH"], "PULSE_SERVER": "unix:/nonexistent/rtanon-test"})
    assert "\n" not in str(err.value) and "Connection" in str(err.value), str(err.value)
