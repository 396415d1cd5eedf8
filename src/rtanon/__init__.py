"""rtanon: real-time voice anonymizer.

Map of the package:

- ``rtanon.engine``: ``Anonymizer`` (shared: method, models, config) and
  ``Session`` (per stream: every buffer, stage state and counter).
- ``rtanon.config``: configuration dataclasses with ``validate()``.
- ``rtanon.methods``: the method registry (``mcadams``; more to come).
- ``rtanon.stages``: streaming stages with one contract (``process``,
  ``reset``, ``hop``, ``latency_samples``): ``vad``, ``mcadams``.
- ``rtanon.audio_io``: files in/out, streamed and written atomically.
- ``rtanon.live``: the real-time loop (PortAudio callback + worker thread).
- ``rtanon.pulse``: PulseAudio/PipeWire virtual microphone and a private test daemon.
- ``rtanon.bench``: latency and compute benchmarks.
- ``rtanon.kaldi``: Kaldi-style data directories.
- ``rtanon.f0``: streaming F0 tracker (C++ and Numba kernels) and pitch conversion.
- ``rtanon.cli``: the ``rtanon`` command.
- ``rtanon._core``: native kernels (C++, pybind11): ``RingBuffer``, ``F0Kernel``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rtanon")
except PackageNotFoundError:  # running from a source tree (PYTHONPATH=src)
    __version__ = "0.0.0+src"

from rtanon.config import AnonymizerConfig  # noqa: E402
from rtanon.engine import Anonymizer, Session  # noqa: E402

__all__ = ["Anonymizer", "AnonymizerConfig", "Session", "__version__"]
