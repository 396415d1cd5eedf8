"""Issue 45: reliability, round two.

Each test reproduces a finding of the issue: outputs that are device nodes or FIFOs replaced by regular
files, identities that overflow float32, names too long for the temporary file, bad input reported as an
internal error, reads that never end, untrusted text reaching the terminal, the control page's unchecked
actions, and the Ray runs' interrupts, bindings and sweeps."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import soundfile as sf

from rtanon import Anonymizer, AnonymizerConfig, atomic
from rtanon.errors import RunFailed
from test_cli_errors import _one_line_error, _rtanon

RATE = 16000


@pytest.fixture(scope="module")
def wav(tmp_path_factory, speech):
    path = tmp_path_factory.mktemp("in") / "in.wav"
    sf.write(path, speech[: 2 * RATE], RATE)
    return path


# -- 1. an output that is a device node or a FIFO is refused, never replaced ----------------------------

def _special(tmp_path, kind):
    path = tmp_path / f"{kind}.wav"
    if kind == "fifo":
        os.mkfifo(path)
    else:  # a copy of /dev/null: only root may make one
        if os.geteuid() != 0:
            pytest.skip("making a character device needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def _still_special(path, kind):
    mode = path.lstat().st_mode
    return stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_the_atomic_writer_refuses_a_special_target_and_leaves_it(tmp_path, kind):
    path = _special(tmp_path, kind)
    with pytest.raises(atomic.OutputPathError, match="not a regular file"):
        atomic.write_text(path, "x")
    assert _still_special(path, kind)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
@pytest.mark.parametrize("writer", ["f0", "file", "identity new"])
def test_every_writer_refuses_a_special_output_in_one_line(tmp_path, wav, writer, kind):
    path = _special(tmp_path, kind)
    args = {"f0": ["f0", str(wav), str(path)],
            "file": ["file", str(wav), str(path), "--method", "mcadams"],
            "identity new": ["identity", "new", "--seed", "1", "--out", str(path)]}[writer]
    _one_line_error(_rtanon(*args, timeout=120), contains="not a regular file")
    assert _still_special(path, kind)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


# -- 3. identities validated in float32; a run that rendered nothing is not a success -------------------

@pytest.fixture(scope="module")
def good_identity(tmp_path_factory):
    from rtanon.identity.speaker import IdentityModel

    path = tmp_path_factory.mktemp("ident") / "good.json"
    IdentityModel().new_identity(rng=np.random.default_rng(7)).save(path)
    return json.loads(path.read_text())


def _identity_file(tmp_path, text: str):
    path = tmp_path / "identity.json"
    path.write_text(text)
    return path


def _file_with_identity(wav, tmp_path, identity, timeout=120):
    return _rtanon("file", str(wav), str(tmp_path / "o.wav"), "--method", "mcadams", "--identity", str(identity),
                   timeout=timeout)


@pytest.mark.parametrize("change", ["one 1e39", "all 1e20"])
def test_an_identity_beyond_float32_is_refused(tmp_path, wav, good_identity, change):
    emb = good_identity["embedding"]
    emb = [1e39] + emb[1:] if change == "one 1e39" else [1e20] * len(emb)  # 1e20: its square overflows
    path = _identity_file(tmp_path, json.dumps({**good_identity, "embedding": emb}))
    _one_line_error(_file_with_identity(wav, tmp_path, path), contains="'embedding'")
    assert not (tmp_path / "o.wav").exists()


class _SilentThenBoom:
    """A stage that a broken voice makes fail: silence while it warms up after each reset, then an error."""

    hop, latency_samples = 320, 0

    def __init__(self):
        self.calls = 0

    def process(self, chunk):
        self.calls += 1
        if self.calls % 2 == 0:
            raise FloatingPointError("injected")
        return np.zeros_like(chunk)

    def reset(self):
        pass


def test_a_file_where_no_chunk_was_anonymized_is_a_failed_run(tmp_path, wav):
    from rtanon.io.audio import anonymize_file

    session = Anonymizer(AnonymizerConfig(method="mcadams")).open_session(seed=0)
    session.stages.insert(0, _SilentThenBoom())
    with pytest.raises(RunFailed, match="no chunk was anonymized"):
        anonymize_file(session, wav, tmp_path / "o.wav")
    c = session.counters
    assert 0 < c.stage_errors < c.chunks and c.rendered_chunks == 0
    assert list(tmp_path.iterdir()) == []
    healthy = Anonymizer(AnonymizerConfig(method="mcadams")).open_session(seed=0)
    anonymize_file(healthy, wav, tmp_path / "o.wav")  # real speech: rendered
    assert healthy.counters.rendered_chunks > 0


# -- 8, 9. bad identity files: one line, exit 2, at once ---------------------------------------------------

@pytest.mark.parametrize("case", ["nested 100000", "400 digits", "5000 digits", "strategy a string",
                                  "strategy a list", "gender an object", "not UTF-8", "2 MB"])
def test_malformed_identity_files_are_usage_errors(tmp_path, wav, good_identity, case):
    digits = {"400 digits": 400, "5000 digits": 5000}.get(case)
    text = {
        "nested 100000": "[" * 100_000 + "]" * 100_000,
        "strategy a string": json.dumps({**good_identity, "strategy": "gmm"}),
        "strategy a list": json.dumps({**good_identity, "strategy": ["gmm"]}),
        "gender an object": json.dumps({**good_identity, "gender": {"x": 1}}),
        "2 MB": json.dumps({**good_identity, "encoder": "x" * 2_000_000}),
    }.get(case)
    if digits:
        text = json.dumps(good_identity).replace('"embedding": [', f'"embedding": [{"9" * digits}, ', 1)
    path = _identity_file(tmp_path, text or "")
    if case == "not UTF-8":
        path.write_bytes(b'{"embedding": "\xff\xfe"}'.replace(b"\\xff\\xfe", b"\xff\xfe"))
    _one_line_error(_file_with_identity(wav, tmp_path, path), contains="--identity")


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_an_identity_that_is_not_a_regular_file_is_refused_at_once(tmp_path, wav, kind):
    path = "/dev/zero"
    if kind == "fifo":
        path = tmp_path / "identity.json"
        os.mkfifo(path)
    _one_line_error(_file_with_identity(wav, tmp_path, path, timeout=60), contains="not a regular file")


def _corpus(tmp_path, wav, entry: str):
    data = tmp_path / "data"
    data.mkdir()
    (data / "wav.scp").write_text(f"u1 {wav}\nu2 {entry}\n")
    (data / "utt2spk").write_text("u1 s1\nu2 s1\n")
    (data / "spk2gender").write_text("s1 f\n")
    return data


@pytest.mark.parametrize("entry", ["fifo", "symlink loop", "/dev/zero"])
def test_a_corpus_input_that_is_not_a_regular_file_is_a_usage_error(tmp_path, wav, entry):
    if entry == "fifo":
        os.mkfifo(tmp_path / "f.wav")
    elif entry == "symlink loop":
        (tmp_path / "a.wav").symlink_to(tmp_path / "b.wav")
        (tmp_path / "b.wav").symlink_to(tmp_path / "a.wav")
    path = {"fifo": tmp_path / "f.wav", "symlink loop": tmp_path / "a.wav"}.get(entry, entry)
    data = _corpus(tmp_path, wav, str(path))
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--workers", "0",
                   "--method", "mcadams", "--no-progress", timeout=60)
    _one_line_error(proc, contains="u2")
    assert not (tmp_path / "out").exists()


def test_a_kaldi_table_that_is_a_fifo_is_refused(tmp_path, wav):
    data = _corpus(tmp_path, wav, str(wav))
    (data / "utt2spk").unlink()
    os.mkfifo(data / "utt2spk")
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--workers", "0",
                   "--method", "mcadams", "--no-progress", timeout=60)
    _one_line_error(proc, contains="not a regular file")


# -- 12. untrusted text reaches the terminal escaped and short ---------------------------------------------

def test_identity_show_escapes_and_cuts_the_fields_of_the_file(tmp_path, good_identity):
    evil = "\x1b]0;pwned\x07\x1b[2J"
    body = {**good_identity, "gender": evil, "encoder": evil, "created_utc": "2" * 500_000,
            "strategy": {"name": evil, evil: evil}}
    path = _identity_file(tmp_path, json.dumps(body))
    proc = _rtanon("identity", "show", str(path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b]0;pwned" in proc.stdout  # shown, escaped
    assert len(proc.stdout) < 2000, len(proc.stdout)


def test_a_path_from_wav_scp_is_escaped_in_the_error_line(tmp_path, wav):
    data = _corpus(tmp_path, wav, str(tmp_path / "\x1b[31mred\x1b[0m.wav"))
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--workers", "0",
                   "--method", "mcadams", "--no-progress", timeout=60)
    _one_line_error(proc, contains="\\x1b[31mred")
    assert "\x1b" not in proc.stderr


# -- 7. an utterance id too long for the writer's temporary name is refused before the first output ---------

def test_an_utterance_id_too_long_for_the_temporary_name_is_refused_up_front(tmp_path, wav):
    long_id = "u" * 240  # "u….wav" fits in 255 bytes, ".u….wav.PID.XXXXXXXX.part" does not
    data = _corpus(tmp_path, wav, str(wav))
    (data / "wav.scp").write_text(f"a0 {wav}\n{long_id} {wav}\n")
    (data / "utt2spk").write_text(f"a0 s1\n{long_id} s1\n")
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--workers", "0",
                   "--method", "mcadams", "--no-progress", timeout=120)
    _one_line_error(proc, contains="file name too long")
    assert not (tmp_path / "out").exists()  # nothing written: a0 was not anonymized first


# -- 10. the control page checks every action and keeps nothing unchecked -----------------------------------

BAD_ACTIONS = [
    {"action": "devices", "input": {"a": 1}}, {"action": "devices", "output": [1]}, {"action": "devices", "input": 5},
    {"action": "devices", "monitor": "x" * 1000}, {"action": "devices", "input": "mic\x1b[2J"},
    {"action": "devices", "speaker": "x"}, {"action": "mute", "value": "false"}, {"action": "mute", "value": [[[]]]},
    {"action": "chunk_ms", "value": "20"}, {"action": "chunk_ms", "value": True}, {"action": "chunk_ms", "value": 7},
    {"action": "chunk_ms"}, {"action": "method", "value": {"x": 1}}, {"action": "method", "value": "nope"},
    {"action": "stop", "extra": 1}, {"action": [1]}, {"action": {"a": "b"}}, {}, [1, 2],
]


@pytest.fixture
def control(tmp_path):
    from rtanon.live.control import LiveControl, LiveSettings

    return LiveControl(LiveSettings(method="mcadams"), settings_file=tmp_path / "live-ui.json")


@pytest.mark.parametrize("message", BAD_ACTIONS, ids=[json.dumps(m)[:40] for m in BAD_ACTIONS])
def test_every_malformed_action_is_refused_in_one_line_and_nothing_is_saved(tmp_path, control, message):
    from rtanon.errors import UserError

    before = control.settings
    with pytest.raises(UserError) as err:
        control.act(message)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and len(str(err.value)) < 400
    assert control.settings == before and not (tmp_path / "live-ui.json").exists()


def test_a_valid_device_action_is_saved(tmp_path, control):
    control.act({"action": "devices", "input": "pulse:mic", "monitor": None})
    saved = json.loads((tmp_path / "live-ui.json").read_text())
    assert saved["input"] == "pulse:mic" and saved["monitor"] is None


@pytest.mark.parametrize("stored", [{"input": {"a": 1}}, {"output": 5}, {"chunk_ms": 20.5}, {"chunk_ms": True},
                                    {"method": ["mcadams"]}, [1], "[" * 50_000])
def test_saved_settings_of_the_wrong_type_give_the_defaults(tmp_path, stored):
    from rtanon.live.control import LiveSettings, load_settings

    path = tmp_path / "live-ui.json"
    path.write_text(stored if isinstance(stored, str) else json.dumps(stored))
    assert load_settings(path) == LiveSettings()


def test_the_server_answers_bad_json_with_400_and_a_dropped_handshake_in_one_line(control, capsys, caplog):
    import asyncio
    import logging

    import aiohttp

    from rtanon.ui.server import UiServer

    async def scenario():
        server = UiServer(control)
        await server.start()
        host = f"127.0.0.1:{server.port}"
        try:
            for _ in range(200):  # clients that go away during the WebSocket handshake (the 200)
                _, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write((f"GET /ws?token={server.token} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Version: 13\r\n\r\n").encode())
                await writer.drain()
                writer.transport.abort()
            await asyncio.sleep(0.5)
            answers = []
            async with aiohttp.ClientSession() as client:
                for body in ("[" * 100_000 + "]" * 100_000, json.dumps({"action": "mute", "value": {"a": [1]}})):
                    async with client.post(f"http://{host}/api/action?token={server.token}", data=body,
                                           headers={"Content-Type": "application/json"}) as resp:
                        answers.append((resp.status, await resp.json()))
            return answers
        finally:
            await server.stop()

    with caplog.at_level(logging.DEBUG):
        answers = asyncio.run(scenario())
    assert [status for status, _ in answers] == [400, 400], answers
    assert all("error" in body for _, body in answers)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    err = capsys.readouterr().err.splitlines()
    assert 1 <= len(err) <= 200 and all("closed its connection" in line for line in err), err  # one line each at most


# -- 11. Ctrl-C on the control page exits 130, as documented ---------------------------------------------

@pytest.mark.parametrize("command", [["ui"], ["live", "--ui", "--method", "mcadams"]])
def test_ctrl_c_on_the_control_page_exits_130(tmp_path, command):
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("aiohttp")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "PULSE_SERVER": "unix:/nonexistent/rtanon-test"}
    proc = subprocess.Popen([sys.executable, "-m", "rtanon", *command, "--no-browser"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "control page" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
        assert "control page" in line, (line, proc.poll())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
        proc.communicate()


# -- 6. a folder sweep removes only what a dead rtanon writer left ---------------------------------------

def test_a_folder_sweep_keeps_every_part_file_rtanon_did_not_leave(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours = tmp_path / f".u1.wav.{dead.pid}.abcd_123.part"  # what a writer killed with SIGKILL left
    others = [tmp_path / ".mydownload.part", tmp_path / ".notes.txt.part", tmp_path / ".x.wav.12ab.part",
              tmp_path / f".u2.wav.{os.getpid()}.abcd1234.part"]  # the last: a writer still running
    for p in [ours, *others]:
        p.write_bytes(b"x")
    assert atomic.remove_leftovers(tmp_path) == [ours]
    assert sorted(tmp_path.iterdir()) == sorted(others)


def test_anonymize_dir_keeps_a_users_part_files_in_an_existing_out(tmp_path, wav):
    data = _corpus(tmp_path, wav, str(wav))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".mydownload.part").write_text("x")
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(out), "--workers", "0", "--method", "mcadams",
                   "--no-progress", "--seed", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / ".mydownload.part").read_text() == "x"


# -- 2. --ray-address with no cluster there: one line, exit 2, in seconds --------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on return: nothing listens there


@pytest.mark.parametrize("address, contains", [("127.0.0.1:{port}", "no Ray cluster there"),
                                               ("garbage", "HOST:PORT"), ("host:99999", "HOST:PORT")])
def test_a_ray_address_with_no_cluster_is_a_usage_error_in_seconds(tmp_path, wav, address, contains):
    import time

    pytest.importorskip("ray")
    data = _corpus(tmp_path, wav, str(wav))
    t0 = time.monotonic()
    proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--method", "mcadams",
                   "--no-progress", "--ray-address", address.format(port=_free_port()), timeout=100)
    _one_line_error(proc, contains=contains)
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("server, contains", [("silent", "does not answer within"), ("http", "not Ray's")])
def test_a_ray_address_where_something_else_listens_is_a_usage_error_in_seconds(tmp_path, wav, server, contains):
    """A TCP server that is not Ray: Ray's client used to retry for minutes (past 120 s)."""
    import http.server
    import socket
    import threading
    import time

    pytest.importorskip("ray")
    data = _corpus(tmp_path, wav, str(wav))
    if server == "silent":  # the kernel accepts the connection; nothing ever answers on it
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port, stop = listener.getsockname()[1], listener.close
    else:
        quiet = type("Quiet", (http.server.BaseHTTPRequestHandler,), {"log_message": lambda *_: None})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), quiet)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_address[1]

        def stop():
            httpd.shutdown()
            httpd.server_close()
    try:
        t0 = time.monotonic()
        proc = _rtanon("anonymize-dir", "--data", str(data), "--out", str(tmp_path / "out"), "--method", "mcadams",
                       "--no-progress", "--ray-address", f"127.0.0.1:{port}", timeout=60)
        took = time.monotonic() - t0
    finally:
        stop()
    _one_line_error(proc, contains=contains)
    assert "no Ray cluster there" in proc.stderr
    assert took < 30, took  # the greeting waits 5 s at most; the rest is start-up
    assert not (tmp_path / "out").exists()


