"""Issue 44 item 4: the README's commands work after the README's set-up.

``./setup.sh demo`` is asked which extras it installs (tests/setup_extras.py runs it with a fake .venv);
every command line under the README's "Using it" then runs from this source tree in a Python where only
those extras can be imported, on small inputs: real speech from ../shared/data, a two-speaker corpus, a
private PulseAudio daemon for the devices, the virtual microphone and `live` (skipped with the reason
where pulseaudio is missing, as tests/test_pulse.py is). The lines are read from the README, so a new line
there needs a check here (``CHECKS``), and a line whose command changes fails here.

What is changed from the README's line, and why: `live` gets ``--duration 3`` (it runs until Ctrl-C) and
its ``--input 2`` (an index as `rtanon devices` lists it on the README writer's machine) becomes the index
of an input that `rtanon devices` lists in the private daemon; `live --ui` gets ``--no-browser`` and is
stopped with SIGINT once its page answers; `bench --json` gets ``--seconds 2 --live-seconds 1``. Run only
as far as their arguments parse, with the reason: `soak` (its shortest schedule is 60 s: tests/test_soak.py
runs it), `train vocoder --data DIR ...` (placeholders; hours of training). `eval` needs the [eval] extra
(Whisper, the attackers), which the README says: after `./setup.sh demo` it must answer the one line that
names that extra."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from setup_extras import REPO, env_without_extras, setup_extras, setup_packages

RATE = 16000


def using_it_lines() -> list[str]:
    """The command lines of the README's "Using it" code block: continuations joined, comments dropped."""
    section = (REPO / "README.md").read_text().split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"\n((?: {4}.*\n|\n)+)", section).group(1)
    lines, pending = [], ""
    for raw in block.splitlines():
        if not raw.strip():
            continue
        text = pending + raw.strip()
        if text.endswith("\\"):
            pending = text[:-1]
            continue
        pending = ""
        lines.append(re.split(r"\s+#\s", text, maxsplit=1)[0].strip())
    return lines


LINES = using_it_lines()


