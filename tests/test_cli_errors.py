"""Issue 27: the CLI over a catalogue of bad inputs. Every case must end with exactly one line on stderr
(no traceback), an exit status that ``rtanon --help`` documents, and nothing left in the output folder.

Read-only and full output folders are real mounts (a read-only tmpfs, a 16 KiB tmpfs) where the test may
mount (root); otherwise a read-only folder is a chmod 555 folder and the full disk is skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from rtanon.cli import EXIT_CODES

RATE = 16000
DOCUMENTED = {code for code, _ in EXIT_CODES}
NO_PULSE = {"PULSE_SERVER": "unix:/nonexistent/rtanon-test", "PULSE_SOURCE": "", "PULSE_SINK": ""}


def _rtanon(*args, env=None, timeout=300):
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "rtanon", *args], capture_output=True, text=True,
                          timeout=timeout, env=full)


def _one_line_error(proc, code=2, contains=""):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == code and code in DOCUMENTED, (proc.returncode, proc.stderr)
    assert lines[0].startswith("rtanon"), lines
    assert contains in lines[0], lines[0]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, speech):
    d = tmp_path_factory.mktemp("inputs")
    sf.write(d / "in.wav", speech[: 2 * RATE], RATE)
    sf.write(d / "ten_ms.wav", speech[:160], RATE)
    sf.write(d / "in96k.wav", np.repeat(speech[: 2 * RATE], 6), 96000)
    data = (d / "in.wav").read_bytes()
    (d / "cut.wav").write_bytes(data[: len(data) // 2])
    return d


def _mount(path: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    if _mount(d, "ro,size=64k"):
        yield d
        _umount(d)
        return
    if os.geteuid() == 0:
        pytest.skip("root without mount: a chmod 555 folder would still be writable")
    d.mkdir()
    d.chmod(0o555)
    yield d
    d.chmod(0o755)


@pytest.fixture
def full_dir(tmp_path):
    d = tmp_path / "full"
    if not _mount(d, "size=16k"):
        pytest.skip("a full disk is simulated with a 16 KiB tmpfs, which needs root and mount")
    yield d
    _umount(d)


def test_output_in_a_read_only_folder(inputs, read_only_dir):
    _one_line_error(_rtanon("file", str(inputs / "in.wav"), str(read_only_dir / "o.wav"), "--method", "mcadams"),
                    contains="o.wav")


def test_output_on_a_full_disk(inputs, full_dir):
    _one_line_error(_rtanon("file", str(inputs / "in.wav"), str(full_dir / "o.wav"), "--method", "mcadams"),
                    contains="disk full")
    assert list(full_dir.iterdir()) == []


@pytest.mark.parametrize("name, args, contains", [
    ("missing input", ["file", "{d}/nope.wav", "{o}/o.wav"], "no such file"),
    ("truncated input", ["file", "{d}/cut.wav", "{o}/o.wav"], "truncated"),
    ("output equals input", ["file", "{d}/in.wav", "{d}/in.wav"], "overwrite the input"),
    ("raw output", ["file", "{d}/in.wav", "{o}/o.raw"], "o.raw"),
    ("output is a folder", ["file", "{d}/in.wav", "{o}"], ""),
    ("mp3 at 96 kHz", ["file", "{d}/in96k.wav", "{o}/o.mp3"], "96000"),
    ("output folder missing", ["file", "{d}/in.wav", "{o}/no/o.wav"], "does not exist"),
    ("bad chunk size", ["file", "{d}/in.wav", "{o}/o.wav", "--chunk-ms", "7"], "--chunk-ms"),
    ("unknown command", ["frobnicate"], "invalid choice"),
    ("identity into a missing folder", ["identity", "new", "--out", "{o}/no/x.json"], "does not exist"),
    ("theta-fd -1", ["identity", "new", "--theta-fd", "-1", "--out", "{o}/x.json"], "--theta-fd"),
    ("enroll 10 ms", ["identity", "new", "--strategy", "near", "--enroll", "{d}/ten_ms.wav", "--out", "{o}/x.json"],
     "--enroll"),
    ("soak too short", ["soak", "--duration", "20"], "--duration"),
])
def test_bad_input_catalogue(inputs, tmp_path, name, args, contains):
    out = tmp_path / "out"
    out.mkdir()
    args = [a.format(d=inputs, o=out) for a in args]
    proc = _rtanon(*args, "--method", "mcadams") if args[0] == "file" else _rtanon(*args)
    _one_line_error(proc, contains=contains)
    assert not [p for p in out.rglob("*")], list(out.rglob("*"))


@pytest.fixture(scope="module")
def good_identity(tmp_path_factory):
    from rtanon.identity.speaker import IdentityModel

    path = tmp_path_factory.mktemp("ident") / "good.json"
    IdentityModel().new_identity(rng=np.random.default_rng(5)).save(path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("change", [
    {"embedding": "0.1 0.2"}, {"embedding": [float("inf")] * 256}, {"f0_quantiles_hz": [1e6] * 101},
    {"f0_quantiles_hz": [1e-3] * 101}, {"quantile_levels": 5}, {"quantile_levels": list(np.linspace(1, 0, 101))},
    {"embedding": None}, "not json",
], ids=["string", "infinity", "1MHz", "1mHz", "levels-5", "levels-reversed", "null", "not-json"])
def test_bad_identity_files(inputs, tmp_path, good_identity, change):
    path = tmp_path / "bad.json"
    path.write_text(change if isinstance(change, str) else json.dumps({**good_identity, **change}))
    proc = _rtanon("file", str(inputs / "in.wav"), str(tmp_path / "o.wav"), "--method", "mcadams",
                   "--identity", str(path))
    _one_line_error(proc, contains="--identity")
    assert not (tmp_path / "o.wav").exists()


def test_debug_shows_the_traceback(inputs, tmp_path):
    proc = _rtanon("--debug", "file", str(inputs / "nope.wav"), str(tmp_path / "o.wav"))
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "no such file" in proc.stderr


def test_a_native_crash_says_where_it_happened():
    """A segfault in native code cannot be caught, but the command's stderr shows every thread's Python
    stack (a CI run once ended `rtanon file` with -11 and nothing else)."""
    code = ("import ctypes, sys\n"
            "from rtanon import cli\n"
            "cli.build_parser = lambda: type('P', (), {'parse_args': lambda self, a: type('A', (), "
            "{'command': 'crash', 'func': staticmethod(lambda args: ctypes.string_at(0))})()})()\n"
            "sys.exit(cli.main(['crash']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode < 0, proc.stderr  # killed by the signal, as before
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "in main" in proc.stderr and "cli.py" in proc.stderr, proc.stderr


def test_help_documents_the_exit_codes():
    proc = _rtanon("--help")
    text = " ".join(proc.stdout.split())
    for code, meaning in EXIT_CODES:
        assert f"{code} {' '.join(meaning.split()[:3])}" in text, (code, text)


# -- rtanon live: devices ---------------------------------------------------------------------------

def _device_count(env) -> int | None:
    probe = subprocess.run([sys.executable, "-c", "import sounddevice as sd; print(len(sd.query_devices()))"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    return int(probe.stdout) if probe.returncode == 0 and probe.stdout.strip().isdigit() else None


@pytest.mark.parametrize("args", [[], ["--input", "0"], ["--input", "99"], ["--input", "pulse:foo"]])
def test_live_without_any_sound_device(args):
    count = _device_count(NO_PULSE)
    if count is None:
        pytest.skip("PortAudio (libportaudio2) is not installed")
    if count:
        pytest.skip(f"this machine has {count} sound devices even without a sound server")
    _one_line_error(_rtanon("live", "--method", "mcadams", "--duration", "1", *args, env=NO_PULSE),
                    contains="no audio device")


@pytest.mark.pulse
@pytest.mark.parametrize("args, contains", [
    (["--input", "99"], "no such device"), (["--input", "pulse:foo"], "no PulseAudio source named 'foo'"),
    (["--output", "pulse:bar"], "no PulseAudio sink named 'bar'"), (["--input", "no-such-mic"], "no-such-mic"),
])
def test_live_with_a_device_that_does_not_exist(args, contains):
    if shutil.which("pulseaudio") is None or shutil.which("pactl") is None:
        pytest.skip("needs pulseaudio and pactl (apt-get install pulseaudio pulseaudio-utils libasound2-plugins)")
    from rtanon.live.pulse import PulseDaemon

    with PulseDaemon() as pd:
        if not _device_count(pd.env):
            pytest.skip("PortAudio does not list the ALSA 'pulse' device: install libasound2-plugins")
        proc = subprocess.run([sys.executable, "-m", "rtanon", "live", "--method", "mcadams", "--duration", "1",
                               *args], capture_output=True, text=True, env=pd.env, timeout=120)
    _one_line_error(proc, contains=contains)


def test_a_missing_extra_is_named_by_the_extra_that_installs_it():
    """A module only an extra brings (rtanon's metadata: pyproject.toml's extras) is a one-line usage error
    naming that extra; a module of the base install or of rtanon itself stays an internal error (a bug)."""
    from rtanon.cli import extra_providing

    assert extra_providing("torch", "train") == "train" and extra_providing("torch", "eval") == "identity"
    assert extra_providing("ray") == "corpus" and extra_providing("faster_whisper", "eval") == "eval"
    assert extra_providing("pyworld") == "identity"  # from pyworld-prebuilt
    assert extra_providing("numpy") is None and extra_providing("rtanon") is None
    assert extra_providing("onnxruntime", "eval") is None  # a base dependency, whatever extras repeat it


def _no_model(monkeypatch):
    """Any attempt to build the engine fails the test: an output error must come before the models load."""
    import rtanon.engine

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(rtanon.engine, "Anonymizer", refuse)


@pytest.mark.parametrize("case", ["no-folder", "same-as-input", "extension", "fifo", "dev-null"])
def test_file_output_errors_come_before_the_model_loads(tmp_path, monkeypatch, capsys, case):
    from rtanon.cli import main

    _no_model(monkeypatch)
    src = tmp_path / "in.wav"
    sf.write(src, np.zeros(RATE, np.float32), RATE)
    out = {"no-folder": tmp_path / "missing" / "out.wav", "same-as-input": src, "extension": tmp_path / "out.xyz",
           "fifo": tmp_path / "pipe.wav", "dev-null": Path("/dev/null")}[case]
    if case == "fifo":
        os.mkfifo(out)
    assert main(["file", str(src), str(out), "--method", "neural"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rtanon file: error: ") and err.count("\n") == 1, err


def test_demo_output_errors_come_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from rtanon.cli import main

    _no_model(monkeypatch)
    assert main(["demo", "--out", str(tmp_path / "missing" / "demo.wav")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_slow_load_is_announced(monkeypatch, capsys):
    """Loading longer than LOADING_NOTICE_S prints one line on stderr; a quick one prints nothing."""
    import argparse
    import time

    import rtanon.engine
    from rtanon.commands import _common

    monkeypatch.setattr(_common, "LOADING_NOTICE_S", 0.05)
    args = argparse.Namespace(method="neural", chunk_ms=20)
    monkeypatch.setattr(rtanon.engine, "Anonymizer", lambda cfg: time.sleep(0.5) or "engine")
    assert _common.anonymizer_from_args(args) == "engine"
    assert capsys.readouterr().err == "loading the neural voice...\n"
    monkeypatch.setattr(rtanon.engine, "Anonymizer", lambda cfg: "engine")
    _common.anonymizer_from_args(args)
    time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_file_runs_without_portaudio_and_devices_says_what_to_install(tmp_path):
    """sounddevice's Linux wheel does not bundle PortAudio: where libportaudio is missing, `import
    sounddevice` raises OSError. `rtanon file` must not need it; `rtanon devices` names the package."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "sounddevice.py").write_text("raise OSError('PortAudio library not found')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(stub), os.environ.get("PYTHONPATH", "")])}
    from rtanon.io.resources import demo_speech_path

    with demo_speech_path() as sample:
        out = _rtanon("file", "--seed", "1", str(sample), str(tmp_path / "out.wav"), env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out.wav").stat().st_size > 1000
    _one_line_error(_rtanon("devices", env=env), contains="Fedora: sudo dnf install portaudio")