# -- 4. interrupting a Ray run: the documented status, one line, no temporary file left -----------------

def _start_a_long_ray_run(tmp_path, speech):
    """``anonymize-dir --workers 2`` on 16 two-minute utterances, in a session of its own, once a Ray worker
    writes its first output (a ``.part`` file): (the driver's Popen, OUT)."""
    import subprocess
    import sys
    import time

    long_wav = tmp_path / "long.wav"
    sf.write(long_wav, np.tile(speech, int(np.ceil(120 * RATE / speech.shape[0])))[: 120 * RATE], RATE)
    data = tmp_path / "data"
    data.mkdir()
    (data / "wav.scp").write_text("".join(f"u{i:02d} {long_wav}\n" for i in range(16)))
    (data / "utt2spk").write_text("".join(f"u{i:02d} s{i % 2}\n" for i in range(16)))
    (data / "spk2gender").write_text("s0 f\ns1 m\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "rtanon", "anonymize-dir", "--data", str(data), "--out", str(out),
                             "--workers", "2", "--batch", "1", "--method", "mcadams", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_dir() and any(p.name.endswith(".part") for p in out.iterdir()):
            break  # a worker is writing
        time.sleep(0.05)
    return proc, out


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_ray_run_exits_with_the_signals_status_and_leaves_no_part_file(tmp_path, speech, sig, code):
    import signal

    pytest.importorskip("ray")
    proc, out = _start_a_long_ray_run(tmp_path, speech)
    try:
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) <= 2 and "***" not in err and "Traceback" not in err, err
    assert [p.name for p in out.iterdir() if p.name.endswith(".part")] == []


