"use strict";
// The rtanon serve page: the microphone (getUserMedia) -> rtanon-capture (16 kHz, 20 ms frames) -> the
// server's /ws with sequence numbers (rtanon.serve.protocol) -> its answers -> rtanon-player -> speakers.
// window.rtanon holds the counters (frames sent, received, played; playback gaps); dump() returns the last
// 30 s sent and received, PCM16 by sequence number (for tests and checks).

const FRAME = 320;
const KEEP_FRAMES = 1500;  // 30 s of what was sent and received, for dump()
const token = new URLSearchParams(location.search).get("token") || "";
const $ = (id) => document.getElementById(id);

const page = {
  state: "stopped", ready: null, error: "", sent: 0, received: 0, played: 0, gaps: 0, contextRate: 0,
  keptSent: new Map(), keptReceived: new Map(),
  dump() {
    const b64 = (pcm) => btoa(String.fromCharCode(...new Uint8Array(pcm.buffer)));
    const rows = (m) => Array.from(m, ([seq, pcm]) => [seq, b64(pcm)]);
    return {sent: rows(this.keptSent), received: rows(this.keptReceived)};
  },
};
window.rtanon = page;
let ctx = null, mic = null, ws = null, seq = 0;

function keep(map, key, pcm) {
  map.set(key, pcm);
  if (map.size > KEEP_FRAMES) map.delete(map.keys().next().value);
}

function show() {
  $("state").textContent = page.state + (page.error ? ": " + page.error : "");
  const r = page.ready;
  $("voice").textContent = r ? JSON.stringify(r.voice) : "\u2013";
  $("latency").textContent = r ? `${r.latency_ms.toFixed(0)} ms on the server (${r.method})` : "\u2013";
  $("frames").textContent = `${page.sent} / ${page.received}`;
  $("gaps").textContent = String(page.gaps);
  $("start").disabled = page.state !== "stopped";
  $("stop").disabled = page.state === "stopped";
}

function toPcm16(x) {
  const pcm = new Int16Array(x.length);
  for (let i = 0; i < x.length; i++) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(x[i] * 32767)));
  return pcm;
}

async function start() {
  page.error = "";
  page.state = "starting";
  show();
  try {
    ctx = new AudioContext({latencyHint: "interactive"});
    page.contextRate = ctx.sampleRate;
    await ctx.audioWorklet.addModule("/static/worklet.js");
    mic = await navigator.mediaDevices.getUserMedia(
      {audio: {channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false}});
  } catch (err) {
    stop(`no microphone (${err.name || err})`);
    return;
  }
  const capture = new AudioWorkletNode(ctx, "rtanon-capture", {numberOfInputs: 1, numberOfOutputs: 0});
  const player = new AudioWorkletNode(ctx, "rtanon-player", {numberOfInputs: 0, outputChannelCount: [1]});
  player.port.onmessage = (e) => { page.gaps = e.data.gaps; page.played = e.data.played; };
  ctx.createMediaStreamSource(mic).connect(capture);
  player.connect(ctx.destination);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${scheme}//${location.host}/ws?token=${encodeURIComponent(token)}`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => ws.send(JSON.stringify({type: "start"}));
  ws.onmessage = (e) => {
    if (typeof e.data === "string") {
      const msg = JSON.parse(e.data);
      if (msg.type === "ready") { page.ready = msg; page.state = "running"; show(); }
      return;
    }
    const view = new DataView(e.data);
    const n = view.getUint32(0, true);
    const pcm = new Int16Array(e.data.slice(4));
    keep(page.keptReceived, n, pcm);
    const y = new Float32Array(FRAME);
    for (let i = 0; i < FRAME; i++) y[i] = pcm[i] / 32768;
    player.port.postMessage(y, [y.buffer]);
    page.received++;
  };
  ws.onclose = (e) => { if (page.state !== "stopped") stop(`the server closed the session (${e.code} ${e.reason})`); };
  capture.port.onmessage = (e) => {
    if (page.state !== "running" || ws.readyState !== WebSocket.OPEN) return;
    const pcm = toPcm16(e.data);
    const msg = new Uint8Array(4 + 2 * FRAME);
    new DataView(msg.buffer).setUint32(0, seq >>> 0, true);
    msg.set(new Uint8Array(pcm.buffer), 4);
    ws.send(msg);
    keep(page.keptSent, seq >>> 0, pcm);
    seq++;
    page.sent++;
  };
  show();
}

function stop(why) {
  page.state = "stopped";
  page.error = typeof why === "string" ? why : "";
  if (ws) {
    if (ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify({type: "bye"})); ws.close(1000); }
    ws = null;
  }
  if (mic) { mic.getTracks().forEach((t) => t.stop()); mic = null; }
  if (ctx) { ctx.close(); ctx = null; }
  show();
}

$("start").addEventListener("click", start);
$("stop").addEventListener("click", () => stop());
setInterval(show, 250);
show();
