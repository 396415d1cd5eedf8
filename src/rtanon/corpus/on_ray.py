"""Corpus anonymization on Ray: one actor per worker holds the models, batches of utterances go to them.

``start_ray(address, workers)`` joins a running cluster (``address``, e.g.
``127.0.0.1:6379`` after ``ray start --head``) or starts a local Ray in this
process with ``workers`` CPUs. ``RayExecutor(config, identity, workers)``
creates ``workers`` :class:`CorpusWorker` actors; each builds one
:class:`rtanon.engine.Anonymizer` (models loaded once per worker, not per
utterance) and anonymizes the batches of utterances that Ray's
``ActorPool`` hands it, reading inputs and writing outputs on paths every node
must see. With the neural method on ``--accelerator cuda|auto`` and GPUs in
the cluster, each actor asks Ray for its share of a GPU (``num_gpus``) and runs
the vocoder there. Ray schedules; rtanon only splits the corpus into batches.

A SIGTERM or SIGHUP while a local Ray runs may have reached Ray's own processes too (``timeout``, a shell or
a supervisor signals the whole process group), and a Ray whose GCS is gone makes the driver's calls wait a
minute before it ends the process with its own error. So from such a signal on nothing asks Ray anything:
:class:`_StopWatch` sees the signal at once and has the watchdog kill the local Ray, ``RayExecutor.close``
and ``stop_ray`` skip Ray's own teardown, and the interrupt reaches the CLI's exit status in seconds (or,
where a Ray call holds it back, the watch ends the process after STOP_GRACE_S). SIGINT (Ctrl-C, also sent to
the whole group) leaves Ray's processes running, and Ray is shut down as at the end of a run.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from rtanon.atomic import pid_alive
from rtanon.corpus import ray_watchdog
from rtanon.corpus.run import CorpusError, process_batch, warm_up
from rtanon.errors import Interrupted, install_hint
from rtanon.paths import printable

#: the version the [corpus] extra pins
RAY_PIN = "ray==2.60.0"
#: How long --ray-address may take to answer before the run gives up (Ray itself retries for minutes).
CONNECT_TIMEOUT_S = 10.0
#: How long a server there may take to greet a gRPC client (Ray's GCS: milliseconds; a server that is not
#: gRPC never does, and Ray's client would retry for minutes).
HANDSHAKE_TIMEOUT_S = 5.0
#: What a gRPC client sends first: HTTP/2's connection preface and an empty SETTINGS frame (RFC 9113 3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: Ray's switch for clusters on this platform; off, a node's address is 127.0.0.1 and Ray listens there only.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: How long closing waits for killed actors to be gone.
CLOSE_WAIT_S = 10.0

#: The watchdog over the local Ray this process started (:mod:`rtanon.corpus.ray_watchdog`), like Ray itself one per
#: process: started by start_ray, told by stop_ray that Ray was shut down.
_watchdog = None
#: The signals that end the local Ray at once: sent to the process group, they reached its GCS too.
_ENDS_RAY = (signal.SIGTERM, signal.SIGHUP)
#: How long a run may take to stop on its own after one of _ENDS_RAY before its process ends at once.
STOP_GRACE_S = 3.0
#: The _StopWatch over the local Ray this process started (started by start_ray, finished by stop_ray).
_stop = None
_end_lock = threading.Lock()


def stopped_line(signum: int) -> str:
    """What ``anonymize-dir`` prints when signal ``signum`` stopped it: every output it recorded is complete."""
    return (f"rtanon anonymize-dir: stopped by {signal.Signals(signum).name}; what is done is recorded in the "
            "manifest: rerun the same command to continue")


def need_ray():
    """The ray module, or a CorpusError saying how to install it (or to run in this process)."""
    try:
        import ray
    except ImportError:
        raise CorpusError(f"Ray is not installed: {install_hint('corpus')} ({RAY_PIN}), or run in this "
                          "process with --workers 0") from None
    return ray


def ray_installed() -> bool:
    """Whether Ray can be imported (the [corpus] extra); without it ``anonymize-dir`` runs in this process."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def check_address(address: str) -> None:
    """Raises CorpusError unless ``address`` is ``HOST:PORT`` (or ``ray://HOST:PORT``), something there accepts
    a connection within CONNECT_TIMEOUT_S and greets a gRPC client as Ray's servers do within
    HANDSHAKE_TIMEOUT_S: Ray would wait minutes for a cluster that is not there."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CorpusError(f"--ray-address {printable(address, 80)}: expected HOST:PORT, as `ray start --head` "
                          "prints it (e.g. 127.0.0.1:6379)")

    def no_cluster(why: str) -> CorpusError:
        return CorpusError(f"--ray-address {printable(address, 80)}: no Ray cluster there ({why}); start one "
                           "with `ray start --head`, or leave the option out for a local Ray")

    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        why = f"no answer within {CONNECT_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else exc.strerror
        raise no_cluster(why or str(exc)) from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return  # Ray speaks TLS there: the plain-text greeting below would be refused
        try:
            greeting = _h2_greeting(sock)
        except OSError as exc:
            why = (f"it accepts connections but does not answer within {HANDSHAKE_TIMEOUT_S:g} s"
                   if isinstance(exc, TimeoutError) else exc.strerror or str(exc))
            raise no_cluster(why) from None
    if not _is_settings_frame(greeting):
        said = f"answered '{printable(greeting.decode('latin-1'))}'" if greeting else "closed the connection"
        raise no_cluster(f"the server there is not Ray's: it {said} when greeted as a gRPC client")


def _h2_greeting(sock) -> bytes:
    """The first 9 bytes (an HTTP/2 frame header) the server at ``sock`` sends after a gRPC client's preface,
    fewer if it closes first; OSError (TimeoutError) if it says nothing within HANDSHAKE_TIMEOUT_S."""
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    sock.sendall(_H2_PREFACE)
    data = b""
    while len(data) < 9:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(9 - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _is_settings_frame(header: bytes) -> bool:
    """Whether ``header`` is an HTTP/2 SETTINGS frame's header on stream 0: how every gRPC server, Ray's GCS
    and Ray's client server among them, begins (RFC 9113 3.4, 6.5)."""
    return len(header) == 9 and header[3] == 4 and int.from_bytes(header[5:9], "big") & 0x7FFFFFFF == 0


