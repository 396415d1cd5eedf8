"""rtanon: real-time voice anonymizer.

Map of the package (``docs/ARCHITECTURE.md`` draws it, with the import rules). What ships (the run time):

- ``rtanon.engine``: ``Anonymizer`` (shared: method, models, config) and
  ``Session`` (per stream: every buffer, stage state and counter).
- ``rtanon.config``: configuration dataclasses with ``validate()``;
  ``rtanon.constants``: the sample rate, the 10 ms hop and the 20 ms frame.
- ``rtanon.methods``: the method registry: ``mcadams`` and ``neural``.
- ``rtanon.stages``: streaming stages with one contract (``process``,
  ``reset``, ``hop``, ``latency_samples``): ``vad``, ``mcadams``,
  ``allpass``, ``neural``.
- ``rtanon.content``: the causal content encoder's ONNX stream.
- ``rtanon.neural``: the neural method's vocoder and its backends.
- ``rtanon.f0``: streaming F0 tracker (C++ and Numba kernels) and pitch conversion.
- ``rtanon.identity``: pseudo-speakers (pool, selection, GMM generation).
- ``rtanon.io``: audio files in/out, streamed, Kaldi-style directories, package data;
  ``rtanon.atomic``: the one atomic writer every file goes through; ``rtanon.paths``: bounded reads;
  ``rtanon.errors``: ``UserError``, the base of the errors the CLI prints in one line.
- ``rtanon.live``: the real-time loop (PortAudio callback + worker thread), PulseAudio/PipeWire
  (the virtual microphone, a private test daemon), the control page's controller, the soak.
- ``rtanon.corpus``: ``rtanon anonymize-dir``, Kaldi-style corpora anonymized (in this process or on Ray).
- ``rtanon.serve``: ``rtanon serve``, many sessions batched behind a WebSocket, and its clients.
- ``rtanon.bench``: the core's latency and compute benchmarks; ``rtanon.eval``: privacy
  and utility evaluation.
- ``rtanon.cli``, ``rtanon.commands``: the ``rtanon`` command.
- ``rtanon._core``: native kernels (C++, pybind11): ``RingBuffer``, ``F0Kernel``.

What trains the models lives apart, in ``rtanon.train`` (``rtanon train`` and
``rtanon lab``); nothing above imports it.

Importing rtanon sets ``ORT_DISABLE_TELEMETRY=1`` unless the environment already sets it: ONNX Runtime
(1.29 and later) otherwise writes a persistent device id and an event database under
``~/.cache/Microsoft/DeveloperTools/.onnxruntime/`` at its first model load, and may send them. The one
side effect of the import, set before any ONNX Runtime environment exists (ours or a dependency's), and
inherited by every process rtanon starts.
"""

import os
from importlib.metadata import PackageNotFoundError, version

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

try:
    __version__ = version("rtanon")
except PackageNotFoundError:  # running from a source tree (PYTHONPATH=src)
    __version__ = "0.0.0+src"

from rtanon.config import AnonymizerConfig  # noqa: E402
from rtanon.engine import Anonymizer, Session  # noqa: E402

__all__ = ["Anonymizer", "AnonymizerConfig", "Session", "__version__"]
