"""The clients of ``rtanon serve``: ``rtanon connect`` (the live loop with a RemoteSession) and the page at ``/``.

Against a real server started in the test (test_serve's ``Running``): the live loop's fake device clock
(as in test_live_core), a private PulseAudio daemon for ``rtanon connect`` itself, and headless Debian
chromium with a fake microphone reading real speech for the page. What comes back must be the pseudo-voice
(speech present, no raw copy), comfort noise while the server is away, and the client must run without
any model runtime."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from rtanon.eval.signal import envelope_delay_s, max_xcorr  # noqa: E402
from rtanon.io.audio import read_audio  # noqa: E402
from rtanon.config import AnonymizerConfig, McAdamsConfig  # noqa: E402
from rtanon.live.core import LiveCore  # noqa: E402
from rtanon.live.config import LiveConfig
from rtanon.serve.remote import RemoteConfig, RemoteSession  # noqa: E402
from rtanon.eval.signal import windowed_max_xcorr as raw_voice_score  # noqa: E402
from test_serve import TOKEN, Running  # noqa: E402

RATE = 16000
#: where this process imports rtanon from (the source tree, or the installed package with its built extension):
#: the children import the same one
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("rtanon").__file__)))
#: what a thin client must not load: the model runtimes
MODEL_RUNTIMES = ("onnxruntime", "onnx", "torch", "numba", "sklearn")
#: a prelude that makes importing any of MODEL_RUNTIMES fail, and lists the attempts at exit
BLOCK_MODELS = f"""
import atexit, sys
attempts = []
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {MODEL_RUNTIMES!r}:
            attempts.append(name)
            raise ImportError("blocked by the test: a thin client must not need " + name)
sys.meta_path.insert(0, _Block())
atexit.register(lambda: print("MODEL IMPORTS:", sorted(set(attempts)), file=sys.stderr, flush=True))
"""


def env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}


#: McAdams voices from the lower part of the shipped range: the raw-voice check below scores them up to about
#: 0.65 on a half-second (at alpha 0.9, the top of the range, up to 0.85: too close to a copy's 1 to tell)
PINNED = AnonymizerConfig(method="mcadams", mcadams=McAdamsConfig(alpha_min=0.75, alpha_max=0.8))


@pytest.fixture(scope="module")
def server():
    running = Running("mcadams", base=PINNED)
    yield running
    running.stop()


def check_pseudo_voice(x: np.ndarray, y: np.ndarray) -> None:
    """Speech came back and it is not the input, however it is delayed (up to 0.5 s): test_serve's
    check_anonymized with the connect client's longer delay."""
    assert np.sqrt(np.mean(y**2)) > 0.01
    assert raw_voice_score(x, y, max_lag_s=0.5) < 0.8
    copy = np.concatenate([np.zeros(int(0.3 * RATE), np.float32), x])[: len(y)]
    assert raw_voice_score(x, copy, max_lag_s=0.5) > 0.95  # the check finds a raw copy


def drive(core: LiveCore, x: np.ndarray, block: int = 160, at=()) -> np.ndarray:
    """Feeds ``x`` in ``block``-sample input callbacks at real-time pace and pulls as many output samples
    (a fake device clock, as test_live_core's); ``at``: (seconds into x, callable) run on the way."""
    out, todo = [], sorted(at, key=lambda a: a[0])
    t_next = time.monotonic()
    core.start()
    try:
        for i in range(0, x.shape[0] - block + 1, block):
            while todo and i >= todo[0][0] * RATE:
                todo.pop(0)[1]()
                t_next = time.monotonic()  # what ran took device time: the clock goes on from now
            core.on_input(np.ascontiguousarray(x[i:i + block]))
            buf = np.empty(block, np.float32)
            core.on_output(buf)
            out.append(buf)
            t_next += block / RATE
            time.sleep(max(0.0, t_next - time.monotonic()))
    finally:
        core.stop()
    return np.concatenate(out)