def _start_time(pid: int) -> int | None:
    """Process ``pid``'s start time (clock ticks since boot); None when it is gone or a zombie."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _command(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "?"


def _still_running(recorded: dict[int, int]) -> list[str]:
    return [_command(pid) for pid, start in recorded.items() if _start_time(pid) == start]


@pytest.mark.slow
def test_ray_processes_go_within_seconds_when_the_driver_is_killed(tmp_path, speech):
    """kill -9 of the driver: the raylet's agents used to wait a minute for the dead GCS."""
    import signal
    import time

    pytest.importorskip("ray")
    proc, out = _start_a_long_ray_run(tmp_path, speech)
    recorded = {}
    try:
        assert proc.poll() is None, proc.communicate()
        deadline = time.monotonic() + 60  # the first .part can come before Ray names the second worker's process
        while True:
            recorded = {pid: _start_time(pid) for pid in _process_tree(proc.pid) - {proc.pid}}
            commands = " ".join(_command(pid) for pid in recorded)
            if commands.count("CorpusWorker") == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert commands.count("CorpusWorker") == 2 and "raylet" in commands and "gcs_server" in commands, commands
        assert "DashboardAgent" in commands and "RuntimeEnvAgent" in commands, commands
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        t0 = time.monotonic()
        while _still_running(recorded) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert _still_running(recorded) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid, start in recorded.items():
            if _start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)