def start_ray(address: str | None = None, workers: int | None = None) -> dict:
    """Connects to the cluster at ``address`` or starts a local Ray with ``workers`` CPUs; returns the
    cluster's resources. Local workers import rtanon from where this process does. A local Ray listens on
    127.0.0.1 only: Ray binds its servers (GCS, raylet, workers, this driver) to loopback when the node's
    address is loopback, which it chooses where it does not offer clusters (``LOOPBACK_ENV`` set to 0, read
    when ray is imported, and its constant for a ray imported before). A watchdog process ends the local
    Ray's processes should this one be killed (:mod:`rtanon.corpus.ray_watchdog`), and a SIGTERM or SIGHUP ends
    them at once (:class:`_StopWatch`)."""
    global _stop
    if not address:
        os.environ[LOOPBACK_ENV] = "0"  # the processes Ray starts inherit it
    ray = need_ray()
    if not address:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        return dict(ray.cluster_resources())
    here = str(Path(__file__).resolve().parents[1])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in [str(Path(p).resolve()) for p in paths]:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])  # Ray's workers inherit it
    if address:
        check_address(address)
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if address:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        else:
            before = ray_watchdog.children(os.getpid()) if ray_watchdog.supported() else {}
            _stop = _StopWatch(before) if main and ray_watchdog.supported() else None
            try:
                ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                         logging_level=logging.ERROR, log_to_driver=False, object_store_memory=200 * 2**20)
                _watch_local_ray(before)
            except SystemExit as exc:  # Ray's own SIGTERM handler, while ray.init runs
                if _stop is None or exc.code != signal.SIGTERM:
                    raise
                _stop.seen(signal.SIGTERM)
                _watch_local_ray(before)
                _end_local_ray()
                raise Interrupted(signal.SIGTERM) from None
    except ConnectionError as exc:
        raise CorpusError(f"--ray-address {address}: no Ray cluster there ({exc}); start one with "
                          "`ray start --head`") from None
    finally:  # Ray's core worker takes SIGTERM over (a stack dump, exit 1): the CLI's handlers come back
        if main:
            for sig, handler in handlers.items():
                if handler is not None:
                    watched = _stop is not None and sig in _ENDS_RAY and callable(handler)
                    signal.signal(sig, _stop.noting(handler) if watched else handler)
    return dict(ray.cluster_resources())


