"""`rtanon anonymize-dir` on Ray: actors load the models once and give the same bytes as one process;
the CLI's default path starts a local Ray. One local Ray (2 CPUs) serves the whole module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtanon.config import AnonymizerConfig, NeuralConfig
from rtanon.corpus.run import CorpusError, CorpusPlan, InProcessExecutor, run_corpus
from rtanon.corpus.on_ray import gpus_per_worker
from rtanon.io.kaldi import KaldiDir
from test_corpus import make_corpus, tree  # pytest puts tests/ on sys.path (no __init__.py)

REPO = Path(__file__).resolve().parents[1]


def test_gpu_actors_take_a_share_of_the_clusters_gpus_for_the_neural_method():
    neural = AnonymizerConfig(method="neural", neural=NeuralConfig(device="auto"))
    assert gpus_per_worker(neural, 4, {"CPU": 8, "GPU": 2}) == 0.5
    assert gpus_per_worker(neural, 1, {"CPU": 8, "GPU": 2}) == 1.0
    assert gpus_per_worker(neural, 2, {"CPU": 8}) == 0.0
    assert gpus_per_worker(AnonymizerConfig(method="mcadams"), 2, {"CPU": 8, "GPU": 2}) == 0.0  # McAdams: CPU only
    with pytest.raises(CorpusError, match="no GPU"):
        gpus_per_worker(AnonymizerConfig(method="neural", neural=NeuralConfig(device="cuda")), 2, {"CPU": 2})


def test_ray_workers_give_the_bytes_of_one_process_and_load_models_once(tmp_path, shared_data, ray_local):
    from rtanon.corpus.on_ray import RayExecutor

    d = make_corpus(tmp_path, shared_data, 4, copies=2)
    data = KaldiDir.load(d)
    config = AnonymizerConfig()
    local = run_corpus(CorpusPlan(data, tmp_path / "local", config, seed=3, batch=1, progress=False),
                       lambda: InProcessExecutor(config))
    executors = []

    def factory():
        executors.append(RayExecutor(config, None, 2))
        return executors[-1]

    on_ray = run_corpus(CorpusPlan(data, tmp_path / "ray", config, seed=3, batch=1, progress=False), factory)
    assert local.ok and on_ray.ok and on_ray.done == 8
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    # two actors, each built once (its model load reported once), both did work
    assert len(executors[0].ready) == 2 and len({name for name, _ in executors[0].ready}) == 2
    assert set(on_ray.workers) == {name for name, _ in executors[0].ready}


def test_the_cli_runs_on_a_local_ray_by_default_and_resumes_on_a_given_cluster(tmp_path, shared_data, ray_local):
    d = make_corpus(tmp_path, shared_data, 2)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "rtanon", "anonymize-dir", "--data", str(d), "--out", str(out)]
    proc = subprocess.run([*cmd, "--workers", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "2 utterances anonymized on 1 Ray workers" in proc.stdout
    recs = json.loads((out / "manifest.json").read_text())["utterances"]
    assert len(recs) == 2
    # the same command on the module's Ray (an existing cluster): verifies and skips both
    (out / sorted(p.name for p in out.glob("*.wav"))[0]).unlink()
    address = ray_local.get_runtime_context().gcs_address
    again = subprocess.run([*cmd, "--ray-address", address], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    assert "1 utterances anonymized on 2 Ray workers" in again.stdout and "1 already done" in again.stdout


def _long_corpus(root: Path, shared_data: Path, copies: int = 10) -> Path:
    """A Kaldi dir of 8 so762_train utterances of one speaker, each ``copies`` times under new ids."""
    src = shared_data / "so762_train"
    lines = (src / "wav.scp").read_text().splitlines()[:8]
    utt2spk = dict(line.split() for line in (src / "utt2spk").read_text().splitlines())
    gender = dict(line.split() for line in (src / "spk2gender").read_text().splitlines())
    d = root / "data"
    d.mkdir()
    scp, u2s = [], []
    for c in range(copies):
        for line in lines:
            utt, path = line.split()
            scp.append(f"{utt}-{c:02d} {src / path}\n")
            u2s.append(f"{utt}-{c:02d} {utt2spk[utt]}\n")
    (d / "wav.scp").write_text("".join(scp))
    (d / "utt2spk").write_text("".join(u2s))
    spks = sorted({line.split()[1] for line in u2s})
    (d / "spk2gender").write_text("".join(f"{s} {gender[s]}\n" for s in spks))
    return d


def _started(pid: int, moment: str, out: Path) -> bool:
    """Whether the run ``pid`` has reached ``moment``: its actors loading the models, or a first output written."""
    from test_reliability2 import _command, _process_tree

    if moment == "running":
        return bool(list(out.glob("*.wav")))
    return any("CorpusWorker" in _command(child) for child in _process_tree(pid) - {pid})


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["starting", "running"])
def test_sigterm_to_the_process_group_stops_a_ray_run_at_once_and_it_resumes(tmp_path, shared_data, moment):
    """`timeout` or `kill -TERM -PGID` reaches Ray's GCS and raylet too: the driver used to wait a minute
    for the dead GCS and die with Ray's error (exit 1), or took 10-20 s, or crashed at exit (139)."""
    import signal
    import time

    from test_reliability2 import _process_tree, _start_time, _still_running

    pytest.importorskip("ray", reason="Ray is not installed (the [corpus] extra)")
    d = _long_corpus(tmp_path, shared_data)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "rtanon", "anonymize-dir", "--data", str(d), "--out", str(out), "--method",
           "mcadams", "--batch", "1", "--seed", "1", "--no-progress"]
    proc = subprocess.Popen([*cmd, "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    recorded = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not _started(proc.pid, moment, out):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        recorded = {pid: _start_time(pid) for pid in _process_tree(proc.pid) - {proc.pid}}
        os.killpg(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
        while _still_running(recorded) and time.monotonic() - t0 < took + 10:
            time.sleep(0.1)
        assert _still_running(recorded) == []  # Ray's processes and the watchdog: none left behind
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid, start in recorded.items():
            if _start_time(pid) == start:
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert took < 15, (took, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "rerun the same command" in lines[0], err
    # what the manifest records is there, complete; no temporary file is left
    manifest = out / "manifest.json"  # none before the workers started
    recs = json.loads(manifest.read_text())["utterances"] if manifest.exists() else {}
    for rec in recs.values():
        assert tree(out)[rec["output"]] == rec["output_sha256"]
    assert [p.name for p in out.iterdir() if p.name.endswith(".part")] == []
    # the same command continues, to what one uninterrupted run (in this process) writes
    again = subprocess.run([*cmd, "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(recs)} already done" in again.stdout
    clean = subprocess.run([*cmd[:7], str(tmp_path / "clean"), *cmd[8:], "--workers", "0"], capture_output=True,
                           text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    assert tree(out) == tree(tmp_path / "clean")