def test_connect_loop_plays_the_pseudo_voice_behind_its_stated_delay(server, speech_paths):
    from rtanon import Anonymizer

    x = np.concatenate([read_audio(p) for p in speech_paths[:2]])
    remote = RemoteSession(server.url, TOKEN, {"method": "mcadams"}).open()
    try:
        y = drive(LiveCore(remote, RATE, RATE), x)
    finally:
        remote.close()
    check_pseudo_voice(x[: len(y)], y)
    stats = remote.stats()
    assert remote.ready["method"] == "mcadams" and remote.voice["method"] == "mcadams"
    assert remote.counters.chunks >= len(y) // 320 - 2 and remote.counters.speech_chunks > 50
    assert stats["missed_deadlines"] <= 0.1 * stats["frames"] and stats["unsent"] == 0, stats
    # the delay the status line states (server + pipeline + the live loop's jitter queue) is the one heard
    local = Anonymizer(PINNED).open_session(seed=1)
    y_local = drive(LiveCore(local, RATE, RATE), x[: 6 * RATE])
    heard = envelope_delay_s(x[: len(y)], y, max_delay_s=0.5)
    heard_local = envelope_delay_s(x[: len(y_local)], y_local, max_delay_s=0.5)
    stated = remote.algorithmic_latency_samples / RATE + LiveConfig().jitter_ms / 1000  # + the queue's margin
    print(f"\nconnect: heard {1000 * heard:.0f} ms behind the input (stated {1000 * stated:.0f}; local live "
          f"{1000 * heard_local:.0f}: added {1000 * (heard - heard_local):.0f} ms); round trip p50 "
          f"{stats['round_trip_ms_p50']} ms p99 {stats['round_trip_ms_p99']} ms; missed {stats['missed_deadlines']} "
          f"of {stats['frames']}")
    assert remote.algorithmic_latency_samples == remote.ready["latency_ms"] * 16 + 4 * 320
    assert abs(heard - stated) < 0.03
    assert 0.06 <= heard - heard_local <= 0.12  # the pipeline's 80 ms, give or take the estimate


def test_server_away_plays_comfort_noise_and_the_client_reconnects(speech_paths):
    x = np.concatenate([read_audio(p) for p in speech_paths[2:5]])[: 14 * RATE]
    first = Running("mcadams", base=PINNED)
    port = first.port
    servers = [first]
    remote = RemoteSession(first.url, TOKEN, {"method": "mcadams"}, RemoteConfig(retry_max_s=0.5)).open()
    voice = remote.ready["voice"]
    marks = {}

    def stop():
        marks["stopped"] = time.monotonic()
        servers[0].stop()

    def restart():
        marks["down_seen"] = not remote.connected and "DOWN" in remote.status()
        servers.append(Running("mcadams", port=port, base=PINNED))

    try:
        y = drive(LiveCore(remote, RATE, RATE), x, at=[(4.0, stop), (8.0, restart)])
    finally:
        remote.close()
        servers[-1].stop()
    stats = remote.stats()
    assert marks["down_seen"] and stats["reconnects"] == 1 and stats["unsent"] > 100, stats
    assert stats["missed_deadlines"] >= stats["unsent"]
    away = y[int(4.3 * RATE):int(8.0 * RATE)]  # after the frames in flight, until the restart
    assert np.sqrt(np.mean(away**2)) < 10 ** (-60 / 20)  # comfort noise (-66 dBFS), no voice
    assert np.sqrt(np.mean(away**2)) > 10 ** (-72 / 20)  # and not a dead line
    check_pseudo_voice(x[: int(4 * RATE)], y[: int(4 * RATE)])
    back = slice(int(10 * RATE), len(y))  # the new session: a voice again, a fresh one
    check_pseudo_voice(x[back], y[back])
    assert remote.ready["voice"] != voice
    assert raw_voice_score(x[: len(y)], y, max_lag_s=0.5) < 0.8


def rtanon_connect(*args, prelude: str = "", timeout: float = 60, **popen):
    code = prelude + "\nimport sys\nfrom rtanon.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "connect", *args], capture_output=True, text=True,
                          timeout=timeout, **{"env": env(), **popen})


