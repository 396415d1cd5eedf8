"""``rtanon live``: the real-time loop on sound devices, and what drives and measures it.

The loop, from the microphone to the output:

- ``core``: ``LiveCore``, the device-independent heart: input and output callbacks that only copy, and a
  worker that runs the session; ``config``: ``LiveConfig`` (its queue, blocks and buffers); ``output``: one
  output device's queue of processed audio, resampler and comfort noise; ``ring_buffer``: the native ring
  buffer (or its Python twin); ``recent``: ``RecentValues``, what a thread records for the status line.
- ``loop``: ``run_live``, the streams around a core, the watchdog and the status line; ``stream``:
  ``DeviceStream``, a stream that reopens itself; ``devices``: ``--input``/``--output`` to a device and
  its rate; ``feedback``: refusing an input that records the output; ``server``: the buffering asked of
  the audio server; ``delay``: the device delays it reports.
- ``pulse``: PulseAudio and PipeWire: the virtual microphone, the sources and sinks, a private daemon;
  ``pulse_stream``: an output stream on libpulse itself.
- ``control``: ``LiveControl``, what the control page (``rtanon.ui``) drives.
- ``faults``, ``soak``: ``rtanon soak``, the loop under injected faults; ``bench``: the live loop's
  benchmarks (``rtanon bench --live-seconds``, ``--e2e``).

May import: the streaming core and the utilities at the package root, ``rtanon.io`` and
``rtanon.eval.signal`` (the soak's and the benchmark's yardsticks). Never ``corpus``, ``serve``, ``ui`` or ``train``: ``rtanon connect`` and the server's
clients import this package, not the other way round.
"""