class _StopWatch:
    """Sees a SIGTERM or SIGHUP the moment it arrives, whatever the main thread does: Python runs signal
    handlers there only between bytecodes, and a Ray call waiting for a GCS that the signal ended holds
    them back (or swallows what they raise) for a minute. A thread reads the signal numbers Python's C
    handler writes to a socket (``signal.set_wakeup_fd``); on one of _ENDS_RAY it notes it (``signum``:
    from then on nothing asks Ray anything), ends the local Ray (:func:`_end_local_ray`) and, unless the
    run stopped on its own within STOP_GRACE_S (:meth:`finish`), prints :func:`stopped_line` and ends the
    process. The run's outputs and manifest are written atomically: a process ended there leaves at most
    temporary files, which the next run sweeps."""

    def __init__(self, before: dict[int, int]) -> None:
        self.signum: int | None = None
        self.before = before  # this process's children before ray.init (the rest is Ray's)
        self._finished = threading.Event()
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="rtanon-stop-watch", daemon=True).start()

    def seen(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum

    def noting(self, handler):
        """The signal handler ``handler`` (the CLI's), which first notes the signal."""
        def noting(signum, frame):
            self.seen(signum)
            return handler(signum, frame)

        noting.handler = handler
        return noting

    def _watch(self) -> None:
        with self._read:
            while not self._finished.is_set():
                try:
                    data = self._read.recv(64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum in _ENDS_RAY:
                        break
                else:
                    continue
                self.seen(signum)
                _end_local_ray(self.before)
                if not self._finished.wait(STOP_GRACE_S):
                    print(stopped_line(self.signum), file=sys.stderr, flush=True)
                    os._exit(128 + self.signum)
                return

    def finish(self) -> None:
        """The run has stopped (or Ray was shut down): the watch ends, Python's wakeup socket comes back."""
        self._finished.set()
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd)
        self._write.close()  # the watching thread reads the end of its socket


@contextmanager
def _interrupts_through_ray():
    """Ray's Cython calls turn what a signal handler raises while they wait (the CLI's ``Interrupted`` on
    SIGTERM or SIGHUP) into a SystemError: this gives the interrupt back, so the run stops with its status."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__context__, (Interrupted, KeyboardInterrupt)):
            raise exc.__context__ from None
        raise


def _watch_local_ray(before: dict[int, int]) -> None:
    """Starts the watchdog over the processes ray.init started: this process's children not in ``before``."""
    global _watchdog
    if not ray_watchdog.supported():
        return
    started = {pid: t for pid, t in ray_watchdog.children(os.getpid()).items() if before.get(pid) != t}
    if started:
        _watchdog = ray_watchdog.start(started)


def stop_ray() -> None:
    """Shuts Ray down (a local Ray ends; a cluster stays), then lets the local Ray's watchdog go; after a
    SIGTERM or SIGHUP, has the watchdog kill the local Ray instead (:func:`ray_abandoned`)."""
    global _watchdog, _stop
    ray = need_ray()
    if ray_abandoned():
        _end_local_ray()
    else:
        if ray.is_initialized():
            ray.shutdown()
        if _watchdog is not None:
            ray_watchdog.stop(_watchdog)
            _watchdog = None
    if _stop is not None:
        _stop.finish()
        if threading.current_thread() is threading.main_thread():
            for sig in _ENDS_RAY:
                if hasattr(handler := signal.getsignal(sig), "handler"):
                    signal.signal(sig, handler.handler)


def ray_abandoned() -> bool:
    """Whether a SIGTERM or SIGHUP ended the local Ray without ray.shutdown (:class:`_StopWatch`). This
    process's own Ray connection is then left as it is, and only ``os._exit`` ends the process at once: its
    normal exit runs ray.shutdown, which waits a minute for the GCS, or crashes in Ray's threads."""
    return _stop is not None and _stop.signum is not None


def _end_local_ray(before: dict[int, int] | None = None) -> None:
    """Ends the local Ray without a word to it: its watchdog kills every process Ray started (the GCS, the
    raylet, its agents, the actors); while ray.init runs (no watchdog yet), this process's children not in
    ``before`` and their descendants are killed."""
    global _watchdog
    with _end_lock:
        if _watchdog is not None:
            ray_watchdog.end(_watchdog)
            _watchdog = None
        elif before is not None:
            ray_watchdog.kill_all({pid: t for pid, t in ray_watchdog.children(os.getpid()).items()
                                   if before.get(pid) != t})


class CorpusWorker:
    """One Ray actor: an Anonymizer built once, then batches of utterances (:func:`process_batch`)."""

    def __init__(self, config, identity=None) -> None:
        import ray

        from rtanon.engine import Anonymizer

        t0 = time.perf_counter()
        self.anonymizer = Anonymizer(config)
        warm_up(self.anonymizer)
        self.identity = identity
        self.load_s = time.perf_counter() - t0
        self.name = f"{ray.get_runtime_context().get_node_id()[:8]}:{os.getpid()}"

    def ready(self) -> tuple[str, float]:
        return self.name, self.load_s

    def process(self, jobs: list[dict]) -> list[dict]:
        results = process_batch(self.anonymizer, self.identity, jobs)
        for r in results:
            r["worker"] = self.name
        return results


def gpus_per_worker(config, workers: int, resources: dict) -> float:
    """The GPU share each actor asks for: the neural method on ``cuda`` or ``auto`` gets the cluster's GPUs
    split over the workers (at most one each); McAdams and CPU runs none."""
    if config.method != "neural" or config.neural.device == "cpu":
        return 0.0
    gpus = float(resources.get("GPU", 0.0))
    if gpus == 0.0:
        if config.neural.device == "cuda":
            raise CorpusError("--accelerator cuda, but the Ray cluster has no GPU; use --accelerator cpu")
        return 0.0
    return min(1.0, gpus / workers)


class RayExecutor:
    """``workers`` CorpusWorker actors behind Ray's ActorPool (Ray must be started: :func:`start_ray`)."""

    name = "ray"

    def __init__(self, config, identity=None, workers: int | None = None) -> None:
        ray = need_ray()
        from ray.util import ActorPool

        resources = dict(ray.cluster_resources())
        self.workers = workers or max(1, int(resources.get("CPU", 1)))
        gpus = gpus_per_worker(config, self.workers, resources)
        if self.workers > resources.get("CPU", 0) and not gpus:
            raise CorpusError(f"--workers {self.workers}, but the Ray cluster has {resources.get('CPU', 0):g} CPUs")
        t0 = time.perf_counter()
        actor = ray.remote(num_cpus=1, num_gpus=gpus)(CorpusWorker)
        self._actors = [actor.remote(config, identity) for _ in range(self.workers)]
        try:
            with _interrupts_through_ray():
                self.ready = ray.get([a.ready.remote() for a in self._actors])
        except ray.exceptions.RayError as exc:
            self.close()
            raise CorpusError(f"a Ray worker could not load the models: {str(exc).splitlines()[-1]}") from None
        self.startup_s = time.perf_counter() - t0
        self.gpus_per_worker = gpus
        self._pool = ActorPool(self._actors)

    def run(self, batches):
        ray = need_ray()
        try:
            with _interrupts_through_ray():
                yield from self._pool.map_unordered(lambda a, batch: a.process.remote(batch), batches)
        except ray.exceptions.RayError as exc:  # a worker process died (killed, out of memory)
            raise CorpusError(f"a Ray worker died ({str(exc).splitlines()[0]}); the work done so far is "
                              "recorded: rerun the same command to continue") from None

    def close(self) -> None:
        """Kills the actors (after a SIGTERM or SIGHUP, the whole local Ray: :func:`_end_local_ray`) and
        waits (at most CLOSE_WAIT_S) until those on this node are gone, so that the temporary files they
        were writing are a dead writer's, which the caller may sweep."""
        ray = need_ray()
        if ray_abandoned():
            _end_local_ray()
            here = None  # a local Ray: every actor ran on this node
        else:
            for a in self._actors:
                ray.kill(a)
            here = ray.get_runtime_context().get_node_id()[:8]
        self._actors = []
        pids = [int(pid) for node, _, pid in (name.partition(":") for name, _ in getattr(self, "ready", []))
                if here is None or node == here]
        deadline = time.monotonic() + CLOSE_WAIT_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = [pid for pid in pids if pid_alive(pid)]
