"use strict";
// Audio thread of the rtanon serve page: rtanon-capture turns the microphone (at the context's rate) into
// 20 ms frames of 16 kHz float32 posted to the page; rtanon-player plays the 16 kHz frames the page posts
// to it at the context's rate, silence when none is there (never the microphone: it has no input).

const RATE = 16000;
const FRAME = 320;

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / RATE;  // input samples per output sample
    // low-pass below 16 kHz's Nyquist (windowed sinc, cut-off 7.2 kHz) before the decimation
    const taps = this.step > 1 ? 63 : 1;
    const fc = Math.min(0.5, 7200 / sampleRate);
    this.h = new Float32Array(taps);
    let sum = 0;
    for (let i = 0; i < taps; i++) {
      const m = i - (taps - 1) / 2;
      const sinc = m === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * m) / (Math.PI * m);
      const w = taps > 1 ? 0.42 - 0.5 * Math.cos(2 * Math.PI * i / (taps - 1)) + 0.08 * Math.cos(4 * Math.PI * i / (taps - 1)) : 1;
      this.h[i] = sinc * w;
      sum += this.h[i];
    }
    for (let i = 0; i < taps; i++) this.h[i] /= sum;
    this.hist = new Float32Array(taps);  // the last inputs, newest last
    this.prev = 0;  // the filtered sample before the current one
    this.t = 0;  // position of the next output sample, in input samples after `prev`
    this.frame = new Float32Array(FRAME);
    this.n = 0;
  }

  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true;
    const h = this.h, hist = this.hist, taps = h.length;
    for (let i = 0; i < x.length; i++) {
      hist.copyWithin(0, 1);
      hist[taps - 1] = x[i];
      let cur = 0;
      for (let k = 0; k < taps; k++) cur += h[k] * hist[k];
      // output samples that fall between `prev` (position 0) and `cur` (position 1)
      while (this.t <= 1) {
        this.frame[this.n++] = this.prev + (cur - this.prev) * this.t;
        this.t += this.step;
        if (this.n === FRAME) {
          this.port.postMessage(this.frame, [this.frame.buffer]);
          this.frame = new Float32Array(FRAME);
          this.n = 0;
        }
      }
      this.t -= 1;
      this.prev = cur;
    }
    return true;
  }
}

class Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = RATE / sampleRate;  // 16 kHz samples per output sample
    this.queue = [];
    this.cur = null;
    this.pos = 0;  // fractional position in `cur`
    this.last = 0;  // the sample before `cur`
    this.playing = false;
    this.gaps = 0;
    this.played = 0;  // frames played to the end
    this.port.onmessage = (e) => {
      this.queue.push(e.data);
      if (this.queue.length > 10) this.queue.splice(0, this.queue.length - 3);  // drift: keep the delay low
    };
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queue.length >= 3) this.playing = true;  // 60 ms ahead absorbs network jitter
    for (let i = 0; i < out.length; i++) {
      if (!this.playing) { out[i] = 0; continue; }
      if (this.cur === null || this.pos >= FRAME) {
        if (this.cur !== null) {
          this.last = this.cur[FRAME - 1];
          this.pos -= FRAME;
          if (++this.played % 50 === 0) this.port.postMessage({gaps: this.gaps, played: this.played});
        }
        this.cur = this.queue.shift() || null;
        if (this.cur === null) {  // ran dry: silence until 60 ms are queued again
          this.playing = false;
          this.pos = 0;
          this.gaps++;
          this.port.postMessage({gaps: this.gaps, played: this.played});
          out[i] = 0;
          continue;
        }
      }
      const k = Math.floor(this.pos), f = this.pos - k;
      const a = k === 0 ? this.last : this.cur[k - 1];
      out[i] = a + (this.cur[k] - a) * f;
      this.pos += this.step;
    }
    return true;
  }
}

registerProcessor("rtanon-capture", Capture);
registerProcessor("rtanon-player", Player);
