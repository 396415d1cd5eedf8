// rtanon live control page: status over a WebSocket (about 10 Hz), actions as JSON POSTs.
// Every request carries the token of this page's URL; the server refuses any other.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const q = "token=" + encodeURIComponent(token);
const $ = (id) => document.getElementById(id);
window.rtanon = { updates: 0, last: null };  // read by the browser tests
let deviceChoices = null;

function showError(text) { $("error").textContent = text || ""; }

async function act(message) {
  try {
    const r = await fetch("api/action?" + q, { method: "POST", headers: { "Content-Type": "application/json" },
                                               body: JSON.stringify(message) });
    const reply = await r.json();
    showError(reply.error);
    if (reply.status) render(reply.status);
    return reply;
  } catch (e) { showError("rtanon is not answering: " + e); return { error: String(e) }; }
}

function meter(bar, text, db) {
  const pct = Math.max(0, Math.min(100, (db + 80) / 80 * 100));  // -80 .. 0 dBFS
  bar.style.width = pct.toFixed(1) + "%";
  bar.dataset.db = db.toFixed(1);
  bar.className = db > -3 ? "bad" : db > -9 ? "warn" : "";  // near clipping: orange, then red
  text.textContent = db <= -100 ? "\u2013" : db.toFixed(0) + " dB";
}

function setText(id, text, bad) { const el = $(id); el.textContent = text; el.classList.toggle("bad", !!bad); }

function render(s) {
  window.rtanon.last = s;
  meter($("in-bar"), $("in-db"), s.in_dbfs);
  meter($("out-bar"), $("out-db"), s.out_dbfs);
  $("gate").classList.toggle("on", !!s.gate);
  $("gate-text").textContent = s.gate ? "speech: your words go out in the pseudo-voice" : "no speech: comfort noise";
  const state = $("state");
  const down = (s.down || []).join(" and ");
  state.textContent = !s.running ? "stopped" : down ? `${down} lost: reopening` : s.muted ? "muted" : "anonymizing";
  state.className = "badge " + (!s.running ? "" : down || s.muted ? "warn" : "ok");
  $("mute").textContent = s.muted ? "Unmute" : "Mute";
  $("mute").classList.toggle("active", !!s.muted);
  $("startstop").textContent = s.running ? "Stop" : "Start";
  $("voice").textContent = s.voice || "\u2013";
  $("voice-pending").hidden = !s.voice_pending;
  if (document.activeElement !== $("method")) $("method").value = s.settings.method;
  if (document.activeElement !== $("privacy")) $("privacy").value = s.settings.privacy;
  $("privacy").disabled = s.settings.method !== "neural";  // McAdams has no privacy point; kept for neural
  if (document.activeElement !== $("chunk")) $("chunk").value = String(s.settings.chunk_ms);
  setText("algo", s.algorithmic_ms !== undefined ? s.algorithmic_ms.toFixed(0) + " ms" : "\u2013");
  setText("e2e", s.e2e_ms !== undefined ? "~" + s.e2e_ms.toFixed(0) + " ms" : "\u2013");
  setText("missed", String(s.missed ?? "\u2013"), s.missed > 0);
  setText("xruns", String(s.xruns ?? "\u2013"), s.xruns > 0);
  setText("errors", String(s.errors ?? "\u2013"), s.errors > 0);
  $("overload").hidden = !s.overload;  // compute falls behind: why, and the fix
  $("overload").textContent = s.overload || "";
  if (deviceChoices) selectDevices(s.settings);
}

function fill(select, choices, extra) {
  select.replaceChildren(...[...extra, ...choices].map((c) => new Option(c.label, c.id)));
}

function selectDevices(settings) {
  for (const [id, key] of [["input", "input"], ["output", "output"], ["monitor", "monitor"]]) {
    const el = $(id);
    if (document.activeElement !== el) el.value = settings[key] || "";
  }
}

async function loadDevices() {
  try {
    const r = await fetch("api/devices?" + q);
    deviceChoices = await r.json();
  } catch (e) { showError("could not list devices: " + e); return; }
  fill($("input"), deviceChoices.inputs, []);
  fill($("output"), deviceChoices.outputs, []);
  fill($("monitor"), deviceChoices.outputs.filter((c) => c.id !== "rtanon" && c.id !== ""),
       [{ id: "", label: "off" }]);
  $("create-mic").hidden = deviceChoices.virtual_mic;
  if (window.rtanon.last) selectDevices(window.rtanon.last.settings);
}

function connect() {
  const ws = new WebSocket(`ws://${location.host}/ws?${q}`);
  ws.onopen = () => { $("conn").textContent = "connected"; $("conn").className = "badge ok"; };
  ws.onmessage = (e) => {
    const msg = JSON.parse(e.data);
    if (msg.type === "status") { window.rtanon.updates += 1; render(msg); }
  };
  ws.onclose = () => {
    $("conn").textContent = "disconnected: retrying"; $("conn").className = "badge bad";
    setTimeout(connect, 1000);
  };
}

$("mute").onclick = () => act({ action: "mute", value: !(window.rtanon.last && window.rtanon.last.muted) });
$("new-voice").onclick = () => act({ action: "new_voice" });
$("startstop").onclick = () => act({ action: window.rtanon.last && window.rtanon.last.running ? "stop" : "start" });
$("method").onchange = (e) => { showError("loading the method\u2026"); act({ action: "method", value: e.target.value }); };
$("privacy").onchange = (e) => {
  showError("loading the vocoder\u2026"); act({ action: "privacy", value: e.target.value });
};
$("chunk").onchange = (e) => act({ action: "chunk_ms", value: Number(e.target.value) });
for (const id of ["input", "output", "monitor"]) {
  $(id).onchange = (e) => act({ action: "devices", [id]: e.target.value });
}
$("create-mic").onclick = async () => {
  const reply = await act({ action: "create_virtual_mic" });
  if (!reply.error) { await loadDevices(); act({ action: "devices", output: "rtanon" }); }
};

loadDevices();
connect();