_DRIVER = """
import os, subprocess, sys
from rtanon.corpus import ray_watchdog
before = ray_watchdog.children(os.getpid())
child = subprocess.Popen(["sh", "-c", "read go; sleep 60 <&- >&- 2>&- & echo $!; exec sleep 60 >&-"],
                         stdin=subprocess.PIPE, text=True)
dog = ray_watchdog.start({p: t for p, t in ray_watchdog.children(os.getpid()).items() if before.get(p) != t})
print(os.getpid(), flush=True)
child.stdin.write("go\\n")  # the child starts a grandchild now, after the watchdog
child.stdin.flush()
sys.stdin.readline()
ray_watchdog.stop(dog)
print("stopped", flush=True)
"""


@pytest.mark.parametrize("driver", ["killed", "stops it"])
def test_the_ray_watchdog_ends_what_a_killed_driver_started_and_nothing_after_a_stop(driver):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    recorded = {}
    try:
        assert int(proc.stdout.readline()) == proc.pid
        grandchild = int(proc.stdout.readline())
        time.sleep(1.0)  # the watchdog records the grandchild
        recorded = {pid: _start_time(pid) for pid in _process_tree(proc.pid) - {proc.pid}}
        commands = sorted(_command(pid) for pid in recorded)
        assert grandchild in recorded and len(recorded) == 3 and "ray_watchdog" in commands[0], commands
        if driver == "killed":
            proc.kill()
            proc.communicate()
            t0 = time.monotonic()
            while _still_running(recorded) and time.monotonic() - t0 < 5:
                time.sleep(0.05)
            assert _still_running(recorded) == []
        else:
            assert proc.communicate("\n", timeout=30)[0] == "stopped\n"
            time.sleep(1.0)
            assert _still_running(recorded) == ["sleep 60 ", "sleep 60 "]  # the child and grandchild
    finally:
        proc.kill()
        proc.communicate()
        for pid, start in recorded.items():
            if _start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("option", ["--vocoder", "--content", "--pool"])