def test_connect_errors_are_one_line_and_its_help_teaches(server, tmp_path):
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("w" * 32 + "\n")
    identity = tmp_path / "id.json"
    identity.write_text("{}")
    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        free = f"ws://127.0.0.1:{sock.getsockname()[1]}"
    cases = [
        (("--server", free, "--token-file", str(good)), "cannot reach"),
        (("--server", server.url, "--token-file", str(wrong)), "refused the token"),
        (("--server", server.url, "--token-file", str(tmp_path / "none")), "no such file"),
        (("--server", "ftp://x", "--token-file", str(good)), "use ws://HOST:PORT"),
        (("--server", server.url + "?token=x", "--token-file", str(good)), "not in the URL"),
        (("--server", server.url, "--token-file", str(good), "--pipeline-ms", "30"), "multiple of 20"),
        (("--server", server.url, "--token-file", str(good), "--identity", str(identity)), "needs 'embedding'"),
        (("--server", server.url, "--token-file", str(good), "--method", "mcadams", "--identity", str(identity)),
         "does not go with --method mcadams"),
    ]
    for args, says in cases:
        r = rtanon_connect(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (args, r.stderr)
        assert lines[0].startswith("rtanon connect: error: ")
    assert server.said("refused: missing or wrong token")
    help_text = rtanon_connect("--help").stdout
    for needed in ("--server", "--token-file", "--pipeline-ms", "comfort noise", "rtanon serve --host", "Example"):
        assert needed in help_text


def test_connect_client_needs_no_model_runtime(server, speech_paths):
    """The whole client path (CLI, RemoteSession, the live loop) in a process where importing ONNX Runtime,
    torch, numba or scikit-learn fails, and speech still comes back anonymized."""
    script = BLOCK_MODELS + f"""
import numpy as np
import rtanon.commands.connect, rtanon.cli
from rtanon.io.audio import read_audio
from rtanon.live.core import LiveCore
from rtanon.serve.remote import RemoteSession
rtanon.cli.build_parser()
x = read_audio({str(speech_paths[5])!r})[: 3 * 16000]
remote = RemoteSession({server.url!r}, {TOKEN!r}, {{"method": "mcadams"}}).open()
core = LiveCore(remote, 16000, 16000)
core.start()
out = []
t0 = __import__("time").monotonic()
for i in range(0, len(x) - 159, 160):
    core.on_input(np.ascontiguousarray(x[i:i + 160]))
    buf = np.empty(160, np.float32)
    core.on_output(buf)
    out.append(buf)
    __import__("time").sleep(max(0.0, t0 + (i + 160) / 16000 - __import__("time").monotonic()))
core.stop()
remote.close()
y = np.concatenate(out)
print("speech frames", remote.counters.speech_chunks, "rms", float(np.sqrt(np.mean(y ** 2))))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env())
    assert r.returncode == 0, r.stderr
    assert "MODEL IMPORTS: []" in r.stderr
    speech_frames = int(r.stdout.split()[2])
    assert speech_frames > 20 and float(r.stdout.split()[-1]) > 0.01, r.stdout
    # the blocker works: the engine's neural method does import a runtime
    probe = subprocess.run([sys.executable, "-c", BLOCK_MODELS + "\nfrom rtanon import Anonymizer\nAnonymizer()"],
                           capture_output=True, text=True, timeout=60, env=env())
    assert probe.returncode != 0 and "blocked by the test" in probe.stderr


# -- rtanon connect between real devices (a private PulseAudio daemon) ---------------------------------------

@pytest.mark.pulse
def test_connect_through_the_virtual_microphone_then_ctrl_c(server, tmp_path, speech_paths):
    for tool in ("pulseaudio", "pactl", "parec", "paplay"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (apt-get install pulseaudio pulseaudio-utils libasound2-plugins)")
    import soundfile as sf

    from rtanon.live.pulse import PulseDaemon

    speech = read_audio(speech_paths[6])
    pad = np.zeros(RATE // 2, np.float32)
    played = np.concatenate((pad, speech, pad))
    wav = tmp_path / "mic.wav"
    sf.write(wav, played, RATE)
    (tmp_path / "token").write_text(TOKEN + "\n")
    with PulseDaemon() as daemon:
        e = {**daemon.env, "PYTHONPATH": env()["PYTHONPATH"]}
        probe = subprocess.run([sys.executable, "-c", "import sounddevice as sd; print(sd.query_devices())"],
                               env=e, capture_output=True, text=True)
        if "pulse" not in probe.stdout:
            pytest.skip("PortAudio does not list the ALSA 'pulse' device: install libasound2-plugins")
        daemon.load_null_sink("fake_mic", RATE)
        assert subprocess.run([sys.executable, "-m", "rtanon", "virtual-device", "create"], env=e,
                              capture_output=True).returncode == 0
        code = BLOCK_MODELS + "\nimport sys\nfrom rtanon.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        proc = subprocess.Popen([sys.executable, "-c", code, "connect", "--server", server.url, "--token-file",
                                 str(tmp_path / "token"), "--input", "pulse:fake_mic.monitor", "--output", "rtanon",
                                 "--method", "mcadams"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            for line in proc.stderr:
                if "rtanon connect: running" in line:
                    break
            else:
                raise AssertionError(f"rtanon connect exited early: {proc.wait()} {proc.stdout.read()}")
            rec = subprocess.Popen(["parec", "--device=rtanon_mic", "--format=float32le", f"--rate={RATE}",
                                    "--channels=1", "--latency-msec=20", "--raw", str(tmp_path / "anon.raw")], env=e)
            deadline = time.monotonic() + 30
            while not ((tmp_path / "anon.raw").exists() and (tmp_path / "anon.raw").stat().st_size > 0):
                assert time.monotonic() < deadline, "parec did not start recording"
                time.sleep(0.05)
            subprocess.run(["paplay", "--device=fake_mic", str(wav)], env=e, check=True, timeout=60)
            time.sleep(1.5)  # the delayed tail
            rec.terminate()
            rec.wait(10)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    anon = np.fromfile(tmp_path / "anon.raw", np.float32)
    assert proc.returncode == 130, err
    assert "rtanon connect: interrupted" in err and "MODEL IMPORTS: []" in err
    assert "stopped:" in out and "reconnects 0" in out, out
    assert np.sqrt(np.mean(anon**2)) > 0.01  # the voice came through the virtual microphone
    assert max_xcorr(speech, anon) < 0.5 < max_xcorr(speech, speech)
    assert server.said("started (mcadams)")


# -- the page at / in headless chromium --------------------------------------------------------------------

def fetch(url: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_page_needs_the_token_and_is_served_under_a_strict_policy(server):
    base = f"http://127.0.0.1:{server.port}"
    status, _, text = fetch(base + "/")
    assert status == 401 and "open /?token=TOKEN" in text
    assert fetch(base + "/?token=guess")[0] == 401
    assert server.said("page refused: missing or wrong token")
    status, headers, html = fetch(f"{base}/?token={TOKEN}")
    assert status == 200 and 'src="/static/app.js"' in html and TOKEN not in html
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe" not in csp and "http" not in csp.replace(f"ws://127.0.0.1:{server.port}", "")
    assert headers["Referrer-Policy"] == "no-referrer" and headers["X-Frame-Options"] == "DENY"
    for name, kind in (("app.js", "text/javascript"), ("worklet.js", "text/javascript"), ("style.css", "text/css")):
        status, headers, _ = fetch(f"{base}/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
    assert fetch(f"{base}/static/../server.py")[0] == 404 and fetch(f"{base}/static/index.html")[0] == 404


@pytest.fixture(scope="module")
def chromium(tmp_path_factory, speech_paths):
    pytest.importorskip("selenium", reason="the browser tests need selenium (the [test] extra)")
    binary, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_bin is None:
        pytest.skip("needs Debian's chromium and chromium-driver (./setup.sh test installs them)")
    import soundfile as sf
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    speech = np.concatenate([read_audio(p) for p in speech_paths[:3]])  # about 12 s, looped by chromium
    wav = tmp_path_factory.mktemp("mic") / "so762.wav"
    sf.write(wav, speech, RATE, subtype="PCM_16")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-extensions", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        yield driver, speech
    finally:
        driver.quit()


def decode(rows) -> dict[int, np.ndarray]:
    return {seq: np.frombuffer(base64.b64decode(b), "<i2").astype(np.float32) / 32768 for seq, b in rows}


def test_page_streams_the_microphone_and_plays_the_pseudo_voice(server, chromium):
    driver, speech = chromium
    driver.get(f"http://127.0.0.1:{server.port}/?token={TOKEN}")
    driver.find_element("id", "start").click()

    def page():
        return driver.execute_script("const p = window.rtanon; return {state: p.state, error: p.error, sent: p.sent, "
                                     "received: p.received, played: p.played, gaps: p.gaps, rate: p.contextRate}")

    deadline = time.monotonic() + 40
    while page()["received"] < 400:  # 8 s back from the server
        assert time.monotonic() < deadline and page()["state"] != "stopped", page()
        time.sleep(0.25)
    p = page()
    dump = driver.execute_script("return window.rtanon.dump()")
    sent, got = decode(dump["sent"]), decode(dump["received"])
    seqs = [s for s in sorted(sent) if s in got]
    assert len(seqs) >= 390 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every frame answered in order
    x, y = np.concatenate([sent[s] for s in seqs]), np.concatenate([got[s] for s in seqs])
    print(f"\npage: context {p['rate']} Hz, {p['sent']} frames sent, {p['received']} received, {p['played']} "
          f"played, {p['gaps']} playback gaps")
    # the page captured the speech file, resampled to 16 kHz: some second of it matches the file (on a loaded
    # machine chromium's fake microphone skips samples now and then, and a 2 s window once read 0.64)
    captured = max(max_xcorr(x[k * RATE:(k + 1) * RATE], speech) for k in range(1, 7))
    assert captured > 0.8, captured
    check_pseudo_voice(x, y)
    assert p["played"] >= 0.8 * p["received"] - 50  # the answers went to the speakers
    assert "running" in driver.find_element("id", "state").text
    assert "mcadams" in driver.find_element("id", "voice").text
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]  # no CSP or script error
    before = len(server.lines())
    driver.find_element("id", "stop").click()
    assert driver.find_element("id", "state").text == "stopped"
    deadline = time.monotonic() + 5
    while not any(line.endswith("closed: bye") for line in server.lines()[before:]):
        assert time.monotonic() < deadline, server.lines()[before:]
        time.sleep(0.05)
