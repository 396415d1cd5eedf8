"""``DelayMeter``: the device delays the audio server reports through PortAudio's callback timestamps,
for the live status line."""

from __future__ import annotations

import time

from rtanon.live.recent import RecentValues


class DelayMeter:
    """Device delays as the audio server reports them through PortAudio's
    callback timestamps (capture: now - ADC time; playback: DAC time - now).
    ``device_ms`` is None until both streams reported a delay (a host API
    without timestamps gives zeros; a report beyond 2 s or more than
    ``TOLERANCE_S`` negative is not a delay); then the status line shows it,
    otherwise an estimate from the streams' nominal latencies. A capture
    delay of zero is a report: PulseAudio's ALSA plugin gives it whenever the
    callback has just taken all that was captured."""

    #: a timestamp this far behind ``currentTime`` still reads as a zero delay (the clocks' jitter)
    TOLERANCE_S = 0.002

    def __init__(self) -> None:
        self.in_s: float | None = None
        self.out_s: float | None = None
        self.in_ms, self.out_ms = RecentValues(), RecentValues()  # the reports, for their medians
        self.out_gap_s = 0.0  # the longest wait between two output callbacks since ``take_out_gap``
        self._last_out: float | None = None

    @classmethod
    def _delay_s(cls, now: float, stamp: float, sign: float) -> float | None:
        """The delay ``sign * (stamp - now)`` where both timestamps are given and it is plausible, else None."""
        if now <= 0.0 or stamp <= 0.0:
            return None
        d = sign * (stamp - now)
        return max(0.0, d) if -cls.TOLERANCE_S <= d < 2.0 else None

    def take_out_gap(self) -> float:
        """The longest wait between two output callbacks since the last call, in s (the output stalled)."""
        gap, self.out_gap_s = self.out_gap_s, 0.0
        return gap

    def on_input(self, time_info) -> None:
        self.in_s = self._delay_s(time_info.currentTime, time_info.inputBufferAdcTime, -1.0)
        if self.in_s is not None:
            self.in_ms.add(1000.0 * self.in_s)

    def on_output(self, time_info) -> None:
        now = time.monotonic()
        if self._last_out is not None:
            self.out_gap_s = max(self.out_gap_s, now - self._last_out)
        self._last_out = now
        self.out_s = self._delay_s(time_info.currentTime, time_info.outputBufferDacTime, 1.0)
        if self.out_s is not None:
            self.out_ms.add(1000.0 * self.out_s)

    def device_ms(self) -> float | None:
        return None if self.in_s is None or self.out_s is None else 1000.0 * (self.in_s + self.out_s)