def test_a_model_file_that_is_a_fifo_is_refused_at_once(tmp_path, wav, option):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    if option == "--pool":
        args = ["identity", "new", "--pool", str(fifo), "--out", str(tmp_path / "x.json")]
    else:
        pytest.importorskip("onnxruntime")
        args = ["file", str(wav), str(tmp_path / "o.wav"), "--method", "neural", option, str(fifo)]
    _one_line_error(_rtanon(*args, timeout=60), contains="not a regular file")


# -- 5. the local Ray listens on 127.0.0.1 only -----------------------------------------------------------

def _process_tree(root: int) -> set[int]:
    parents = {}
    for stat_file in os.listdir("/proc"):
        if stat_file.isdigit():
            try:
                fields = open(f"/proc/{stat_file}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat_file)] = int(fields[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def test_the_local_ray_listens_on_loopback_only():
    import re
    import shutil
    import subprocess
    import sys

    pytest.importorskip("ray")
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2)")
    script = ("from rtanon.corpus.on_ray import start_ray, stop_ray\nstart_ray(None, 1)\nprint('READY', flush=True)\n"
              "input()\nstop_ray()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        tree = _process_tree(proc.pid)
        listening = []
        for line in subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout.splitlines():
            pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
            if pids & tree:
                listening.append(line.split()[3])
    finally:
        proc.communicate("\n", timeout=120)
    assert len(listening) >= 3, listening  # the GCS, the raylet, this driver at least
    loopback = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")
    assert all(address.startswith(loopback) for address in listening), listening


def test_a_failed_utterances_error_is_escaped_in_the_run_report(tmp_path, wav, speech):
    bad = tmp_path / "bad\x1b[31m.flac"  # decodable header, corrupt frames: fails while it is anonymized
    sf.write(bad, speech[: 2 * RATE], RATE)
    data = bytearray(bad.read_bytes())
    data[2000:-100] = b"\xff" * (len(data) - 2100)
    bad.write_bytes(bytes(data))
    proc = _rtanon("anonymize-dir", "--data", str(_corpus(tmp_path, wav, str(bad))), "--out", str(tmp_path / "out"),
                   "--workers", "0", "--method", "mcadams", "--no-progress", timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "u2" in proc.stderr and "\\x1b[31m" in proc.stderr and "\x1b" not in proc.stderr


# -- 13. messages that say what is wrong -------------------------------------------------------------------

def test_a_byte_order_mark_in_a_kaldi_table_is_not_part_of_the_first_key(tmp_path, wav):
    """Windows editors start UTF-8 files with a BOM; the first utterance id must still be 'u1'."""
    from rtanon.io.kaldi import KaldiDir

    data = tmp_path / "bom"
    data.mkdir()
    (data / "wav.scp").write_bytes(f"\ufeffu1 {wav}\n".encode("utf-8"))
    (data / "utt2spk").write_bytes("\ufeffu1 s1\n".encode("utf-8"))
    (data / "spk2gender").write_bytes("\ufeffs1 f\n".encode("utf-8"))
    kd = KaldiDir.load(data)
    assert list(kd.wav) == ["u1"] and kd.utt2spk == {"u1": "s1"} and kd.spk2gender == {"s1": "f"}


def test_a_format_version_of_the_wrong_type_says_so(tmp_path, wav, good_identity):
    path = _identity_file(tmp_path, json.dumps({**good_identity, "format_version": "1"}))
    _one_line_error(_file_with_identity(wav, tmp_path, path),
                    contains="'format_version' must be the JSON number 1, not a str")
