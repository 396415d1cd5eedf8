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
from rtanon.corpus import CorpusError, CorpusPlan, InProcessExecutor, run_corpus
from rtanon.corpus_ray import gpus_per_worker
from rtanon.kaldi import KaldiDir
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


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is not installed (the [corpus] extra)")
    from rtanon.corpus_ray import start_ray, stop_ray

    start_ray(None, 2)
    yield ray
    stop_ray()


def test_ray_workers_give_the_bytes_of_one_process_and_load_models_once(tmp_path, shared_data, ray_local):
    from rtanon.corpus_ray import RayExecutor

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
