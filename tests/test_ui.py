"""The live control page against a real live session: `rtanon live --ui` between a private PulseAudio
daemon's fake microphone (playing real speech) and a fake call (a null sink we record with parec).

Without a browser: token, Origin and Host enforcement; status over the WebSocket; actions over HTTP and
WebSocket (mute within 100 ms, new voice changes the speaker embedding, switches never let the input
through). With Debian's chromium headless (selenium + chromium-driver): meters move, mute works from the
page, the token is enforced. Set RTANON_UI_SCREENSHOT=FILE.png to keep a screenshot of the page."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from rtanon.eval.signal import max_xcorr
from rtanon.live.control import LiveSettings
from test_live_control import leak_score

pytestmark = pytest.mark.pulse
pytest.importorskip("aiohttp", reason="the control page needs the [ui] extra (aiohttp)")
TOOLS = ("pulseaudio", "pactl", "parec", "paplay")
missing = [t for t in TOOLS if shutil.which(t) is None]
if missing:
    pytest.skip(f"needs {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils libasound2-plugins; "
                "./setup.sh test installs them unless PipeWire provides the sound server)", allow_module_level=True)

RATE = 16000
QUIET_DBFS = -50.0  # comfort noise sits at -66 dBFS, speech above -40


class Recorder:
    """parec on one source, each 10 ms block placed on the monotonic clock by its sample position:
    ``t = offset + samples so far / RATE``, with ``offset`` the least delayed arrival seen (so a
    recorder that the scheduler starves for a moment does not shift the blocks it then delivers)."""

    def __init__(self, env, source: str) -> None:
        self.blocks: list[tuple[float, int, np.ndarray]] = []  # (arrival, samples before it, block)
        self.proc = subprocess.Popen(["parec", f"--device={source}", "--format=float32le", f"--rate={RATE}",
                                      "--channels=1", "--latency-msec=10", "--raw"], env=env,
                                     stdout=subprocess.PIPE)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        fd, n, count = self.proc.stdout.fileno(), 160 * 4, 0
        buf = b""
        while True:
            data = os.read(fd, n - len(buf))
            if not data:
                return
            buf += data
            if len(buf) == n:
                self.blocks.append((time.monotonic(), count, np.frombuffer(buf, np.float32)))
                count += 160
                buf = b""

    def _timed(self):
        """(time the block's last sample was captured, block) for every block so far."""
        blocks = list(self.blocks)
        if not blocks:
            return []
        offset = min(arrival - (idx + 160) / RATE for arrival, idx, _ in blocks)
        return [(offset + (idx + 160) / RATE, b) for _, idx, b in blocks]

    def since(self, t0: float, t1: float = float("inf")) -> tuple[np.ndarray, np.ndarray]:
        """(capture times, levels in dBFS) of the blocks captured in [t0, t1)."""
        rows = [(t, 10 * np.log10(np.mean(np.square(b, dtype=np.float64)) + 1e-12))
                for t, b in self._timed() if t0 <= t < t1]
        return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])

    def audio(self, t0: float, t1: float = float("inf")) -> np.ndarray:
        blocks = [b for t, b in self._timed() if t0 <= t < t1]
        return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)

    def level_now(self, ms: int = 30) -> float:
        tail = [b for _, _, b in list(self.blocks)[-ms // 10:]]
        return float(10 * np.log10(np.mean(np.square(np.concatenate(tail), dtype=np.float64)) + 1e-12)) \
            if tail else -120.0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Live:
    """The running `rtanon live --ui` and what the tests need around it."""

    def __init__(self, daemon, proc, url, utterances, config_home) -> None:
        self.daemon, self.proc, self.url = daemon, proc, url
        self.origin, self.token = url.split("/?token=")
        self.utterances, self.config_home = utterances, config_home
        self.call = Recorder(daemon.env, "call.monitor")  # what the other side of the call hears
        self.mic = Recorder(daemon.env, "fake_mic.monitor")

    def request(self, path, body=None, token=True, headers=None):
        """(status, parsed JSON or text) of a GET, or of a POST when ``body`` is given."""
        sep = "&" if "?" in path else "?"
        url = self.origin + path + (f"{sep}token={self.token}" if token is True else
                                    f"{sep}token={token}" if token else "")
        req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def state(self) -> dict:
        status, s = self.request("/api/state")
        assert status == 200, s
        return s

    def act(self, **message) -> dict:
        status, reply = self.request("/api/action", message)
        assert status == 200, reply
        return reply["status"]

    def wait_for(self, predicate, timeout=20.0, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_speaking(self):
        """Blocks until the call carries the pseudo-voice (the output is loud now); on a time-out the
        message has what the live side says and how much the call's recorder got."""
        try:
            self.wait_for(lambda: self.call.level_now() > -35.0, what="speech in the call")
        except AssertionError as exc:
            s = self.state()
            keys = ("running", "down", "in_dbfs", "out_dbfs", "gate", "queue_ms", "xruns", "errors", "last_error")
            raise AssertionError(f"{exc}: {len(self.call.blocks)} blocks recorded from the call; live: "
                                 f"{ {k: s.get(k) for k in keys} }") from None


@pytest.fixture(scope="module")
def live(tmp_path_factory, speech_paths):
    from rtanon.io.audio import read_audio
    from rtanon.live.pulse import PulseDaemon

    tmp = tmp_path_factory.mktemp("ui")
    with PulseDaemon() as pd:
        probe = subprocess.run([sys.executable, "-c", "import sounddevice as sd; print(sd.query_devices())"],
                               env=pd.env, capture_output=True, text=True)
        if "pulse" not in probe.stdout:
            pytest.skip("PortAudio does not list the ALSA 'pulse' device: install libasound2-plugins")
        players, utterances = [], []
        for sink, path in (("fake_mic", speech_paths[0]), ("fake_mic2", speech_paths[1])):
            x = read_audio(path)
            utterances.append(x)
            gap = np.zeros(int(0.6 * RATE), np.float32)  # pauses: where a new voice may start
            wav = tmp / f"{sink}.wav"
            sf.write(wav, np.tile(np.concatenate((x, gap)), int(np.ceil(150 * RATE / (x.shape[0] + gap.shape[0])))),
                     RATE)
            pd.load_null_sink(sink, RATE)
            players.append(subprocess.Popen(["paplay", f"--device={sink}", str(wav)], env=pd.env))
        pd.load_null_sink("call", RATE)
        pd.load_null_sink("headphones", 48000)
        env = {**pd.env, "XDG_CONFIG_HOME": str(tmp / "config")}
        proc = subprocess.Popen([sys.executable, "-m", "rtanon", "live", "--ui", "--no-browser", "--input",
                                 "pulse:fake_mic.monitor", "--output", "pulse:call", "--method", "mcadams",
                                 "--seed", "7"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        url = None
        for line in proc.stderr:
            m = re.search(r"control page (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, f"rtanon live --ui printed no URL: {proc.wait()} {proc.stdout.read()}"
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
        session = Live(pd, proc, url, utterances, tmp / "config")
        try:
            yield session
        finally:
            session.call.close()
            session.mic.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for p in players:
                p.kill()
                p.wait()


async def _ws_collect(url, seconds, origin=None, send=None, until=None):
    """Status messages (and replies) received over ``seconds`` from the WebSocket at ``url``
    (or until a message of type ``until``)."""
    import aiohttp

    out = []
    headers = {"Origin": origin} if origin else {}
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers) as ws:
        if send is not None:
            await ws.send_json(send)
        t_end = time.monotonic() + seconds
        while (left := t_end - time.monotonic()) > 0:
            try:
                msg = await asyncio.wait_for(ws.receive(), timeout=left)
            except asyncio.TimeoutError:
                break
            if msg.type == aiohttp.WSMsgType.TEXT:
                out.append((time.monotonic(), json.loads(msg.data)))
                if until is not None and out[-1][1]["type"] == until:
                    break
    return out


def _ws_act(live, message) -> dict:
    """Sends one action over the WebSocket; returns the server's result message."""
    url = f"{live.origin.replace('http', 'ws')}/ws?token={live.token}"
    msgs = asyncio.run(_ws_collect(url, 3.0, origin=live.origin, send=message, until="result"))
    results = [m for _, m in msgs if m["type"] == "result"]
    assert results, "no result over the WebSocket"
    return results[0]


def _ws_refused(url, origin=None) -> int:
    import aiohttp

    async def attempt():
        try:
            await _ws_collect(url, 0.2, origin=origin)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        return 101
    return asyncio.run(attempt())


def test_token_origin_and_host_are_enforced(live):
    assert live.origin.startswith("http://127.0.0.1:")
    status, page = live.request("/")
    assert status == 200 and "rtanon live" in page and live.token in page
    for path in ("/", "/static/app.js", "/api/state", "/api/devices"):
        assert live.request(path, token=None)[0] == 403, path
        assert live.request(path, token="wrong-" + live.token)[0] == 403, path
        assert live.request(path, headers={"Origin": "http://evil.example"})[0] == 403, path
    assert live.request("/static/app.js")[0] == 200
    assert live.request("/api/state", headers={"Origin": live.origin})[0] == 200
    assert live.request("/api/state", headers={"Host": f"evil.example:{live.origin.rsplit(':', 1)[1]}"})[0] == 403
    # a refused action does nothing
    assert live.request("/api/action", {"action": "mute", "value": True}, token=None)[0] == 403
    assert live.request("/api/action", {"action": "mute", "value": True},
                        headers={"Origin": "http://evil.example"})[0] == 403
    assert live.state()["muted"] is False
    ws = live.origin.replace("http", "ws") + "/ws"
    assert _ws_refused(ws) == 403
    assert _ws_refused(f"{ws}?token=nope") == 403
    assert _ws_refused(f"{ws}?token={live.token}", origin="http://evil.example") == 403
    assert _ws_refused(f"{ws}?token={live.token}", origin=live.origin) == 101


def test_status_streams_at_10_hz_and_closing_the_page_keeps_the_audio(live):
    live.wait_speaking()
    msgs = asyncio.run(_ws_collect(f"{live.origin.replace('http', 'ws')}/ws?token={live.token}", 3.0,
                                   origin=live.origin))
    status = [m for _, m in msgs if m["type"] == "status"]
    times = np.array([m["t"] for m in status])
    rate = (len(times) - 1) / (times[-1] - times[0])
    print(f"\nWebSocket status updates: {rate:.2f} Hz over {times[-1] - times[0]:.1f} s")
    assert 8.0 <= rate <= 12.0
    ins, outs = np.array([m["in_dbfs"] for m in status]), np.array([m["out_dbfs"] for m in status])
    assert ins.max() > -35.0 and np.ptp(ins) > 10.0  # the input meter moves with the speech
    assert outs.max() > -35.0 and np.ptp(outs) > 10.0  # so does the output meter
    assert {m["gate"] for m in status} == {True, False}  # words and pauses
    last = status[-1]
    assert last["running"] and last["method"] == "mcadams" and last["voice"].startswith("McAdams")
    assert last["algorithmic_ms"] >= 20.0 and last["e2e_ms"] >= last["algorithmic_ms"]
    # the page (WebSocket) is closed now: the audio goes on
    time.sleep(0.5)
    assert live.state()["running"]
    t = time.monotonic()
    time.sleep(1.5)
    assert live.call.since(t)[1].max() > -35.0  # the pseudo-voice still reaches the call


def test_mute_silences_the_call_within_100_ms_and_unmute_brings_the_voice_back(live):
    delays, attempts = [], 0
    while len(delays) < 3:
        attempts += 1
        assert attempts <= 8, "the microphone kept pausing (or starving) right after each mute"
        live.wait_speaking()
        t0 = time.monotonic()
        assert live.act(action="mute", value=True)["muted"]
        time.sleep(0.6)
        live.act(action="mute", value=False)
        t, db = live.call.since(t0 - 0.1, t0 + 0.6)
        _, mic_db = live.mic.since(t0 + 0.1, t0 + 0.6)
        if mic_db.size == 0 or mic_db.max() < -35.0:
            continue  # the speaker paused: this trial would not show what mute does
        loud = np.flatnonzero((t > t0) & (db > QUIET_DBFS))
        delays.append(1000.0 * ((t[loud[-1]] - t0) if loud.size else 0.0))
        assert db[t > t0 + 0.1].max() < QUIET_DBFS  # quiet, although the microphone kept speaking
    print(f"\nmute-to-silence (last loud block of the call after the request): {np.round(delays, 1)} ms")
    # within 100 ms; a machine so loaded that the request itself waits (2 shared cores at load 8 gave
    # 1 trial in 20 over 150 ms, its HTTP round trip alone 165 ms) may delay one trial, not the median
    assert np.median(delays) < 100.0 and max(delays) < 300.0
    live.wait_speaking()  # the voice is back


def _embedding(encoder, x):
    return encoder.embed(np.ascontiguousarray(x, np.float32))


def test_new_voice_changes_the_speaker_embedding(live):
    pytest.importorskip("onnxruntime", reason="the neural method needs onnxruntime")
    pytest.importorskip("resemblyzer", reason="the speaker encoder needs resemblyzer")
    from rtanon.identity.encoder import make_encoder

    t_start = time.monotonic()
    loaded = {}

    def load():  # while the call is being recorded (its first embedding loads the rest)
        loaded["encoder"] = make_encoder("resemblyzer")
        loaded["encoder"].embed((0.1 * np.random.default_rng(0).standard_normal(RATE)).astype(np.float32))

    loader = threading.Thread(target=load)
    loader.start()
    voices, windows = [], []
    try:
        assert live.act(action="method", value="neural")["settings"]["method"] == "neural"
        live.wait_for(lambda: live.state()["method"] == "neural", what="the neural session")
        t_neural = time.monotonic()
        for _ in range(2):
            voices.append(live.state()["voice"])
            t0 = time.monotonic() + 0.5  # the call still plays the voice before for the output latency (~0.2 s)
            time.sleep(8.0)
            windows.append((t0, time.monotonic()))
            reply = live.act(action="new_voice")
            # pending until the next pause, or already swapped in if the worker met one before the reply
            assert reply["voice_pending"] or reply["voice"] != voices[-1], reply
            live.wait_for(lambda: not live.state()["voice_pending"], what="the new voice at a pause")
    finally:
        live.act(action="method", value="mcadams")  # frees the CPU for the encoder; the next test starts there
        loader.join()
    encoder = loaded["encoder"]
    t_record = time.monotonic()
    emb = [[_embedding(encoder, x) for x in np.array_split(live.call.audio(*w), 2)] for w in windows]
    (a1, a2), (b1, b2) = emb
    same = [float(a1 @ a2), float(b1 @ b2)]
    other = [float(a @ b) for a in (a1, a2) for b in (b1, b2)]
    print(f"\nspeaker cosine, same pseudo-voice {np.round(same, 3)}, after new voice {np.round(other, 3)}; "
          f"times: neural {t_neural - t_start:.1f} s, recording and loading the encoder "
          f"{t_record - t_neural:.1f} s, embedding {time.monotonic() - t_record:.1f} s")
    assert voices[0] != voices[1]
    assert np.mean(other) < np.mean(same) - 0.05


def test_the_privacy_point_is_picked_and_checked_like_the_method(live):
    """The page's privacy picker (`--privacy balanced|strong`): refused values change nothing and answer one
    line; a point picked under McAdams is kept and runs when the neural method is picked."""
    assert live.state()["settings"]["privacy"] == "balanced"
    for bad in ("loud", 2, None, "strong\nmore"):
        status, reply = live.request("/api/action", {"action": "privacy", "value": bad})
        assert status == 400 and "\n" not in reply["error"], reply
        assert "choose one of balanced, strong" in reply["error"] or "must be a string" in reply["error"], reply
    result = _ws_act(live, {"action": "privacy", "value": "loud"})
    assert "choose one of balanced, strong" in result["error"], result
    assert live.state()["settings"]["privacy"] == "balanced"
    s = live.act(action="privacy", value="strong")
    assert s["settings"]["privacy"] == "strong" and s["method"] == "mcadams"
    if importlib.util.find_spec("onnxruntime") is not None:
        live.act(action="method", value="neural")
        live.wait_for(lambda: live.state().get("privacy") == "strong", what="the strong vocoder")
        live.wait_speaking()
        live.act(action="method", value="mcadams")
    assert live.act(action="privacy", value="balanced")["settings"]["privacy"] == "balanced"


def test_switching_method_voice_and_devices_never_lets_the_input_through(live):
    import importlib.util

    neural = importlib.util.find_spec("onnxruntime") is not None
    t0 = time.monotonic()
    for step in ({"action": "method", "value": "mcadams"}, {"action": "new_voice"},
                 {"action": "chunk_ms", "value": 40}, {"action": "devices", "input": "pulse:fake_mic2.monitor"},
                 {"action": "devices", "monitor": "pulse:headphones"}, {"action": "method", "value": "neural"},
                 {"action": "chunk_ms", "value": 20}, {"action": "devices", "input": "pulse:fake_mic.monitor"},
                 {"action": "new_voice"}, {"action": "method", "value": "mcadams"}):
        if step.get("value") == "neural" and not neural:
            continue
        if step["action"] == "new_voice":  # through the WebSocket, as the page could
            assert _ws_act(live, step)["ok"]
        else:
            live.act(**step)
        time.sleep(0.7)
    # the monitor (headphones) plays the same anonymized voice
    phones = Recorder(live.daemon.env, "headphones.monitor")
    try:
        live.wait_for(lambda: phones.level_now() > -35.0, what="the voice in the monitor")
        time.sleep(1.0)
        monitored = phones.audio(0.0)
    finally:
        phones.close()
    for utt in live.utterances:
        assert leak_score(utt, monitored) < 0.95
    # stop: nothing reaches the call; start: the voice is back
    assert not live.act(action="stop")["running"]
    t_stop = time.monotonic()
    time.sleep(0.8)
    assert live.call.since(t_stop + 0.2)[1].max() < QUIET_DBFS
    assert live.act(action="start")["running"]
    # the rtanon virtual microphone, created from the page and fed with the voice
    assert live.request("/api/devices")[1]["virtual_mic"] is False
    live.act(action="create_virtual_mic")
    assert live.request("/api/devices")[1]["virtual_mic"] is True
    live.act(action="devices", output="rtanon")
    rtanon_mic = Recorder(live.daemon.env, "rtanon_mic")
    try:
        live.wait_for(lambda: rtanon_mic.level_now() > -35.0, what="the voice in the rtanon microphone")
        heard = rtanon_mic.audio(0.0)
    finally:
        rtanon_mic.close()
    live.act(action="devices", output="pulse:call")
    for utt in live.utterances:
        assert leak_score(utt, heard) < 0.95
    s = live.state()
    assert s["running"] and s["settings"]["input"] == "pulse:fake_mic.monitor" and s["chunk_ms"] == 20
    live.wait_speaking()
    call = live.call.audio(t0)
    assert call.shape[0] > 6 * RATE
    assert max_xcorr(live.utterances[0], live.mic.audio(t0)) > 0.6  # the detector finds a copy
    for utt in live.utterances:  # in the call: only the anonymized voice (McAdams alone: 0.16-0.39)
        assert max_xcorr(utt, call) < 0.5
        assert leak_score(utt, call) < 0.95  # not even 150 ms of raw input
    saved = json.loads((live.config_home / "rtanon" / "live-ui.json").read_text())
    assert saved == s["settings"] and saved["monitor"] == "pulse:headphones"
    assert set(saved) == {"input", "output", "monitor", "method", "privacy", "chunk_ms"}  # never a voice


def test_a_lost_output_is_reopened_when_it_comes_back(live):
    """The call's sink goes away (a headset unplugged) and comes back: the page says the output is lost,
    then the voice reaches the call again with no action, as with `rtanon live` (the same watcher)."""
    pd = live.daemon
    live.wait_speaking()
    module = next(line.split("\t")[0] for line in pd.pactl("list", "short", "modules").splitlines()
                  if "sink_name=call" in line)
    pd.pactl("unload-module", module)
    live.wait_for(lambda: "output" in live.state().get("down", ()), timeout=5.0, what="the output said lost")
    assert live.state()["running"]
    pd.load_null_sink("call", RATE)
    live.call.close()
    live.call = Recorder(pd.env, "call.monitor")
    live.wait_speaking()
    assert live.state()["down"] == []


# -- a real browser ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("selenium", reason="the browser tests need selenium (the [test] extra)")
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_bin is None:
        pytest.skip("needs Debian's chromium and chromium-driver (./setup.sh test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _both_moved(widths: set) -> bool:
    """More than 5 distinct widths of the input and of the output meter (10 updates a second)."""
    return len({w[0] for w in widths}) > 5 and len({w[1] for w in widths}) > 5


def test_page_meters_move_and_mute_works_from_the_page(live, browser):
    from selenium.webdriver.common.by import By

    browser.get(live.url)
    live.wait_for(lambda: (browser.execute_script("return window.rtanon && window.rtanon.updates") or 0) > 5,
                  what="status in the page")
    # a test before this one may have just reopened the output (device switch): PulseAudio holds a fresh
    # stream up to 1.5 s before it flows, and the output meter stands still until then (two CI runs)
    live.wait_speaking()
    u0, t0 = browser.execute_script("return window.rtanon.updates"), time.monotonic()
    widths = set()
    while time.monotonic() - t0 < 2.0 or (time.monotonic() - t0 < 6.0 and not _both_moved(widths)):
        widths.add((browser.find_element(By.ID, "in-bar").get_attribute("style"),
                    browser.find_element(By.ID, "out-bar").get_attribute("style")))
        time.sleep(0.05)
    rate = (browser.execute_script("return window.rtanon.updates") - u0) / (time.monotonic() - t0)
    print(f"\npage updates: {rate:.2f} Hz over {time.monotonic() - t0:.1f} s")
    assert 7.0 <= rate <= 13.0
    assert _both_moved(widths), widths
    assert "anonymizing" in browser.find_element(By.ID, "state").text
    if os.environ.get("RTANON_UI_SCREENSHOT"):
        live.wait_speaking()
        time.sleep(0.3)
        browser.save_screenshot(os.environ["RTANON_UI_SCREENSHOT"])
    live.wait_speaking()
    t_click = time.monotonic()
    browser.find_element(By.ID, "mute").click()
    live.wait_for(lambda: live.state()["muted"], timeout=2.0, what="mute from the page")
    t_muted = time.monotonic()  # the click went through chromedriver, the page's fetch and the server
    time.sleep(0.5)
    t, db = live.call.since(t_muted + 0.1)
    assert t.size and db.max() < QUIET_DBFS  # comfort noise only
    loud = np.flatnonzero(live.call.since(t_click)[1] > QUIET_DBFS)
    print(f"page click to last loud block of the call: "
          f"{1000 * (live.call.since(t_click)[0][loud[-1]] - t_click) if loud.size else 0:.0f} ms "
          f"(the server reported muted after {1000 * (t_muted - t_click):.0f} ms)")
    live.wait_for(lambda: browser.find_element(By.ID, "mute").text == "Unmute", timeout=2.0, what="the button")
    browser.find_element(By.ID, "mute").click()
    live.wait_for(lambda: not live.state()["muted"], timeout=2.0, what="unmute from the page")
    live.wait_speaking()


def test_page_without_the_token_is_refused(live, browser):
    for url in (live.origin + "/", live.origin + "/?token=guess"):
        browser.get(url)
        assert "token" in browser.find_element("tag name", "body").text
        assert browser.execute_script("return typeof window.rtanon") == "undefined"


def test_ctrl_c_stops_the_audio_and_rtanon_ui_starts_with_the_last_settings(live):
    saved = live.state()["settings"]
    voice = live.state()["voice"]
    live.proc.send_signal(signal.SIGINT)
    out, _ = live.proc.communicate(timeout=30)
    assert live.proc.returncode == 130  # Ctrl-C, as documented (cli.EXIT_CODES)
    assert "stopped:" in out and "stage errors 0" in out
    env = {**live.daemon.env, "XDG_CONFIG_HOME": str(live.config_home)}
    ui = subprocess.Popen([sys.executable, "-m", "rtanon", "ui", "--no-browser"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in ui.stderr:
            m = re.search(r"control page (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            if m:
                live.origin, live.token = m.group(1).split("/?token=")
                break
        state = live.state()
        assert state["running"] and state["settings"] == saved
        # a fresh pseudo-voice: the file holds the devices, method and chunk size and nothing of a voice
        # (comparing the two voices' labels would fail on a chance draw: McAdams' shows 3 decimals)
        stored = json.loads((live.config_home / "rtanon" / "live-ui.json").read_text())
        assert set(stored) == {f.name for f in dataclasses.fields(LiveSettings)}
        assert state["voice"] and voice
    finally:
        ui.send_signal(signal.SIGINT)
        ui.communicate(timeout=30)
    assert ui.returncode == 130