def _argv(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == ".venv/bin/rtanon", line  # the command `./setup.sh` installs
    return words[1:]


def _check_name(argv: list[str]) -> str:
    if argv[0] == "live":
        return "live --ui" if "--ui" in argv else "live"
    return argv[0]


def _one_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _no_install_hint(proc):
    for text in (proc.stdout, proc.stderr):
        assert not re.search(r"pip install|not installed|extra\b", text), text


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The Python environment `./setup.sh demo` leaves, and a folder for the commands' files."""
    tmp = tmp_path_factory.mktemp("readme")
    extras, _ = setup_extras("demo", tmp)
    work = tmp / "work"
    work.mkdir()
    return SimpleNamespace(extras=extras, env=env_without_extras(tmp, extras), tmp=tmp, work=work)


@pytest.fixture(scope="module")
def pulse(demo):
    """A private PulseAudio daemon; the demo environment pointed at it."""
    missing = [t for t in ("pulseaudio", "pactl") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils libasound2-plugins)")
    from rtanon.live.pulse import PulseDaemon

    with PulseDaemon() as pd:
        env = {**pd.env, **{k: demo.env[k] for k in ("PYTHONPATH", "RTANON_TEST_HIDDEN_MODULES")}}
        probe = subprocess.run([sys.executable, "-c", "import sounddevice as sd; print(sd.query_devices())"],
                               env=env, capture_output=True, text=True)
        if "pulse" not in probe.stdout:
            pytest.skip("PortAudio does not list the ALSA 'pulse' device: install libasound2-plugins")
        yield SimpleNamespace(daemon=pd, env=env)


def _run(argv, env, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "rtanon", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def talk(demo, speech_paths):
    """talk.wav in the commands' folder: two utterances of real speech."""
    from rtanon.io.audio import read_audio

    x = np.concatenate([read_audio(p) for p in speech_paths[:2]])
    sf.write(demo.work / "talk.wav", x, RATE)
    return x


# ---- the checks, one per command of "Using it" ------------------------------------------------------

def check_devices(argv, demo, request):
    env = request.getfixturevalue("pulse").env
    proc = _run(argv, env, demo.work)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s*\d+\s+pulse\s", proc.stdout, re.M), proc.stdout


def check_virtual_device(argv, demo, request):
    pulse = request.getfixturevalue("pulse")
    proc = _run(argv, pulse.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    assert "rtanon_mic" in pulse.daemon.pactl("list", "short", "sources")


def _an_input_index(env, cwd) -> str:
    listing = _run(["devices"], env, cwd).stdout
    m = re.search(r"^\s*(\d+)\s+pulse\s+\((\d+) in", listing, re.M)
    assert m and int(m.group(2)) > 0, listing
    return m.group(1)


def check_live(argv, demo, request):
    """The microphone is the server's default source, a fake one playing talk.wav (the private server's
    default would otherwise be the virtual microphone itself: rtanon refuses to record its own output)."""
    pulse = request.getfixturevalue("pulse")
    talk = request.getfixturevalue("talk")
    assert _run(["virtual-device", "create"], pulse.env, demo.work).returncode == 0
    if "readme_mic" not in pulse.daemon.pactl("list", "short", "sinks"):
        pulse.daemon.load_null_sink("readme_mic", RATE)
    pulse.daemon.pactl("set-default-source", "readme_mic.monitor")
    argv = list(argv)
    argv[argv.index("--input") + 1] = _an_input_index(pulse.env, demo.work)
    # the talk four times over, started once the input is known: on a loaded machine live can take
    # seconds to start listening (a run beside a training job heard no speech in its 3 s)
    looped = demo.tmp / "talk_looped.wav"
    sf.write(looped, np.tile(talk, 4), RATE)
    player = subprocess.Popen(["paplay", "--device=readme_mic", str(looped)], env=pulse.env)
    try:
        proc = _run([*argv, "--duration", "3"], pulse.env, demo.work)
    finally:
        player.kill()
        player.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"stopped: (\d+) chunks \((\d+) speech\).*stage errors 0, worker errors 0", proc.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, proc.stdout


def check_live_ui(argv, demo, request):
    pulse = request.getfixturevalue("pulse")
    env = {**pulse.env, "XDG_CONFIG_HOME": str(demo.tmp / "config")}
    live = subprocess.Popen([sys.executable, "-m", "rtanon", *argv, "--no-browser"], env=env, cwd=demo.work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in live.stderr:
            assert "error" not in line, line
            m = re.search(r"control page (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, f"no URL: {live.wait(timeout=30)}"
        origin, token = url.split("/?token=")
        with urllib.request.urlopen(f"{origin}/api/state?token={token}", timeout=30) as r:
            state = json.loads(r.read())
        assert state["settings"]["privacy"] == "balanced" and state["method"] == "neural"
    finally:
        live.send_signal(signal.SIGINT)
        out, err = live.communicate(timeout=60)
    assert live.returncode == 130, err  # Ctrl-C, as the README documents


def check_file(argv, demo, request):
    from rtanon.eval.signal import max_xcorr

    x = request.getfixturevalue("talk")
    proc = _run(argv, demo.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    _no_install_hint(proc)
    y, rate = sf.read(demo.work / argv[2], dtype="float32")
    assert rate == RATE and y.shape == x.shape and np.abs(y).max() > 0.01
    assert max_xcorr(x[:RATE * 2], y) < 0.5  # a voice, not the input


def check_anonymize_dir(argv, demo, request):
    from test_corpus import make_corpus

    root = demo.tmp / "corpus-root"
    root.mkdir()
    data = make_corpus(root, request.getfixturevalue("shared_data"), 2)
    data.rename(demo.work / argv[argv.index("--data") + 1].rstrip("/"))
    proc = _run([*argv, "--no-progress"], demo.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    if "corpus" not in demo.extras:  # Ray is the [corpus] extra: the run goes on in this process, in one line
        assert _one_line(proc).startswith("rtanon anonymize-dir: Ray is not installed, so this runs in this "
                                          "process"), proc.stderr
    assert "2 utterances anonymized" in proc.stdout and ", 0 failed" in proc.stdout, proc.stdout
    assert len(list((demo.work / argv[argv.index("--out") + 1]).glob("*.wav"))) == 2


def check_bench(argv, demo, request):
    proc = _run([*argv, "--seconds", "2", "--live-seconds", "1"], demo.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    _no_install_hint(proc)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report, proc.stdout


def check_soak(argv, demo, request):
    # an hour of live audio; tests/test_soak.py runs the command for its shortest schedule (60 s)
    from rtanon.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.func.__module__ == "rtanon.commands.soak" and args.duration == 3600


def check_identity(argv, demo, request):
    proc = _run(argv, demo.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    _no_install_hint(proc)
    pinned = json.loads((demo.work / argv[argv.index("--out") + 1]).read_text())
    assert pinned
    request.getfixturevalue("talk")  # "--identity me.json pins it"
    proc = _run(["file", "talk.wav", "talk-me.wav", "--identity", argv[argv.index("--out") + 1]], demo.env,
                demo.work)
    assert proc.returncode == 0, proc.stderr


def check_f0(argv, demo, request):
    x = request.getfixturevalue("talk")
    proc = _run(argv, demo.env, demo.work)
    assert proc.returncode == 0, proc.stderr
    rows = (demo.work / argv[2]).read_text().splitlines()
    assert abs(len(rows) - 1 - x.shape[0] // 160) <= 2, len(rows)  # a header, then every 10 ms


def check_eval(argv, demo, request):
    # the [eval] extra (Whisper, speaker encoders; several hundred MB): the README says so on the line
    line = next(line for line in (REPO / "README.md").read_text().splitlines() if "rtanon eval --data" in line)
    assert "[eval]" in line, line
    if "eval" in demo.extras:
        pytest.fail("./setup.sh demo installs the [eval] extra: run eval here on a small corpus")
    (demo.work / argv[argv.index("--data") + 1]).mkdir(exist_ok=True)
    proc = _run(argv, demo.env, demo.work)
    assert proc.returncode == 2
    assert re.search(r"^rtanon eval: error: .*(RTANON_EXTRAS=eval \./setup\.sh|pip install '\.\[eval\]')",
                     _one_line(proc)), proc.stderr


def check_train(argv, demo, request):
    # placeholders (--data DIR ...) and hours of training: its options parse, and without the [train] extra
    # it answers the one line that names the extra, as the README's line says
    assert "[train]" in next(line for line in (REPO / "README.md").read_text().splitlines()
                             if "rtanon train " in line)
    proc = _run(["train", "vocoder", "--help"], demo.env, demo.work)
    assert proc.returncode == 0 and "--data" in proc.stdout
    if "train" not in demo.extras:
        (demo.work / "DIR").mkdir(exist_ok=True)
        proc = _run(["train", "vocoder", "--data", "DIR", "--out", "runs/v"], demo.env, demo.work)
        assert proc.returncode == 2
        line = _one_line(proc)
        assert line.startswith("rtanon train: error: rtanon train vocoder needs torch"), line
        assert "(the [train] extra): " in line
        assert "RTANON_EXTRAS=train ./setup.sh" in line or "pip install '.[train]' in the rtanon source" in line


def check_help(argv, demo, request):
    from rtanon.cli import build_parser

    commands = [argv[0]] if argv[0] != "COMMAND" else \
        list(build_parser()._subparsers._group_actions[0].choices)
    for command in commands:
        proc = _run([command, "--help"], demo.env, demo.work, timeout=60)
        assert proc.returncode == 0 and "usage: rtanon" in proc.stdout, (command, proc.stderr)


CHECKS = {"devices": check_devices, "virtual-device": check_virtual_device, "live": check_live,
          "live --ui": check_live_ui, "file": check_file, "anonymize-dir": check_anonymize_dir,
          "bench": check_bench, "soak": check_soak, "identity": check_identity, "f0": check_f0,
          "eval": check_eval, "train": check_train, "lab": check_help, "COMMAND": check_help}


def test_setup_demo_installs_the_control_page_and_leaves_ray_to_the_corpus_extra(tmp_path):
    demo, calls = setup_extras("demo", tmp_path)
    assert demo == ["ui"] and calls[-1] == "rtanon demo", calls
    assert setup_extras("", tmp_path / "plain")[0] == ["ui"]
    assert setup_extras("", tmp_path / "corpus", {"RTANON_EXTRAS": "corpus"})[0] == ["ui", "corpus"]
    test = setup_extras("test", tmp_path / "test")[0]
    assert {"ui", "corpus", "test"} <= set(test)


def test_setup_test_installs_what_the_pulseaudio_and_pipewire_tests_start(tmp_path):
    packages = setup_packages("test", tmp_path)
    assert {"pulseaudio-utils", "libasound2-plugins", "chromium", "chromium-driver"} <= set(packages), packages
    show = subprocess.run(["apt-cache", "show", "pipewire-pulse"], capture_output=True, text=True).stdout \
        if shutil.which("apt-cache") else ""
    if not re.search(r"^(Conflicts|Breaks):.*\bpulseaudio\b", show, re.M):  # else setup.sh keeps PulseAudio
        assert {"pipewire", "wireplumber", "pipewire-pulse", "dbus"} <= set(packages), packages
    assert not {"pipewire", "wireplumber"} & set(setup_packages("demo", tmp_path / "demo"))


def test_every_using_it_line_has_a_check():
    assert len(LINES) >= 15, LINES
    assert [line for line in LINES if _check_name(_argv(line)) not in CHECKS] == []


@pytest.mark.parametrize("line", LINES, ids=[f"{i:02d}-{'-'.join(_argv(x)[:2])}" for i, x in enumerate(LINES)])
def test_using_it_after_setup_demo(line, demo, request):
    argv = _argv(line)
    t0 = time.monotonic()
    CHECKS[_check_name(argv)](argv, demo, request)
    print(f"\n{line}: {time.monotonic() - t0:.1f} s")
